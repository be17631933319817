"""Streams prepared shards into length-bucketed batches, a window at a time.

The paper batches sentence pairs "by approximate sequence length", each batch
holding about 25,000 source and 25,000 target tokens (section 5.1). Grouping
pairs into buckets one pair at a time (`tf.data`'s `group_by_window`) does
the work of the tf.data runtime once per pair, too slow to feed an
accelerator. Here the batches (the fixed buckets of `bucket_boundaries`,
`tokens_per_batch // bound` pairs per batch, so at most `len(boundaries)`
shapes) are made with a few vectorized ops per *window* of thousands of
pairs (the pipeline's throughput is in docs/results.md, "Paper-scale data
path"):

1. one epoch at a time: read the shards interleaved (`cycle_length` at a
   time, in an order shuffled per epoch), shuffle the serialized records in
   blocks of `shuffle_buffer_size`, group them into windows of
   `window_size` records;
2. per window (`window_parallelism` at once): decode every record with one `decode_raw`,
   apply the length policy (training drops a pair with a side over
   `max_length` tokens, BOS/EOS included; evaluation cuts both sides to
   `max_length - 1` subwords), sort the pairs by bucket (stably, so the
   shuffled order survives inside a bucket), and cut full batches bucket by
   bucket. A bucket's leftover pairs (fewer than one batch) move up into
   the next bucket's batches (padded to its bound), so no pair is lost; the
   last few pairs of a window fill one more batch of the last bucket's
   shape, completed with all-padding rows, which the loss and the metrics
   ignore (at most one such batch per window);
3. mix each window's batches (training) and prefetch.

Every shuffle is stateless, seeded by `seed` and the epoch: an epoch's batches
depend on nothing else, so `stream_position` finds where a continued run
resumes (counting the batches of earlier epochs from the records' lengths
alone) and the stream started there is the uninterrupted one's tail. Epoch `e`
reads view `e mod len(views)` when the shards come as views (sampled
segmentations, `keras_transformer.data.sampling`).

Every batch has exactly the shape `(batch_size(bucket), bound(bucket))`, on
both sides, so an XLA-compiled or JAX-jitted step sees at most
`len(boundaries)` shapes.

Sequence convention (the model's inputs, pad id 0):

    source_ids = subwords(source) + [EOS]
    target_ids = [BOS] + subwords(target)      (right-shifted, teacher forcing)
    labels     = subwords(target) + [EOS]

To train on pairs held in memory, write them as text files
(`readers.write_parallel_text`) and prepare them (`corpora.prepare_corpus`):
there is one batcher.
"""

import dataclasses
import os

import numpy as np
import tensorflow as tf

# Pairs decoded and bucketed together.
WINDOW_SIZE = 16_384
# Serialized records in the training shuffle buffer (about 100-200 bytes each).
SHUFFLE_BUFFER_SIZE = 200_000
CYCLE_LENGTH = 16

_ITEM = {"uint16": (tf.uint16, 2), "int32": (tf.int32, 4)}


def bucket_boundaries(max_length, *, min_length=8, growth=1.1, multiple=8):
    """The fixed bucket upper bounds of the batches.

    Bounds grow geometrically (by `growth`, at least by `multiple`), rounded
    up to a multiple of `multiple` (friendly to accelerators), and the last
    one is `max_length`. Bucket i holds the pairs whose longer side has
    `boundaries[i-1] < length <= boundaries[i]` tokens.

    Args:
        max_length: the longest sequence, BOS/EOS included.
        min_length: the first (smallest) bound.
        growth: ratio between successive bounds.
        multiple: bounds are multiples of this (except `max_length`).

    Returns:
        A strictly increasing list of ints ending with `max_length`.

    Example:

    >>> bucket_boundaries(64)
    [8, 16, 24, 32, 40, 48, 56, 64]
    """
    if not isinstance(max_length, int) or max_length < 1:
        raise ValueError(f"max_length must be a positive integer, received {max_length!r}")
    if growth < 1.0:
        raise ValueError(f"growth must be >= 1, received {growth}")
    boundaries = []
    bound = min_length
    while bound < max_length:
        boundaries.append(bound)
        grown = -(-int(np.ceil(bound * growth)) // multiple) * multiple
        bound = max(bound + multiple, grown)
    boundaries.append(max_length)
    return boundaries


def bucket_batch_sizes(boundaries, tokens_per_batch, *, num_replicas=1):
    """Per-bucket batch sizes: `tokens_per_batch // bound`, a multiple of `num_replicas`.

    Args:
        boundaries: bucket upper bounds, as from `bucket_boundaries`.
        tokens_per_batch: the (global) token budget of one batch and side.
        num_replicas: batch sizes are rounded down to a multiple of this, so
            `tf.distribute` splits every full batch evenly.

    Returns:
        A list of ints, one per bucket.
    """
    if not isinstance(num_replicas, int) or num_replicas < 1:
        raise ValueError(f"num_replicas must be a positive integer, received {num_replicas!r}")
    sizes = [tokens_per_batch // bound // num_replicas * num_replicas
             for bound in boundaries]
    if sizes[-1] < 1:
        raise ValueError(
            f"tokens_per_batch={tokens_per_batch} is too small: the longest bucket "
            f"(length {boundaries[-1]}) needs at least {boundaries[-1] * num_replicas} "
            f"tokens for one sentence per replica (num_replicas={num_replicas}); "
            "raise tokens_per_batch or lower max_length"
        )
    return sizes


@dataclasses.dataclass(frozen=True)
class LengthPolicyCounts:
    """What the length policy does to a corpus (`PreparedCorpus.length_policy`).

    Attributes:
        num_pairs: pairs read.
        num_over_long: pairs with a side longer than `max_length` (BOS/EOS
            included): dropped for training, truncated for evaluation.
        num_source_over_long, num_target_over_long: the same, per side.
        source_tokens, target_tokens: tokens per side, EOS included, before
            the policy.
    """

    num_pairs: int
    num_over_long: int
    num_source_over_long: int
    num_target_over_long: int
    source_tokens: int
    target_tokens: int


def default_window_parallelism():
    """Windows decoded at once: one per 8 CPU cores, at least one.

    Not `tf.data.AUTOTUNE`: on a machine of few cores autotuning raises the
    parallelism while the training step needs the same cores, which slows
    training and leaves windows in flight that `fit` then waits for when it
    ends. One window at a time already delivers far more target tokens per
    second than a step consumes (docs/results.md, "Paper-scale data path").
    """
    return max(1, (os.cpu_count() or 1) // 8)


def _window_lengths(raw, *, dtype, max_length, training, boundaries):
    """Decoded lengths and buckets of one window of serialized records.

    Returns:
        `(raw, nbytes, num_source, rows, num_source_kept, num_target_kept,
        bucket)`: `rows` are the kept records (training drops over-long pairs),
        the `*_kept` lengths are in subwords (evaluation cuts them), `bucket`
        is each kept row's length bucket.
    """
    out_type, itemsize = _ITEM[dtype]
    nbytes = tf.strings.length(raw)
    if training:  # cheap pre-filter: a pair longer than this on both sides together
        keep = nbytes <= itemsize * (1 + 2 * (max_length - 1))
        raw, nbytes = tf.boolean_mask(raw, keep), tf.boolean_mask(nbytes, keep)
    num_source = tf.cast(tf.reshape(tf.io.decode_raw(
        tf.strings.substr(raw, 0, itemsize), out_type), [-1]), tf.int32)
    num_target = nbytes // itemsize - 1 - num_source
    if training:
        keep = tf.logical_and(num_source < max_length, num_target < max_length)
        rows = tf.cast(tf.where(keep)[:, 0], tf.int32)
        num_source_kept = tf.gather(num_source, rows)
        num_target_kept = tf.gather(num_target, rows)
    else:
        rows = tf.range(tf.size(nbytes))
        num_source_kept = tf.minimum(num_source, max_length - 1)
        num_target_kept = tf.minimum(num_target, max_length - 1)
    length = tf.maximum(num_source_kept, num_target_kept) + 1  # EOS / BOS included
    bounds = tf.constant(boundaries, tf.int32)
    bucket = tf.reduce_sum(tf.cast(bounds[None, :] < length[:, None], tf.int32), axis=1)
    return raw, nbytes, num_source, rows, num_source_kept, num_target_kept, bucket


def _cut(counts, batch_sizes):
    """Full batches per bucket, and the pairs left over (the window's last batch)."""
    full_batches = []
    carry = tf.constant(0, tf.int32)
    for index, size in enumerate(batch_sizes):
        available = carry + counts[index]
        full_batches.append(available // size)
        carry = available - full_batches[-1] * size
    return full_batches, carry


def _window_batch_count(raw, *, dtype, max_length, training, boundaries, batch_sizes):
    """How many batches `_window_to_batches` cuts from this window (lengths only)."""
    bucket = _window_lengths(raw, dtype=dtype, max_length=max_length, training=training,
                             boundaries=boundaries)[-1]
    counts = tf.math.bincount(bucket, minlength=len(boundaries),
                              maxlength=len(boundaries), dtype=tf.int32)
    full_batches, carry = _cut(counts, batch_sizes)
    return tf.cast(tf.add_n(full_batches) + tf.minimum(carry, 1), tf.int64)


def _window_to_batches(raw, *, dtype, max_length, training, boundaries, batch_sizes,
                       pad_id, bos_id, eos_id):
    """One window of serialized records -> a tuple of per-bucket batch stacks."""
    out_type, itemsize = _ITEM[dtype]
    raw, nbytes, num_source, rows, num_source_kept, num_target_kept, bucket = \
        _window_lengths(raw, dtype=dtype, max_length=max_length, training=training,
                        boundaries=boundaries)
    width = tf.maximum(tf.reduce_max(tf.concat([nbytes, [itemsize]], 0)), itemsize)
    ids = tf.cast(tf.io.decode_raw(raw, out_type, fixed_length=width), tf.int32)
    body_width = tf.shape(ids)[1] - 1
    flat = tf.reshape(ids[:, 1:], [-1])
    row_start = rows * body_width
    source = tf.gather(flat, tf.ragged.range(row_start, row_start + num_source_kept))
    target_start = row_start + tf.gather(num_source, rows)
    target = tf.gather(flat, tf.ragged.range(target_start, target_start + num_target_kept))
    order = tf.argsort(bucket, stable=True)
    counts = tf.math.bincount(bucket, minlength=len(boundaries),
                              maxlength=len(boundaries), dtype=tf.int32)

    def stack(take, size, bound, num_batches):
        """Rows `take` as `(num_batches, size, bound)` batches (missing rows: padding)."""
        fill = num_batches * size - tf.size(take)
        source_len = tf.pad(tf.gather(num_source_kept, take), [[0, fill]],
                            constant_values=-1)
        target_len = tf.pad(tf.gather(num_target_kept, take), [[0, fill]],
                            constant_values=-1)
        shape = [num_batches * size, bound]
        source_ids = tf.gather(source, take).to_tensor(pad_id, shape=shape)
        target_body = tf.gather(target, take).to_tensor(pad_id, shape=shape)
        source_ids += eos_id * tf.one_hot(source_len, bound, dtype=tf.int32)
        labels = target_body + eos_id * tf.one_hot(target_len, bound, dtype=tf.int32)
        real = tf.cast(target_len >= 0, tf.int32)[:, None]
        target_ids = tf.concat([bos_id * real, target_body[:, :-1]], axis=1)
        batches = [num_batches, size, bound]
        return {"source_ids": tf.reshape(source_ids, batches),
                "target_ids": tf.reshape(target_ids, batches),
                "labels": tf.reshape(labels, batches)}

    groups = []
    start = tf.constant(0, tf.int32)
    full_batches, carry = _cut(counts, batch_sizes)
    for bound, size, full in zip(boundaries, batch_sizes, full_batches):
        groups.append(stack(order[start:start + full * size], size, bound, full))
        start += full * size
    # The window's last pairs: one batch of the last bucket's shape, if any.
    groups.append(stack(order[start:], batch_sizes[-1], boundaries[-1],
                        tf.minimum(carry, 1)))
    return tuple(groups)


def _views(shard_paths):
    """`shard_paths` as a list of views, each a list of shard paths."""
    if not shard_paths:
        raise ValueError("no shards to read")
    if isinstance(shard_paths[0], (list, tuple)):
        views = [[str(p) for p in view] for view in shard_paths]
        if len({len(view) for view in views}) != 1 or not views[0]:
            raise ValueError("every view must have the same (non-zero) number of shards")
        return views
    return [[str(p) for p in shard_paths]]


def _layout(shard_paths, *, tokens_per_batch, max_length, training, num_replicas,
            num_pairs, boundaries, window_size):
    """`(views, boundaries, batch_sizes, window)` of a stream: what its batches and counts share."""
    boundaries = [int(b) for b in (boundaries or bucket_boundaries(max_length))]
    batch_sizes = bucket_batch_sizes(boundaries, tokens_per_batch, num_replicas=num_replicas)
    window = (window_size or WINDOW_SIZE) if training else (
        window_size or max(num_pairs or WINDOW_SIZE, 1))
    return _views(shard_paths), boundaries, batch_sizes, window


def _epoch_seed(seed, epoch, part):
    """A stateless seed (shape `[2]`) for one shuffle of one epoch."""
    return tf.stack([tf.constant(seed, tf.int64),
                     tf.cast(epoch, tf.int64) * 1_000_003 + part])


def _epoch_pipeline(views, epoch, *, seed, training, num_pairs, window, shuffle_buffer_size,
                    cycle_length, per_window, window_parallelism):
    """One pass over the view `epoch mod len(views)`: `per_window` mapped over its windows.

    Training shuffles with stateless ops seeded by `(seed, epoch)`: the shard
    order, then the records in blocks of `shuffle_buffer_size` (a block
    shuffle, not `Dataset.shuffle`'s sliding buffer, whose seed cannot depend
    on the epoch). `prepare` already wrote every shard in a random order.
    """
    num_shards = len(views[0])
    paths = tf.constant(views)[epoch % len(views)]
    if training:
        paths = tf.random.experimental.stateless_shuffle(
            paths, seed=_epoch_seed(seed, epoch, 0))
    files = tf.data.Dataset.from_tensor_slices(paths)
    parallel = dict(num_parallel_calls=min(4, cycle_length, num_shards),
                    deterministic=True) if num_shards > 1 else {}
    records = files.interleave(
        lambda path: tf.data.TFRecordDataset(path, buffer_size=2**20),
        cycle_length=min(cycle_length, num_shards), block_length=1, **parallel)
    if training:
        block_size = shuffle_buffer_size or min(num_pairs or SHUFFLE_BUFFER_SIZE,
                                                SHUFFLE_BUFFER_SIZE)
        records = records.batch(block_size).enumerate().map(
            lambda index, block: tf.random.experimental.stateless_shuffle(
                block, seed=_epoch_seed(seed, epoch, 1 + index))).unbatch()
    return records.batch(window).map(
        per_window, num_parallel_calls=window_parallelism or default_window_parallelism(),
        deterministic=True)


def _unstack(groups, seed):
    """The batches of one window's per-bucket stacks: in bucket order, or (`seed`) mixed."""
    parts = [tf.data.Dataset.from_tensor_slices(group) for group in groups]
    if seed is None:
        dataset = parts[0]
        for part in parts[1:]:
            dataset = dataset.concatenate(part)
        return dataset
    counts = tf.stack([tf.shape(group["labels"])[0] for group in groups])
    choices = tf.random.experimental.stateless_shuffle(
        tf.repeat(tf.range(len(groups), dtype=tf.int64), counts), seed=seed)
    return tf.data.Dataset.choose_from_datasets(
        parts, tf.data.Dataset.from_tensor_slices(choices), stop_on_empty_dataset=False)


def _options(dataset):
    options = tf.data.Options()
    options.deterministic = True
    return dataset.with_options(options)


def stream_batches(shard_paths, *, dtype, tokens_per_batch, max_length, training,
                   num_replicas=1, seed=None, repeat=False, num_pairs=None,
                   boundaries=None, shuffle_buffer_size=None, window_size=None,
                   shuffle_batches=True, cycle_length=CYCLE_LENGTH,
                   window_parallelism=None, start=(0, 0), pad_id=0, bos_id=1, eos_id=2):
    """The batches of prepared shards for `model.fit`; see the module docstring.

    The stream is a sequence of epochs. Epoch `e` reads the view
    `e mod len(views)` (one view unless the shards are sampled segmentations,
    `keras_transformer.data.sampling`), shuffled with seeds made from `seed`
    and `e`: the batches of an epoch depend on nothing else, so a stream
    started at `start=(e, k)` (`stream_position`) is the tail of the stream
    started at `(0, 0)`, batch for batch.

    Args:
        shard_paths: TFRecord files written by `preparation.prepare`, or a list
            of views, each such a list (as many shards in each).
        dtype: the records' id type (`"uint16"` or `"int32"`, the manifest's).
        tokens_per_batch: token slots per batch and side (global over replicas).
        max_length: longest sequence, BOS/EOS included.
        training: shuffle and drop over-long pairs, or keep order and cut them.
        num_replicas: batch sizes are multiples of this.
        seed: seed of the shard order and the shuffles (`None`: random).
        repeat: epochs forever (training), else one.
        num_pairs: the pairs in the shards (the manifest's): bounds the
            shuffle buffer, and for evaluation makes one window of them all.
        boundaries: bucket bounds; default `bucket_boundaries(max_length)`.
        shuffle_buffer_size: serialized records in the shuffle buffer.
        window_size: pairs bucketed together (training).
        shuffle_batches: training mixes the batches of each window (else
            they come bucket by bucket, shortest first).
        cycle_length: shards read at once.
        window_parallelism: windows decoded at once (default
            `default_window_parallelism()`).
        start: `(epoch, batches)`: begin at this epoch, after its first
            `batches` batches (a continued run's position, `stream_position`).

    Returns:
        A `tf.data.Dataset` of `({"source_ids", "target_ids"}, labels)` int32
        batches, pad id 0.
    """
    views, boundaries, batch_sizes, window = _layout(
        shard_paths, tokens_per_batch=tokens_per_batch, max_length=max_length,
        training=training, num_replicas=num_replicas, num_pairs=num_pairs,
        boundaries=boundaries, window_size=window_size)
    if seed is None:
        seed = int(np.random.default_rng().integers(2**31))
    convert = dict(dtype=dtype, max_length=max_length, training=training,
                   boundaries=boundaries, batch_sizes=batch_sizes, pad_id=pad_id,
                   bos_id=bos_id, eos_id=eos_id)

    def epoch_batches(epoch):
        groups = _epoch_pipeline(
            views, epoch, seed=seed, training=training, num_pairs=num_pairs, window=window,
            shuffle_buffer_size=shuffle_buffer_size, cycle_length=cycle_length,
            per_window=lambda raw: _window_to_batches(raw, **convert),
            window_parallelism=window_parallelism)
        return groups.enumerate().flat_map(
            lambda index, groups: _unstack(groups, _epoch_seed(
                seed, epoch, -1 - index) if training and shuffle_batches else None))

    first_epoch, skip = (int(v) for v in start)
    epochs = tf.data.Dataset.range(first_epoch, 2**62 if repeat else first_epoch + 1)
    batches = epochs.flat_map(epoch_batches)
    if skip:
        batches = batches.skip(skip)
    batches = batches.map(
        lambda x: ({"source_ids": x["source_ids"], "target_ids": x["target_ids"]},
                   x["labels"]))
    return _options(batches).prefetch(tf.data.AUTOTUNE)


def epoch_batch_counts(shard_paths, *, dtype, tokens_per_batch, max_length, training,
                       num_replicas=1, seed=None, num_pairs=None, boundaries=None,
                       shuffle_buffer_size=None, window_size=None, cycle_length=CYCLE_LENGTH,
                       window_parallelism=None, shuffle_batches=True, pad_id=0, bos_id=1,
                       eos_id=2):
    """The batches in epochs 0, 1, ... of `stream_batches` (same arguments), as a Dataset.

    Reads the records' lengths only: no batch is built. (`shuffle_batches`
    and the special ids do not change the counts.)
    """
    views, boundaries, batch_sizes, window = _layout(
        shard_paths, tokens_per_batch=tokens_per_batch, max_length=max_length,
        training=training, num_replicas=num_replicas, num_pairs=num_pairs,
        boundaries=boundaries, window_size=window_size)
    count = dict(dtype=dtype, max_length=max_length, training=training,
                 boundaries=boundaries, batch_sizes=batch_sizes)

    def epoch_count(epoch):
        return _epoch_pipeline(
            views, epoch, seed=seed, training=training, num_pairs=num_pairs, window=window,
            shuffle_buffer_size=shuffle_buffer_size, cycle_length=cycle_length,
            window_parallelism=window_parallelism,
            per_window=lambda raw: _window_batch_count(raw, **count)).reduce(
                tf.constant(0, tf.int64), lambda a, b: a + b)

    return _options(tf.data.Dataset.range(2**62).map(epoch_count))


def stream_position(shard_paths, batches, **stream_arguments):
    """The `start=(epoch, batches)` of `stream_batches` after its first `batches` batches.

    Counts the batches of epochs 0, 1, ... (`epoch_batch_counts`) until
    `batches` are reached: a continued run reads on from where the stopped
    one was, without building the batches it has already trained on.
    """
    if not batches:
        return 0, 0
    if stream_arguments.get("seed") is None:
        raise ValueError("a stream without a seed has no position to continue from")
    for epoch, count in enumerate(
            epoch_batch_counts(shard_paths, **stream_arguments).as_numpy_iterator()):
        if count == 0:
            raise ValueError("an epoch of the stream has no batch")
        if batches < count:
            return epoch, int(batches)
        batches -= count


def _cascade(counts, batch_sizes):
    """Batches the window algorithm cuts from integer bucket counts."""
    carry = batches = 0
    for count, size in zip(counts, batch_sizes):
        available = carry + count
        batches += available // size
        carry = available % size
    return batches + (1 if carry else 0)


def expected_batches(pair_lengths, pair_target_tokens, target_lengths, *,
                     tokens_per_batch, max_length, training, num_replicas=1,
                     boundaries=None, window_size=None):
    """Batches and target tokens of one pass of `stream_batches`, from histograms.

    Args:
        pair_lengths: `pair_lengths[l]` pairs whose longer side has `l`
            tokens (BOS/EOS included).
        pair_target_tokens: target tokens of those pairs.
        target_lengths: `target_lengths[l]` pairs whose target has `l` tokens.
        tokens_per_batch, max_length, training, num_replicas, boundaries:
            as for `stream_batches`.
        window_size: training windows (default `WINDOW_SIZE`); evaluation is
            one window, as `stream_batches` reads it.

    Returns:
        `(num_batches, target_tokens)`: exact for evaluation; for training the
        expectation over windows of `window_size` shuffled pairs.
    """
    boundaries = [int(b) for b in (boundaries or bucket_boundaries(max_length))]
    batch_sizes = bucket_batch_sizes(boundaries, tokens_per_batch, num_replicas=num_replicas)
    pair_lengths = np.asarray(pair_lengths, np.int64)
    lengths = np.arange(len(pair_lengths))
    if training:
        keep = lengths <= max_length
        counts_by_length = np.where(keep, pair_lengths, 0)
        tokens = int(np.asarray(pair_target_tokens, np.int64)[:max_length + 1].sum())
        bucket_of = np.searchsorted(boundaries, np.minimum(lengths, max_length))
    else:
        counts_by_length = pair_lengths
        target = np.asarray(target_lengths, np.int64)
        tokens = int((np.minimum(np.arange(len(target)), max_length) * target).sum())
        bucket_of = np.searchsorted(boundaries, np.minimum(lengths, max_length))
    counts = np.bincount(bucket_of, weights=counts_by_length,
                         minlength=len(boundaries))[:len(boundaries)]
    total = int(counts.sum())
    if not training:
        return _cascade([int(c) for c in counts], batch_sizes), tokens
    window = window_size or WINDOW_SIZE
    full_windows, last = divmod(total, window)
    shares = counts / max(total, 1)
    batches = full_windows * _cascade(np.round(shares * window).astype(int), batch_sizes)
    if last:
        batches += _cascade(np.round(shares * last).astype(int), batch_sizes)
    return batches, tokens


__all__ = ["epoch_batch_counts", "expected_batches", "stream_batches", "stream_position"]
