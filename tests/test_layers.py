"""Every public layer round-trips through get_config/from_config and .keras files."""

import keras
import numpy as np
import pytest

import keras_transformer as kt
from layer_test_utils import assert_round_trips, to_np

rng = np.random.default_rng(0)
X = rng.normal(size=(2, 5, 16)).astype("float32")
Y = rng.normal(size=(2, 3, 16)).astype("float32")
IDS = np.array([[4, 5, 6, 0, 0], [7, 8, 9, 10, 11]], "int32")


@pytest.mark.parametrize(
    "make_layer, args",
    [
        (lambda: kt.MultiHeadAttention(num_heads=2, key_dim=4, value_dim=6), (X, Y)),
        (lambda: kt.PositionalEncoding(), (X,)),
        (lambda: kt.PositionalEncoding(max_length=8, learned=True), (X,)),
        (lambda: kt.SharedEmbedding(vocab_size=12, d_model=16), (IDS,)),
        (lambda: kt.EncoderLayer(num_heads=2, key_dim=8, d_ff=32), (X,)),
        (lambda: kt.EncoderLayer(num_heads=2, key_dim=8, d_ff=32, norm_first=True), (X,)),
        (lambda: kt.DecoderLayer(num_heads=2, key_dim=8, d_ff=32), (Y, X)),
        (lambda: kt.TransformerEncoder(num_layers=2, num_heads=2, key_dim=8, d_ff=32), (X,)),
        (lambda: kt.TransformerDecoder(num_layers=2, num_heads=2, key_dim=8, d_ff=32,
                                       norm_first=True), (Y, X)),
        (lambda: kt.PaddingMask(0), (IDS,)),
    ],
    ids=["mha", "sinusoid", "learned_positions", "embedding", "encoder_layer",
         "encoder_layer_prenorm", "decoder_layer", "encoder", "decoder", "padding_mask"],
)
def test_layer_round_trips(make_layer, args, tmp_path):
    assert_round_trips(make_layer(), args, tmp_path=tmp_path)


def test_layers_are_registered_under_the_package():
    for name in ["MultiHeadAttention", "PositionalEncoding", "SharedEmbedding", "EncoderLayer",
                 "DecoderLayer", "TransformerEncoder", "TransformerDecoder", "Transformer",
                 "TransformerSchedule", "LabelSmoothedCrossEntropy", "MaskedAccuracy"]:
        cls = getattr(kt, name)
        assert keras.saving.get_registered_name(cls) == f"keras_transformer>{name}"


def test_shared_embedding_reverse_is_the_transposed_matrix():
    layer = kt.SharedEmbedding(vocab_size=12, d_model=16)
    embedded = to_np(layer(IDS))
    table = to_np(layer.embeddings)
    np.testing.assert_allclose(embedded, table[IDS] * 4.0, rtol=1e-6)  # sqrt(16)
    np.testing.assert_allclose(to_np(layer(X, reverse=True)), X @ table.T, rtol=1e-5, atol=1e-5)


def test_encoder_layer_post_norm_structure():
    """Post-norm: each output position is normalised (zero mean, unit variance)."""
    layer = kt.EncoderLayer(num_heads=2, key_dim=8, d_ff=32, dropout=0.0)
    out = to_np(layer(X))
    np.testing.assert_allclose(out.mean(-1), 0, atol=1e-5)
    np.testing.assert_allclose(out.std(-1), 1, atol=1e-2)


def test_constructor_errors_name_the_argument():
    with pytest.raises(ValueError, match="num_heads"):
        kt.MultiHeadAttention(num_heads=0, key_dim=4)
    with pytest.raises(ValueError, match="dropout"):
        kt.EncoderLayer(num_heads=2, key_dim=4, d_ff=8, dropout=2.0)
    with pytest.raises(ValueError, match="d_ff"):
        kt.DecoderLayer(num_heads=2, key_dim=4, d_ff=0)
    with pytest.raises(ValueError, match="num_layers"):
        kt.TransformerEncoder(num_layers=0, num_heads=2, key_dim=4)
    with pytest.raises(ValueError, match="vocab_size"):
        kt.SharedEmbedding(vocab_size=0, d_model=4)
