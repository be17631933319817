"""Which corpus `--data` names, its preparation, and the datasets a run trains on.

    corpus = prepare_corpus("demo", vocab_size=4000, max_length=64)
    train_ds, valid_ds, tokens_per_update = training_datasets(
        corpus, tokens_per_batch=4096, max_length=64)

`--data` is `demo` (generated offline), `wmt14` (tensorflow-datasets), a
folder of `{train,valid,test}.{en,de}` text files, or a folder written by
`prepare`. Text is prepared once into `PREPARED_ROOT/<corpus>_v<vocab>` (or
`_spm-<hash>` for a given vocabulary), the one place both `keras-transformer
prepare` and `train` look, whatever the run's `--output-dir`, and reused
until an input file or the vocabulary size changes.
"""

import itertools
import logging
import pathlib
import time

from keras_transformer import names
from keras_transformer.data import preparation, prepared

logger = logging.getLogger("keras_transformer")

PREPARED_ROOT = pathlib.Path(names.PREPARED_ROOT)


def corpus_inputs(data, work_dir=None, *, seed=0):
    """The `preparation.CorpusInputs` that `--data` names.

    Args:
        data: `"demo"` (generated offline, see `keras_transformer.data.demo`),
            `"wmt14"` (tensorflow-datasets; needs internet the first time), or
            a folder with `{train,valid,test}.{en,de}`.
        work_dir: where the demo corpus's text goes (default `PREPARED_ROOT`).
        seed: demo corpus seed.
    """
    if data == "demo":
        from keras_transformer.data.demo import write_demo_corpus

        directory = pathlib.Path(work_dir or PREPARED_ROOT) / f"demo-seed{seed}"
        if not (directory / "test.de").exists():
            write_demo_corpus(directory, seed=seed)
        inputs = preparation.text_inputs(directory, name=f"demo-seed{seed}")
    elif data == "wmt14":
        from keras_transformer.data.readers import WMT14_NAME, load_wmt14

        # tfds names: train (4.5M pairs), validation (newstest2013), test
        # (newstest2014). Loaded only when a preparation is needed.
        inputs = preparation.CorpusInputs(
            "wmt14", train=lambda: load_wmt14("train"),
            valid=lambda: load_wmt14("validation"), test=lambda: load_wmt14("test"),
            key={"tfds": WMT14_NAME, "splits": ["train", "validation", "test"]})
    else:
        inputs = preparation.text_inputs(data)
    missing = [split for split in ("valid", "test") if getattr(inputs, split) is None]
    if missing:
        raise FileNotFoundError(
            f"corpus folder {data} must hold train/valid/test .en/.de files (the layout "
            f"of shared/data/multi30k); missing: {', '.join(missing)}")
    return inputs


def default_prepared_dir(inputs, vocab_size, tokenizer_file=None, root=None):
    """`<root>/<corpus>_v<vocab>` (or `_spm-<hash>` for a given vocabulary); root `PREPARED_ROOT`."""
    return preparation.default_directory(root or PREPARED_ROOT, inputs, vocab_size,
                                      tokenizer_file)


def prepare_corpus(data, *, vocab_size, max_length=None, prepared_dir=None,
                   tokenizer_file=None, tokenizer_from_default=False, seed=0):
    """The `PreparedCorpus` that `--data` names, prepared now only when needed.

    A prepared folder is used as it is (its vocabulary size must be
    `vocab_size`). Text (demo, wmt14, a folder) is prepared into
    `prepared_dir` (default `default_prepared_dir`) the first time and
    reused afterwards; a changed input file or vocabulary size prepares it
    again. The preparation belongs to the corpus, not to a run: its
    tokenizer sample and shard order use `prepare`'s default seed, so runs
    with any seed share it.

    Args:
        data: see `corpus_inputs`, or a prepared folder.
        vocab_size: the vocabulary size.
        max_length: reported by the length policy of the preparation.
        prepared_dir: where to prepare text (default `default_prepared_dir`).
        tokenizer_file: a SentencePiece model the corpus must be encoded with
            (a continued run's, or the one of the weights a run fine-tunes);
            `None` trains one.
        tokenizer_from_default: `tokenizer_file` came from the default
            preparation (a continued run's own): that folder is reused as it
            is while it is up to date, instead of a folder of its own.
        seed: the demo corpus's seed.

    Raises:
        prepared.PreparedCorpusError: a prepared folder of another vocabulary
            size, a corpus without valid and test splits, or a damaged
            preparation.
    """
    if prepared.is_prepared(data):
        corpus = prepared.PreparedCorpus(data)
        corpus.check()
        if corpus.vocab_size != vocab_size:
            raise prepared.PreparedCorpusError(
                f"--vocab-size {vocab_size}: the prepared corpus {data} has vocabulary "
                f"size {corpus.vocab_size}; prepare it again with --vocab-size "
                f"{vocab_size}, or leave the flag out")
        logger.info(f"Prepared corpus {data}: {corpus.summary()}")
    else:
        inputs = corpus_inputs(data, seed=seed)
        named = None if tokenizer_from_default else tokenizer_file
        directory = prepared_dir or default_prepared_dir(inputs, vocab_size, named)
        if tokenizer_from_default and preparation.stale_reason(
                directory, inputs, vocab_size=vocab_size) is None:
            tokenizer_file = None  # the usual case: the vocabulary came from there
        corpus = preparation.ensure_prepared(inputs, directory, vocab_size=vocab_size,
                                          tokenizer_file=tokenizer_file,
                                          max_length=max_length)
    if not corpus.has_split("valid") or corpus.text_paths("test") is None:
        raise prepared.PreparedCorpusError(
            f"the prepared corpus {corpus.directory} has no valid and test splits; "
            "training needs both")
    return corpus


def training_datasets(corpus, *, tokens_per_batch, max_length, num_replicas=1,
                      grad_accum_steps=1, seed=0, bucket_multiple=8, sampled=None,
                      start_update=0):
    """Training and validation `tf.data` pipelines streamed from a corpus's shards.

    Token counts come from the manifest: nothing is read before the first
    update.

    Args:
        corpus: a `prepared.PreparedCorpus`.
        tokens_per_batch: token slots of one micro-batch, over all replicas.
        max_length: the length policy's limit.
        num_replicas: batch sizes are multiples of this.
        grad_accum_steps: micro-batches per update (for the token count and
            the position of a continued run).
        seed: the training order's seed.
        bucket_multiple: the length buckets' bounds are multiples of this
            (`streaming.bucket_boundaries`).
        sampled: a `sampling.SampledViews`: train on its sampled
            segmentations (validation keeps the deterministic one).
        start_update: the updates already trained: the training stream
            continues where a run that did them stopped, batch for batch.

    Returns:
        `(train_ds, valid_ds, target_tokens_per_update)`.
    """
    import tensorflow as tf

    from keras_transformer.data.streaming import bucket_boundaries

    common = dict(tokens_per_batch=tokens_per_batch, max_length=max_length,
                  num_replicas=num_replicas,
                  boundaries=bucket_boundaries(max_length, multiple=bucket_multiple))
    counts = prepared.length_policy_counts(
        sampled.split() if sampled else corpus.split("train"), max_length)
    logger.info(f"Training pairs: {counts.num_pairs:,}; the length policy (max "
                f"{max_length} tokens) drops {counts.num_over_long:,}"
                + (" of the first sampled segmentation" if sampled else ""))
    start = (0, 0)
    if start_update:
        begin = time.time()
        start = corpus.stream_position("train", start_update * grad_accum_steps,
                                       training=True, seed=seed, sampled=sampled, **common)
        logger.info(f"The training stream continues at epoch {start[0]}, after its "
                    f"first {start[1]} batches (counted in {time.time() - begin:.1f} s)")
    train_ds = corpus.dataset("train", training=True, repeat=True, seed=seed,
                              sampled=sampled, start=start, **common)
    batches, target_tokens = corpus.batch_plan("train", training=True, sampled=sampled,
                                               **common)
    # A known number of validation batches: without it Keras warns that the
    # input "ran out of data".
    valid_batches, _ = corpus.batch_plan("valid", training=False, **common)
    valid_ds = corpus.dataset("valid", training=False, **common).apply(
        tf.data.experimental.assert_cardinality(valid_batches))
    return train_ds, valid_ds, target_tokens / max(batches, 1) * grad_accum_steps


def validation_sample(corpus, count):
    """The first `count` validation pairs with two non-empty sides, as (sources, references)."""
    from keras_transformer.data.readers import iter_parallel_lines

    if not count:
        return (), ()
    pairs = ((s, t) for _, s, t in iter_parallel_lines(*corpus.text_paths("valid"))
             if s.strip() and t.strip())
    sample = list(itertools.islice(pairs, count))
    return [s for s, _ in sample], [t for _, t in sample]
