import keras
import numpy as np
import pytest

import keras_transformer as kt
from keras_transformer import TransformerConfig, build_model
from layer_test_utils import to_np


def random_batch(config, batch=3, source_length=7, target_length=6, seed=0):
    rng = np.random.default_rng(seed)
    low = 4  # above the special ids
    source = rng.integers(low, config.vocab_size, (batch, source_length)).astype("int32")
    target = rng.integers(low, config.vocab_size, (batch, target_length)).astype("int32")
    target[:, 0] = config.bos_id
    return source, target


def logits_of(model, source, target):
    return to_np(model({"source_ids": source, "target_ids": target}, training=False))


def test_inputs_outputs_and_layer_names(tiny_config):
    model = build_model(tiny_config)
    assert sorted(model.input_names if hasattr(model, "input_names") else
                  [t.name for t in model.inputs]) == ["source_ids", "target_ids"]
    source, target = random_batch(tiny_config)
    logits = model({"source_ids": source, "target_ids": target})
    assert tuple(logits.shape) == (3, 6, tiny_config.vocab_size)
    assert keras.backend.standardize_dtype(logits.dtype) == "float32"
    names = [layer.name for layer in model.encoder.stack + model.decoder.stack]
    assert names == ["encoder_layer_0", "encoder_layer_1", "decoder_layer_0", "decoder_layer_1"]
    assert model.get_layer("shared_embedding") is model.source_embedding
    paths = {v.path for v in model.weights}
    assert "encoder/encoder_layer_0/self_attention/query/kernel" in paths
    assert "decoder/decoder_layer_1/cross_attention/attention_output/bias" in paths


@pytest.mark.parametrize("norm_first", [False, True])
def test_future_target_tokens_do_not_change_earlier_logits(tiny_config, norm_first):
    model = build_model(tiny_config, norm_first=norm_first)
    source, target = random_batch(tiny_config)
    reference = logits_of(model, source, target)
    for t in range(target.shape[1] - 1):
        changed = target.copy()
        changed[:, t + 1:] = np.random.default_rng(t).integers(4, tiny_config.vocab_size,
                                                                 changed[:, t + 1:].shape)
        logits = logits_of(model, source, changed)
        np.testing.assert_allclose(logits[:, :t + 1], reference[:, :t + 1], atol=1e-5)
        assert not np.allclose(logits[:, t + 1:], reference[:, t + 1:], atol=1e-3)


@pytest.mark.parametrize("position_embedding", ["sinusoidal", "learned"])
def test_appending_source_padding_leaves_logits_unchanged(tiny_config, position_embedding):
    model = build_model(tiny_config, position_embedding=position_embedding)
    source, target = random_batch(tiny_config)
    reference = logits_of(model, source, target)
    padded = np.concatenate([source, np.zeros((3, 5), "int32")], axis=1)
    np.testing.assert_allclose(logits_of(model, padded, target), reference, atol=1e-5)
    # Ragged batch: padding one sentence does not change another's logits...
    ragged = source.copy()
    ragged[0, 4:] = 0
    logits = logits_of(model, ragged, target)
    np.testing.assert_allclose(logits[1:], reference[1:], atol=1e-5)
    # ...and the padded sentence equals that sentence alone, unpadded.
    alone = logits_of(model, source[:1, :4], target[:1])
    np.testing.assert_allclose(logits[:1], alone, atol=1e-5)


def test_target_padding_leaves_real_positions_unchanged(tiny_config):
    model = build_model(tiny_config)
    source, target = random_batch(tiny_config)
    reference = logits_of(model, source, target)
    padded = np.concatenate([target, np.zeros((3, 4), "int32")], axis=1)
    np.testing.assert_allclose(logits_of(model, source, padded)[:, :6], reference, atol=1e-5)


# Parameter counts of the two Table 3 presets with V = 37,000, derived by hand.
# Each layer: multi-head attention has 4 projections with biases (h*d_k = h*d_v
# = d_model); the FFN is d_model*d_ff + d_ff + d_ff*d_model + d_model; each
# LayerNorm has gamma and beta (2*d_model). An encoder layer has 1 attention,
# the FFN and 2 LayerNorms; a decoder layer 2 attentions, the FFN and 3
# LayerNorms. One shared embedding matrix (source = target = pre-softmax, no
# output bias) of V*d_model.
#
# base: N=6, d_model=512, h=8, d_k=d_v=64, d_ff=2048
#   embedding       37000 * 512                                 = 18,944,000
#   attention       4 * (512*512 + 512)                          =  1,050,624
#   FFN             512*2048 + 2048 + 2048*512 + 512             =  2,099,712
#   encoder layer   1,050,624 + 2,099,712 + 2 * 1,024            =  3,152,384
#   decoder layer   2 * 1,050,624 + 2,099,712 + 3 * 1,024        =  4,204,032
#   total           18,944,000 + 6 * (3,152,384 + 4,204,032)     = 63,082,496
# The paper quotes 65M; the gap is its vocabulary/bookkeeping, not structure.
#
# big: N=6, d_model=1024, h=16, d_k=d_v=64, d_ff=4096
#   embedding       37000 * 1024                                 =  37,888,000
#   attention       4 * (1024*1024 + 1024)                       =   4,198,400
#   FFN             1024*4096 + 4096 + 4096*1024 + 1024          =   8,393,728
#   encoder layer   4,198,400 + 8,393,728 + 2 * 2,048            =  12,596,224
#   decoder layer   2 * 4,198,400 + 8,393,728 + 3 * 2,048        =  16,796,672
#   total           37,888,000 + 6 * (12,596,224 + 16,796,672)   = 214,245,376
# The paper quotes 213M.
@pytest.mark.parametrize("preset, expected", [("base", 63_082_496), ("big", 214_245_376)])
def test_preset_parameter_count_matches_derivation(preset, expected):
    model = build_model(preset=preset, vocab_size=37000)
    assert model.count_params() == expected
    assert TransformerConfig.preset(preset, vocab_size=37000).num_parameters() == expected
    del model
    keras.backend.clear_session()


@pytest.mark.parametrize(
    "overrides",
    [dict(share_embeddings=False), dict(tie_output_embeddings=False),
     dict(position_embedding="learned"), dict(norm_first=True),
     dict(num_heads=2, key_dim=8, value_dim=12)],
)
def test_parameter_count_of_variants(tiny_config, overrides):
    config = tiny_config.replace(**overrides)
    assert build_model(config).count_params() == config.num_parameters()


def test_save_and_load_keras_file_gives_identical_outputs(tiny_config, tmp_path):
    model = build_model(tiny_config.replace(dropout=0.1))
    source, target = random_batch(tiny_config)
    expected = logits_of(model, source, target)
    path = tmp_path / "model.keras"
    model.save(path)
    restored = keras.saving.load_model(path, safe_mode=True)
    assert isinstance(restored, kt.Transformer)
    assert restored.config == model.config
    np.testing.assert_array_equal(logits_of(restored, source, target), expected)


def test_compiled_model_saves_and_loads(tiny_config, tmp_path):
    model = kt.compile_model(build_model(tiny_config))
    source, target = random_batch(tiny_config)
    model.fit({"source_ids": source, "target_ids": target}, target, epochs=1, verbose=0)
    path = tmp_path / "compiled.keras"
    model.save(path)
    restored = keras.saving.load_model(path)
    assert isinstance(restored.loss, kt.LabelSmoothedCrossEntropy)
    np.testing.assert_array_equal(logits_of(restored, source, target),
                                  logits_of(model, source, target))


def test_dropout_only_in_training(tiny_config):
    model = build_model(tiny_config.replace(dropout=0.3))
    source, target = random_batch(tiny_config)
    inputs = {"source_ids": source, "target_ids": target}
    np.testing.assert_array_equal(to_np(model(inputs)), to_np(model(inputs)))
    assert not np.allclose(to_np(model(inputs, training=True)), to_np(model(inputs)))


def test_mixed_precision_logits_are_float32(tiny_config):
    keras.mixed_precision.set_global_policy("mixed_float16")
    try:
        model = build_model(tiny_config)
        source, target = random_batch(tiny_config)
        logits = model({"source_ids": source, "target_ids": target})
        assert keras.backend.standardize_dtype(logits.dtype) == "float32"
        assert keras.backend.standardize_dtype(model.encoder.compute_dtype) == "float16"
        assert np.all(np.isfinite(to_np(logits)))
    finally:
        keras.mixed_precision.set_global_policy("float32")


def test_cached_decoder_equals_full_decoder(tiny_config):
    """The step-by-step cached decoder reproduces the teacher-forced logits."""
    model = build_model(tiny_config)
    source, target = random_batch(tiny_config)
    source[0, 5:] = 0
    expected = logits_of(model, source, target)
    source_mask = source != 0
    encoder_output = model.encoder(model.source_embedding(source), padding_mask=source_mask)
    cross = model.decoder.compute_cross_attention_cache(encoder_output)
    cache = model.decoder.init_self_attention_cache(3, 10)
    steps = []
    for t in range(target.shape[1]):
        x, cache = model.decoder(
            model.target_embedding(target[:, t:t + 1]), encoder_padding_mask=source_mask,
            self_attention_cache=cache, cross_attention_cache=cross, cache_update_index=t)
        steps.append(to_np(model.project(x)))
    np.testing.assert_allclose(np.concatenate(steps, axis=1), expected, atol=1e-5)


def test_build_model_arguments(tiny_config):
    assert build_model(preset="tiny", vocab_size=123).config.vocab_size == 123
    assert build_model(tiny_config, num_layers=1).config.num_layers == 1
    with pytest.raises(ValueError, match="Unknown preset"):
        build_model(preset="medium")
    with pytest.raises(TypeError, match="TransformerConfig"):
        kt.Transformer(config=42)


def test_attention_scores_are_available_for_plots(tiny_config):
    model = build_model(tiny_config)
    source, target = random_batch(tiny_config)
    _, encoder_scores = model.encoder(model.source_embedding(source),
                                      padding_mask=source != 0, return_attention_scores=True)
    assert len(encoder_scores) == 2 and tuple(encoder_scores[0].shape) == (3, 4, 7, 7)
