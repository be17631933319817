"""Token-id records: their layout, the shards that hold them, and their statistics.

One TFRecord per sentence pair, whose payload is little-endian `uint16`
(`int32` for vocabularies over 65,536 ids):
`[len(source), source ids..., target ids...]`, subword ids without BOS/EOS.
A pair with a side over 65,535 subwords has no such record: it is dropped
and counted. `keras_transformer.data.preparation` writes the shards of a
prepared corpus with them, `keras_transformer.data.sampling` its sampled
segmentations, and `keras_transformer.data.streaming` decodes them.
`SplitStats` counts a split's pairs, tokens and length histograms as they
are written, for the manifest (`keras_transformer.data.prepared` reads it).
"""

import array
import dataclasses
import errno
import os

import numpy as np

from keras_transformer.data.prepared import length_policy_counts
from keras_transformer.files import WriteError, file_sha256

MAX_SIDE_LENGTH = 2**16 - 1  # subwords of one side: its length is a uint16


def _histogram_dict(counts):
    return {str(i): int(c) for i, c in enumerate(counts) if c}


class SplitStats:
    """Counts of one split while it is encoded: pairs, drops, tokens, length histograms."""

    def __init__(self):
        self.pairs_read = 0
        self.empty_side = 0
        self.too_long_for_record = 0
        self.source_tokens = 0
        self.target_tokens = 0
        # Lengths count EOS (BOS on the target input side): len(ids) + 1.
        self.source_lengths = np.zeros(1, np.int64)
        self.target_lengths = np.zeros(1, np.int64)
        # By pair length max(source, target): pairs and target tokens.
        self.pair_lengths = np.zeros(1, np.int64)
        self.pair_target_tokens = np.zeros(1, np.int64)

    @staticmethod
    def _add(total, values, weights=None):
        counts = np.bincount(values, weights=weights).astype(np.int64)
        if len(counts) > len(total):
            total = np.concatenate([total, np.zeros(len(counts) - len(total), np.int64)])
        total[:len(counts)] += counts
        return total

    def add(self, source_lengths, target_lengths):
        """Counts the kept pairs of these lengths (EOS counted: `len(ids) + 1`)."""
        source_lengths = np.asarray(source_lengths, np.int64)
        target_lengths = np.asarray(target_lengths, np.int64)
        pair = np.maximum(source_lengths, target_lengths)
        self.source_tokens += int(source_lengths.sum())
        self.target_tokens += int(target_lengths.sum())
        self.source_lengths = self._add(self.source_lengths, source_lengths)
        self.target_lengths = self._add(self.target_lengths, target_lengths)
        self.pair_lengths = self._add(self.pair_lengths, pair)
        self.pair_target_tokens = self._add(self.pair_target_tokens, pair, target_lengths)

    def to_dict(self, max_length):
        """The manifest's entry of the split; with its length policy when `max_length`."""
        pairs = int(self.pair_lengths.sum())
        stats = {
            "pairs_read": self.pairs_read, "pairs": pairs,
            "dropped": {"empty_side": self.empty_side,
                        "side_over_65535_subwords": self.too_long_for_record},
            "source_tokens": self.source_tokens, "target_tokens": self.target_tokens,
            "lengths": {"source": _histogram_dict(self.source_lengths),
                        "target": _histogram_dict(self.target_lengths),
                        "pair": _histogram_dict(self.pair_lengths),
                        "pair_target_tokens": _histogram_dict(self.pair_target_tokens)},
        }
        if max_length:
            stats["length_policy"] = dict(max_length=max_length, **dataclasses.asdict(
                length_policy_counts(stats, max_length)))
        return stats


def record_payloads(sources, targets, typecode, stats):
    """Record payloads of encoded pairs (the module docstring's layout), counted in `stats`.

    Args:
        sources, targets: aligned lists of subword-id lists.
        typecode: `array` typecode of the ids, `"H"` (uint16) or `"i"` (int32).
        stats: the split's `SplitStats`; pairs with a side over 65,535
            subwords are dropped and counted there.
    """
    payloads, source_lengths, target_lengths = [], [], []
    for source, target in zip(sources, targets):
        if len(source) > MAX_SIDE_LENGTH or len(target) > MAX_SIDE_LENGTH:
            stats.too_long_for_record += 1
            continue
        record = array.array(typecode, [len(source)])
        record.extend(source)
        record.extend(target)
        payloads.append(record.tobytes())
        source_lengths.append(len(source) + 1)
        target_lengths.append(len(target) + 1)
    stats.add(source_lengths, target_lengths)
    return payloads


def write_shard(path, payloads):
    """Writes `payloads` as the TFRecord file `path`; returns its manifest entry.

    The shard is written inside its preparation's staging folder, which is
    renamed into place once complete.

    Returns:
        `{"file", "pairs", "bytes", "sha256"}` of the shard.

    Raises:
        WriteError: the file could not be written (a full disk: TensorFlow's
            `ResourceExhaustedError`, said as the `OSError` it stands for).
    """
    import tensorflow as tf

    try:
        with tf.io.TFRecordWriter(str(path)) as writer:
            for payload in payloads:
                writer.write(payload)
    except (OSError, tf.errors.OpError) as error:
        raise WriteError(path, tf_os_error(error)) from error
    return {"file": path.name, "pairs": len(payloads), "bytes": path.stat().st_size,
            "sha256": file_sha256(path)}


def tf_os_error(error):
    """The `OSError` a TensorFlow file error stands for (an `OSError` is returned as is).

    TensorFlow's file errors read "<path>; <reason>" (e.g. "...tfrecord; No
    space left on device"): the reason, with its errno when it is the
    system's text for one (`ENOSPC` for a full disk).
    """
    if isinstance(error, OSError):
        return error
    message = (getattr(error, "message", None) or str(error) or type(error).__name__)
    message = message.splitlines()[0]
    path, _, reason = message.partition("; ")
    if not reason or os.sep not in path:
        path, reason = None, message
    number = next((n for n in sorted(errno.errorcode) if os.strerror(n) == reason), None)
    return OSError(number, reason, path) if number else OSError(reason)


__all__ = ["MAX_SIDE_LENGTH", "SplitStats", "record_payloads", "tf_os_error", "write_shard"]
