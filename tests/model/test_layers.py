"""Every public layer round-trips through get_config/from_config and .keras files."""

import keras
import numpy as np
import pytest

import keras_transformer as kt
from layer_test_utils import assert_round_trips, to_np, weight_shapes

rng = np.random.default_rng(0)
X = rng.normal(size=(2, 5, 16)).astype("float32")
Y = rng.normal(size=(2, 3, 16)).astype("float32")
# An encoder output of another length and width than the decoder's inputs.
Z = rng.normal(size=(2, 7, 12)).astype("float32")
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
        (lambda: kt.DecoderLayer(num_heads=2, key_dim=8, value_dim=4, d_ff=32), (Y, Z)),
        (lambda: kt.TransformerEncoder(num_layers=2, num_heads=2, key_dim=8, d_ff=32), (X,)),
        (lambda: kt.TransformerDecoder(num_layers=2, num_heads=2, key_dim=8, d_ff=32,
                                       norm_first=True), (Y, X)),
        (lambda: kt.TransformerDecoder(num_layers=2, num_heads=2, key_dim=8, d_ff=32), (Y, Z)),
        (lambda: kt.PaddingMask(0), (IDS,)),
    ],
    ids=["mha", "sinusoid", "learned_positions", "embedding", "encoder_layer",
         "encoder_layer_prenorm", "decoder_layer", "decoder_layer_other_encoder_shape",
         "encoder", "decoder", "decoder_other_encoder_shape", "padding_mask"],
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


def decoder_layer_weight_shapes(prefix, d_model, encoder_width, heads_key, heads_value, d_ff):
    """Expected `{path: shape}` of a `DecoderLayer`'s weights."""
    shapes = {}
    for name, kv_width in (("self_attention", d_model), ("cross_attention", encoder_width)):
        shapes.update({
            f"{prefix}/{name}/query/kernel": (d_model, heads_key),
            f"{prefix}/{name}/query/bias": (heads_key,),
            f"{prefix}/{name}/key/kernel": (kv_width, heads_key),
            f"{prefix}/{name}/key/bias": (heads_key,),
            f"{prefix}/{name}/value/kernel": (kv_width, heads_value),
            f"{prefix}/{name}/value/bias": (heads_value,),
            f"{prefix}/{name}/attention_output/kernel": (heads_value, d_model),
            f"{prefix}/{name}/attention_output/bias": (d_model,),
        })
    for norm in ("self_attention_norm", "cross_attention_norm", "ffn_norm"):
        shapes[f"{prefix}/{norm}/gamma"] = (d_model,)
        shapes[f"{prefix}/{norm}/beta"] = (d_model,)
    shapes.update({
        f"{prefix}/ffn_inner/kernel": (d_model, d_ff),
        f"{prefix}/ffn_inner/bias": (d_ff,),
        f"{prefix}/ffn_output/kernel": (d_ff, d_model),
        f"{prefix}/ffn_output/bias": (d_model,),
    })
    return shapes


@pytest.mark.parametrize("encoder_width", [16, 12])
def test_decoder_layer_build_takes_the_encoder_output_shape(encoder_width):
    """`build(inputs_shape, encoder_output_shape)`, Keras' one-shape-per-input convention.

    The encoder output has another length than the decoder inputs (and, with
    `encoder_width=12`, another width): every sublayer is built, the
    cross-attention's keys and values for the encoder width, and a call then
    creates no further weights.
    """
    layer = kt.DecoderLayer(num_heads=2, key_dim=8, value_dim=4, d_ff=32, name="dec")
    layer.build((2, 3, 16), (2, 7, encoder_width))
    assert layer.built
    sublayers = [layer.self_attention, layer.self_attention_norm, layer.cross_attention,
                 layer.cross_attention_norm, layer.ffn_inner, layer.ffn_output,
                 layer.ffn_norm]
    assert all(sub.built for sub in sublayers)
    assert all(sub.built for sub in layer._flatten_layers())
    expected = decoder_layer_weight_shapes("dec", 16, encoder_width, 16, 8, 32)
    assert weight_shapes(layer) == expected
    assert layer.get_build_config() == {"shapes_dict": {
        "inputs_shape": (2, 3, 16), "encoder_output_shape": (2, 7, encoder_width)}}

    encoder_output = np.random.default_rng(1).normal(
        size=(2, 7, encoder_width)).astype("float32")
    outputs, scores = layer(Y, encoder_output, decoder_padding_mask=np.ones((2, 3), bool),
                            return_attention_scores=True)
    assert tuple(outputs.shape) == (2, 3, 16)
    assert tuple(scores["self_attention"].shape) == (2, 2, 3, 3)
    assert tuple(scores["cross_attention"].shape) == (2, 2, 3, 7)
    assert weight_shapes(layer) == expected

    # The same weights as building by a call, eager or symbolic.
    eager = kt.DecoderLayer(num_heads=2, key_dim=8, value_dim=4, d_ff=32, name="dec")
    eager(Y, encoder_output)
    assert weight_shapes(eager) == expected
    symbolic = kt.DecoderLayer(num_heads=2, key_dim=8, value_dim=4, d_ff=32, name="dec")
    y = symbolic(keras.Input((None, 16)), keras.Input((None, encoder_width)))
    assert tuple(y.shape) == (None, None, 16)
    assert weight_shapes(symbolic) == expected
    assert symbolic.compute_output_shape((2, 3, 16), (2, 7, encoder_width)) == (2, 3, 16)


def test_decoder_layer_build_without_encoder_shape_defaults_to_d_model():
    """With only `inputs_shape` (e.g. a build config saved before
    `encoder_output_shape` existed) the encoder output is taken to be d_model wide."""
    layer = kt.DecoderLayer(num_heads=2, key_dim=8, d_ff=32, name="dec")
    layer.build((None, None, 16))
    assert weight_shapes(layer) == decoder_layer_weight_shapes("dec", 16, 16, 16, 16, 32)
    assert tuple(layer(Y, X).shape) == (2, 3, 16)


def test_decoder_stack_build_takes_the_encoder_output_shape():
    decoder = kt.TransformerDecoder(num_layers=2, num_heads=2, key_dim=8, value_dim=4,
                                    d_ff=32, norm_first=True, name="decoder")
    decoder.build((2, 3, 16), (2, 7, 12))
    assert decoder.built and all(sub.built for sub in decoder._flatten_layers())
    shapes = weight_shapes(decoder)
    for i in range(2):
        expected = decoder_layer_weight_shapes(f"decoder/decoder_layer_{i}", 16, 12, 16, 8, 32)
        assert {k: v for k, v in shapes.items() if k in expected} == expected
    assert shapes["decoder/final_norm/gamma"] == (16,)
    outputs = decoder(Y, Z, encoder_padding_mask=np.ones((2, 7), bool))
    assert tuple(outputs.shape) == (2, 3, 16)
    assert weight_shapes(decoder) == shapes
    # Step-by-step decoding with a cross-attention cache from the wider encoder output.
    cross = decoder.compute_cross_attention_cache(Z)
    cache = decoder.init_self_attention_cache(2, 3)
    steps = []
    for t in range(3):
        x, cache = decoder(Y[:, t:t + 1], self_attention_cache=cache,
                           cross_attention_cache=cross, cache_update_index=t)
        steps.append(to_np(x))
    np.testing.assert_allclose(np.concatenate(steps, axis=1), to_np(outputs), atol=1e-5)
