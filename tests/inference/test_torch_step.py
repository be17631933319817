"""The plain-PyTorch decoder step against the Keras step it replaces (torch backend).

The reference is the Keras layers' own cached step (`make_step_fn(...,
plain_torch=False)`): both are run on the same tokens and caches, step by
step, and must give the same log-probabilities and caches (float32 to
rounding; Keras' int8 layers to the rounding of their int8 activations). The
searches built on the plain step are checked against the uncached Keras
decoder by `tests/inference/test_decoding.py`, which under the torch backend now runs
the plain step for its cached searches.
"""

import keras
import numpy as np
import pytest

from keras_transformer.inference import decoding, steps
from keras_transformer.model.transformer import build_model, quantized

torch_only = pytest.mark.skipif(keras.backend.backend() != "torch",
                                reason="the plain step is the torch backend's")

VOCAB, STEPS = 300, 12


def _model(**overrides):
    keras.utils.set_random_seed(5)
    return build_model(preset="tiny", vocab_size=VOCAB, dropout=0.0, **overrides)


def _sources():
    rng = np.random.default_rng(0)
    source = rng.integers(4, VOCAB, (3, 9)).astype("int32")
    source[:, -1] = 2
    source[1, 4], source[1, 5:] = 2, 0  # a padded row
    source[2, :] = 0  # an all-pad row (Translator pads batches with them)
    return source


def _run_steps(model, plain, beam_size=2):
    """Log-probs `(STEPS, N, V)` and the final caches of one step function."""
    import torch

    source = _sources()
    next_fn, cache = steps.make_step_fn(model, source, buffer_length=STEPS,
                                        beam_size=beam_size, plain_torch=plain)
    rows = source.shape[0] * beam_size
    tokens = np.ones((rows, STEPS + 1), "int32")
    tokens[:, 1:] = np.random.default_rng(1).integers(3, VOCAB, (rows, STEPS))
    tokens = torch.as_tensor(tokens)
    log_probs = []
    with torch.no_grad():
        for index in range(STEPS):
            step_log_probs, cache = next_fn(tokens, cache, torch.tensor(index))
            log_probs.append(keras.ops.convert_to_numpy(step_log_probs))
    caches = [[keras.ops.convert_to_numpy(t) for t in layer] for layer in cache]
    return np.stack(log_probs), caches


def _clone(cache):
    return [[t.clone() for t in layer] for layer in cache]


def _teacher_forced_steps(model, beam_size=2):
    """Log-probs `(STEPS, N, V)` of the Keras and the plain step, each step from the same cache.

    The plain step starts every step from a copy of the Keras step's cache, so
    a difference in one step (an int8 activation that rounding moves across a
    .5 boundary) stays in that step instead of following the row's cache.
    """
    import torch

    source = _sources()
    keras_fn, cache = steps.make_step_fn(model, source, buffer_length=STEPS,
                                         beam_size=beam_size, plain_torch=False)
    plain_fn, _ = steps.make_step_fn(model, source, buffer_length=STEPS,
                                     beam_size=beam_size, plain_torch=True)
    rows = source.shape[0] * beam_size
    tokens = np.ones((rows, STEPS + 1), "int32")
    tokens[:, 1:] = np.random.default_rng(1).integers(3, VOCAB, (rows, STEPS))
    tokens = torch.as_tensor(tokens)
    reference, plain = [], []
    with torch.no_grad():
        for index in range(STEPS):
            plain_log_probs, _ = plain_fn(tokens, _clone(cache), torch.tensor(index))
            log_probs, cache = keras_fn(tokens, _clone(cache), torch.tensor(index))
            reference.append(keras.ops.convert_to_numpy(log_probs))
            plain.append(keras.ops.convert_to_numpy(plain_log_probs))
    return np.stack(reference), np.stack(plain)


@torch_only
@pytest.mark.parametrize("overrides", [
    {},
    {"norm_first": True},
    {"position_embedding": "learned", "share_embeddings": False,
     "tie_output_embeddings": False, "key_dim": 16, "value_dim": 48},
], ids=["post-norm", "pre-norm", "learned-untied-dv"])
def test_plain_step_equals_the_keras_step(overrides):
    from keras_transformer.inference import torch_step

    model = _model(**overrides)
    assert torch_step.supports(model) == (True, "")
    reference, reference_cache = _run_steps(model, plain=False)
    plain, plain_cache = _run_steps(model, plain=True)
    assert np.all(np.isfinite(plain))  # the all-pad row too
    np.testing.assert_allclose(plain, reference, atol=2e-5)
    for got, expected in zip(plain_cache, reference_cache):
        for a, b in zip(got, expected):
            np.testing.assert_allclose(a, b, atol=2e-5)


@torch_only
@pytest.mark.parametrize("exact_int_mm", [None, False], ids=["probed", "float32-products"])
@pytest.mark.parametrize("overrides", [{}, {"norm_first": True}], ids=["post", "pre"])
def test_plain_step_with_int8_weights_follows_keras_int8(overrides, exact_int_mm):
    from keras_transformer.inference import torch_step

    torch_step._INT_MM_EXACT = exact_int_mm  # None: probe this CPU
    try:
        model8 = quantized(_model(**overrides), "int8")
        reference, plain = _teacher_forced_steps(model8)
    finally:
        torch_step._INT_MM_EXACT = None
    difference = np.abs(plain - reference)
    # The same int8 arithmetic; an activation that float32 rounding (other
    # kernels on another CPU) moves across a .5 boundary changes by one int8
    # step, so a few values of that step differ.
    assert np.mean(difference < 1e-4) > 0.95, np.mean(difference < 1e-4)
    # And it is int8, not float32: the float32 model's log-probs differ far
    # more (and a saturating int8 product far more still).
    float32 = _teacher_forced_steps(_model(**overrides))[0]
    gap = np.abs(float32 - reference).mean()
    assert difference.mean() < 0.05 * gap, (difference.mean(), gap)


@torch_only
def test_models_the_plain_step_does_not_know_keep_the_keras_step():
    from keras_transformer.inference import torch_step

    keras.config.set_dtype_policy("mixed_bfloat16")
    try:
        model = _model()
    finally:
        keras.config.set_dtype_policy("float32")
    ok, reason = torch_step.supports(model)
    assert not ok and "mixed_bfloat16" in reason
    with pytest.raises(ValueError, match="cannot decode this model: dtype policy"):
        torch_step.make_step_fn(model, _sources(), buffer_length=4)
    # decoding still works, through the Keras layers.
    tokens = decoding.greedy_decode(model, _sources(), max_extra_length=2)
    assert keras.ops.convert_to_numpy(tokens).shape == (3, 11)


def test_other_backends_are_not_supported():
    from keras_transformer.inference import torch_step

    ok, reason = torch_step.supports(_model())
    assert ok == (keras.backend.backend() == "torch")
    if not ok:
        assert reason == "not the torch backend"
