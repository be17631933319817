"""Greedy and beam search with an incremental (key/value-cached) decoder.

The encoder runs once per batch, the encoder-decoder keys and values once per
batch, and the decoder one position at a time with a fixed-shape
self-attention cache (see `TransformerDecoder`). The searches themselves know
nothing about the model: they see a step function

    next_fn(tokens, cache, index) -> (log_probs, cache)

where `tokens` is the `(N, L + 1)` int32 buffer of the hypotheses so far (BOS
at position 0), `index` the position whose token is fed to the decoder, and
`log_probs` the float32 `(N, vocab_size)` log-distribution of the token at
position `index + 1` (the keras-hub sampler contract). `make_step_fn` builds
it from a `Transformer`; tests drive the searches with scripted
distributions.

All loops are `keras.ops.while_loop`s over fixed-shape state, so the whole
search compiles: `greedy_decode` and `beam_search` wrap it in
`tf.function(jit_compile=True)` under TensorFlow and `jax.jit` under JAX
(once per model, setting and input shape); under PyTorch it runs eagerly
under `torch.no_grad()`.

Lengths: a sentence's output (the generated tokens, EOS included, BOS not)
has at most `source_length + max_extra_length` tokens, where
`source_length` counts its non-pad source ids (EOS included), as in the
paper (section 6.1: "maximum output length to input length + 50").

Shapes: sizes are read with `ops.shape`, which gives Python ints for known
dimensions. Compiled (XLA, `jax.jit`) and eager searches always have them,
and their loops are what they were with static shapes. Inside a plain
TensorFlow graph traced with an unknown batch size or source width (the
exported SavedModel, `keras_transformer.export.saved_model`) the sizes are scalar
tensors: the buffer length is then a tensor too, and the cache grows inside
one loop instead of one loop per cache size (`cache_lengths`), so one traced
search serves every batch size and width.
"""

import warnings
import weakref

import keras
from keras import ops

from keras_transformer.model.config import DecodingOptions, length_penalty
from keras_transformer.model.layers.updates import slice_update

_NEG_INF = float("-inf")

# Compiled searches, per model and static setting: {model: {key: fn}}.
_COMPILED = weakref.WeakKeyDictionary()


def output_length_limits(source_ids, config, max_extra_length=DecodingOptions.max_extra_length):
    """Per-sentence output length limits and the static buffer length.

    Args:
        source_ids: `(batch, S)` int source ids, `config.pad_id`-padded.
        config: the model's `TransformerConfig`.
        max_extra_length: a sentence may produce up to its source length
            (non-pad ids) plus this many tokens.

    Returns:
        `(max_lengths, buffer_length)`: int32 `(batch,)` limits (0 for an
        all-pad row, which is then skipped) and `S + max_extra_length`, the
        largest possible limit: a Python int when `S` is static, an int32
        scalar tensor when it is not (a TensorFlow graph traced with an
        unknown width). With learned position embeddings both are capped at
        `config.max_length`, the size of the position table.
    """
    if not isinstance(max_extra_length, int) or max_extra_length < 0:
        raise ValueError(
            "max_extra_length must be a non-negative integer, "
            f"received max_extra_length={max_extra_length!r}"
        )
    source_length = ops.shape(source_ids)[1]
    if source_length is None:  # a symbolic KerasTensor
        raise ValueError("source_ids needs a known length (its second dimension)")
    lengths = ops.sum(ops.cast(ops.not_equal(source_ids, config.pad_id), "int32"), axis=1)
    max_lengths = ops.where(lengths > 0, lengths + max_extra_length, 0)
    if config.position_embedding == "learned":
        max_lengths = ops.minimum(max_lengths, config.max_length)
    if isinstance(source_length, int):
        buffer_length = source_length + max_extra_length
        if config.position_embedding == "learned":
            buffer_length = min(buffer_length, config.max_length)
        return ops.cast(max_lengths, "int32"), max(buffer_length, 1)
    buffer_length = ops.cast(source_length, "int32") + max_extra_length
    if config.position_embedding == "learned":
        buffer_length = ops.minimum(buffer_length, config.max_length)
    return ops.cast(max_lengths, "int32"), ops.maximum(buffer_length, 1)


def make_step_fn(model, source_ids, *, buffer_length, beam_size=1, use_cache=True,
                 dynamic_prefix=False, cache_length=None, plain_torch=True):
    """Runs the encoder once and returns the decoder's step function.

    Args:
        model: a `keras_transformer.Transformer`.
        source_ids: `(batch, S)` int32 source ids (EOS-terminated, 0-padded).
        buffer_length: L, the most decoder positions a search will feed.
        beam_size: K; the step function then works on `batch * K` rows, row
            `b * K + k` being beam `k` of sentence `b`.
        use_cache: `True`: the decoder runs on one position per step, with a
            self-attention key/value cache of L steps and the encoder-decoder
            keys/values computed here once. `False`: the slow reference; every
            step re-runs the decoder on the whole prefix (cross-attention
            keys/values included).
        dynamic_prefix: with `use_cache=False`, run each step on exactly the
            `index + 1` tokens so far (eager execution only). Otherwise the
            whole fixed-size buffer is decoded, the only option under XLA.
        cache_length: steps of the initial self-attention cache (default L);
            a search that starts shorter grows it with
            `model.decoder.grow_self_attention_cache` (see `cache_lengths`).
        plain_torch: under the torch backend, run the cached step in plain
            PyTorch (`keras_transformer.inference.torch_step`, the same numbers without
            the per-layer overhead of eager Keras) when the model allows it;
            `False` keeps the Keras layers (the reference).

    Returns:
        `(next_fn, initial_cache)`, see the module docstring. The cache is a
        list of per-layer `(keys, values)` tuples, or an empty list without
        caching.

    Example:

    >>> next_fn, cache = make_step_fn(model, source_ids, buffer_length=20)
    >>> tokens = np.ones((2, 21), "int32")  # BOS
    >>> log_probs, cache = next_fn(tokens, cache, 0)  # (2, vocab_size)
    """
    if use_cache and plain_torch and keras.backend.backend() == "torch":
        from keras_transformer.inference import torch_step

        if torch_step.supports(model)[0]:
            return torch_step.make_step_fn(model, source_ids, buffer_length=buffer_length,
                                           beam_size=beam_size, cache_length=cache_length)
    config = model.config
    source_ids = ops.convert_to_tensor(source_ids, "int32")
    batch_size = ops.shape(source_ids)[0]  # an int, or a scalar tensor in a TF graph
    rows = batch_size * beam_size
    source_mask = ops.not_equal(source_ids, config.pad_id)
    encoder_output = model.encoder(
        model.source_embedding(source_ids), padding_mask=source_mask, training=False
    )
    if beam_size > 1:
        source_mask = ops.repeat(source_mask, beam_size, axis=0)  # (B * K, S)

    if use_cache:
        return _cached_step_fn(model, encoder_output, source_mask, rows=rows,
                               beam_size=beam_size,
                               cache_length=buffer_length if cache_length is None
                               else cache_length)
    if beam_size > 1:
        encoder_output = ops.repeat(encoder_output, beam_size, axis=0)
    return _uncached_step_fn(model, encoder_output, source_mask, rows=rows,
                             buffer_length=buffer_length, dynamic_prefix=dynamic_prefix), []


def _cached_step_fn(model, encoder_output, source_mask, *, rows, beam_size, cache_length):
    """`make_step_fn` with caches: one decoder position per step."""
    # (B, h, S, d) per layer, computed once; then one copy per beam.
    cross_cache = model.decoder.compute_cross_attention_cache(encoder_output)
    if beam_size > 1:
        cross_cache = [
            tuple(ops.repeat(t, beam_size, axis=0) for t in layer_cache)
            for layer_cache in cross_cache
        ]
    cache = model.decoder.init_self_attention_cache(rows, cache_length)

    def next_fn(tokens, cache, index):
        step_ids = ops.slice(tokens, [0, index], [rows, 1])  # (N, 1)
        x, cache = model.decoder(
            model.target_embedding(step_ids),
            encoder_padding_mask=source_mask,
            self_attention_cache=cache,
            cross_attention_cache=cross_cache,
            cache_update_index=index,
            training=False,
        )
        logits = model.project(x)[:, 0, :]  # (N, V) float32
        return ops.log_softmax(logits, axis=-1), cache

    return next_fn, cache


def _uncached_step_fn(model, encoder_output, source_mask, *, rows, buffer_length,
                      dynamic_prefix):
    """`make_step_fn`'s slow reference: the decoder re-runs on the whole prefix."""

    def uncached_next_fn(tokens, cache, index):
        if dynamic_prefix:
            index = int(ops.convert_to_numpy(index))
            prefix = tokens[:, : index + 1]
        else:
            # Positions after `index` are ignored by the causal mask.
            prefix = tokens[:, :buffer_length]
        with warnings.catch_warnings():
            # A one-token prefix makes keras warn about a softmax over one key.
            warnings.filterwarnings("ignore", message="You are using a softmax over axis")
            x = model.decoder(
                model.target_embedding(prefix),
                encoder_output,
                encoder_padding_mask=source_mask,
                training=False,
            )
        x = ops.slice(x, [0, index, 0], [rows, 1, x.shape[-1]])  # (N, 1, d_model)
        logits = model.project(x)[:, 0, :]
        return ops.log_softmax(logits, axis=-1), cache

    return uncached_next_fn


def cache_lengths(buffer_length, first=16):
    """The self-attention cache sizes a search grows through: 16, 32, 64, ..., L.

    Each decoder step reads the whole cache, and each beam-search step copies
    it to reorder the beams, so a cache of `buffer_length` (source length +
    50) steps for a 20-token output would mostly move zeros. The searches
    start with `first` steps and double the cache when the outputs reach its
    end (a few static shapes, so XLA compiles one loop per size).

    A `buffer_length` that is a tensor (a TensorFlow graph traced with an
    unknown source width) gives `(min(first, L), L)`: the first size and the
    last, both tensors; the search then doubles the cache inside one loop
    (`_while_in_segments`).

    Example:

    >>> cache_lengths(84)
    (16, 32, 64, 84)
    """
    if not isinstance(buffer_length, int):
        return (ops.minimum(first, buffer_length), buffer_length)
    lengths, length = [], first
    while length < buffer_length:
        lengths.append(length)
        length *= 2
    return tuple(lengths) + (buffer_length,)


def _while_in_segments(cond, body, loop_vars, *, buffer_length, segments=None, grow_fn=None):
    """`ops.while_loop` up to `buffer_length`, growing the cache between segments.

    `loop_vars` is `(index, ..., cache)`; `segments` the cache lengths
    (`cache_lengths`), the loop over segment `i` ending when `index` reaches
    `segments[i]`, after which `grow_fn(cache, segments[i + 1])` enlarges the
    cache. Without `grow_fn` it is one loop over the whole buffer.

    With a tensor `buffer_length` (a plain TensorFlow graph: the cache
    length is dynamic there) it is one loop, in which the cache doubles,
    capped at `buffer_length`, when `index` reaches its size: the step is
    traced once instead of once per size, and sizes past the sentence's
    buffer are never allocated.
    """
    if grow_fn is None or not segments:
        return ops.while_loop(cond, body, loop_vars)
    if not isinstance(buffer_length, int):
        return _while_growing(cond, body, loop_vars, buffer_length=buffer_length,
                              first=segments[0], grow_fn=grow_fn)
    if segments[-1] != buffer_length:
        raise ValueError(f"the last cache length must be buffer_length={buffer_length}, "
                         f"received {segments!r}")
    for i, end in enumerate(segments):
        if i:
            loop_vars = tuple(loop_vars[:-1]) + (grow_fn(loop_vars[-1], end),)

        def segment_cond(*args, end=end):
            return ops.logical_and(ops.less(args[0], end), cond(*args))

        loop_vars = ops.while_loop(segment_cond, body, tuple(loop_vars))
    return loop_vars


def _while_growing(cond, body, loop_vars, *, buffer_length, first, grow_fn):
    """`_while_in_segments` in one loop: the cache grows in the loop body."""
    def grown_cond(capacity, *args):
        return cond(*args)

    def grown_body(capacity, *args):
        index, cache = args[0], args[-1]
        grow = ops.greater_equal(index, capacity)
        capacity = ops.where(grow, ops.minimum(2 * capacity, buffer_length), capacity)
        cache = ops.cond(grow, lambda: grow_fn(cache, capacity), lambda: cache)
        return (capacity,) + tuple(body(*args[:-1], cache))

    first = ops.cast(first, "int32")
    return tuple(ops.while_loop(grown_cond, grown_body, (first,) + tuple(loop_vars)))[1:]


# --- searches over a step function ---------------------------------------------


def _check_ids(bos_id, eos_id, pad_id, min_length):
    if len({bos_id, eos_id, pad_id}) != 3:
        raise ValueError(
            "bos_id, eos_id and pad_id must be distinct, received "
            f"bos_id={bos_id}, eos_id={eos_id}, pad_id={pad_id}"
        )
    if not isinstance(min_length, int) or min_length < 0:
        raise ValueError(
            f"min_length must be a non-negative integer, received {min_length!r}"
        )


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
            (`cache_lengths`) and `grow_fn(cache, length)`; default one cache
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
    _check_ids(bos_id, eos_id, pad_id, min_length)
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

    _, tokens, step_log_probs, _, _ = _while_in_segments(
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
    _check_ids(bos_id, eos_id, pad_id, min_length)
    if not isinstance(beam_size, int) or beam_size < 1:
        raise ValueError(f"beam_size must be a positive integer, received {beam_size!r}")
    if alpha < 0:
        raise ValueError(f"alpha must be >= 0, received alpha={alpha!r}")
    search = _BeamSearch(max_lengths, beam_size=beam_size, buffer_length=buffer_length,
                         alpha=alpha, eos_id=eos_id, min_length=min_length,
                         all_beams=return_all_beams, step_log_probs=return_step_log_probs)
    done, state = search.init(bos_id, pad_id)
    index = ops.convert_to_tensor(0, "int32")

    def cond(index, done, state, cache):
        return ops.logical_and(ops.less(index, search.L), ops.logical_not(ops.all(done)))

    def body(index, done, state, cache):
        return search.step(next_fn, index, done, state, cache)

    _, _, state, _ = _while_in_segments(cond, body, (index, done, state, cache),
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


# --- model-level entry points --------------------------------------------------


def _compiled(model, key, impl, jit_compile):
    """`impl(model, source_ids)`, compiled once per (model, key) when asked to.

    The compiled functions hold the model weakly (they live in a
    `WeakKeyDictionary` keyed by the model), so they go away with it.
    """
    backend = keras.backend.backend()
    if jit_compile is None:
        jit_compile = backend in ("tensorflow", "jax")
    if backend == "torch":  # always eager
        import torch

        def run_torch(source_ids):
            with torch.no_grad():
                return impl(model, source_ids, dynamic_prefix=True)

        return run_torch
    if not jit_compile:
        # Eager TensorFlow runs the loop in Python, so the uncached step can
        # decode the growing prefix; inside a graph (e.g. an exported
        # tf.function) or under JAX's lax.while_loop it cannot.
        def run_uncompiled(source_ids):
            eager = False
            if backend == "tensorflow":
                import tensorflow as tf

                eager = tf.executing_eagerly()
            return impl(model, source_ids, dynamic_prefix=eager)

        return run_uncompiled

    functions = _COMPILED.setdefault(model, {})
    # A quantized model (`model.quantize`) has other variables and calls.
    quantized = getattr(model.target_embedding, "quantization_mode", None)
    key = (backend, quantized) + key
    if key in functions:
        return functions[key]
    model_ref = weakref.ref(model)
    if backend == "tensorflow":
        import tensorflow as tf

        # No autograph: the loops are explicit `ops.while_loop`s already.
        function = tf.function(lambda source_ids: impl(model_ref(), source_ids),
                               jit_compile=True, autograph=False)
    elif backend == "jax":
        import jax

        # The weights are arguments, not constants baked into the program, so
        # the compiled search sees later weight updates (keras-hub's pattern).
        @jax.jit
        def stateless(variable_values, source_ids):
            model = model_ref()
            mapping = zip(model.variables, variable_values)
            with keras.StatelessScope(state_mapping=mapping):
                return impl(model, source_ids)

        def function(source_ids):
            return stateless([v.value for v in model_ref().variables], source_ids)
    else:
        raise ValueError(f"jit_compile=True is not supported on the {backend} backend")
    functions[key] = function
    return function


def _check_model(model):
    for name in ("config", "encoder", "decoder", "source_embedding",
                 "target_embedding", "project"):
        if not hasattr(model, name):
            raise TypeError(
                "model must be a keras_transformer.Transformer (from build_model), "
                f"received {type(model).__name__} without `{name}`"
            )


def greedy_decode(model, source_ids, *, max_extra_length=DecodingOptions.max_extra_length,
                  min_length=0, use_cache=True,
                  return_step_log_probs=False, jit_compile=None):
    """Translates a batch greedily, one cached decoder step per token.

    Args:
        model: a `keras_transformer.Transformer`.
        source_ids: int `(batch, S)` source ids, each row subword ids then
            EOS, padded with 0; rows may have different lengths. An all-pad
            row gets an empty output.
        max_extra_length: a sentence's output has at most its source length
            (non-pad ids, EOS included) plus this many tokens.
        min_length: EOS is forbidden below this output length. Meant for
            benchmarks that force a fixed output length; leave at 0.
        use_cache: `False` runs the slow reference that re-decodes the whole
            prefix at every step (for tests and benchmarks).
        return_step_log_probs: also return the per-token log-probabilities.
        jit_compile: compile the search (`None`: yes under TensorFlow and JAX,
            no under PyTorch). Compiled once per model, setting and shape.

    Returns:
        int32 `(batch, L)` generated ids, `L = S + max_extra_length`: EOS
        included, 0 after it (no BOS); with `return_step_log_probs`, also the
        float32 `(batch, L)` log-probabilities of those tokens (0 after the
        end). Backend tensors.

    Example:

    >>> model = build_model(preset="tiny", vocab_size=100)
    >>> source_ids = np.array([[5, 6, 7, 2], [8, 2, 0, 0]], "int32")
    >>> greedy_decode(model, source_ids, max_extra_length=5).shape
    (2, 9)
    """
    _check_model(model)
    source_ids = ops.convert_to_tensor(source_ids, "int32")

    def impl(model, source_ids, dynamic_prefix=False):
        config = model.config
        max_lengths, buffer_length = output_length_limits(source_ids, config,
                                                          max_extra_length)
        segments = cache_lengths(buffer_length) if use_cache else None
        next_fn, cache = make_step_fn(model, source_ids, buffer_length=buffer_length,
                                      use_cache=use_cache, dynamic_prefix=dynamic_prefix,
                                      cache_length=segments[0] if segments else None)
        tokens, step_log_probs = run_greedy_search(
            next_fn, cache, max_lengths, buffer_length=buffer_length,
            bos_id=config.bos_id, eos_id=config.eos_id, pad_id=config.pad_id,
            min_length=min_length, segments=segments,
            grow_fn=model.decoder.grow_self_attention_cache)
        return (tokens, step_log_probs) if return_step_log_probs else tokens

    key = ("greedy", max_extra_length, min_length, use_cache, return_step_log_probs)
    return _compiled(model, key, impl, jit_compile)(source_ids)


def beam_search(model, source_ids, *, beam_size=DecodingOptions.beam_size,
                alpha=DecodingOptions.alpha, max_extra_length=DecodingOptions.max_extra_length,
                min_length=0, use_cache=True, return_all_beams=False,
                return_step_log_probs=False, jit_compile=None):
    """Translates a batch with beam search and GNMT length normalisation.

    The paper's decoding (section 6.1): beam size 4, alpha 0.6, outputs of at
    most input length + 50 tokens, stopping early when no hypothesis can
    improve. The encoder runs once, the decoder once per step for all beams
    with a key/value cache. See `run_beam_search` for the search itself.

    Args:
        model: a `keras_transformer.Transformer`.
        source_ids: int `(batch, S)` source ids (EOS-terminated, 0-padded).
        beam_size: K, hypotheses kept per sentence.
        alpha: length penalty `lp(Y) = ((5 + |Y|) / 6) ** alpha`; 0 ranks by
            plain log-probability.
        max_extra_length: output length limit is source length plus this.
        min_length: EOS forbidden below this output length (benchmarks only).
        use_cache: `False` is the slow uncached reference.
        return_all_beams: return the K finished hypotheses, best first.
        return_step_log_probs: also return per-token log-probabilities.
        jit_compile: as in `greedy_decode`.

    Returns:
        `(tokens, scores)`: int32 `(batch, L)` ids (EOS included, 0 after
        it, no BOS) and float32 `(batch,)` scores `log P(Y) / lp(Y)`; plus the
        float32 `(batch, L)` per-token log-probabilities if requested. With
        `return_all_beams`: `(batch, K, L)`, `(batch, K)`, `(batch, K, L)`.

    Example:

    >>> tokens, scores = beam_search(model, source_ids, beam_size=4, alpha=0.6)

    References:
        Vaswani et al., 2017, section 6.1; Wu et al., 2016, section 7.
    """
    _check_model(model)
    source_ids = ops.convert_to_tensor(source_ids, "int32")
    alpha = float(alpha)

    def impl(model, source_ids, dynamic_prefix=False):
        config = model.config
        max_lengths, buffer_length = output_length_limits(source_ids, config,
                                                          max_extra_length)
        segments = cache_lengths(buffer_length) if use_cache else None
        next_fn, cache = make_step_fn(model, source_ids, buffer_length=buffer_length,
                                      beam_size=beam_size, use_cache=use_cache,
                                      dynamic_prefix=dynamic_prefix,
                                      cache_length=segments[0] if segments else None)
        return run_beam_search(
            next_fn, cache, max_lengths, buffer_length=buffer_length,
            beam_size=beam_size, alpha=alpha, bos_id=config.bos_id,
            eos_id=config.eos_id, pad_id=config.pad_id, min_length=min_length,
            return_all_beams=return_all_beams,
            return_step_log_probs=return_step_log_probs, segments=segments,
            grow_fn=model.decoder.grow_self_attention_cache)

    key = ("beam", beam_size, alpha, max_extra_length, min_length, use_cache,
           return_all_beams, return_step_log_probs)
    return _compiled(model, key, impl, jit_compile)(source_ids)


def decode(model, source_ids, options=None, *, jit_compile=None):
    """Translates a batch of source ids as `options` say: the search of every caller.

    `Translator`, the exported SavedModel and the benchmarks decode through
    this function, so greedy and beam search give the same outputs and the
    same scores everywhere.

    Args:
        model: a `keras_transformer.Transformer`.
        source_ids: int `(batch, S)` source ids (EOS-terminated, 0-padded).
        options: a `DecodingOptions` (default: the paper's).
        jit_compile: as in `greedy_decode`.

    Returns:
        `(tokens, scores)`: int32 `(batch, S + max_extra_length)` generated ids
        (EOS included, 0 after it, no BOS) and float32 `(batch,)` scores
        `log P(Y) / lp(|Y|)` with `lp` = `length_penalty` at `options.alpha`
        and `|Y|` counting EOS when generated. For greedy decoding the score
        is that formula applied to the greedy output. Backend tensors.

    Example:

    >>> tokens, scores = decode(model, source_ids, DecodingOptions(beam_size=1))
    """
    options = DecodingOptions() if options is None else options
    if not isinstance(options, DecodingOptions):
        raise TypeError(f"options must be a DecodingOptions, received {type(options).__name__}")
    if not options.greedy:
        return beam_search(model, source_ids, beam_size=options.beam_size,
                           alpha=options.alpha, max_extra_length=options.max_extra_length,
                           min_length=options.min_length, jit_compile=jit_compile)
    tokens, step_log_probs = greedy_decode(
        model, source_ids, max_extra_length=options.max_extra_length,
        min_length=options.min_length, return_step_log_probs=True, jit_compile=jit_compile)
    # The generated ids (EOS included) are the non-pad ones.
    lengths = ops.sum(ops.cast(ops.not_equal(tokens, model.config.pad_id), "int32"), axis=1)
    scores = ops.sum(ops.cast(step_log_probs, "float32"), axis=1) / length_penalty(
        ops.cast(ops.maximum(lengths, 1), "float32"), options.alpha)
    return tokens, scores
