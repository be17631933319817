import dataclasses

import pytest

from keras_transformer import TransformerConfig


def test_base_and_big_presets_match_table_3():
    base = TransformerConfig.preset("base")
    assert (base.num_layers, base.d_model, base.d_ff, base.num_heads) == (6, 512, 2048, 8)
    assert (base.key_dim, base.value_dim) == (64, 64)
    assert (base.dropout, base.label_smoothing, base.warmup_steps) == (0.1, 0.1, 4000)
    assert base.share_embeddings and base.tie_output_embeddings
    assert base.position_embedding == "sinusoidal" and not base.norm_first
    big = TransformerConfig.preset("big")
    assert (big.num_layers, big.d_model, big.d_ff, big.num_heads) == (6, 1024, 4096, 16)
    assert (big.key_dim, big.value_dim, big.dropout) == (64, 64, 0.3)


# Table 3 rows, built for real with a 1,000-token vocabulary (V=1000) to keep
# the embedding small. Expected parameter counts are written out by hand from
# the paper's layer structure, independently of `TransformerConfig.num_parameters`:
#   attention = 2 * (d * h*d_k + h*d_k)  [Q, K]  + (d * h*d_v + h*d_v)  [V]
#               + (h*d_v * d + d)  [output projection]
#   FFN = d*d_ff + d_ff + d_ff*d + d;  LayerNorm = 2*d
#   encoder layer = attention + FFN + 2 LayerNorm
#   decoder layer = 2 attention + FFN + 3 LayerNorm
#   total = V*d (one shared, tied embedding) + N * (encoder + decoder layer)
# Base (N=6, d=512, d_ff=2048, h*d_k = h*d_v = 512):
#   attention 1,050,624; FFN 2,099,712; encoder 3,152,384; decoder 4,204,032;
#   total 512,000 + 6 * 7,356,416 = 44,650,496.
TABLE_3_VOCAB = 1000
TABLE_3_ROWS = [
    # (overrides, (h, d_k, d_v), expected count_params())
    # Row (A): h * d_k = 512 throughout, so the count equals the base model's.
    pytest.param(dict(num_heads=1, key_dim=512, value_dim=512), (1, 512, 512),
                 44_650_496, id="A-1x512"),
    pytest.param(dict(num_heads=4, key_dim=128, value_dim=128), (4, 128, 128),
                 44_650_496, id="A-4x128"),
    pytest.param(dict(num_heads=16, key_dim=32, value_dim=32), (16, 32, 32),
                 44_650_496, id="A-16x32"),
    pytest.param(dict(num_heads=32, key_dim=16, value_dim=16), (32, 16, 16),
                 44_650_496, id="A-32x16"),
    # Row (B): d_k = 16, d_v stays 64. Q, K: 2 * (512*128 + 128) = 131,328;
    # V and output: 2 * (512*512 + 512) = 525,312; attention 656,640;
    # encoder 2,758,400; decoder 3,416,064; 512,000 + 6 * 6,174,464.
    pytest.param(dict(key_dim=16, value_dim=64), (8, 16, 64), 37_558_784, id="B-dk16"),
    # Row (B): d_k = 32. Q, K: 2 * (512*256 + 256) = 262,656; attention
    # 787,968; encoder 2,889,728; decoder 3,678,720; 512,000 + 6 * 6,568,448.
    pytest.param(dict(key_dim=32, value_dim=64), (8, 32, 64), 39_922_688, id="B-dk32"),
    # Row (C): N = 2. 512,000 + 2 * 7,356,416.
    pytest.param(dict(num_layers=2), (8, 64, 64), 15_224_832, id="C-N2"),
    # Row (C): d_model = 256, d_k = d_v = 32. Attention 4 * (256*256 + 256)
    # = 263,168; FFN 256*2048 + 2048 + 2048*256 + 256 = 1,050,880; encoder
    # 1,315,072; decoder 1,578,752; 256,000 + 6 * 2,893,824.
    pytest.param(dict(d_model=256, key_dim=32, value_dim=32), (8, 32, 32), 17_618_944,
                 id="C-d256"),
    # Row (C): d_ff = 1024. FFN 512*1024 + 1024 + 1024*512 + 512 = 1,050,112;
    # encoder 2,102,784; decoder 3,154,432; 512,000 + 6 * 5,257,216.
    pytest.param(dict(d_ff=1024), (8, 64, 64), 32_055_296, id="C-dff1024"),
]


def _weight_shapes(model):
    return {v.path: tuple(v.shape) for v in model.weights}


# Shapes and parameter counts come from the layers' own code, the same under
# every backend: the builds run under the first backend only.
@pytest.mark.backend_independent
@pytest.mark.parametrize("overrides, heads_and_dims, expected_count", TABLE_3_ROWS)
def test_table_3_rows_build_the_described_model(overrides, heads_and_dims, expected_count):
    import keras
    import numpy as np

    import keras_transformer

    config = TransformerConfig.preset("base", vocab_size=TABLE_3_VOCAB, **overrides)
    model = keras_transformer.build_model(config)
    h, d_k, d_v = heads_and_dims
    d = overrides.get("d_model", 512)
    d_ff = overrides.get("d_ff", 2048)
    shapes = _weight_shapes(model)
    prefix = "encoder/encoder_layer_0/self_attention/"
    assert shapes[prefix + "query/kernel"] == (d, h * d_k)
    assert shapes[prefix + "key/kernel"] == (d, h * d_k)
    assert shapes[prefix + "value/kernel"] == (d, h * d_v)
    assert shapes[prefix + "attention_output/kernel"] == (h * d_v, d)
    assert shapes["encoder/encoder_layer_0/ffn_inner/kernel"] == (d, d_ff)
    assert shapes["shared_embedding/embeddings"] == (TABLE_3_VOCAB, d)
    num_layers = overrides.get("num_layers", 6)
    assert len(model.encoder.stack) == len(model.decoder.stack) == num_layers
    # The heads are real: the attention computes h weight maps and splits the
    # projections into h slices of d_k (queries/keys) and d_v (values).
    attention = model.encoder.stack[0].self_attention
    x = np.random.default_rng(0).normal(size=(1, 5, d)).astype("float32")
    _, scores = attention(x, return_attention_scores=True)
    assert tuple(scores.shape) == (1, h, 5, 5)
    keys, values = attention.compute_key_value(x)
    assert tuple(keys.shape) == (1, h, 5, d_k) and tuple(values.shape) == (1, h, 5, d_v)
    assert model.count_params() == expected_count
    del model
    keras.backend.clear_session()


def test_table_3_row_d_dropout_and_label_smoothing_reach_the_model():
    """Row (D): P_drop and epsilon_ls end up in the built layers and the compiled loss."""
    import keras
    import numpy as np

    import keras_transformer
    from keras_transformer.training.optimization import compile_model

    for dropout, smoothing in ((0.0, 0.2), (0.2, 0.0)):
        config = TransformerConfig.preset(
            "base", vocab_size=50, num_layers=1, d_model=32, num_heads=4, d_ff=64,
            dropout=dropout, label_smoothing=smoothing)
        model = compile_model(keras_transformer.build_model(config))
        rates = [model.encoder.embedding_dropout.rate, model.decoder.embedding_dropout.rate]
        rates += [layer.residual_dropout.rate
                  for layer in model.encoder.stack + model.decoder.stack]
        assert rates == [dropout] * 4
        assert model.loss.label_smoothing == smoothing
        # With P_drop = 0, training and inference outputs agree; otherwise not.
        rng = np.random.default_rng(0)
        inputs = {"source_ids": rng.integers(4, 50, (2, 7)).astype("int32"),
                  "target_ids": rng.integers(4, 50, (2, 6)).astype("int32")}
        train = keras.ops.convert_to_numpy(model(inputs, training=True))
        infer = keras.ops.convert_to_numpy(model(inputs, training=False))
        assert np.allclose(train, infer, atol=1e-6) == (dropout == 0.0)


@pytest.mark.backend_independent
def test_table_3_row_e_learned_positions_add_two_trainable_tables():
    """Row (E): each stack gets a trainable (max_length, d_model) position table.

    Learned tables add 2 * max_length * d_model = 2 * 256 * 512 = 262,144
    parameters to the base model: 44,650,496 + 262,144 = 44,912,640 for V=1000.
    """
    import keras_transformer

    sinusoidal = keras_transformer.build_model(
        TransformerConfig.preset("base", vocab_size=TABLE_3_VOCAB))
    assert sinusoidal.count_params() == 44_650_496
    assert not [v for v in sinusoidal.weights if "position" in v.path]
    del sinusoidal
    learned = keras_transformer.build_model(
        TransformerConfig.preset("base", vocab_size=TABLE_3_VOCAB,
                                 position_embedding="learned"))
    assert learned.count_params() == 44_912_640
    tables = {v.path: tuple(v.shape) for v in learned.trainable_weights
              if "position" in v.path}
    assert tables == {
        "encoder/positional_encoding/position_embeddings": (256, 512),
        "decoder/positional_encoding/position_embeddings": (256, 512),
    }


def test_bad_values_name_the_problem():
    with pytest.raises(ValueError, match="Unknown preset 'huge'"):
        TransformerConfig.preset("huge")
    with pytest.raises(ValueError, match="num_hedas"):
        TransformerConfig.preset("base", num_hedas=4)
    with pytest.raises(ValueError, match="divisible"):
        TransformerConfig(d_model=100, num_heads=8)
    with pytest.raises(ValueError, match="dropout"):
        TransformerConfig(dropout=1.5)
    with pytest.raises(ValueError, match="position_embedding"):
        TransformerConfig(position_embedding="rotary")
    with pytest.raises(ValueError, match="pad_id must be 0"):
        TransformerConfig(pad_id=5)
    with pytest.raises(ValueError, match="distinct"):
        TransformerConfig(bos_id=2, eos_id=2)


def test_config_is_frozen_and_round_trips():
    config = TransformerConfig.preset("small")
    with pytest.raises(dataclasses.FrozenInstanceError):
        config.d_model = 3
    assert TransformerConfig.from_dict(config.to_dict()) == config
    wider = config.replace(d_model=512)
    assert (wider.d_model, wider.key_dim) == (512, 128)


def test_to_dict_has_exactly_the_init_fields_with_resolved_dims():
    config = TransformerConfig.preset("base")
    values = config.to_dict()
    assert list(values) == [f.name for f in dataclasses.fields(TransformerConfig)]
    assert not any(name.startswith("_") for name in values)
    assert dataclasses.asdict(config) == values
    assert (values["key_dim"], values["value_dim"]) == (64, 64)
    assert TransformerConfig.from_dict(values) == config
    assert hash(TransformerConfig.from_dict(values)) == hash(config)
    assert "_derived" not in repr(config)
    # How key_dim was obtained survives copying and pickling.
    import copy
    import pickle

    for clone in (copy.deepcopy(config), pickle.loads(pickle.dumps(config))):
        assert clone == config and clone.replace(d_model=1024).key_dim == 128


def test_replace_keeps_explicit_dims_and_rederives_derived_ones():
    # key_dim=64 given explicitly equals d_model // h; it must not follow d_model.
    explicit = TransformerConfig.preset("base", key_dim=64).replace(d_model=1024)
    assert (explicit.d_model, explicit.key_dim, explicit.value_dim) == (1024, 64, 64)
    both = TransformerConfig.preset("base", key_dim=64, value_dim=64).replace(num_heads=4)
    assert (both.key_dim, both.value_dim) == (64, 64)
    derived = TransformerConfig.preset("base").replace(d_model=1024)
    assert (derived.key_dim, derived.value_dim) == (128, 128)
    # An explicit value_dim stays; the derived key_dim follows num_heads.
    mixed = TransformerConfig.preset("base", value_dim=32).replace(num_heads=4)
    assert (mixed.num_heads, mixed.key_dim, mixed.value_dim) == (4, 128, 32)
    # A derived value_dim follows a changed key_dim.
    assert TransformerConfig.preset("base").replace(key_dim=32).value_dim == 32
    # Chained replaces remember what was derived.
    chained = TransformerConfig.preset("base").replace(dropout=0.2).replace(d_model=256)
    assert (chained.key_dim, chained.value_dim, chained.dropout) == (32, 32, 0.2)
    # Equality and hashing ignore how a value was obtained.
    assert TransformerConfig.preset("base", key_dim=64) == TransformerConfig.preset("base")
    assert len({TransformerConfig.preset("base", key_dim=64),
                TransformerConfig.preset("base")}) == 1
    with pytest.raises(ValueError, match="_derived"):
        TransformerConfig.preset("base").replace(_derived=frozenset())
    with pytest.raises(ValueError, match="_derived"):
        TransformerConfig.preset("base", _derived=frozenset())
