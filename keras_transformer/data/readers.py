"""Readers of sentence-aligned parallel text: local files and WMT14 via tfds.

A parallel corpus is two UTF-8 files, one sentence per line, line i of the
source file translating line i of the target file (the layout of Multi30k,
the WMT test sets and the demo corpus). `load_parallel_text` reads such a
pair and refuses input that would silently misalign or corrupt it.
`load_wmt14` reads the paper's WMT 2014 English-German data through
tensorflow-datasets.
"""

import dataclasses
import gzip
import logging
import pathlib
import socket
from typing import Tuple

import tensorflow as tf

logger = logging.getLogger(__name__)

_GZIP_MAGIC = b"\x1f\x8b"
WMT14_NAME = "wmt14_translate/de-en"
# Where tfds downloads WMT14 from (checked before a download is attempted).
_WMT14_HOST = "www.statmt.org"


class CorpusError(ValueError):
    """Input text that cannot be read as an aligned corpus (names file and line)."""


@dataclasses.dataclass(frozen=True)
class ParallelText:
    """Aligned sentence pairs read from two files.

    A sequence of `(source, target)` string pairs. Pairs with an empty (or
    whitespace-only) line on either side are not in it; `dropped_lines` holds
    their 1-based line numbers.

    Attributes:
        source: the source sentences.
        target: the target sentences, aligned with `source`.
        source_path, target_path: the files read.
        dropped_lines: 1-based line numbers of the pairs dropped because a
            side was empty.
    """

    source: Tuple[str, ...]
    target: Tuple[str, ...]
    source_path: str = None
    target_path: str = None
    dropped_lines: Tuple[int, ...] = ()

    def __len__(self):
        return len(self.source)

    def __getitem__(self, index):
        return self.source[index], self.target[index]

    def __iter__(self):
        return zip(self.source, self.target)


def _open_binary(path):
    with open(path, "rb") as f:
        magic = f.read(2)
    if magic == _GZIP_MAGIC:
        return gzip.open(path, "rb")
    return open(path, "rb")


def iter_lines(path):
    """Yields `(line_number, text)` for each line of a UTF-8 text file.

    Lines end at `\\n` only (so U+2028 and other Unicode separators stay inside
    their line); a `\\r` before it (CRLF) and a UTF-8 byte-order mark at the
    start are removed. Gzipped files are recognised by their magic bytes.

    Args:
        path: the file.

    Raises:
        CorpusError: the file is empty, is a broken gzip file, or holds bytes
            that are not UTF-8 (the message gives the line and byte column).
    """
    path = pathlib.Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"corpus file not found: {path}")
    line_number = 0
    try:
        with _open_binary(path) as f:
            for line_number, raw in enumerate(f, start=1):
                if raw.endswith(b"\n"):
                    raw = raw[:-1]
                if raw.endswith(b"\r"):
                    raw = raw[:-1]
                if line_number == 1 and raw.startswith(b"\xef\xbb\xbf"):
                    raw = raw[3:]
                try:
                    text = raw.decode("utf-8")
                except UnicodeDecodeError as error:
                    raise CorpusError(
                        f"{path}, line {line_number}, byte {error.start + 1}: "
                        f"not UTF-8 ({raw[error.start:error.start + 4]!r}); "
                        "convert the file to UTF-8 (e.g. iconv -f latin1 -t utf-8)"
                    ) from None
                yield line_number, text
    except (OSError, EOFError, gzip.BadGzipFile) as error:
        if isinstance(error, FileNotFoundError):
            raise
        raise CorpusError(
            f"{path}, line {line_number + 1}: cannot read the file ({error})"
        ) from None
    if line_number == 0:
        raise CorpusError(f"{path} is empty: expected one sentence per line")



def iter_parallel_lines(source_path, target_path):
    """Yields `(line_number, source, target)` for every line of two aligned files.

    The streaming form of `load_parallel_text`: the same checks (UTF-8,
    equal line counts, gzip, CRLF), nothing held in memory. Lines with an
    empty side are yielded too; the caller decides what to do with them.

    Raises:
        CorpusError: as `load_parallel_text`, when the reader reaches the
            problem.
    """
    source_path, target_path = pathlib.Path(source_path), pathlib.Path(target_path)
    source_lines, target_lines = iter_lines(source_path), iter_lines(target_path)
    while True:
        source_item = next(source_lines, None)
        target_item = next(target_lines, None)
        if source_item is None and target_item is None:
            return
        if source_item is None or target_item is None:
            short, long_ = ((source_path, target_path) if source_item is None
                            else (target_path, source_path))
            line_number = (target_item or source_item)[0]
            raise CorpusError(
                f"{short} has {line_number - 1} lines but {long_} has more: "
                f"{long_}, line {line_number} has no counterpart in {short}; "
                "the files are not sentence-aligned"
            )
        yield source_item[0], source_item[1], target_item[1]


def load_parallel_text(source_path, target_path):
    """Reads a sentence-aligned corpus from two UTF-8 text files.

    Line i of `source_path` is the translation source of line i of
    `target_path`. Files may be gzipped and may use CRLF line ends. A pair
    with an empty (or whitespace-only) line on either side is dropped, never
    shifted: the count is logged and its line numbers are kept in
    `ParallelText.dropped_lines`.

    Args:
        source_path: the source-language file (e.g. `train.en`).
        target_path: the target-language file (e.g. `train.de`).

    Returns:
        A `ParallelText` of `(source, target)` pairs.

    Raises:
        CorpusError: a file is empty, holds bytes that are not UTF-8, or the
            files have different numbers of lines; the message names the
            file and line.

    Example:

        >>> pairs = load_parallel_text("multi30k/train.en", "multi30k/train.de")
        >>> len(pairs), pairs[0][0]
        (29000, 'Two young, White males are outside near many bushes.')
    """
    source_path, target_path = pathlib.Path(source_path), pathlib.Path(target_path)
    sources, targets, dropped = [], [], []
    for line_number, source, target in iter_parallel_lines(source_path, target_path):
        if not source.strip() or not target.strip():
            dropped.append(line_number)
            continue
        sources.append(source)
        targets.append(target)
    if dropped:
        shown = ", ".join(str(n) for n in dropped[:10])
        logger.warning(
            "%s / %s: dropped %d pair(s) with an empty side (line %s%s)",
            source_path, target_path, len(dropped), shown,
            ", ..." if len(dropped) > 10 else "",
        )
    return ParallelText(tuple(sources), tuple(targets), str(source_path),
                        str(target_path), tuple(dropped))


def write_parallel_text(pairs, source_path, target_path):
    """Writes `(source, target)` pairs as two aligned UTF-8 files.

    The format `load_parallel_text` reads: one sentence per line, `\\n` line
    ends, a trailing newline.

    Args:
        pairs: an iterable of `(source, target)` strings, e.g. a
            `ParallelText` or `load_wmt14(...)` converted with
            `.as_numpy_iterator()` (bytes are decoded as UTF-8).
        source_path: the source file to write (parents created).
        target_path: the target file to write (parents created).

    Returns:
        The number of pairs written.
    """
    source_path, target_path = pathlib.Path(source_path), pathlib.Path(target_path)
    for path in (source_path, target_path):
        path.parent.mkdir(parents=True, exist_ok=True)
    count = 0
    with open(source_path, "w", encoding="utf-8", newline="\n") as source_file, \
            open(target_path, "w", encoding="utf-8", newline="\n") as target_file:
        for count, (source, target) in enumerate(pairs, start=1):
            source = source.decode("utf-8") if isinstance(source, bytes) else source
            target = target.decode("utf-8") if isinstance(target, bytes) else target
            for text, path in ((source, source_path), (target, target_path)):
                if "\n" in text or "\r" in text:
                    raise CorpusError(
                        f"pair {count} for {path} contains a line break: {text!r}"
                    )
            source_file.write(source + "\n")
            target_file.write(target + "\n")
    return count


def _offline_message(data_dir, reason):
    return (
        f"WMT14 ({WMT14_NAME}) is not prepared in "
        f"{data_dir or '~/tensorflow_datasets'} and cannot be downloaded: {reason}. "
        "Alternatives: (1) the offline demo corpus: `--data demo`, or "
        "keras_transformer.data.demo.write_demo_corpus(output_dir); "
        "(2) local aligned text files with load_parallel_text(source_path, "
        "target_path), e.g. the newstest2014/newstest2013 files in "
        "../shared/data/wmt14_newstest or Multi30k in ../shared/data/multi30k; "
        "(3) run `tfds build wmt14_translate/de-en` on a machine with internet "
        "and copy the prepared folder here, passing its parent as data_dir"
    )


def _host_reachable(host, timeout):
    try:
        with socket.create_connection((host, 443), timeout=timeout):
            return True
    except OSError:
        return False


def load_wmt14(split, *, data_dir=None, download=True, timeout=5.0):
    """Loads WMT 2014 English-German through tensorflow-datasets.

    Reads `wmt14_translate/de-en` (Europarl v7, Common Crawl, News Commentary
    v9 for training; newstest2013 as `"validation"`, newstest2014 as
    `"test"`) in the English-to-German direction. When the data is not
    prepared in `data_dir`, it is downloaded (several GB, about an hour) if
    the download host answers; offline this fails within `timeout` seconds
    with a message naming the alternatives.

    Args:
        split: a tfds split: `"train"`, `"validation"`, `"test"`, or a slice
            such as `"train[:1%]"`.
        data_dir: the tfds data folder (default `~/tensorflow_datasets`).
        download: download and prepare the data when it is missing.
        timeout: seconds to wait for the download host.

    Returns:
        A `tf.data.Dataset` of `(english, german)` scalar `tf.string` pairs,
        which a preparation accepts (`preparation.CorpusInputs`).

    Raises:
        RuntimeError: the data is missing and cannot be downloaded.

    Example:

    >>> pairs = load_wmt14("validation")  # newstest2013
    >>> next(pairs.as_numpy_iterator())
    (b'A Republican strategy to counter the re-election of Obama', b'Eine ...')
    """
    import tensorflow_datasets as tfds

    def to_pair(example):
        return example["en"], example["de"]

    try:
        dataset = tfds.load(WMT14_NAME, split=split, data_dir=data_dir, download=False)
    except (AssertionError, tfds.core.DatasetNotFoundError) as error:
        if not download:
            raise RuntimeError(
                _offline_message(data_dir, f"download=False ({error})")
            ) from None
        if not _host_reachable(_WMT14_HOST, timeout):
            raise RuntimeError(
                _offline_message(data_dir, f"{_WMT14_HOST} is unreachable (offline?)")
            ) from None
        dataset = tfds.load(WMT14_NAME, split=split, data_dir=data_dir, download=True)
    return dataset.map(to_pair, num_parallel_calls=tf.data.AUTOTUNE)
