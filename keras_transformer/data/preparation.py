"""Preparing a corpus once: shared vocabulary, sharded token-id records, a manifest.

`prepare` is the data stage of a paper-scale run, as `fairseq-preprocess` or
OpenNMT-tf's vocabulary and data steps are: it runs once per corpus and every
training run that names the prepared folder reuses it
(`keras_transformer.data.prepared` reads it; its docstring gives the folder's
layout and record format).

1. It trains the shared SentencePiece model on a random sample of the
   training sentences (`tokenizer_sample`, SentencePiece's
   `input_sentence_size` with `shuffle_input_sentence`), so its memory does
   not grow with the corpus.
2. It encodes every pair once, streaming, chunk by chunk (SentencePiece
   encodes each chunk on all cores), and writes the training pairs to
   `num_shards` TFRecord shards in a seeded random order: each pair goes to
   a random shard, then each shard is shuffled in memory (one shard at a
   time). Reading the shards interleaved with a bounded shuffle buffer is
   then a good global shuffle, even for a corpus that is sorted by origin.
   The validation pairs keep their order in one shard. Pairs with an empty
   side, or a side over 65,535 subwords, are dropped and counted.
3. It writes `manifest.json` last. A preparation is written to a staging
   folder and renamed into place (`files.replace_with_staged`). A write that
   fails (a full disk) raises `PreparationWriteError`, one line naming the
   prepared folder and the file: the staging folder is removed and a
   previous preparation in the folder is left as it was.

`ensure_prepared` prepares only when needed: a preparation is reused while
its inputs (`CorpusInputs`: same paths and contents) and its vocabulary are
those asked for (`stale_reason` says why not).
"""

import contextlib
import dataclasses
import datetime
import json
import logging
import os
import pathlib
import resource
import shutil
import struct
import time

import numpy as np

from keras_transformer.data.prepared import (FORMAT, MANIFEST_FILE, TEXT_DIR, TOKENIZER_FILE,
                                             PreparedCorpus, PreparedCorpusError)
from keras_transformer.data.readers import CorpusError, iter_parallel_lines
from keras_transformer.data.records import SplitStats, record_payloads, write_shard
from keras_transformer.files import (STAGING_PREFIX, WriteError, file_lock, file_sha256,
                                     replace_with_staged, staging_dir)

logger = logging.getLogger("keras_transformer")

# Default shard count: about this many bytes of input text per shard.
BYTES_PER_SHARD = 32 * 2**20
MAX_SHARDS = 1024
# Default sentences sampled for the tokenizer (both languages together).
TOKENIZER_SAMPLE = 2_000_000
ENCODE_CHUNK = 20_000


# --- inputs --------------------------------------------------------------------------


def describe_file(path, *, sha256=True):
    """`{path, size, mtime_ns, sha256}` of an input file (what makes it "the same")."""
    path = pathlib.Path(path).resolve()
    stat = path.stat()
    info = {"path": str(path), "size": stat.st_size, "mtime_ns": stat.st_mtime_ns}
    if sha256:
        info["sha256"] = file_sha256(path)
    return info


def _same_file(recorded, path):
    """Whether `path` still holds the bytes `recorded` describes (sha256 only if needed)."""
    path = pathlib.Path(path).resolve()
    if str(path) != recorded.get("path") or not path.is_file():
        return False
    stat = path.stat()
    if stat.st_size != recorded.get("size"):
        return False
    if stat.st_mtime_ns == recorded.get("mtime_ns"):
        return True
    return file_sha256(path) == recorded.get("sha256")


@dataclasses.dataclass(frozen=True)
class CorpusInputs:
    """What a preparation is made from.

    Attributes:
        name: a short name (`multi30k`, `wmt14`, `demo`), used in folder names.
        train: `(source_path, target_path)` text files, or a `tf.data.Dataset`
            of `(source, target)` scalar strings, or a function returning one
            (e.g. `lambda: load_wmt14("train")`, called only if a preparation
            is needed).
        valid: the same for the validation split, or `None`.
        test: `(source_path, target_path)` text files of the test split, or
            `None`; recorded, not encoded (beam search reads the text).
        key: for dataset inputs, what identifies them (e.g. the tfds name and
            split); files are identified by their contents.
    """

    name: str
    train: object
    valid: object = None
    test: object = None
    key: dict = None

    def files(self):
        """`{split: (source, target)}` of the splits given as text files."""
        return {split: tuple(pathlib.Path(p) for p in value)
                for split, value in (("train", self.train), ("valid", self.valid),
                                     ("test", self.test))
                if isinstance(value, (tuple, list))}


def text_inputs(directory, name=None):
    """`CorpusInputs` of a folder with `{train,valid,test}.{en,de}` (valid/test optional)."""
    directory = pathlib.Path(directory)
    splits = {}
    for split in ("train", "valid", "test"):
        pair = (directory / f"{split}.en", directory / f"{split}.de")
        present = [p.is_file() for p in pair]
        if all(present):
            splits[split] = pair
        elif any(present) or split == "train":
            missing = [str(p) for p, ok in zip(pair, present) if not ok]
            raise FileNotFoundError(
                f"corpus folder {directory} must hold train/valid/test .en/.de files "
                f"(the layout of shared/data/multi30k); missing: {', '.join(missing)}")
    return CorpusInputs(name or directory.resolve().name, splits["train"],
                        splits.get("valid"), splits.get("test"))


# --- writing -------------------------------------------------------------------------


class PreparationWriteError(WriteError):
    """Writing a preparation failed (a full disk); nothing of it was kept.

    One line for the commands: the prepared folder, the reason, the file
    that failed, and what to do. `path` is that file, `what` "preparing
    <folder>".
    """

    def __str__(self):
        return (f"{self.what} failed: {self.reason} (writing {self.path.name}); nothing was "
                "kept. Free space (or fix the folder) and run the same command")


@contextlib.contextmanager
def _writing(path):
    """Turns an `OSError` of the block into a `WriteError` naming `path` (the file written)."""
    try:
        yield
    except WriteError:
        raise
    except OSError as error:
        raise WriteError(path, error) from error


@contextlib.contextmanager
def _failed_write_is_said(output_dir):
    """Turns a `WriteError` of the block into `PreparationWriteError` for `output_dir`."""
    try:
        yield
    except PreparationWriteError:
        raise
    except WriteError as error:
        raise PreparationWriteError(error.path, error.error,
                                    f"preparing {output_dir}") from error


def _close_all(handles, paths):
    """Closes every file of `handles`; raises a `WriteError` for the first that failed."""
    failure = None
    for handle, path in zip(handles, paths):
        try:
            handle.close()
        except OSError as error:
            failure = failure or WriteError(path, error)
    if failure is not None:
        raise failure


def _peak_rss_mib():
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def _iter_pairs(value, what):
    """`(line_number, source, target)` of text files or of a Dataset of string pairs.

    `value` may also be a function returning the Dataset (e.g. `lambda:
    load_wmt14("train")`), called only when the split is read.
    """
    if isinstance(value, (tuple, list)):
        yield from iter_parallel_lines(*value)
        return
    if callable(value) and not hasattr(value, "as_numpy_iterator"):
        value = value()
    for number, (source, target) in enumerate(value.as_numpy_iterator(), start=1):
        yield number, source.decode("utf-8"), target.decode("utf-8")


def _chunks(iterable, size):
    chunk = []
    for item in iterable:
        chunk.append(item)
        if len(chunk) == size:
            yield chunk
            chunk = []
    if chunk:
        yield chunk


class _Encoder:
    """Text pairs to record payloads, with the split's statistics."""

    def __init__(self, processor, dtype):
        self.processor = processor
        self.typecode = "H" if dtype == "uint16" else "i"
        self.threads = os.cpu_count() or 1

    def encode(self, chunk, stats):
        """Record payloads of the kept pairs of `chunk` (a list of (n, src, tgt))."""
        stats.pairs_read += len(chunk)
        kept = [(s, t) for _, s, t in chunk if s.strip() and t.strip()]
        stats.empty_side += len(chunk) - len(kept)
        if not kept:
            return []
        sources = self.processor.encode([s for s, _ in kept], num_threads=self.threads)
        targets = self.processor.encode([t for _, t in kept], num_threads=self.threads)
        return record_payloads(sources, targets, self.typecode, stats)


def _shard_name(split, index, count):
    return f"{split}-{index:05d}-of-{count:05d}.tfrecord"


def _encode_train(pairs, encoder, folder, num_shards, seed, stats):
    """Encodes the training pairs into `num_shards` shuffled shards."""
    rng = np.random.default_rng(seed)
    paths = [folder / f".part-{i:05d}" for i in range(num_shards)]
    parts = []
    try:
        for path in paths:
            with _writing(path):
                parts.append(open(path, "wb"))
        for chunk in _chunks(pairs, ENCODE_CHUNK):
            payloads = encoder.encode(chunk, stats)
            shard = 0
            try:  # around the writes only: an error reading the input is not one
                for payload, shard in zip(payloads,
                                          rng.integers(num_shards, size=len(payloads))):
                    parts[shard].write(struct.pack("<I", len(payload)))
                    parts[shard].write(payload)
            except OSError as error:
                raise WriteError(paths[shard], error) from error
    except BaseException:
        with contextlib.suppress(OSError):
            _close_all(parts, paths)
        raise
    _close_all(parts, paths)  # flushes: a full disk may show only now
    shards = []
    for index in range(num_shards):
        part = folder / f".part-{index:05d}"
        data = part.read_bytes()
        payloads, offset = [], 0
        while offset < len(data):
            (size,) = struct.unpack_from("<I", data, offset)
            payloads.append(data[offset + 4: offset + 4 + size])
            offset += 4 + size
        del data
        rng.shuffle(payloads)
        shards.append(write_shard(folder / _shard_name("train", index, num_shards), payloads))
        part.unlink()
    return shards


def _default_num_shards(train):
    if isinstance(train, (tuple, list)):
        size = sum(pathlib.Path(p).stat().st_size for p in train)
        return max(1, min(MAX_SHARDS, -(-size // BYTES_PER_SHARD)))
    return 64  # a tf.data corpus (WMT14: 4.5M pairs, about 70,000 per shard)


def prepare(inputs, output_dir, *, vocab_size, tokenizer_file=None, num_shards=None,
            seed=0, tokenizer_sample=TOKENIZER_SAMPLE, max_length=None):
    """Prepares a corpus into `output_dir` (replacing what is there); see the module docstring.

    Args:
        inputs: a `CorpusInputs`.
        output_dir: the prepared folder.
        vocab_size: the shared vocabulary's size.
        tokenizer_file: encode with this SentencePiece model instead of
            training one (fine-tuning keeps the vocabulary of its weights).
        num_shards: training shards; default about one per 32 MiB of text.
        seed: seed of the tokenizer sample and of the shard order.
        tokenizer_sample: sentences sampled to train the tokenizer.
        max_length: also report the length policy for this `max_length`
            (any other is computed from the histograms).

    Returns:
        The `PreparedCorpus`.

    Raises:
        PreparationWriteError: a file could not be written (a full disk);
            nothing was kept, a previous preparation is unchanged.
    """
    import sentencepiece

    start = time.time()
    output_dir = pathlib.Path(output_dir)
    # A staging folder beside the result; one a killed `prepare` left is
    # removed by the next one (`files.staging_dir`). A failed write leaves
    # no staging folder, and `output_dir` as it was.
    with _failed_write_is_said(output_dir), contextlib.ExitStack() as stack:
        with _writing(output_dir.parent / f"{STAGING_PREFIX}{output_dir.name}-*"):
            staging = stack.enter_context(staging_dir(output_dir.parent, output_dir.name))
        partial = staging / "corpus"
        with _writing(partial):
            partial.mkdir()
        spm_file = partial / TOKENIZER_FILE
        tokenizer = _vocabulary(inputs, spm_file, vocab_size=vocab_size,
                                tokenizer_file=tokenizer_file, seed=seed,
                                tokenizer_sample=tokenizer_sample)
        processor = sentencepiece.SentencePieceProcessor(model_proto=tokenizer.model_proto)
        dtype = "uint16" if tokenizer.vocabulary_size() <= 2**16 else "int32"
        splits, text = _encode_splits(inputs, _Encoder(processor, dtype), partial,
                                      num_shards=num_shards, seed=seed, max_length=max_length)
        manifest = {
            "format": FORMAT,
            "created": datetime.datetime.now(datetime.timezone.utc).isoformat(
                timespec="seconds"),
            "name": inputs.name,
            "inputs": {"files": {split: [describe_file(p) for p in pair]
                                 for split, pair in inputs.files().items()},
                       "key": inputs.key},
            "vocab_size": vocab_size,
            "tokenizer": {"file": TOKENIZER_FILE, "sha256": file_sha256(spm_file),
                          "vocabulary_size": tokenizer.vocabulary_size(),
                          "given": str(tokenizer_file) if tokenizer_file else None,
                          "sample_sentences": None if tokenizer_file else tokenizer_sample},
            "record": {"dtype": dtype, "layout": "[len(source), source ids..., target "
                       "ids...], subword ids without BOS/EOS, little-endian"},
            "seed": seed,
            "splits": splits,
            "text": text,
            "prepare_seconds": round(time.time() - start, 1),
            "prepare_peak_rss_mib": round(_peak_rss_mib()),
        }
        with _writing(partial / MANIFEST_FILE):
            (partial / MANIFEST_FILE).write_text(json.dumps(manifest, indent=1) + "\n")
        if output_dir.exists():
            logger.info(f"Replacing the previous preparation in {output_dir}")
        with _writing(output_dir):
            replace_with_staged(partial, output_dir)
    corpus = PreparedCorpus(output_dir)
    logger.info(f"Prepared {output_dir} in {time.time() - start:.0f} s: {corpus.summary()}")
    return corpus


def _vocabulary(inputs, spm_file, *, vocab_size, tokenizer_file, seed, tokenizer_sample):
    """`prepare`'s shared vocabulary in `spm_file`: `tokenizer_file` copied, or trained.

    Returns:
        The `Tokenizer`.
    """
    from keras_transformer.data.tokenizer import Tokenizer, train_tokenizer

    if tokenizer_file is not None:
        with _writing(spm_file):
            shutil.copyfile(tokenizer_file, spm_file)
        logger.info(f"Encoding with the given vocabulary {tokenizer_file}")
        return Tokenizer.load(spm_file)
    start = time.time()
    failures = []

    def sentences():
        # SentencePiece turns an exception of its input iterator into a
        # multi-line RuntimeError: keep ours, stop, raise it after.
        try:
            for _, source, target in _iter_pairs(inputs.train, "train"):
                for text in (source, target):
                    if text.strip():
                        yield text
        except CorpusError as error:
            failures.append(error)

    try:
        # Its input is read through `sentences`: an OSError is writing spm_file.
        with _writing(spm_file):
            tokenizer = train_tokenizer(
                [p for p in inputs.files().get("train", ())], vocab_size, spm_file,
                max_sentences=tokenizer_sample, seed=seed, sentences=sentences())
    except ValueError as error:
        if failures:
            raise failures[0] from None
        raise PreparedCorpusError(f"--vocab-size {vocab_size}: {error}") from None
    if failures:
        raise failures[0]
    logger.info(f"Trained the shared vocabulary ({tokenizer.vocabulary_size()} ids) "
                f"on a sample of at most {tokenizer_sample:,} sentences in "
                f"{time.time() - start:.0f} s")
    return tokenizer


def _encode_splits(inputs, encoder, partial, *, num_shards, seed, max_length):
    """`prepare`'s shards (training, validation) and the text files kept for BLEU.

    Returns:
        `(splits, text)`: the manifest's `splits` and `text` entries.
    """
    splits, text = {}, {}
    start = time.time()
    train_stats = SplitStats()
    num_shards = num_shards or _default_num_shards(inputs.train)
    shards = _encode_train(_iter_pairs(inputs.train, "train"), encoder, partial,
                           num_shards, seed, train_stats)
    splits["train"] = {**train_stats.to_dict(max_length), "shards": shards}
    if splits["train"]["pairs"] == 0:
        raise PreparedCorpusError("the training split has no pair with two non-empty sides")
    logger.info(f"Encoded {splits['train']['pairs']:,} training pairs into "
                f"{num_shards} shard(s) in {time.time() - start:.0f} s")
    if inputs.valid is not None:
        valid_stats = SplitStats()
        payloads = [p for chunk in _chunks(_iter_pairs(inputs.valid, "valid"), ENCODE_CHUNK)
                    for p in encoder.encode(chunk, valid_stats)]
        shard = write_shard(partial / _shard_name("valid", 0, 1), payloads)
        splits["valid"] = {**valid_stats.to_dict(max_length), "shards": [shard]}
    for split in ("valid", "test"):
        value = getattr(inputs, split)
        if isinstance(value, (tuple, list)):
            text[split] = [str(pathlib.Path(p).resolve()) for p in value]
        elif value is not None:  # a Dataset: keep its (small) text for BLEU
            from keras_transformer.data.readers import write_parallel_text

            paths = [f"{TEXT_DIR}/{split}.en", f"{TEXT_DIR}/{split}.de"]
            with _writing(partial / TEXT_DIR / f"{split}.{{en,de}}"):
                (partial / TEXT_DIR).mkdir(exist_ok=True)
                write_parallel_text(((s, t) for _, s, t in _iter_pairs(value, split)),
                                    *(partial / n for n in paths))
            text[split] = paths
    return splits, text


def stale_reason(output_dir, inputs, *, vocab_size, tokenizer_file=None):
    """Why `output_dir` is not a current preparation of `inputs`, or `None` if it is."""
    output_dir = pathlib.Path(output_dir)
    manifest_path = output_dir / MANIFEST_FILE
    if not manifest_path.is_file():
        return "not prepared yet"
    try:
        manifest = json.loads(manifest_path.read_text())
    except (OSError, ValueError) as error:
        return f"its {MANIFEST_FILE} is unreadable ({error})"
    if manifest.get("format") != FORMAT:
        return f"it has format {manifest.get('format')!r}, this version writes {FORMAT!r}"
    if tokenizer_file is None and manifest.get("vocab_size") != vocab_size:
        return (f"it was prepared with vocabulary size {manifest.get('vocab_size')}, "
                f"now {vocab_size} is asked for")
    if tokenizer_file is not None and (manifest["tokenizer"]["sha256"]
                                       != file_sha256(tokenizer_file)):
        return f"it was encoded with another vocabulary than {tokenizer_file}"
    recorded = manifest["inputs"]["files"]
    files = {split: [str(p) for p in pair] for split, pair in inputs.files().items()}
    if set(recorded) != set(files):
        return f"its splits {sorted(recorded)} differ from the input's {sorted(files)}"
    for split, pair in inputs.files().items():
        for info, path in zip(recorded[split], pair):
            if not _same_file(info, path):
                return f"{path} changed since it was prepared"
    if (manifest["inputs"].get("key") or None) != (inputs.key or None):
        return f"it was prepared from {manifest['inputs'].get('key')}, not {inputs.key}"
    return None


def default_directory(root, inputs, vocab_size, tokenizer_file=None):
    """`<root>/<corpus>_v<vocab_size>`, or `<root>/<corpus>_spm-<hash>` for a given vocabulary.

    Where `train --data` and `prepare` put a preparation unless told.
    """
    root = pathlib.Path(root)
    if tokenizer_file is not None:
        return root / f"{inputs.name}_spm-{file_sha256(tokenizer_file)[:10]}"
    return root / f"{inputs.name}_v{vocab_size}"


def ensure_prepared(inputs, output_dir, *, vocab_size, tokenizer_file=None, verify=False,
                    **options):
    """The `PreparedCorpus` of `inputs` in `output_dir`, prepared (again) only when needed.

    A preparation is reused when its inputs are unchanged (same paths and
    contents) and it has the vocabulary asked for; otherwise it is prepared
    again and the log says why. Two processes never prepare the same folder
    at once (a lock file beside it). The corpus's `reused` attribute says
    which happened; `verify=True` checks a reused one's shards by sha256.
    """
    output_dir = pathlib.Path(output_dir)
    lock = output_dir.parent / f".{output_dir.name}.lock"
    with contextlib.ExitStack() as stack:
        # So that two processes never prepare the same folder at once.
        with _failed_write_is_said(output_dir), _writing(lock):
            stack.enter_context(file_lock(
                lock, waiting=f"Waiting for another process preparing {output_dir} ..."))
        reason = stale_reason(output_dir, inputs, vocab_size=vocab_size,
                              tokenizer_file=tokenizer_file)
        shards = options.get("num_shards")
        if reason is None and shards and shards != len(
                PreparedCorpus(output_dir).split("train")["shards"]):
            reason = f"{shards} shards are asked for"
        if reason is None:
            corpus = PreparedCorpus(output_dir)
            corpus.check(deep=verify)
            logger.info(f"Using the prepared corpus {output_dir}: {corpus.summary()}")
            corpus.reused = True
            return corpus
        logger.info(f"Preparing {inputs.name} into {output_dir} ({reason})")
        corpus = prepare(inputs, output_dir, vocab_size=vocab_size,
                         tokenizer_file=tokenizer_file, **options)
        corpus.reused = False
        return corpus


__all__ = ["CorpusInputs", "PreparationWriteError", "default_directory", "describe_file",
           "ensure_prepared", "prepare", "stale_reason", "text_inputs"]
