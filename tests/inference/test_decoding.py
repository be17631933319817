"""Greedy and beam search of a model: cached == uncached == the teacher-forced model,
length limits, batch independence, the cache growing, one graph for every shape.
The searches themselves, on scripted distributions: `test_search.py`."""

import math

import keras
import numpy as np
import pytest
from keras import ops

from conftest import backend
from keras_transformer.model.config import TransformerConfig, length_penalty
from keras_transformer.inference.decoding import beam_search, greedy_decode, output_length_limits
from keras_transformer.inference.steps import cache_lengths
from keras_transformer.model.transformer import build_model
from layer_test_utils import to_np

PAD, BOS, EOS = 0, 1, 2
EXTRA = 4  # max_extra_length of the model tests
SOURCE_LENGTHS = [9, 6, 2, 7]  # non-pad ids per row, EOS included


# --- a small random model whose weights do not depend on the backend -----------------


@pytest.fixture(scope="module")
def model():
    config = TransformerConfig.preset(
        "tiny", vocab_size=50, num_layers=2, d_model=32, num_heads=4, d_ff=64,
        dropout=0.0, max_length=64, tie_output_embeddings=False)
    model = build_model(config)
    rng = np.random.default_rng(0)
    for variable in model.weights:
        shape = tuple(variable.shape)
        if len(shape) >= 2:
            scale = (1.0 if "embedding" in variable.path else 1.5) / math.sqrt(shape[0])
            variable.assign(rng.normal(0.0, scale, shape).astype("float32"))
    bias = np.zeros(config.vocab_size, "float32")
    bias[EOS] = 1.0  # some hypotheses end with EOS, others at the length limit
    model.output_projection.bias.assign(bias)
    return model


def make_sources(lengths=SOURCE_LENGTHS, width=None, seed=0):
    rng = np.random.default_rng(seed)
    width = width or max(lengths)
    source = rng.integers(4, 50, (len(lengths), width)).astype("int32")
    for row, length in enumerate(lengths):
        source[row, length - 1] = EOS
        source[row, length:] = PAD
    return source


def teacher_forced_log_probs(model, source, tokens):
    """Log-probabilities of `tokens` under one full (uncached) model call."""
    decoder_input = np.concatenate([np.full((len(tokens), 1), BOS, "int32"), tokens[:, :-1]], 1)
    decoder_input = np.where(decoder_input == PAD, BOS, decoder_input)  # any real id
    logits = to_np(model({"source_ids": source, "target_ids": decoder_input}))
    logits = logits.astype("float64")
    log_probs = logits - np.log(np.exp(logits - logits.max(-1, keepdims=True)).sum(
        -1, keepdims=True)) - logits.max(-1, keepdims=True)
    return log_probs  # (B, L, V)


def output_lengths(tokens):
    """Generated length of each row: up to and including EOS, else up to padding."""
    lengths = []
    for row in tokens:
        row = list(row)
        lengths.append(row.index(EOS) + 1 if EOS in row else sum(t != PAD for t in row))
    return np.array(lengths)


@pytest.fixture(scope="module")
def greedy_results(model):
    source = make_sources()
    results = {}
    for use_cache in (True, False):
        tokens, steps = greedy_decode(model, source, max_extra_length=EXTRA,
                                      use_cache=use_cache, return_step_log_probs=True)
        results[use_cache] = (to_np(tokens), to_np(steps))
    return source, results


@pytest.fixture(scope="module")
def beam_results(model):
    source = make_sources()
    results = {}
    for use_cache in (True, False):
        outputs = beam_search(model, source, beam_size=3, alpha=0.6, max_extra_length=EXTRA,
                              use_cache=use_cache, return_all_beams=True,
                              return_step_log_probs=True)
        results[use_cache] = tuple(to_np(x) for x in outputs)
    return source, results


# --- the model paths -----------------------------------------------------------------


def test_greedy_cached_equals_uncached_and_the_full_model(model, greedy_results):
    source, results = greedy_results
    tokens, steps = results[True]
    np.testing.assert_array_equal(tokens, results[False][0])
    np.testing.assert_allclose(steps, results[False][1], atol=1e-5)
    # Independent reference: the functional model on the chosen tokens.
    reference = teacher_forced_log_probs(model, source, tokens)
    lengths = output_lengths(tokens)
    for row, length in enumerate(lengths):
        for t in range(length):
            assert tokens[row, t] == np.argmax(reference[row, t])
            np.testing.assert_allclose(steps[row, t], reference[row, t, tokens[row, t]],
                                       atol=1e-5)
        assert np.all(steps[row, length:] == 0.0)


def test_beam_cached_equals_uncached_and_scores_follow_the_formula(model, beam_results):
    source, results = beam_results
    tokens, scores, steps = results[True]
    assert tokens.shape == (4, 3, 9 + EXTRA) and scores.shape == (4, 3)
    np.testing.assert_array_equal(tokens, results[False][0])
    np.testing.assert_allclose(scores, results[False][1], atol=1e-5)
    np.testing.assert_allclose(steps, results[False][2], atol=1e-5)
    assert np.all(np.diff(scores, axis=1) <= 1e-6), "beams are sorted best first"
    for beam in range(3):
        reference = teacher_forced_log_probs(model, source, tokens[:, beam])
        lengths = output_lengths(tokens[:, beam])
        for row, length in enumerate(lengths):
            expected = [reference[row, t, tokens[row, beam, t]] for t in range(length)]
            np.testing.assert_allclose(steps[row, beam, :length], expected, atol=1e-5)
            np.testing.assert_allclose(
                scores[row, beam], sum(expected) / ((5 + length) / 6) ** 0.6, atol=1e-5)


def test_outputs_respect_length_limits_and_end_at_eos(greedy_results, beam_results):
    source, greedy = greedy_results
    _, beam = beam_results
    limits = np.array(SOURCE_LENGTHS) + EXTRA
    ended_by_eos = 0
    for tokens in [greedy[True][0]] + [beam[True][0][:, k] for k in range(3)]:
        lengths = output_lengths(tokens)
        assert np.all(lengths <= limits)
        for row, length in enumerate(lengths):
            assert np.all(tokens[row, length:] == PAD), "nothing follows EOS"
            assert PAD not in tokens[row, :length] and BOS not in tokens[row, :length]
            if tokens[row, length - 1] == EOS:
                ended_by_eos += 1
                assert EOS not in tokens[row, :length - 1]
            else:
                assert length == limits[row], "without EOS a hypothesis runs to the limit"
    assert ended_by_eos > 0, "the fixture should produce some EOS endings"


def test_beam_size_one_without_penalty_is_greedy(model, greedy_results):
    source, results = greedy_results
    greedy_tokens, greedy_steps = results[True]
    tokens, scores = beam_search(model, source, beam_size=1, alpha=0.0,
                                 max_extra_length=EXTRA)
    np.testing.assert_array_equal(to_np(tokens), greedy_tokens)
    np.testing.assert_allclose(to_np(scores), greedy_steps.sum(1), atol=1e-5)


def test_translation_does_not_depend_on_the_rest_of_the_batch(model, greedy_results,
                                                              beam_results):
    source, greedy = greedy_results
    _, beam = beam_results
    # Other companions and order, plus an all-pad row (which stays empty).
    permutation = [2, 0, 3, 1]
    other = np.concatenate([source[permutation], make_sources([5], width=9, seed=7),
                            np.zeros((1, 9), "int32")])
    tokens = to_np(greedy_decode(model, other, max_extra_length=EXTRA))
    np.testing.assert_array_equal(tokens[:4], greedy[True][0][permutation])
    assert np.all(tokens[5] == PAD)
    beams, scores = beam_search(model, other, beam_size=3, alpha=0.6,
                                max_extra_length=EXTRA, return_all_beams=True)
    np.testing.assert_array_equal(to_np(beams)[:4], beam[True][0][permutation])
    np.testing.assert_allclose(to_np(scores)[:4], beam[True][1][permutation], atol=1e-5)
    assert np.all(to_np(beams)[5] == PAD)
    # Alone in its batch.
    for row in (0, 2):
        alone = to_np(greedy_decode(model, source[row:row + 1], max_extra_length=EXTRA))
        np.testing.assert_array_equal(alone[0], greedy[True][0][row])


def test_min_length_forces_the_output_length(model):
    source = make_sources([5, 3])
    limit = 5 + EXTRA
    tokens = to_np(greedy_decode(model, source, max_extra_length=EXTRA, min_length=limit))
    lengths = output_lengths(tokens)
    assert lengths[0] == limit and lengths[1] == 3 + EXTRA
    assert EOS not in tokens[0, :limit - 1]


def test_cache_lengths_double_up_to_the_buffer():
    assert cache_lengths(84) == (16, 32, 64, 84)
    assert cache_lengths(16) == (16,) and cache_lengths(5) == (5,)
    assert cache_lengths(40, first=8) == (8, 16, 32, 40)


def test_outputs_longer_than_the_first_cache_segments_equal_the_uncached_search(model):
    """Outputs of 40 tokens cross the cache growths at 16 and 32 steps."""
    source = make_sources([6, 4])
    extra = 40 - 4  # the shorter row's limit is 40 tokens; the longer one's 42
    cached = to_np(greedy_decode(model, source, max_extra_length=extra, min_length=40))
    uncached = to_np(greedy_decode(model, source, max_extra_length=extra, min_length=40,
                                   use_cache=False))
    assert output_lengths(cached).min() >= 40
    np.testing.assert_array_equal(cached, uncached)
    (tokens, scores), (ref_tokens, ref_scores) = (
        [to_np(t) for t in beam_search(model, source, beam_size=3, max_extra_length=extra,
                                       min_length=40, use_cache=use_cache)]
        for use_cache in (True, False))
    np.testing.assert_array_equal(tokens, ref_tokens)
    np.testing.assert_allclose(scores, ref_scores, atol=1e-4)


@pytest.mark.skipif(backend() != "tensorflow", reason="dynamic shapes: TensorFlow graphs only")
def test_one_graph_of_dynamic_shape_equals_the_uncached_search_at_every_shape(model):
    """What the SavedModel traces: one search for any batch size and width, whose cache
    grows inside its loop (here across 16 and 32 steps, forced by min_length)."""
    import tensorflow as tf

    from keras_transformer.model.config import DecodingOptions
    from keras_transformer.inference.decoding import decode

    spec = [tf.TensorSpec([None, None], tf.int32)]
    for options in (DecodingOptions(beam_size=1, max_extra_length=36, min_length=40),
                    DecodingOptions(beam_size=3, alpha=0.6, max_extra_length=36,
                                    min_length=40)):
        search = tf.function(lambda x, o=options: decode(model, x, o, jit_compile=False),
                             input_signature=spec, autograph=False)
        graph = search.get_concrete_function().graph.as_graph_def()
        for source in (make_sources([6, 4]), make_sources([8, 5, 7], seed=1)):
            tokens, scores = (to_np(t) for t in search(tf.constant(source)))
            assert output_lengths(tokens).min() >= 40
            if options.greedy:
                reference = to_np(greedy_decode(model, source, max_extra_length=36,
                                                min_length=40, use_cache=False))
            else:
                reference = to_np(beam_search(model, source, beam_size=3, alpha=0.6,
                                              max_extra_length=36, min_length=40,
                                              use_cache=False)[0])
            np.testing.assert_array_equal(tokens, reference)
        # One trace served both shapes, with one search loop (no loop per cache size).
        assert len(search._list_all_concrete_functions()) == 1
        loops = [n for f in graph.library.function for n in f.node_def
                 if n.op in ("While", "StatelessWhile")]
        loops += [n for n in graph.node if n.op in ("While", "StatelessWhile")]
        assert len(loops) == 1


def test_output_length_limits():
    config = TransformerConfig.preset("tiny", vocab_size=50, max_length=10,
                                      position_embedding="learned")
    source = make_sources([8, 3, 1], width=8)
    source[2] = PAD
    limits, buffer_length = output_length_limits(ops.convert_to_tensor(source), config, 5)
    assert buffer_length == 10  # 8 + 5, capped by the learned position table
    np.testing.assert_array_equal(to_np(limits), [10, 8, 0])
    limits, buffer_length = output_length_limits(ops.convert_to_tensor(source),
                                                 config.replace(position_embedding="sinusoidal"), 5)
    assert buffer_length == 13
    np.testing.assert_array_equal(to_np(limits), [13, 8, 0])
    with pytest.raises(ValueError, match="max_extra_length"):
        output_length_limits(ops.convert_to_tensor(source), config, -1)


def test_length_penalty_values():
    # One definition (keras_transformer.model.config) for Python numbers, NumPy
    # arrays and float tensors of the backend; the searches use it.
    from keras_transformer.inference import decoding, search

    assert decoding.length_penalty is length_penalty and search.length_penalty is length_penalty
    assert length_penalty(1, 0.6) == pytest.approx(1.0)
    assert length_penalty(7, 0.6) == pytest.approx(2.0 ** 0.6)
    assert length_penalty(30, 0.0) == 1.0
    lengths = np.array([1, 7, 30])
    expected = ((5 + lengths) / 6) ** 0.6
    np.testing.assert_allclose(length_penalty(lengths, 0.6), expected, rtol=1e-12)
    tensor = length_penalty(ops.convert_to_tensor(lengths, "float32"), 0.6)
    assert ops.is_tensor(tensor) and ops.dtype(tensor) == "float32"
    np.testing.assert_allclose(to_np(tensor), expected, rtol=1e-6)


def test_decoding_arguments_are_checked_before_decoding(model):
    source = make_sources([3])
    with pytest.raises(ValueError, match="^beam_size must be >= 1, received 0$"):
        beam_search(model, source, beam_size=0)
    with pytest.raises(ValueError, match="^alpha must be a number, received 'x'$"):
        beam_search(model, source, alpha="x")
    with pytest.raises(ValueError, match="^max_extra_length must be >= 0, received -1$"):
        greedy_decode(model, source, max_extra_length=-1)
    with pytest.raises(TypeError, match="Transformer"):
        greedy_decode(keras.Sequential(), np.ones((1, 3), "int32"))
