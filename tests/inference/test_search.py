"""The searches over a step function, driven by scripted distributions (fairseq's
test_sequence_generator style): beam search against an exhaustive search, the
length penalty, frozen finished hypotheses, EOS masking, early stopping."""

import math

import numpy as np
import pytest
from keras import ops

from conftest import backend
from keras_transformer.inference.search import run_beam_search, run_greedy_search
from layer_test_utils import to_np

PAD, BOS, EOS = 0, 1, 2


def scripted(tables, beam_size=1, calls=None):
    """A step function reading `tables[sentence, index, last_token]` -> next-token probs.

    `tables` is `(B, T, V, V)`: probabilities of the token at position
    index + 1 given the token at position `index`.
    """
    tables = np.asarray(tables, "float64")
    B, T, V, _ = tables.shape
    with np.errstate(divide="ignore"):
        log_table = np.where(tables > 0, np.log(tables), -np.inf)
    log_table = ops.convert_to_tensor(log_table.reshape(B * T * V, V).astype("float32"))

    def next_fn(tokens, cache, index):
        if calls is not None:
            calls.append(1)
        rows = tokens.shape[0]
        last = ops.slice(tokens, [0, index], [rows, 1])[:, 0]
        sentence = ops.arange(rows, dtype="int32") // beam_size
        return ops.take(log_table, (sentence * T + index) * V + last, axis=0), cache

    return next_fn


def table(steps, vocab_size, length):
    """`(length, V, V)` table from {(index, last): {token: prob}}; unlisted: EOS."""
    result = np.zeros((length, vocab_size, vocab_size))
    result[:, :, EOS] = 1.0
    for (index, last), probs in steps.items():
        result[index, last] = 0.0
        for token, p in probs.items():
            result[index, last, token] = p
    return result


def exhaustive_best(table_, max_length, alpha):
    """Best hypothesis by log P / lp over every sequence (independent reference)."""
    best = (-np.inf, None)

    def visit(prefix, last, log_prob):
        nonlocal best
        for token in range(table_.shape[-1]):
            p = table_[len(prefix), last, token]
            if p == 0:
                continue
            sequence, total = prefix + [token], log_prob + math.log(p)
            if token == EOS or len(sequence) == max_length:
                score = total / ((5 + len(sequence)) / 6) ** alpha
                if score > best[0]:
                    best = (score, sequence)
            else:
                visit(sequence, token, total)

    visit([], BOS, 0.0)
    return best


def search(tables, max_lengths, beam_size=None, **kwargs):
    tables = np.asarray(tables)
    length = tables.shape[1]
    max_lengths = ops.convert_to_tensor(np.asarray(max_lengths, "int32"))
    if beam_size is None:
        tokens, steps = run_greedy_search(scripted(tables), [], max_lengths,
                                          buffer_length=length, **kwargs)
        return to_np(tokens), to_np(steps)
    tokens, scores = run_beam_search(scripted(tables, beam_size), [], max_lengths,
                                     buffer_length=length, beam_size=beam_size, **kwargs)
    return to_np(tokens), to_np(scores)


A, B_, C = 3, 4, 5  # word ids of the scripted vocabulary (size 6)


def test_beam_search_finds_the_best_hypothesis_that_greedy_misses():
    # P(a)=.6, P(b)=.4; after a: EOS .3, a .36, b .34; after b: EOS .9.
    # Greedy: a a EOS (.6 * .36 = .216); best: b EOS (.36).
    steps = {(0, BOS): {A: 0.6, B_: 0.4},
             (1, A): {EOS: 0.3, A: 0.36, B_: 0.34},
             (1, B_): {EOS: 0.9, A: 0.05, B_: 0.05}}
    t = table(steps, 6, 5)
    greedy_tokens, greedy_steps = search([t], [5])
    assert list(greedy_tokens[0][:3]) == [A, A, EOS]
    np.testing.assert_allclose(greedy_steps[0][:3], np.log([0.6, 0.36, 1.0]), atol=1e-6)
    tokens, scores = search([t], [5], beam_size=2, alpha=0.0)
    assert list(tokens[0]) == [B_, EOS, PAD, PAD, PAD]
    np.testing.assert_allclose(scores[0], math.log(0.36), atol=1e-6)
    assert exhaustive_best(t, 5, 0.0)[1] == [B_, EOS]


@pytest.mark.parametrize("alpha", [0.0, 0.6, 2.0])
def test_exact_beam_search_matches_exhaustive_search(alpha):
    # Two words plus EOS and 3 steps: 4 beams keep every alive prefix, so the
    # search is exact and must agree with enumeration.
    rng = np.random.default_rng(int(alpha * 10))
    length, tables = 3, []
    for _ in range(5):
        t = np.zeros((length, 6, 6))
        t[:, :, [EOS, A, B_]] = rng.dirichlet([1.0, 1.0, 1.0], size=(length, 6))
        tables.append(t)
    tokens, scores = search(tables, [length, 3, 2, 1, 3], beam_size=4, alpha=alpha)
    for row, max_length in enumerate([length, 3, 2, 1, 3]):
        best_score, best = exhaustive_best(tables[row], max_length, alpha)
        got = [int(x) for x in tokens[row] if x != PAD]
        assert got == best
        np.testing.assert_allclose(scores[row], best_score, rtol=1e-5)


def test_larger_alpha_favours_the_longer_hypothesis_as_the_formula_says():
    # Short: a EOS (P = .52, |Y| = 2). Long: b c c EOS (P = .48, |Y| = 4).
    steps = {(0, BOS): {A: 0.52, B_: 0.48}, (1, A): {EOS: 1.0}, (1, B_): {C: 1.0},
             (2, C): {C: 1.0}, (3, C): {EOS: 1.0}}
    t = table(steps, 6, 8)
    short, long = math.log(0.52), math.log(0.48)
    crossover = math.log(long / short) / math.log(9 / 7)  # about 0.46
    winners = []
    for alpha in [0.0, 0.3, 0.6, 1.0, 3.0]:
        tokens, scores = search([t], [8], beam_size=2, alpha=alpha)
        expect_long = long / (9 / 6) ** alpha > short / (7 / 6) ** alpha
        assert expect_long == (alpha > crossover)
        expected = [B_, C, C, EOS] if expect_long else [A, EOS]
        assert [int(x) for x in tokens[0] if x != PAD] == expected
        score = (long / (9 / 6) ** alpha) if expect_long else (short / (7 / 6) ** alpha)
        np.testing.assert_allclose(scores[0], score, rtol=1e-5)
        winners.append(expect_long)
    assert winners == [False, False, True, True, True]


def test_finished_hypotheses_are_frozen_and_eos_ends_them():
    # After EOS the table would continue with a likely word: a search that kept
    # extending finished beams would pick it up. Sentence 2 is an empty row.
    steps = {(0, BOS): {EOS: 0.7, A: 0.3}, (1, EOS): {A: 1.0}, (1, A): {A: 0.5, EOS: 0.5},
             (2, A): {EOS: 1.0}}
    t = table(steps, 6, 6)
    tokens, scores = search([t, t, t], [6, 1, 0], beam_size=3, alpha=0.6)
    assert list(tokens[0]) == [EOS, PAD, PAD, PAD, PAD, PAD]
    np.testing.assert_allclose(scores[0], math.log(0.7) / (6 / 6) ** 0.6, rtol=1e-6)
    assert list(tokens[1]) == [EOS] + [PAD] * 5  # limit 1
    assert list(tokens[2]) == [PAD] * 6 and scores[2] == -np.inf
    greedy_tokens, _ = search([t, t, t], [6, 1, 0])
    assert list(greedy_tokens[:, 0]) == [EOS, EOS, PAD]
    assert np.all(greedy_tokens[:, 1:] == PAD)


def test_min_length_masks_eos_in_scripted_search():
    t = np.zeros((6, 6, 6))
    t[:, :, [EOS, A]] = [0.9, 0.1]
    for beam_size in (None, 2):
        tokens, _ = search([t], [6], beam_size=beam_size, min_length=4,
                           **({} if beam_size is None else {"alpha": 0.6}))
        assert list(tokens[0]) == [A, A, A, EOS, PAD, PAD]


@pytest.mark.skipif(backend() == "jax", reason="lax.while_loop traces the step once")
def test_beam_search_stops_early_when_no_alive_hypothesis_can_win():
    t = np.zeros((20, 6, 6))
    t[:, :, [EOS, A]] = [0.9, 0.1]
    calls = []
    run_beam_search(scripted([t], 2, calls), [], ops.convert_to_tensor([20]),
                    buffer_length=20, beam_size=2, alpha=0.6)
    # Step 0 finishes "EOS" (log .9); then alive "a" (log .1) / lp(20) < log .9 / lp(1).
    assert len(calls) == 1


def test_search_arguments_are_checked():
    # One message for each (`DecodingOptions.check`), naming the value.
    with pytest.raises(ValueError, match="^alpha must be >= 0, received -1$"):
        run_beam_search(scripted([np.ones((2, 6, 6))]), [], ops.convert_to_tensor([2]),
                        buffer_length=2, alpha=-1.0)
    with pytest.raises(ValueError, match="^beam_size must be >= 1, received 0$"):
        run_beam_search(scripted([np.ones((2, 6, 6))]), [], ops.convert_to_tensor([2]),
                        buffer_length=2, beam_size=0)
    with pytest.raises(ValueError, match="^min_length must be >= 0, received -2$"):
        run_greedy_search(scripted([np.ones((2, 6, 6))]), [], ops.convert_to_tensor([2]),
                          buffer_length=2, min_length=-2)
    with pytest.raises(ValueError, match="^beam_size must be an integer, received 2.0$"):
        run_beam_search(scripted([np.ones((2, 6, 6))]), [], ops.convert_to_tensor([2]),
                        buffer_length=2, beam_size=2.0)
