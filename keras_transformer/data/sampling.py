"""Sampled segmentations of a prepared corpus's training pairs (subword regularization).

Subword regularization (Kudo 2018) trains on a different segmentation of a
sentence each time it is seen; for a BPE vocabulary, as ours is, the sample
is BPE-dropout (Provilkov et al. 2020): each merge is skipped with
probability `alpha` (0.1 is the usual value; 1.0 leaves single characters).
Decoding, validation, the test score and every export keep the single best
segmentation.

SentencePiece samples with a seed (`set_random_generator_seed`), but
TensorFlow Text's in-graph sampler takes none, and a continued run must read
the stream an uninterrupted one reads. So the samples are written once, from a
seed: `ensure_sampled` writes `views` sampled encodings of every training
pair of a prepared corpus (its shards decoded back to text, SentencePiece's
normalised text, and encoded again with sampling, source and target), in the
same shards and record order as the deterministic ones, into a folder of the
preparation:

    sampled_alpha0.1_views32_seed0/
        manifest.json                      alpha, views, seed, per-view statistics
        train-v000-00000-of-00001.tfrecord ...

Epoch `e` of the training stream reads view `e mod views`
(`streaming.stream_batches`). Each shard is read and decoded once; each view of
it is encoded on one core, so the time to write grows with `views` times the
corpus (`examples/benchmark_data.py` measures it; the figures, and why a
WMT14-size corpus takes a few views, are in docs/results.md). Views stream
from disk like the shards, at any corpus size, and take `views` times the
training shards' space. The folder is removed with the preparation it
belongs to.
"""

import array
import json
import logging
import pathlib
import time

import numpy as np

from keras_transformer.data.prepared import PreparedCorpusError
from keras_transformer.data.records import SplitStats, record_payloads, write_shard
from keras_transformer.files import file_lock, replace_with_staged, staging_dir

logger = logging.getLogger("keras_transformer")

FORMAT = "keras_transformer.sampled/1"
MANIFEST_FILE = "manifest.json"
DEFAULT_VIEWS = 32


SIDES = ("both", "source")


def folder_name(alpha, views, seed, sides="both"):
    side = "" if sides == "both" else f"_{sides}"
    return f"sampled_alpha{alpha:g}{side}_views{views}_seed{seed}"


def check_alpha(alpha):
    """Raises `ValueError` unless `0 < alpha < 1` (1 would leave single characters)."""
    if isinstance(alpha, bool) or not isinstance(alpha, (int, float)) or not 0 < alpha < 1:
        raise ValueError(f"the sampling alpha must be a number between 0 and 1 (0.1 is "
                         f"usual; 1 leaves single characters), received {alpha!r}")


class SampledViews:
    """A folder written by `ensure_sampled`: `views` sampled encodings of the training split.

    Args:
        directory: the folder.
    """

    def __init__(self, directory):
        self.directory = pathlib.Path(directory)
        self.manifest = json.loads((self.directory / MANIFEST_FILE).read_text())

    @property
    def alpha(self):
        return self.manifest["alpha"]

    def shard_views(self):
        """The shards of every view: a list of `views` lists."""
        return [[self.directory / shard["file"] for shard in view["shards"]]
                for view in self.manifest["views"]]

    def split(self):
        """The statistics of view 0, as `PreparedCorpus.split("train")` gives them."""
        return self.manifest["views"][0]

    def summary(self):
        tokens = [view["target_tokens"] for view in self.manifest["views"]]
        return (f"{len(tokens)} sampled segmentations (alpha {self.alpha:g}), "
                f"{sum(tokens) / len(tokens):,.0f} target tokens each on average")


def _matches(directory, corpus):
    """Whether `directory` holds complete views of `corpus`'s current training shards."""
    path = directory / MANIFEST_FILE
    if not path.is_file():
        return False
    try:
        manifest = json.loads(path.read_text())
    except ValueError:
        return False
    return (manifest.get("format") == FORMAT
            and manifest.get("tokenizer_sha256") == corpus.tokenizer_sha256
            and manifest.get("base_shards") == [
                s["sha256"] for s in corpus.split("train")["shards"]])


def _read_texts(path, processor, typecode):
    """The (SentencePiece-normalised) source and target texts of one shard, in order."""
    import tensorflow as tf

    sources, targets = [], []
    for batch in tf.data.TFRecordDataset(str(path)).batch(8192).as_numpy_iterator():
        for payload in batch:
            ids = array.array(typecode)
            ids.frombytes(payload)
            length = ids[0]
            sources.append(ids[1:1 + length].tolist())
            targets.append(ids[1 + length:].tolist())
    return processor.decode(sources), processor.decode(targets)


def _sample_shard(texts, processor, alpha, typecode, stats, sides="both"):
    """Record payloads of one shard's texts encoded with sampling (same layout and order).

    `sides="source"` samples the source only; the target keeps the best
    segmentation, the one the decoder must produce.
    """
    options = dict(enable_sampling=True, alpha=alpha, nbest_size=-1, num_threads=1)
    sources = processor.encode(texts[0], **options)
    targets = processor.encode(texts[1], **(options if sides == "both" else {}))
    stats.pairs_read += len(sources)
    return record_payloads(sources, targets, typecode, stats)


def _write_views(corpus, folder, *, alpha, views, seed, sides):
    """Every view of every shard; each base shard is read and decoded once."""
    import sentencepiece

    processor = sentencepiece.SentencePieceProcessor(model_file=str(corpus.tokenizer_file))
    typecode = "H" if corpus.manifest["record"]["dtype"] == "uint16" else "i"
    base = corpus.shard_paths("train")
    stats = [SplitStats() for _ in range(views)]
    shards = [[] for _ in range(views)]
    for index, path in enumerate(base):
        texts = _read_texts(path, processor, typecode)
        for view in range(views):
            # One thread, seeded per view and shard: the samples depend on the
            # seed only (SentencePiece's generator is per thread).
            sentencepiece.set_random_generator_seed(int(
                np.random.SeedSequence([seed, view, index]).generate_state(1)[0]))
            payloads = _sample_shard(texts, processor, alpha, typecode, stats[view], sides)
            name = f"train-v{view:03d}-{index:05d}-of-{len(base):05d}.tfrecord"
            shards[view].append(write_shard(folder / name, payloads))
    return [{**stat.to_dict(None), "shards": shard} for stat, shard in zip(stats, shards)]


def ensure_sampled(corpus, *, alpha, views=DEFAULT_VIEWS, seed=0, sides="both"):
    """The `SampledViews` of `corpus` for `(alpha, views, seed, sides)`, written now only if missing.

    Args:
        corpus: a `prepared.PreparedCorpus`.
        alpha: BPE-dropout probability (`0 < alpha < 1`).
        views: sampled encodings written; epoch `e` reads view `e mod views`.
        seed: the samples' seed.
        sides: `"both"` samples source and target, `"source"` the source only.

    Raises:
        PreparedCorpusError: the views cannot be written there.
    """
    check_alpha(alpha)
    if not isinstance(views, int) or isinstance(views, bool) or views < 1:
        raise ValueError(f"the number of sampled views must be a positive integer, "
                         f"received {views!r}")
    if sides not in SIDES:
        raise ValueError(f"sides must be one of {', '.join(SIDES)}, received {sides!r}")
    directory = corpus.directory / folder_name(alpha, views, seed, sides)
    try:
        with file_lock(corpus.directory / f".{directory.name}.lock",
                       waiting=f"Waiting for another process writing {directory} ..."):
            if _matches(directory, corpus):
                views_ = SampledViews(directory)
                logger.info(f"Using {directory}: {views_.summary()}")
                return views_
            start = time.time()
            logger.info(f"Writing {views} sampled segmentations (BPE-dropout, alpha "
                        f"{alpha:g}, seed {seed}, {sides} side(s)) of the training pairs "
                        f"into {directory}")
            with staging_dir(corpus.directory, directory.name) as staging:
                partial = staging / "views"
                partial.mkdir()
                written = _write_views(corpus, partial, alpha=alpha, views=views, seed=seed,
                                       sides=sides)
                manifest = {
                    "format": FORMAT, "alpha": alpha, "seed": seed, "sides": sides,
                    "tokenizer_sha256": corpus.tokenizer_sha256,
                    "base_shards": [s["sha256"] for s in corpus.split("train")["shards"]],
                    "views": written, "seconds": round(time.time() - start, 1),
                }
                (partial / MANIFEST_FILE).write_text(json.dumps(manifest, indent=1) + "\n")
                replace_with_staged(partial, directory)
    except OSError as error:
        raise PreparedCorpusError(
            f"cannot write the sampled segmentations into {corpus.directory} ({error}); "
            "prepare the corpus into a writable folder (--prepared-dir)") from None
    views_ = SampledViews(directory)
    logger.info(f"Wrote {views_.summary()} in {time.time() - start:.0f} s")
    return views_


__all__ = ["DEFAULT_VIEWS", "SIDES", "SampledViews", "check_alpha", "ensure_sampled"]
