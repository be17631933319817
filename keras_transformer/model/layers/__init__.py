"""Public layers of keras_transformer."""

from keras_transformer.model.layers.decoder_layer import DecoderLayer
from keras_transformer.model.layers.embedding import SharedEmbedding
from keras_transformer.model.layers.encoder_layer import EncoderLayer
from keras_transformer.model.layers.masks import PaddingMask, causal_mask, padding_mask
from keras_transformer.model.layers.multi_head_attention import MultiHeadAttention
from keras_transformer.model.layers.positional_encoding import PositionalEncoding, sinusoid
from keras_transformer.model.layers.stacks import TransformerDecoder, TransformerEncoder

__all__ = ["DecoderLayer", "EncoderLayer", "MultiHeadAttention", "PaddingMask",
           "PositionalEncoding", "SharedEmbedding", "TransformerDecoder", "TransformerEncoder",
           "causal_mask", "padding_mask", "sinusoid"]
