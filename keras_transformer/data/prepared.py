"""A prepared corpus: its folder, manifest and records, read for training.

A prepared folder is written once per corpus by
`keras_transformer.data.preparation.prepare` (the data stage of a
paper-scale run, as `fairseq-preprocess` is) and read by every run that
names it. Layout:

    manifest.json
    spm.model                              the shared vocabulary
    train-00000-of-00041.tfrecord ...      shuffled training pairs
    valid-00000-of-00001.tfrecord          validation pairs, in order
    text/valid.en, text/test.de, ...       only for tfds input (small splits)

Each shard holds one TFRecord per sentence pair, in the layout of
`keras_transformer.data.records` (`record.dtype` in the manifest).

`manifest.json` is written last, so its presence marks a complete
preparation (`is_prepared`): the inputs (path, size, mtime, sha256), the
tokenizer's sha256, per split the pairs read, kept and dropped (and why),
token counts and length histograms, and every shard's pairs, bytes and
sha256. `PreparedCorpus` reads it, checks the shards against it, and
streams the shards into the batches `model.fit` consumes (see
`keras_transformer.data.streaming`); the length histograms give the length
policy's counts and the batch plan without reading a record.
"""

import json
import os
import pathlib

import numpy as np

from keras_transformer import names
from keras_transformer.data.readers import CorpusError
from keras_transformer.files import file_sha256

FORMAT = "keras_transformer.prepared/1"
MANIFEST_FILE = "manifest.json"
TOKENIZER_FILE = names.TOKENIZER_FILE
TEXT_DIR = "text"


class PreparedCorpusError(CorpusError):
    """A prepared folder that is incomplete, damaged or not what a run needs."""


# --- the manifest's statistics -------------------------------------------------------


def _histogram_array(mapping):
    """A manifest histogram `{"length": count}` as an int64 array indexed by length."""
    if not mapping:
        return np.zeros(1, np.int64)
    size = max(int(k) for k in mapping) + 1
    out = np.zeros(size, np.int64)
    for key, value in mapping.items():
        out[int(key)] = value
    return out


def length_policy_counts(split_stats, max_length):
    """A `LengthPolicyCounts` for `max_length` from a manifest split's histograms."""
    from keras_transformer.data.streaming import LengthPolicyCounts

    lengths = split_stats["lengths"]
    source = _histogram_array(lengths["source"])
    target = _histogram_array(lengths["target"])
    pair = _histogram_array(lengths["pair"])
    return LengthPolicyCounts(
        num_pairs=int(pair.sum()), num_over_long=int(pair[max_length + 1:].sum()),
        num_source_over_long=int(source[max_length + 1:].sum()),
        num_target_over_long=int(target[max_length + 1:].sum()),
        source_tokens=int(split_stats["source_tokens"]),
        target_tokens=int(split_stats["target_tokens"]))


# --- reading -------------------------------------------------------------------------


def is_prepared(directory):
    """Whether `directory` holds a complete preparation (its manifest is written last)."""
    return (pathlib.Path(directory) / MANIFEST_FILE).is_file()


class PreparedCorpus:
    """A prepared folder: its manifest, vocabulary, shards and streaming datasets.

    Args:
        directory: a folder written by `prepare`.

    Raises:
        PreparedCorpusError: no readable manifest, or a format this version
            does not read.
    """

    def __init__(self, directory):
        self.directory = pathlib.Path(directory)
        path = self.directory / MANIFEST_FILE
        if not path.is_file():
            raise PreparedCorpusError(
                f"{self.directory} is not a prepared corpus (no {MANIFEST_FILE}); "
                "prepare it with `keras-transformer prepare`")
        try:
            self.manifest = json.loads(path.read_text())
        except ValueError as error:
            raise PreparedCorpusError(f"{path} is not valid JSON ({error}); prepare the "
                                      "corpus again") from None
        if self.manifest.get("format") != FORMAT:
            raise PreparedCorpusError(
                f"{path} has format {self.manifest.get('format')!r}; this version reads "
                f"{FORMAT!r}: prepare the corpus again")

    @property
    def name(self):
        return self.manifest["name"]

    @property
    def vocab_size(self):
        return self.manifest["vocab_size"]

    @property
    def tokenizer_file(self):
        return self.directory / self.manifest["tokenizer"]["file"]

    @property
    def tokenizer_sha256(self):
        return self.manifest["tokenizer"]["sha256"]

    def tokenizer(self):
        from keras_transformer.data.tokenizer import Tokenizer

        return Tokenizer.load(self.tokenizer_file)

    def has_split(self, split):
        return split in self.manifest["splits"]

    def split(self, split):
        """The manifest's statistics of `split` (`train` or `valid`)."""
        try:
            return self.manifest["splits"][split]
        except KeyError:
            raise PreparedCorpusError(f"{self.directory} has no {split} split") from None

    def shard_paths(self, split):
        return [self.directory / shard["file"] for shard in self.split(split)["shards"]]

    def text_paths(self, split):
        """`(source, target)` text files of `valid` or `test`, or `None`."""
        paths = self.manifest["text"].get(split)
        if paths is None:
            return None
        return tuple(self.directory / p if not os.path.isabs(p) else pathlib.Path(p)
                     for p in paths)

    def length_policy(self, split, max_length):
        """`LengthPolicyCounts` of `split` under `max_length` (from the histograms)."""
        return length_policy_counts(self.split(split), max_length)

    def summary(self):
        train = self.split("train")
        shards = train["shards"]
        size = sum(s["bytes"] for s in shards)
        return (f"{train['pairs']:,} training pairs ({train['target_tokens']:,} target "
                f"tokens) in {len(shards)} shard(s), {size / 2**20:.1f} MiB, vocabulary "
                f"{self.manifest['tokenizer']['vocabulary_size']}")

    def check(self, deep=False):
        """Checks that every shard is there with its size (and, `deep`, its sha256).

        Raises:
            PreparedCorpusError: naming the first missing or damaged shard.
        """
        for split, stats in self.manifest["splits"].items():
            for shard in stats["shards"]:
                path = self.directory / shard["file"]
                problem = None
                if not path.is_file():
                    problem = "is missing"
                elif path.stat().st_size != shard["bytes"]:
                    problem = (f"has {path.stat().st_size} bytes, the manifest says "
                               f"{shard['bytes']}")
                elif deep and file_sha256(path) != shard["sha256"]:
                    problem = "is corrupt: its sha256 differs from the manifest's"
                if problem:
                    raise PreparedCorpusError(
                        f"prepared shard {path} {problem}; prepare the corpus again "
                        f"(delete {self.directory} and rerun the command)")
        if not self.tokenizer_file.is_file() or (
                deep and file_sha256(self.tokenizer_file) != self.tokenizer_sha256):
            raise PreparedCorpusError(
                f"the vocabulary {self.tokenizer_file} is missing or differs from the "
                f"manifest's; prepare the corpus again (delete {self.directory})")

    def _source(self, split, sampled):
        """`(shards or views, statistics)` of `split`, or of `sampled`'s training views."""
        if sampled is not None:
            if split != "train":
                raise ValueError("only the training split is sampled")
            return sampled.shard_views(), sampled.split()
        return self.shard_paths(split), self.split(split)

    def dataset(self, split, *, tokens_per_batch, max_length, training, num_replicas=1,
                seed=None, repeat=False, sampled=None, **options):
        """The batches of `split` for `model.fit`; see `streaming.stream_batches`.

        `sampled` (a `sampling.SampledViews`) streams its sampled
        segmentations of the training split instead, a view per epoch.
        """
        from keras_transformer.data import streaming

        shards, stats = self._source(split, sampled)
        return streaming.stream_batches(
            shards, dtype=self.manifest["record"]["dtype"],
            tokens_per_batch=tokens_per_batch, max_length=max_length, training=training,
            num_replicas=num_replicas, seed=seed, repeat=repeat,
            num_pairs=stats["pairs"], **options)

    def stream_position(self, split, batches, *, tokens_per_batch, max_length, training,
                        num_replicas=1, seed=None, sampled=None, **options):
        """`dataset(..., start=...)` that continues after its first `batches` batches."""
        from keras_transformer.data import streaming

        shards, stats = self._source(split, sampled)
        return streaming.stream_position(
            shards, batches, dtype=self.manifest["record"]["dtype"],
            tokens_per_batch=tokens_per_batch, max_length=max_length, training=training,
            num_replicas=num_replicas, seed=seed, num_pairs=stats["pairs"], **options)

    def batch_plan(self, split, *, tokens_per_batch, max_length, training, num_replicas=1,
                   window_size=None, boundaries=None, sampled=None):
        """Expected batches and target tokens of one pass, from the histograms.

        Returns:
            `(num_batches, target_tokens)`: exact for evaluation (one window
            holds the split), the expectation for training.
        """
        from keras_transformer.data import streaming

        _, stats = self._source(split, sampled)
        return streaming.expected_batches(
            _histogram_array(stats["lengths"]["pair"]),
            _histogram_array(stats["lengths"]["pair_target_tokens"]),
            _histogram_array(stats["lengths"]["target"]),
            tokens_per_batch=tokens_per_batch, max_length=max_length, training=training,
            num_replicas=num_replicas, window_size=window_size, boundaries=boundaries)


__all__ = ["FORMAT", "MANIFEST_FILE", "PreparedCorpus", "PreparedCorpusError", "is_prepared",
           "length_policy_counts"]
