"""Greedy and beam search over a step function.

The searches know nothing about the model: they see a step function

    next_fn(tokens, cache, index) -> (log_probs, cache)

where `tokens` is the `(N, L + 1)` int32 buffer of the hypotheses so far (BOS
at position 0), `index` the position whose token is fed to the decoder, and
`log_probs` the float32 `(N, vocab_size)` log-distribution of the token at
position `index + 1` (the keras-hub sampler contract).
`keras_transformer.inference.steps.make_step_fn` builds it from a
`Transformer`; tests drive the searches with scripted distributions.

All loops are `keras.ops.while_loop`s over fixed-shape state, so a whole
search compiles (`keras_transformer.inference.compiled`).
"""

import keras
from keras import ops

from keras_transformer.inference.steps import while_in_segments
from keras_transformer.model.config import DecodingOptions, length_penalty
from keras_transformer.model.layers.updates import slice_update

_NEG_INF = float("-inf")


def _check_arguments(bos_id, eos_id, pad_id, min_length):
    if len({bos_id, eos_id, pad_id}) != 3:
        raise ValueError(
            "bos_id, eos_id and pad_id must be distinct, received "
            f"bos_id={bos_id}, eos_id={eos_id}, pad_id={pad_id}"
        )
    DecodingOptions.check("min_length", min_length)


def _mask_early_eos(log_probs, index, eos_id, min_length):
    """Forbids EOS while the output would be shorter than `min_length`."""
    if not min_length:
        return log_probs
    vocab_size = log_probs.shape[-1]
    is_eos = ops.equal(ops.arange(vocab_size, dtype="int32"), eos_id)  # (V,)
    too_short = ops.less(index + 1, min_length)
    forbid = ops.logical_and(is_eos, too_short)
    return ops.where(forbid[None, :], _NEG_INF, log_probs)


def _initial_tokens(rows, buffer_length, bos_id, pad_id):
    tokens = ops.full((rows, buffer_length + 1), pad_id, dtype="int32")
    bos = ops.full((rows, 1), bos_id, dtype="int32")
    return slice_update(tokens, [0, 0], bos)


def run_greedy_search(next_fn, cache, max_lengths, *, buffer_length, bos_id=1, eos_id=2,
                      pad_id=0, min_length=0, segments=None, grow_fn=None):
    """Greedy decoding over a step function.

    At each step every unfinished sentence takes its most probable next
    token. A sentence ends at EOS or when its output reaches its
    `max_lengths` entry; the loop ends when all have ended.

    Args:
        next_fn: `next_fn(tokens, cache, index) -> (log_probs, cache)`, see
            the module docstring.
        cache: the initial cache (any nested structure of tensors).
        max_lengths: int32 `(batch,)` output length limits, EOS included,
            each at most `buffer_length`; a row with limit 0 stays empty.
        buffer_length: L: outputs have L slots. A Python int, or an int32
            scalar tensor in a plain TensorFlow graph with an unknown source
            width (`output_length_limits`).
        bos_id, eos_id, pad_id: special ids.
        min_length: EOS is forbidden while the output has fewer than this
            many tokens (EOS included). With `min_length = max_length` every
            output has exactly `max_length` tokens, which is what a decoding
            benchmark needs; translation uses 0.
        segments, grow_fn: a cache that starts short and grows: its lengths
            (`steps.cache_lengths`) and `grow_fn(cache, length)`; default one cache
            of `buffer_length` steps.

    Returns:
        `(tokens, step_log_probs)`: int32 `(batch, L)` generated ids (EOS
        included, pad after it) and float32 `(batch, L)` log-probability of
        each generated token (0 after the end).

    Example:

    >>> next_fn, cache = make_step_fn(model, source_ids, buffer_length=L)
    >>> tokens, step_log_probs = run_greedy_search(next_fn, cache, limits,
    ...                                            buffer_length=L)
    """
    _check_arguments(bos_id, eos_id, pad_id, min_length)
    max_lengths = ops.cast(ops.convert_to_tensor(max_lengths), "int32")
    batch_size = ops.shape(max_lengths)[0]
    tokens = _initial_tokens(batch_size, buffer_length, bos_id, pad_id)
    step_log_probs = ops.zeros((batch_size, buffer_length), "float32")
    finished = ops.less_equal(max_lengths, 0)
    index = ops.convert_to_tensor(0, "int32")

    def cond(index, tokens, step_log_probs, finished, cache):
        return ops.logical_and(ops.less(index, buffer_length),
                               ops.logical_not(ops.all(finished)))

    def body(index, tokens, step_log_probs, finished, cache):
        log_probs, cache = next_fn(tokens, cache, index)  # (B, V)
        log_probs = _mask_early_eos(log_probs, index, eos_id, min_length)
        next_token = ops.cast(ops.argmax(log_probs, axis=-1), "int32")  # (B,)
        token_log_prob = ops.take_along_axis(log_probs, next_token[:, None], axis=1)[:, 0]
        next_token = ops.where(finished, pad_id, next_token)
        token_log_prob = ops.where(finished, 0.0, token_log_prob)
        tokens = slice_update(tokens, [0, index + 1], next_token[:, None])
        step_log_probs = slice_update(step_log_probs, [0, index],
                                          token_log_prob[:, None])
        finished = ops.logical_or(
            finished,
            ops.logical_or(ops.equal(next_token, eos_id),
                           ops.greater_equal(index + 1, max_lengths)),
        )
        return index + 1, tokens, step_log_probs, finished, cache

    _, tokens, step_log_probs, _, _ = while_in_segments(
        cond, body, (index, tokens, step_log_probs, finished, cache),
        buffer_length=buffer_length, segments=segments, grow_fn=grow_fn)
    return tokens[:, 1:], step_log_probs


def _row_offsets(batch_size, width):
    """int32 `(B, 1)`: `b * width`, the first flat row of sentence `b`."""
    return ops.arange(batch_size, dtype="int32")[:, None] * width


def _gather_beams(x, indices, offsets=None):
    """`x` `(B, M, ...)`, `indices` int `(B, N)` -> `(B, N, ...)`, per sentence.

    `offsets`: `_row_offsets(B, M)`, computed once outside a search loop.
    """
    shape = ops.shape(x)
    batch_size, width = shape[0], shape[1]
    num = indices.shape[1]
    if offsets is None:
        offsets = _row_offsets(batch_size, width)
    flat_indices = ops.reshape(ops.cast(indices, "int32") + offsets, (-1,))
    flat = ops.reshape(x, (-1,) + tuple(shape[2:]))
    return ops.reshape(ops.take(flat, flat_indices, axis=0), (-1, num) + tuple(shape[2:]))


def _reorder_cache(cache, beam_indices, beam_size, offsets=None):
    """Cache rows `b * K + beam_indices[b, k]` moved to row `b * K + k`."""
    if offsets is None:
        offsets = _row_offsets(ops.shape(beam_indices)[0], beam_size)
    rows = ops.reshape(beam_indices + offsets, (-1,))
    return keras.tree.map_structure(lambda t: ops.take(t, rows, axis=0), cache)


def run_beam_search(next_fn, cache, max_lengths, *, buffer_length,
                    beam_size=DecodingOptions.beam_size, alpha=DecodingOptions.alpha,
                    bos_id=1, eos_id=2, pad_id=0, min_length=0, return_all_beams=False,
                    return_step_log_probs=False, segments=None, grow_fn=None):
    """Beam search with GNMT length normalisation over a step function.

    The search of tensor2tensor and of the paper (section 6.1): it keeps, per
    sentence, `beam_size` alive hypotheses and up to `beam_size` finished
    ones. At each step the alive hypotheses are extended by every token; of
    the `2 * beam_size` best extensions (by summed log-probability), those
    ending in EOS, or reaching the sentence's length limit, move to the
    finished set with the score `log P(Y) / lp(Y)` (`length_penalty`), and
    the best `beam_size` others stay alive. A finished hypothesis is never
    extended and its score is frozen. A sentence is done when no alive
    hypothesis can still beat its best finished one (for `alpha >= 0` an
    alive score can at best become `log P / lp(max_length)`; with
    `return_all_beams`, its `beam_size`-th best) or at its length limit; the
    loop ends when every sentence is done.

    With `beam_size=1` and `alpha=0` this is greedy decoding. With
    `alpha > 0` a single beam may still look past its first EOS for a
    longer, better-normalised hypothesis.

    Args:
        next_fn: step function over `batch * beam_size` rows (row
            `b * beam_size + k` is beam `k` of sentence `b`).
        cache: initial cache, with `batch * beam_size` rows on axis 0 of
            every tensor (it is reordered along that axis).
        max_lengths: int32 `(batch,)` output length limits, EOS included.
        buffer_length: L, at least `max(max_lengths)`: a Python int, or an
            int32 scalar tensor in a TensorFlow graph (see `run_greedy_search`).
        beam_size: K.
        alpha: length-penalty strength, `>= 0`.
        bos_id, eos_id, pad_id: special ids.
        min_length: EOS forbidden below this output length (see
            `run_greedy_search`).
        return_all_beams: return all K finished hypotheses (best first)
            instead of the best one.
        return_step_log_probs: also return the per-token log-probabilities.
        segments, grow_fn: a cache that starts short and grows (see
            `run_greedy_search`).

    Returns:
        `(tokens, scores)`, plus `step_log_probs` if requested: int32
        `(batch, L)` ids (EOS included, pad after it), float32 `(batch,)`
        normalised scores `log P(Y) / lp(Y)` and float32 `(batch, L)`
        per-token log-probabilities; with `return_all_beams`, shapes
        `(batch, K, L)` and `(batch, K)`.

    Example:

    >>> next_fn, cache = make_step_fn(model, source_ids, buffer_length=L, beam_size=4)
    >>> tokens, scores = run_beam_search(next_fn, cache, limits, buffer_length=L)

    References:
        Wu et al., "Google's Neural Machine Translation System", 2016, eq. 14.
    """
    _check_arguments(bos_id, eos_id, pad_id, min_length)
    DecodingOptions.check("beam_size", beam_size)
    DecodingOptions.check("alpha", alpha)
    search = _BeamSearch(max_lengths, beam_size=beam_size, buffer_length=buffer_length,
                         alpha=alpha, eos_id=eos_id, min_length=min_length,
                         all_beams=return_all_beams, step_log_probs=return_step_log_probs)
    done, state = search.init(bos_id, pad_id)
    index = ops.convert_to_tensor(0, "int32")

    def cond(index, done, state, cache):
        return ops.logical_and(ops.less(index, search.L), ops.logical_not(ops.all(done)))

    def body(index, done, state, cache):
        return search.step(next_fn, index, done, state, cache)

    _, _, state, _ = while_in_segments(cond, body, (index, done, state, cache),
                                        buffer_length=search.L, segments=segments,
                                        grow_fn=grow_fn)
    return search.finalize(state)


class _BeamSearch:
    """The three parts of `run_beam_search`: the initial state, one step, the result.

    Holds what every step shares: the sizes (`B` sentences, `K` beams, `L`
    positions), the length limits and their best possible penalty, and the
    flat-row offsets of the K alive, 2K extended and 3K merged hypotheses
    (loop invariants, computed once rather than at every step).
    """

    def __init__(self, max_lengths, *, beam_size, buffer_length, alpha, eos_id, min_length,
                 all_beams, step_log_probs):
        self.K, self.L = beam_size, buffer_length
        self.max_lengths = ops.cast(ops.convert_to_tensor(max_lengths), "int32")
        self.B = ops.shape(self.max_lengths)[0]  # an int, or a scalar tensor in a TF graph
        self.alpha, self.eos_id, self.min_length = alpha, eos_id, min_length
        self.all_beams, self.step_log_probs = all_beams, step_log_probs
        self.max_penalty = length_penalty(
            ops.cast(ops.maximum(self.max_lengths, 1), "float32"), alpha)  # (B,)
        K = self.K
        self.offsets = {width: _row_offsets(self.B, width) for width in (K, 2 * K, 3 * K)}

    def init(self, bos_id, pad_id):
        """`(done, state)` before the first step: BOS in beam 0 of every sentence."""
        B, K, L = self.B, self.K, self.L
        alive_seq = ops.reshape(_initial_tokens(B * K, L, bos_id, pad_id), (B, K, L + 1))
        # Only beam 0 is live at first, so the K copies of BOS do not fill the beam.
        first = ops.cast(ops.equal(ops.arange(K), 0), "float32")
        state = dict(alive_seq=alive_seq,
                     alive_log_probs=ops.tile(ops.where(first > 0, 0.0, _NEG_INF)[None, :],
                                              (B, 1)),
                     finished_seq=alive_seq,
                     finished_scores=ops.full((B, K), _NEG_INF, "float32"))
        if self.step_log_probs:
            state["alive_steps"] = ops.zeros((B, K, L), "float32")
            state["finished_steps"] = ops.zeros((B, K, L), "float32")
        return ops.less_equal(self.max_lengths, 0), state

    def step(self, next_fn, index, done, state, cache):
        """One position: extend, keep the K best alive, merge the newly finished."""
        B, K, offsets = self.B, self.K, self.offsets
        flat_tokens = ops.reshape(state["alive_seq"], (B * K, self.L + 1))
        log_probs, cache = next_fn(flat_tokens, cache, index)  # (B * K, V)
        log_probs = _mask_early_eos(log_probs, index, self.eos_id, self.min_length)
        V = log_probs.shape[-1]
        log_probs = ops.reshape(log_probs, (B, K * V))
        candidates = ops.reshape(state["alive_log_probs"], (B, K, 1)) + ops.reshape(
            log_probs, (B, K, V))
        candidates = ops.reshape(candidates, (B, K * V))

        # The 2K best extensions: at most K end in EOS, so K others remain.
        top_log_probs, top_index = ops.top_k(candidates, 2 * K)  # (B, 2K)
        top_index = ops.cast(top_index, "int32")
        top_beam = top_index // V
        top_token = top_index % V
        top_seq = _gather_beams(state["alive_seq"], top_beam, offsets[K])  # (B, 2K, L + 1)
        top_seq = slice_update(top_seq, [0, 0, index + 1], top_token[:, :, None])
        length = index + 1  # output length of every extension, EOS included
        ends = ops.logical_or(ops.equal(top_token, self.eos_id),
                              ops.greater_equal(length, self.max_lengths)[:, None])

        # Alive: the K best extensions that did not end.
        alive_candidates = ops.where(ends, _NEG_INF, top_log_probs)
        alive_log_probs, alive_pick = ops.top_k(alive_candidates, K)  # (B, K)
        alive_pick = ops.cast(alive_pick, "int32")
        new_state = dict(alive_seq=_gather_beams(top_seq, alive_pick, offsets[2 * K]),
                         alive_log_probs=alive_log_probs)
        cache = _reorder_cache(cache, ops.take_along_axis(top_beam, alive_pick, axis=1), K,
                               offsets[K])

        # Finished: the K best of the old finished and the newly ended.
        new_scores = ops.where(
            ends, top_log_probs / length_penalty(ops.cast(length, "float32"), self.alpha),
            _NEG_INF)
        merged_scores = ops.concatenate([state["finished_scores"], new_scores], axis=1)
        finished_scores, finished_pick = ops.top_k(merged_scores, K)  # (B, K)
        finished_pick = ops.cast(finished_pick, "int32")
        merged_seq = ops.concatenate([state["finished_seq"], top_seq], axis=1)
        finished_seq = _gather_beams(merged_seq, finished_pick, offsets[3 * K])
        # A done sentence keeps its finished set as it is.
        new_state["finished_scores"] = ops.where(done[:, None], state["finished_scores"],
                                                 finished_scores)
        new_state["finished_seq"] = ops.where(done[:, None, None], state["finished_seq"],
                                              finished_seq)

        if self.step_log_probs:
            token_log_probs = ops.take_along_axis(log_probs, top_index, axis=1)  # (B, 2K)
            top_steps = _gather_beams(state["alive_steps"], top_beam, offsets[K])
            top_steps = slice_update(top_steps, [0, 0, index], token_log_probs[:, :, None])
            new_state["alive_steps"] = _gather_beams(top_steps, alive_pick, offsets[2 * K])
            merged_steps = ops.concatenate([state["finished_steps"], top_steps], axis=1)
            new_state["finished_steps"] = ops.where(
                done[:, None, None], state["finished_steps"],
                _gather_beams(merged_steps, finished_pick, offsets[3 * K]))

        # Done when the best alive score cannot improve on the finished one(s).
        best_possible = alive_log_probs[:, 0] / self.max_penalty
        threshold = new_state["finished_scores"][:, K - 1 if self.all_beams else 0]
        done = ops.logical_or(done, ops.logical_or(
            ops.greater_equal(length, self.max_lengths),
            ops.greater_equal(threshold, best_possible)))
        return index + 1, done, new_state, cache

    def finalize(self, state):
        """`run_beam_search`'s return value from the final state."""
        tokens = state["finished_seq"][:, :, 1:]
        scores = state["finished_scores"]
        steps = state.get("finished_steps")
        if not self.all_beams:
            tokens, scores = tokens[:, 0], scores[:, 0]
            steps = None if steps is None else steps[:, 0]
        if self.step_log_probs:
            return tokens, scores, steps
        return tokens, scores
