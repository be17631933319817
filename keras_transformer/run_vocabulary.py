"""The run's vocabulary: one `spm.model` per run, kept, checked and restored.

A run keeps the SentencePiece vocabulary it was trained with for its whole
life. `adopt` copies the prepared corpus's `spm.model` into the run folder
and records its sha256 and source in `vocabulary.json`; every later use
(`load`, `kept`, `adopt` again) checks the copy first (`restore`): a
damaged one (missing, truncated, not the recorded sha256) is replaced by
its source when that still holds the recorded bytes, and the damaged file
is set aside in `damaged/`; otherwise the command stops with one line
saying what to copy back. A continued run whose corpus was prepared again
with another vocabulary, and fine-tuning from weights of another
vocabulary, are refused.
"""

import logging
import pathlib

from keras_transformer.files import file_sha256, set_aside, write_bytes
from keras_transformer.runs import (DAMAGED_DIR, TOKENIZER_FILE, VOCABULARY_INFO_FILE,
                                    RunError, find_run_dir)

logger = logging.getLogger("keras_transformer")


def _record(run, source):
    """Writes `vocabulary.json`: `spm.model`'s sha256 and the file it was copied from."""
    run.write_json(VOCABULARY_INFO_FILE, dict(
        sha256=file_sha256(run.tokenizer_file),
        source=str(pathlib.Path(source).resolve())))


def problem(run, recorded=None):
    """Why `spm.model` cannot be used (a string), or `None` when it is intact.

    Intact means: a SentencePiece model with this package's special ids
    and, when the run recorded a sha256 (`recorded`, from
    `vocabulary.json`), that sha256.
    """
    from keras_transformer.data.tokenizer import check_model_proto

    path = run.tokenizer_file
    if not path.is_file():
        return "missing"
    if recorded and file_sha256(path) != recorded:
        return f"its sha256 is not the {recorded[:12]}... that {VOCABULARY_INFO_FILE} recorded"
    try:
        check_model_proto(path.read_bytes())
    except ValueError as error:
        return str(error)
    return None


def restore(run, say=None, candidates=()):
    """Checks `spm.model`; restores a damaged one from its recorded source.

    A damaged file (see `problem`) is replaced by the prepared
    corpus's `spm.model` it was copied from (or one of `candidates`) when
    that file's sha256 is the one the run recorded; the damaged file is
    moved to `damaged/`.

    Returns:
        The path of the (intact) `spm.model`.

    Raises:
        RunError: it is damaged and cannot be restored; the message says how.
    """
    say = say or logger.warning
    info = run.read_json(VOCABULARY_INFO_FILE) or {}
    recorded, source = info.get("sha256"), info.get("source")
    why = problem(run, recorded)
    if why is None:
        return run.tokenizer_file
    intact = next((pathlib.Path(c) for c in (source, *candidates)
                   if recorded and c and pathlib.Path(c).is_file()
                   and file_sha256(c) == recorded), None)
    if intact is not None:
        if run.tokenizer_file.exists():
            target = set_aside(run.tokenizer_file, run / DAMAGED_DIR)
            moved = f"; the damaged file is now {target}"
        else:
            moved = ""
        write_bytes(run.tokenizer_file, intact.read_bytes())
        say(f"{run.tokenizer_file} was damaged ({why}): restored it from {intact}, "
            f"whose sha256 is the one the run recorded{moved}.")
        return run.tokenizer_file
    if recorded:
        gone = not source or not pathlib.Path(source).is_file()
        how = (f"copy back the spm.model whose sha256 is {recorded} (the run copied it "
               f"from {source or 'its prepared corpus'}, which "
               f"{'is gone' if gone else 'now holds another vocabulary'})")
    else:
        how = ("copy back the spm.model of the prepared corpus the run was trained on "
               "(this run recorded no sha256 to check it against)")
    raise RunError(f"{run.tokenizer_file} is damaged ({why}); {how}")


def load(run, say=None):
    """The run's `Tokenizer`, its `spm.model` checked (and restored) first."""
    from keras_transformer.data.tokenizer import Tokenizer

    return Tokenizer.load(restore(run, say))


def kept(run, init_from=None):
    """The vocabulary the run must keep: its own, or `init_from`'s; `None` for a new one.

    Raises:
        RunError: `init_from` does not exist, or its vocabulary is not the
            run's own.
    """
    source_spm = None
    if init_from:
        source_run = find_run_dir(init_from)
        if source_run is None and not pathlib.Path(init_from).exists():
            raise RunError(f"--init-from {init_from} does not exist (a run folder or a "
                           ".weights.h5 file)")
        if source_run is not None:
            source_spm = source_run / TOKENIZER_FILE
    if run.tokenizer_file.is_file() or (run / VOCABULARY_INFO_FILE).is_file():
        restore(run)  # a damaged copy is restored from its source, or named
        if source_spm is not None and file_sha256(source_spm) != run.tokenizer_hash():
            raise RunError(
                f"--init-from {init_from}: its vocabulary {source_spm} differs from this "
                f"run's {run.tokenizer_file}; fine-tune in a new --output-dir (it takes "
                "the vocabulary of the weights it starts from)")
        return run.tokenizer_file
    return source_spm


def adopt(run, corpus, init_from=None):
    """The run's copy of the corpus's vocabulary (checked when it has one), loaded.

    A run keeps the vocabulary it was trained with: a continued run whose
    prepared corpus now has another one (prepared again since) is refused,
    and so is fine-tuning from `init_from` weights whose vocabulary is
    not the corpus's.

    Returns:
        The run's `Tokenizer`.
    """
    from keras_transformer.data.tokenizer import Tokenizer

    if run.tokenizer_file.is_file() or (run / VOCABULARY_INFO_FILE).is_file():
        # A damaged copy is restored from the corpus it came from, or named.
        restore(run, candidates=[corpus.tokenizer_file])
        if run.tokenizer_hash() != corpus.tokenizer_sha256:
            raise RunError(
                f"{run.tokenizer_file} differs from the vocabulary of the prepared "
                f"corpus {corpus.tokenizer_file} (prepared again since this run "
                "began?); continue with the run's own vocabulary: pass --prepared-dir "
                "for a new preparation (it will use the run's vocabulary), or train in "
                "a new --output-dir")
    else:
        if init_from:
            source_run = find_run_dir(init_from)
            if source_run is not None and file_sha256(
                    source_run / TOKENIZER_FILE) != corpus.tokenizer_sha256:
                raise RunError(
                    f"--init-from {init_from}: its vocabulary differs from the prepared "
                    f"corpus {corpus.directory}'s; let the job prepare --data with it "
                    "(name the text folder, not a prepared one)")
        write_bytes(run.tokenizer_file, corpus.tokenizer_file.read_bytes())
    if not (run / VOCABULARY_INFO_FILE).is_file():
        _record(run, corpus.tokenizer_file)
    tokenizer = Tokenizer.load(run.tokenizer_file)
    logger.info(f"Tokenizer {run.tokenizer_file} (vocabulary "
                f"{tokenizer.vocabulary_size()})")
    return tokenizer
