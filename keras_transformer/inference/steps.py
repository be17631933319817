"""The decoder's step function, and the loops that grow its cache.

A search sees the model through one function,

    next_fn(tokens, cache, index) -> (log_probs, cache)

(the contract of `keras_transformer.inference.search`). `make_step_fn`
builds it from a `Transformer`: the encoder runs once per batch, the
encoder-decoder keys and values once per batch, and the decoder one
position at a time with a fixed-shape self-attention cache (see
`TransformerDecoder`); `use_cache=False` gives the slow reference that
re-decodes the whole prefix at every step.

The cache starts short and grows as the outputs do (`cache_lengths`):
`while_in_segments` runs a search loop segment by segment, enlarging the
cache between them.

Shapes: sizes are read with `ops.shape`, which gives Python ints for known
dimensions. Compiled (XLA, `jax.jit`) and eager searches always have them,
and their loops are what they were with static shapes. Inside a plain
TensorFlow graph traced with an unknown batch size or source width (the
exported SavedModel, `keras_transformer.export.saved_model`) the sizes are
scalar tensors: the buffer length is then a tensor too, and the cache grows
inside one loop instead of one loop per cache size (`cache_lengths`), so
one traced search serves every batch size and width.
"""

import warnings

import keras
from keras import ops


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
        `(next_fn, initial_cache)`: the contract of
        `keras_transformer.inference.search`. The cache is a
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
    (`while_in_segments`).

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


def while_in_segments(cond, body, loop_vars, *, buffer_length, segments=None, grow_fn=None):
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
    """`while_in_segments` in one loop: the cache grows in the loop body."""
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
