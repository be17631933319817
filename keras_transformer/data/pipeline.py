"""The tf.data input pipeline: sentence pairs to length-bucketed token batches.

The paper batches sentence pairs "by approximate sequence length", each batch
holding about 25,000 source and 25,000 target tokens (section 5.1).
`make_dataset` does this with a fixed set of length buckets, so an XLA-compiled
training step sees a bounded number of shapes, and a per-bucket batch size, so
that every batch holds at most `tokens_per_batch` token slots on each side,
padding included:

    batch_size(bucket) * padded_length(bucket) <= tokens_per_batch

Sequence convention (the model's inputs, pad id 0):

    source_ids = subwords(source) + [EOS]
    target_ids = [BOS] + subwords(target)      (right-shifted, teacher forcing)
    labels     = subwords(target) + [EOS]

Length policy (lengths count the BOS/EOS token): a pair is *over-long* when
`len(source_ids) > max_length` or `len(labels) > max_length`. For training it
is dropped; for evaluation both sides are cut to `max_length - 1` subwords
before BOS/EOS are added, so no pair is lost. `count_length_policy` counts
these pairs; the pipeline itself keeps no counters (it runs in the graph).

The pipeline is TensorFlow-only (tf.data and tf-text) and yields NumPy-
convertible int32 batches, so `model.fit` consumes it on every Keras backend.
"""

import dataclasses
from typing import Tuple

import numpy as np
import tensorflow as tf

from keras_transformer.data.readers import ParallelText


def bucket_boundaries(max_length, *, min_length=8, growth=1.1, multiple=8):
    """The fixed bucket upper bounds used by `make_dataset`.

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


def _as_string_pairs(pairs):
    """Any accepted form of `pairs` as a Dataset of `(source, target)` strings."""
    if isinstance(pairs, ParallelText):
        return pairs.as_dataset(), len(pairs)
    if isinstance(pairs, tf.data.Dataset):
        spec = pairs.element_spec
        if not (isinstance(spec, tuple) and len(spec) == 2 and all(
                isinstance(s, tf.TensorSpec) and s.dtype == tf.string
                and s.shape.rank == 0 for s in spec)):
            raise ValueError(
                "a Dataset of pairs must yield (source, target) scalar tf.string "
                f"tuples, e.g. load_wmt14(...); its element_spec is {spec}"
            )
        cardinality = int(pairs.cardinality())
        return pairs, (cardinality if cardinality >= 0 else None)
    pairs = list(pairs)
    if not pairs:
        raise ValueError("pairs is empty: nothing to batch")
    for index, pair in enumerate(pairs):
        if (not isinstance(pair, (tuple, list)) or len(pair) != 2
                or not all(isinstance(s, (str, bytes)) for s in pair)):
            raise ValueError(
                f"pairs[{index}] must be a (source, target) pair of strings, "
                f"received {pair!r:.100}"
            )
    sources, targets = zip(*pairs)
    dataset = tf.data.Dataset.from_tensor_slices(
        (tf.constant(sources, tf.string), tf.constant(targets, tf.string))
    )
    return dataset, len(pairs)


def _encode_batch(tokenizer, max_length, truncate):
    """A map function: a batch of string pairs to ragged model sequences."""

    def encode(source_text, target_text):
        source = tokenizer.tokenize(source_text)  # (batch, None) ragged int32
        target = tokenizer.tokenize(target_text)
        if truncate:
            source = source[:, : max_length - 1]
            target = target[:, : max_length - 1]
        batch = tf.shape(source_text)[:1]
        bos = tf.RaggedTensor.from_tensor(tf.fill(tf.concat([batch, [1]], 0), tokenizer.bos_id))
        eos = tf.RaggedTensor.from_tensor(tf.fill(tf.concat([batch, [1]], 0), tokenizer.eos_id))
        return {
            "source_ids": tf.concat([source, eos], axis=1),
            "target_ids": tf.concat([bos, target], axis=1),
            "labels": tf.concat([target, eos], axis=1),
        }

    return encode


def _encoded(pairs, tokenizer, max_length, *, truncate, batch_size):
    """Ragged batches of `{"source_ids", "target_ids", "labels"}`."""
    return pairs.batch(batch_size).map(
        _encode_batch(tokenizer, max_length, truncate),
        num_parallel_calls=tf.data.AUTOTUNE,
    )


def make_dataset(pairs, tokenizer, *, tokens_per_batch, max_length, training,
                 boundaries=None, num_replicas=1, pad_to_bucket_boundary=True,
                 shuffle_buffer_size=None, seed=None, deterministic=None,
                 repeat=False, drop_remainder=False, cache=True):
    """Builds the batched, length-bucketed dataset that `model.fit` consumes.

    Steps: tokenize the pairs in the graph, add BOS/EOS, apply the length
    policy (drop over-long pairs for training, truncate them for evaluation;
    see the module docstring), cache the ids in memory (`cache=True`:
    tokenization runs in the first epoch only), shuffle (training), group pairs by
    `max(len(source_ids), len(target_ids))` into the fixed buckets of
    `boundaries`, pad (with 0) and batch each bucket with its own batch size,
    and prefetch.

    Every batch holds at most `tokens_per_batch` token slots per side,
    padding included. With `pad_to_bucket_boundary=True` (default) both sides
    of a batch are padded to the bucket bound, so batches take at most
    `2 * len(boundaries)` shapes (a full and a last, partial batch per
    bucket; `drop_remainder=True` drops the partial ones and so loses
    pairs). With `False` each side is padded to the batch's longest sequence:
    less padding, more shapes.

    Distribution: `tokens_per_batch` is the global budget of one step. Pass
    `num_replicas=strategy.num_replicas_in_sync` so every batch size is a
    multiple of it, then `strategy.experimental_distribute_dataset` splits
    each batch evenly across replicas.

    Args:
        pairs: `(source, target)` sentence pairs: a `ParallelText`, a list of
            string pairs, or a `tf.data.Dataset` of scalar `tf.string` pairs
            (e.g. `load_wmt14`).
        tokenizer: a `Tokenizer` (the shared vocabulary).
        tokens_per_batch: the most token slots in one batch, on each side
            (the paper: about 25,000).
        max_length: the longest sequence, BOS/EOS included; at most the
            model's `TransformerConfig.max_length`.
        training: shuffle and drop over-long pairs (`True`), or keep order
            and truncate them (`False`).
        boundaries: bucket upper bounds, increasing, the last equal to
            `max_length`; default `bucket_boundaries(max_length)`.
        num_replicas: make every bucket's batch size a multiple of this.
        pad_to_bucket_boundary: pad to the bucket bound (fixed shapes) or to
            the longest sequence of the batch.
        shuffle_buffer_size: pairs in the shuffle buffer; default all of them
            when their number is known, else 100,000.
        seed: shuffle seed. Each epoch is still shuffled differently.
        deterministic: set `tf.data.Options().deterministic`; `True` also
            sets `seed=0` when no seed is given, so runs repeat exactly.
        repeat: repeat the pairs indefinitely before bucketing (no partial
            batches); otherwise one pass is one epoch.
        drop_remainder: drop each bucket's last, partial batch.
        cache: keep the tokenized pairs in memory after the first pass (about
            8 bytes per token plus ~100 bytes per pair); turn it off for
            corpora that do not fit.

    Returns:
        A `tf.data.Dataset` of `({"source_ids": (batch, L), "target_ids":
        (batch, L')}, labels (batch, L'))` int32 batches, pad id 0.

    Example:

    >>> pairs = load_parallel_text("train.en", "train.de")
    >>> dataset = make_dataset(pairs, tokenizer, tokens_per_batch=4096,
    ...                        max_length=128, training=True)
    >>> model.fit(dataset, epochs=10)
    """
    if not isinstance(tokens_per_batch, int) or tokens_per_batch < 1:
        raise ValueError(
            f"tokens_per_batch must be a positive integer, received {tokens_per_batch!r}"
        )
    if not isinstance(max_length, int) or max_length < 2:
        raise ValueError(
            f"max_length must be an integer >= 2 (one subword plus BOS/EOS), "
            f"received {max_length!r}"
        )
    if boundaries is None:
        boundaries = bucket_boundaries(max_length)
    boundaries = [int(b) for b in boundaries]
    if (not boundaries or boundaries[-1] != max_length
            or any(a >= b for a, b in zip(boundaries, boundaries[1:]))
            or boundaries[0] < 1):
        raise ValueError(
            "boundaries must be positive, strictly increasing and end with "
            f"max_length={max_length}; received {boundaries}"
        )
    batch_sizes = bucket_batch_sizes(boundaries, tokens_per_batch,
                                     num_replicas=num_replicas)
    if deterministic and seed is None:
        seed = 0

    dataset, size = _as_string_pairs(pairs)
    # Tokenize in batches (one tf-text call per 1024 pairs, in parallel), then
    # work on single pairs: the length policy and the bucketing are per pair.
    dataset = _encoded(dataset, tokenizer, max_length, truncate=not training,
                       batch_size=1024).unbatch()
    # unbatch() gives rank-0-ragged specs; a map turns them into plain tensors,
    # which padded_batch needs.
    dataset = dataset.map(dict)
    if training:  # the length policy; evaluation has truncated already
        dataset = dataset.filter(
            lambda x: tf.logical_and(
                tf.size(x["source_ids"]) <= max_length,
                tf.size(x["labels"]) <= max_length,
            )
        )
    if cache:
        dataset = dataset.cache()
    if training:
        buffer = shuffle_buffer_size or size or 100_000
        dataset = dataset.shuffle(buffer, seed=seed, reshuffle_each_iteration=True)
    if repeat:
        dataset = dataset.repeat()

    bounds = tf.constant(boundaries, tf.int64)
    sizes = tf.constant(batch_sizes, tf.int64)

    def bucket_id(x):
        length = tf.cast(
            tf.maximum(tf.size(x["source_ids"]), tf.size(x["target_ids"])), tf.int64
        )
        # The first bound >= length.
        return tf.reduce_sum(tf.cast(bounds < length, tf.int64))

    def batch_bucket(key, window):
        length = bounds[key] if pad_to_bucket_boundary else -1
        shapes = {"source_ids": [length], "target_ids": [length], "labels": [length]}
        return window.padded_batch(sizes[key], padded_shapes=shapes,
                                   padding_values=tokenizer.pad_id,
                                   drop_remainder=drop_remainder)

    dataset = dataset.group_by_window(
        key_func=bucket_id, reduce_func=batch_bucket,
        window_size_func=lambda key: sizes[key],
    )
    dataset = dataset.map(
        lambda x: ({"source_ids": x["source_ids"], "target_ids": x["target_ids"]},
                   x["labels"]),
        num_parallel_calls=tf.data.AUTOTUNE,
    )
    options = tf.data.Options()
    if deterministic is not None:
        options.deterministic = bool(deterministic)
    return dataset.with_options(options).prefetch(tf.data.AUTOTUNE)


@dataclasses.dataclass(frozen=True)
class LengthPolicyCounts:
    """What the length policy of `make_dataset` does to a corpus.

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

    @property
    def num_kept_for_training(self):
        return self.num_pairs - self.num_over_long


def count_length_policy(pairs, tokenizer, max_length):
    """Counts the pairs that `make_dataset(..., max_length)` drops or truncates.

    Args:
        pairs: as for `make_dataset`.
        tokenizer: a `Tokenizer`.
        max_length: as for `make_dataset`.

    Returns:
        A `LengthPolicyCounts`.

    Example:

    >>> counts = count_length_policy(pairs, tokenizer, max_length=64)
    >>> print(f"training drops {counts.num_over_long} of {counts.num_pairs}")
    """
    dataset, _ = _as_string_pairs(pairs)
    encoded = _encoded(dataset, tokenizer, max_length, truncate=False, batch_size=4096)
    lengths = encoded.map(  # lengths, EOS included
        lambda x: (x["source_ids"].row_lengths(), x["labels"].row_lengths()))
    counts = dict(num_pairs=0, num_over_long=0, num_source_over_long=0,
                  num_target_over_long=0, source_tokens=0, target_tokens=0)
    for source, target in lengths.as_numpy_iterator():
        source_long, target_long = source > max_length, target > max_length
        counts["num_pairs"] += len(source)
        counts["num_over_long"] += int(np.sum(source_long | target_long))
        counts["num_source_over_long"] += int(np.sum(source_long))
        counts["num_target_over_long"] += int(np.sum(target_long))
        counts["source_tokens"] += int(source.sum())
        counts["target_tokens"] += int(target.sum())
    return LengthPolicyCounts(**counts)


@dataclasses.dataclass(frozen=True)
class BatchStatistics:
    """Token and padding counts of a batched dataset (see `batch_statistics`).

    Attributes:
        num_batches, num_pairs: batches and sentence pairs.
        source_tokens, target_tokens: real (non-pad) tokens per side.
        source_slots, target_slots: token slots per side, padding included.
        max_source_slots, max_target_slots: the largest batch, in slots.
        shapes: the distinct `(batch, length)` shapes of `source_ids`.
    """

    num_batches: int
    num_pairs: int
    source_tokens: int
    target_tokens: int
    source_slots: int
    target_slots: int
    max_source_slots: int
    max_target_slots: int
    shapes: Tuple[Tuple[int, int], ...]

    @property
    def padding_fraction(self):
        """Share of all token slots (both sides) that hold padding."""
        slots = self.source_slots + self.target_slots
        return 1.0 - (self.source_tokens + self.target_tokens) / max(slots, 1)


def batch_statistics(dataset, pad_id=0):
    """Iterates a `make_dataset` dataset once and counts tokens and padding.

    Args:
        dataset: yields `({"source_ids", "target_ids"}, labels)` batches.
        pad_id: the padding id.

    Returns:
        A `BatchStatistics`.
    """
    counts = dict(num_batches=0, num_pairs=0, source_tokens=0, target_tokens=0,
                  source_slots=0, target_slots=0, max_source_slots=0,
                  max_target_slots=0)
    shapes = set()
    for inputs, labels in dataset.as_numpy_iterator():
        source, target = inputs["source_ids"], inputs["target_ids"]
        counts["num_batches"] += 1
        counts["num_pairs"] += source.shape[0]
        counts["source_tokens"] += int(np.sum(source != pad_id))
        counts["target_tokens"] += int(np.sum(target != pad_id))
        counts["source_slots"] += source.size
        counts["target_slots"] += target.size
        counts["max_source_slots"] = max(counts["max_source_slots"], source.size)
        counts["max_target_slots"] = max(counts["max_target_slots"], target.size)
        shapes.add(source.shape)
    return BatchStatistics(**counts, shapes=tuple(sorted(shapes)))
