"""Public layers of keras_transformer."""

from keras_transformer.layers.decoder_layer import DecoderLayer
from keras_transformer.layers.embedding import SharedEmbedding
from keras_transformer.layers.encoder_layer import EncoderLayer
from keras_transformer.layers.masks import PaddingMask, causal_mask, padding_mask
from keras_transformer.layers.multi_head_attention import MultiHeadAttention
from keras_transformer.layers.positional_encoding import PositionalEncoding, sinusoid
from keras_transformer.layers.stacks import TransformerDecoder, TransformerEncoder
