"""The run folder: its layout, what it holds, and how a run is resumed from it.

One module owns the folder a training run writes, so that training,
evaluation, translation and export agree on its names (fairseq's
`checkpoint_utils`, OpenNMT-tf's `model_dir`):

    <run>/
      settings.json          the resolved settings (`keras_transformer.settings`)
      config.json            the model's `TransformerConfig`
      spm.model              the shared SentencePiece vocabulary
      vocabulary.json        its sha256 and the prepared corpus it was copied from
      backup/                state-<update>.weights.h5: weights + optimizer, for resuming
      checkpoints/           ckpt-<update>.weights.h5: the last K, for averaging
      */rolled_back/         files of an abandoned trajectory (never averaged or resumed)
      */damaged/             unreadable state files, set aside when the run fell back
      damaged/spm.model      a damaged vocabulary, set aside when it was restored
      best.weights.h5        the weights of the best validation BLEU (+ best.json)
      averaged.weights.h5    the average of the last K checkpoints
      model.keras            the final model (the `final_weights` setting)
      training_log.csv       one row per logged update; validation columns when measured
      training_log.rolled_back.csv  rows of an abandoned trajectory
      tensorboard/           the same scalars for TensorBoard
      training.png, test.hyp.de, results.json
      .lock                  held by the process training in the folder

A state file (backup or checkpoint) is a `model.save_weights` file of the
compiled model, so it also holds the optimizer's variables (its update
count included): the learning-rate schedule and Adam's moments continue
where they stopped. Files are written under a temporary name and renamed, so
a killed process leaves no half-written file under a state name; a file
damaged afterwards is detected when read: the run falls back to the newest
readable state, naming the damaged file and moving it to `damaged/`, or,
when none is readable, stops with a message and changes nothing.

Writes never crash the process and never leave a partial file: weights are
serialised in memory first (HDF5 that hits a full disk halfway leaves the
library in a state that crashes the interpreter), then written under the
temporary name; any failure removes that file and raises `WriteError`, which
names what was being written and why. The files a command reads (`spm.model`,
`config.json`, `settings.json`, `model.keras`, `best.json`) are checked as
they are read: a damaged one is a `RunError` naming it; a damaged `spm.model`
is restored from the prepared corpus it was copied from when its sha256 is
the one the run recorded (`vocabulary.json`).
"""

import contextlib
import csv
import dataclasses
import errno
import hashlib
import io
import json
import logging
import os
import pathlib
import re
import socket

import numpy as np

from keras_transformer import names

SETTINGS_FILE = "settings.json"
CONFIG_FILE = names.CONFIG_FILE
TOKENIZER_FILE = names.TOKENIZER_FILE
MODEL_FILE = "model.keras"
AVERAGED_FILE = "averaged.weights.h5"
BEST_FILE = "best.weights.h5"
BEST_INFO_FILE = "best.json"
VOCABULARY_INFO_FILE = "vocabulary.json"
RESULTS_FILE = "results.json"
LOG_FILE = "training_log.csv"
ROLLED_BACK_LOG_FILE = "training_log.rolled_back.csv"
PLOT_FILE = "training.png"
BACKUP_DIR = "backup"
CHECKPOINT_DIR = "checkpoints"
ROLLED_BACK_DIR = "rolled_back"
DAMAGED_DIR = "damaged"
LOCK_FILE = ".lock"
TENSORBOARD_DIR = "tensorboard"

_CHECKPOINT_PATTERN = re.compile(r"^ckpt-(\d+)\.weights\.h5$")
_BACKUP_PATTERN = re.compile(r"^state-(\d+)\.weights\.h5$")

logger = logging.getLogger("keras_transformer")


class RunError(Exception):
    """A run folder that cannot be used as asked; the message says why and what to do."""


class WriteError(RunError):
    """Writing a file failed (a full disk, a lost mount, no permission).

    Attributes:
        path: the file that was being written.
        error: the underlying exception.
    """

    def __init__(self, path, error, what=None):
        self.path, self.error = pathlib.Path(path), error
        reason = (os.strerror(error.errno) if isinstance(error, OSError) and error.errno
                  else str(error).splitlines()[0] if str(error) else type(error).__name__)
        self.what = what or f"writing {self.path}"
        super().__init__(f"{self.what} failed: {reason}")

    @property
    def disk_full(self):
        return isinstance(self.error, OSError) and self.error.errno in (
            errno.ENOSPC, errno.EDQUOT)


def hypotheses_file(split):
    """The run folder's translations of `split` by the job's final scoring (`test.hyp.de`)."""
    return f"{split}.hyp.de"


def _numbered(directory, pattern):
    directory = pathlib.Path(directory)
    if not directory.is_dir():
        return []
    found = []
    for path in directory.iterdir():
        match = pattern.match(path.name)
        if match and path.is_file():
            found.append((int(match.group(1)), path))
    return sorted(found)


def list_checkpoints(directory):
    """`(update, path)` pairs of `ckpt-<update>.weights.h5` files, oldest first."""
    return [(step, str(path)) for step, path in _numbered(directory, _CHECKPOINT_PATTERN)]


def partial_path(path):
    """The temporary name `write_atomically` writes `path` under."""
    path = pathlib.Path(path)
    return path.with_name(f".partial-{path.name}")


def write_atomically(path, write, what=None):
    """Calls `write(temporary_path)` then renames the result to `path`.

    A failure (an `OSError` such as a full disk, or any error of `write`)
    removes the temporary file and raises `WriteError`; `path` keeps its
    previous content, if any.

    Args:
        path: the file to write.
        write: `write(temporary_path)` writes the whole file.
        what: what is written, for the error message (default the path).
    """
    path = pathlib.Path(path)
    partial = partial_path(path)
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        write(str(partial))
        os.replace(partial, path)
    except Exception as error:  # noqa: BLE001 (any failure: clean up, then say it)
        with contextlib.suppress(OSError):
            os.remove(partial)
        if isinstance(error, WriteError):
            raise
        raise WriteError(path, error, what) from error
    return path


def write_bytes(path, data, what=None):
    """Writes `data` to `path` atomically, flushed to disk (`fsync`) before the rename."""
    def write(tmp):
        with open(tmp, "wb") as handle:
            handle.write(data)
            handle.flush()
            os.fsync(handle.fileno())

    return write_atomically(path, write, what)


def weights_bytes(model):
    """The bytes `model.save_weights` would write (weights + optimizer), made in memory.

    HDF5 writing straight to a disk that fills up leaves the library in a
    state in which freeing its objects crashes the interpreter (measured:
    a segmentation fault after "No space left on device"); in memory it
    cannot meet a full disk, and the bytes are then written with plain file
    I/O, whose errors are ordinary exceptions.
    """
    from keras.src.saving import saving_lib

    buffer = io.BytesIO()
    store = saving_lib.H5IOStore(buffer, mode="w")
    try:
        saving_lib._save_state(model, weights_store=store, assets_store=None,
                               inner_path="", visited_saveables=set())
    finally:
        store.close()
    return buffer.getvalue()


def save_weights(model, path, what=None):
    """`model.save_weights(path)`, atomically, made in memory first (see `weights_bytes`).

    Raises:
        WriteError: the file could not be written; no partial file is left.
    """
    try:
        data = weights_bytes(model)
    except (ImportError, AttributeError, TypeError):
        # Keras moved its saving internals: write through its public API.
        return write_atomically(path, model.save_weights, what)
    return write_bytes(path, data, what)


def _unused_name(path):
    """`path`, or `path.1`, `path.2` ... the first that does not exist."""
    path = pathlib.Path(path)
    candidate, number = path, 0
    while candidate.exists():
        number += 1
        candidate = path.with_name(f"{path.name}.{number}")
    return candidate


def file_sha256(path):
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        for block in iter(lambda: handle.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def find_run_dir(path):
    """The run folder holding `path` (itself or a parent with `spm.model`), or None."""
    path = pathlib.Path(path).resolve()
    for candidate in [path] + list(path.parents)[:3]:
        if candidate.is_dir() and (candidate / TOKENIZER_FILE).is_file():
            return candidate
    return None


def check_state_file(path):
    """Raises `RunError` naming `path` unless it is a readable Keras weights file."""
    import h5py

    try:
        with h5py.File(path, "r") as handle:
            if "layers" not in handle and "_layer_checkpoint_dependencies" not in handle:
                names = list(handle.keys())
                raise OSError(f"no model weights in it (top-level groups {names})")
            # Reading every dataset catches truncation inside the file.
            handle.visititems(lambda name, obj: obj[()] if isinstance(obj, h5py.Dataset)
                              else None)
    except (OSError, KeyError, ValueError, RuntimeError) as error:
        raise RunError(f"{path} is unreadable ({str(error).splitlines()[0]})") from None


@contextlib.contextmanager
def file_lock(path, *, busy=None, waiting=None):
    """Holds an exclusive `fcntl.flock` on `path`, which names its holder.

    The lock is released by the kernel when its process ends, `kill -9`
    included, so a crash never leaves a stale lock. The file says
    "process <pid> on <host>" while it is held.

    Args:
        path: the lock file (created, with its folder).
        busy: when another process holds the lock, raise `RunError` with
            `busy(holder)` as its message instead of waiting.
        waiting: otherwise, the line logged before waiting for the holder.
    """
    try:
        import fcntl
    except ImportError:  # not POSIX: no lock
        yield
        return
    path = pathlib.Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    handle = open(path, "a+")
    try:
        try:
            fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            handle.seek(0)
            holder = handle.read().strip() or "another process"
            if busy is not None:
                raise RunError(busy(holder)) from None
            logger.info(waiting or f"Waiting for {holder}, which holds {path} ...")
            fcntl.flock(handle, fcntl.LOCK_EX)
        handle.seek(0)
        handle.truncate()
        handle.write(f"process {os.getpid()} on {socket.gethostname()}\n")
        handle.flush()
        yield
    finally:
        handle.close()  # releases the lock


@dataclasses.dataclass
class RunFolder:
    """Paths and bookkeeping of one run folder; creates nothing until written to.

    Args:
        root: the folder (`--output-dir`).
    """

    root: pathlib.Path

    def __post_init__(self):
        self.root = pathlib.Path(self.root)

    def __truediv__(self, name):
        return self.root / name

    # --- files ---------------------------------------------------------------

    @property
    def tokenizer_file(self):
        return self.root / TOKENIZER_FILE

    @property
    def settings_file(self):
        return self.root / SETTINGS_FILE

    @property
    def config_file(self):
        return self.root / CONFIG_FILE

    @property
    def model_file(self):
        return self.root / MODEL_FILE

    @property
    def checkpoint_dir(self):
        return self.root / CHECKPOINT_DIR

    @property
    def backup_dir(self):
        return self.root / BACKUP_DIR

    @property
    def log_file(self):
        return self.root / LOG_FILE

    @property
    def results_file(self):
        return self.root / RESULTS_FILE

    def exists(self):
        return self.root.is_dir()

    def checkpoints(self):
        """`(update, path)` of this trajectory's checkpoints, oldest first."""
        return _numbered(self.checkpoint_dir, _CHECKPOINT_PATTERN)

    def backups(self):
        """`(update, path)` of the backups, oldest first."""
        return _numbered(self.backup_dir, _BACKUP_PATTERN)

    def backup_path(self, update):
        return self.backup_dir / f"state-{update}.weights.h5"

    def checkpoint_path(self, update):
        return self.checkpoint_dir / f"ckpt-{update}.weights.h5"

    def lock(self):
        """Holds `<run>/.lock` while a process trains in the folder (see `file_lock`).

        A second `train` on the same folder would interleave its backups,
        checkpoints and log rows with the first one's; it is refused instead.
        """
        return file_lock(self.root / LOCK_FILE, busy=lambda owner: (
            f"{self.root} is in use: {owner} is training in it. Wait for it to finish or "
            "stop it, or use another --output-dir"))

    def tokenizer_hash(self):
        return file_sha256(self.tokenizer_file) if self.tokenizer_file.is_file() else None

    # --- settings and config -------------------------------------------------

    def read_json(self, name):
        """The dict a JSON file of the run holds, `None` without the file.

        Raises:
            RunError: the file is not a JSON object (truncated, overwritten).
        """
        path = self.root / name
        if not path.is_file():
            return None
        try:
            values = json.loads(path.read_text(encoding="utf-8"))
        except (ValueError, UnicodeDecodeError) as error:
            raise RunError(f"{path} is damaged: not valid JSON ({error}); restore it or "
                           "start a new --output-dir") from None
        if not isinstance(values, dict):
            raise RunError(f"{path} is damaged: it holds a {type(values).__name__}, not a "
                           "JSON object; restore it or start a new --output-dir")
        return values

    def write_json(self, name, values):
        text = json.dumps(values, indent=2, sort_keys=False) + "\n"
        return write_bytes(self.root / name, text.encode("utf-8"))

    def read_config(self):
        """The run's `TransformerConfig` (`config.json`), `None` without the file."""
        from keras_transformer.config import TransformerConfig

        values = self.read_json(CONFIG_FILE)
        if values is None:
            return None
        try:
            return TransformerConfig.from_dict(values)
        except (TypeError, ValueError, KeyError) as error:
            message = str(error).splitlines()[0] if str(error) else type(error).__name__
            raise RunError(f"{self.config_file} is damaged: not a model configuration "
                           f"({message}); restore it or start a new --output-dir") from None

    def read_best(self):
        """`best.json` (`{"update": int, "bleu": float}`), `None` without the file."""
        best = self.read_json(BEST_INFO_FILE)
        if best is None:
            return None
        if not (isinstance(best.get("update"), int) and not isinstance(best["update"], bool)
                and isinstance(best.get("bleu"), (int, float))):
            raise RunError(f"{self.root / BEST_INFO_FILE} is damaged: expected "
                           f'{{"update": <int>, "bleu": <number>}}, found {best!r}; delete it '
                           f"and {BEST_FILE} to measure the best weights afresh")
        return best

    # --- the vocabulary ----------------------------------------------------------

    def record_tokenizer(self, source):
        """Writes `vocabulary.json`: `spm.model`'s sha256 and the file it was copied from."""
        self.write_json(VOCABULARY_INFO_FILE, dict(
            sha256=file_sha256(self.tokenizer_file),
            source=str(pathlib.Path(source).resolve())))

    def _tokenizer_problem(self, recorded):
        """Why `spm.model` cannot be used (a string), or `None` when it is intact.

        Intact means: a SentencePiece model with this package's special ids
        and, when the run recorded a sha256 (`recorded`, from
        `vocabulary.json`), that sha256.
        """
        from keras_transformer.data.tokenizer import check_model_proto

        path = self.tokenizer_file
        if not path.is_file():
            return "missing"
        if recorded and file_sha256(path) != recorded:
            return f"its sha256 is not the {recorded[:12]}... that {VOCABULARY_INFO_FILE} recorded"
        try:
            check_model_proto(path.read_bytes())
        except ValueError as error:
            return str(error)
        return None

    def restore_tokenizer(self, say=None, candidates=()):
        """Checks `spm.model`; restores a damaged one from its recorded source.

        A damaged file (see `_tokenizer_problem`) is replaced by the prepared
        corpus's `spm.model` it was copied from (or one of `candidates`) when
        that file's sha256 is the one the run recorded; the damaged file is
        moved to `damaged/`.

        Returns:
            The path of the (intact) `spm.model`.

        Raises:
            RunError: it is damaged and cannot be restored; the message says how.
        """
        say = say or logger.warning
        info = self.read_json(VOCABULARY_INFO_FILE) or {}
        recorded, source = info.get("sha256"), info.get("source")
        problem = self._tokenizer_problem(recorded)
        if problem is None:
            return self.tokenizer_file
        intact = next((pathlib.Path(c) for c in (source, *candidates)
                       if recorded and c and pathlib.Path(c).is_file()
                       and file_sha256(c) == recorded), None)
        if intact is not None:
            if self.tokenizer_file.exists():
                target = _unused_name(self.root / DAMAGED_DIR / TOKENIZER_FILE)
                target.parent.mkdir(exist_ok=True)
                os.replace(self.tokenizer_file, target)
                moved = f"; the damaged file is now {target}"
            else:
                moved = ""
            write_bytes(self.tokenizer_file, intact.read_bytes())
            say(f"{self.tokenizer_file} was damaged ({problem}): restored it from {intact}, "
                f"whose sha256 is the one the run recorded{moved}.")
            return self.tokenizer_file
        if recorded:
            gone = not source or not pathlib.Path(source).is_file()
            how = (f"copy back the spm.model whose sha256 is {recorded} (the run copied it "
                   f"from {source or 'its prepared corpus'}, which "
                   f"{'is gone' if gone else 'now holds another vocabulary'})")
        else:
            how = ("copy back the spm.model of the prepared corpus the run was trained on "
                   "(this run recorded no sha256 to check it against)")
        raise RunError(f"{self.tokenizer_file} is damaged ({problem}); {how}")

    def load_tokenizer(self, say=None):
        """The run's `Tokenizer`, its `spm.model` checked (and restored) first."""
        from keras_transformer.data.tokenizer import Tokenizer

        return Tokenizer.load(self.restore_tokenizer(say))

    def kept_tokenizer(self, init_from=None):
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
        if self.tokenizer_file.is_file() or (self / VOCABULARY_INFO_FILE).is_file():
            self.restore_tokenizer()  # a damaged copy is restored from its source, or named
            if source_spm is not None and file_sha256(source_spm) != self.tokenizer_hash():
                raise RunError(
                    f"--init-from {init_from}: its vocabulary {source_spm} differs from this "
                    f"run's {self.tokenizer_file}; fine-tune in a new --output-dir (it takes "
                    "the vocabulary of the weights it starts from)")
            return self.tokenizer_file
        return source_spm

    def adopt_tokenizer(self, corpus, init_from=None):
        """The run's copy of the corpus's vocabulary (checked when it has one), loaded.

        A run keeps the vocabulary it was trained with: a continued run whose
        prepared corpus now has another one (prepared again since) is refused,
        and so is fine-tuning from `init_from` weights whose vocabulary is
        not the corpus's.

        Returns:
            The run's `Tokenizer`.
        """
        from keras_transformer.data.tokenizer import Tokenizer

        if self.tokenizer_file.is_file() or (self / VOCABULARY_INFO_FILE).is_file():
            # A damaged copy is restored from the corpus it came from, or named.
            self.restore_tokenizer(candidates=[corpus.tokenizer_file])
            if self.tokenizer_hash() != corpus.tokenizer_sha256:
                raise RunError(
                    f"{self.tokenizer_file} differs from the vocabulary of the prepared "
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
            write_bytes(self.tokenizer_file, corpus.tokenizer_file.read_bytes())
        if not (self / VOCABULARY_INFO_FILE).is_file():
            self.record_tokenizer(corpus.tokenizer_file)
        tokenizer = Tokenizer.load(self.tokenizer_file)
        logger.info(f"Tokenizer {self.tokenizer_file} (vocabulary "
                    f"{tokenizer.vocabulary_size()})")
        return tokenizer

    # --- what is intact ----------------------------------------------------------

    def newest_good_state(self):
        """`(update, path)` of the newest readable state, or `None` when there is none.

        For error messages: unlike `latest_state` it does not raise when
        nothing is readable (damaged files found are still reported and set
        aside, as `latest_state` does).
        """
        try:
            update, path = self.latest_state()
        except RunError:
            return None
        return None if path is None else (update, path)

    def newest_state_text(self):
        """A phrase naming the newest readable backup or checkpoint, for error messages."""
        state = self.newest_good_state()
        if state is None:
            if not self.state_files():
                return f"{self.root} holds no backup or checkpoint yet"
            return f"no readable backup or checkpoint in {self.root}"
        update, path = state
        return f"the newest good state is {path.relative_to(self.root)} (update {update})"

    # --- resuming ------------------------------------------------------------

    def state_files(self):
        """Every file a run can resume from, newest update first.

        Backups come before checkpoints of the same update. Returns
        `(update, path)` pairs.
        """
        files = [(step, 1, path) for step, path in self.backups()]
        files += [(step, 0, path) for step, path in self.checkpoints()]
        return [(step, path) for step, _, path in sorted(files, reverse=True)]

    def latest_state(self, say=None):
        """The newest readable state file: `(update, path)`, or `(0, None)` for none.

        Unreadable files newer than it are reported (`say`, default the log)
        and moved to a `damaged/` folder beside them, never deleted. When
        state files exist but none is readable, the run cannot continue
        without losing its training, so this raises `RunError` and moves
        nothing: the user decides.
        """
        say = say or logger.warning
        damaged = []
        for step, path in self.state_files():
            try:
                check_state_file(path)
            except RunError as error:
                damaged.append((path, str(error)))
                continue
            for bad, problem in damaged:
                target = bad.parent / DAMAGED_DIR / bad.name
                target.parent.mkdir(exist_ok=True)
                os.replace(bad, target)
                say(f"{problem}; moved it to {target}.")
            if damaged:
                say(f"Falling back to {path} (update {step}), the newest readable state.")
            return step, path
        if damaged:
            raise RunError(
                f"no readable backup or checkpoint in {self.root}: "
                f"{'; '.join(problem for _, problem in damaged)}. Nothing was changed. "
                f"Move the damaged file(s) aside to train {self.root} again from update 0, "
                "or fine-tune other weights with --init-from in a new --output-dir")
        return 0, None

    def roll_back_to(self, update, say=None):
        """Sets aside what an abandoned trajectory wrote after `update`.

        Checkpoints and backups newer than `update` move to a `rolled_back/`
        folder beside them, log rows after it to
        `training_log.rolled_back.csv`, and a best validation BLEU reached
        after it to `rolled_back/`; nothing is deleted. Called before
        training resumes from `update`, so that averaging, the log and the
        best weights only see this trajectory.
        """
        say = say or logger.info
        moved = []
        for step, path in self.checkpoints() + self.backups():
            if step > update:
                target = path.parent / ROLLED_BACK_DIR / path.name
                target.parent.mkdir(exist_ok=True)
                os.replace(path, target)
                moved.append(str(target))
        best = self.read_best()
        if best is not None and best.get("update", 0) > update:
            for name in (BEST_FILE, BEST_INFO_FILE):
                if (self.root / name).exists():
                    target = self.checkpoint_dir / ROLLED_BACK_DIR / name
                    target.parent.mkdir(parents=True, exist_ok=True)
                    os.replace(self.root / name, target)
                    moved.append(str(target))
        if moved:
            say(f"Set aside {len(moved)} file(s) of updates after {update} (another "
                f"trajectory): {', '.join(moved)}")
        dropped = roll_back_log(self.log_file, self.root / ROLLED_BACK_LOG_FILE, update)
        if dropped:
            say(f"Moved {dropped} log row(s) after update {update} to "
                f"{ROLLED_BACK_LOG_FILE}")


def roll_back_log(log_file, rolled_back_file, update):
    """Keeps the rows of `log_file` up to `update`, appends the others to `rolled_back_file`."""
    log_file = pathlib.Path(log_file)
    if not log_file.is_file():
        return 0
    with open(log_file, newline="") as handle:
        reader = csv.DictReader(handle)
        fields, rows = reader.fieldnames, list(reader)
    if not fields or "step" not in fields:
        return 0
    keep = [r for r in rows if r["step"] and int(float(r["step"])) <= update]
    drop = [r for r in rows if r not in keep]
    if not drop:
        return 0
    rolled_back_file = pathlib.Path(rolled_back_file)
    new_file = not rolled_back_file.is_file()
    with open(rolled_back_file, "a", newline="") as handle:
        writer = csv.DictWriter(handle, fieldnames=fields)
        if new_file:
            writer.writeheader()
        writer.writerows(drop)

    def write(tmp):
        with open(tmp, "w", newline="") as handle:
            writer = csv.DictWriter(handle, fieldnames=fields)
            writer.writeheader()
            writer.writerows(keep)

    write_atomically(log_file, write)
    return len(drop)


# --- loading a run for evaluation, translation and export -----------------------


def check_run(run_dir):
    """The tokenizer, model.keras and config.json paths of a run folder; raises if unusable."""
    run_dir = pathlib.Path(run_dir)
    if not run_dir.is_dir():
        raise FileNotFoundError(
            f"run folder not found: {run_dir} (expected the --output-dir of a "
            f"training run, with {TOKENIZER_FILE} and {CONFIG_FILE} or {MODEL_FILE})")
    spm = run_dir / TOKENIZER_FILE
    if not spm.is_file() and not (run_dir / VOCABULARY_INFO_FILE).is_file():
        raise FileNotFoundError(f"{run_dir} has no {TOKENIZER_FILE} (the SentencePiece "
                                "model a training run writes)")
    keras_file, config_file = run_dir / MODEL_FILE, run_dir / CONFIG_FILE
    if not keras_file.is_file() and not config_file.is_file():
        raise FileNotFoundError(
            f"{run_dir} has neither {MODEL_FILE} nor {CONFIG_FILE}; expected the "
            "--output-dir of a training run")
    return spm, keras_file, config_file


def resolve_weights(run_dir, name):
    """Path of the weights called `name` in a run folder.

    `"final"` is the weights of `model.keras` (`None` is returned: load the
    model as saved), `"averaged"` is `averaged.weights.h5`, `"best"` the
    best validation BLEU's weights, `"last"` the newest checkpoint,
    `"ckpt-<update>"` that checkpoint; anything else is taken as a path to a
    `.weights.h5` file.
    """
    run = RunFolder(run_dir)
    checkpoints = run.checkpoints()
    if name == "final":
        if not run.model_file.is_file():
            raise FileNotFoundError(f"{run.model_file} not found: the run has not "
                                    "finished; use last, ckpt-<update> or best")
        return None
    if name == "averaged":
        path = run / AVERAGED_FILE
    elif name == "best":
        path = run / BEST_FILE
    elif name == "last":
        if not checkpoints:
            raise FileNotFoundError(f"no {CHECKPOINT_DIR}/ckpt-*.weights.h5 in {run_dir}")
        path = checkpoints[-1][1]
    elif name.startswith("ckpt-") and not name.endswith(".h5"):
        path = run.checkpoint_path(name[len("ckpt-"):])
    else:
        path = pathlib.Path(name)
    if not path.exists():
        available = ", ".join(f"ckpt-{step}" for step, _ in checkpoints) or "none"
        raise FileNotFoundError(
            f"weights {name!r} not found ({path}); use final, averaged, best, last, "
            f"ckpt-<update> (checkpoints in {run_dir}: {available}) or a .weights.h5 path")
    return path


def load_run(run_dir, weights=None):
    """Model and tokenizer of a run folder, for inference.

    Args:
        run_dir: a training run's folder.
        weights: `None` (or `"final"`) for the final model (`model.keras`; an
            unfinished run: its config with the newest checkpoint), a name
            that `resolve_weights` understands, or a `.weights.h5` path.

    Returns:
        `(model, tokenizer)`; the model is not compiled.
    """
    from keras_transformer.model import build_model

    spm, keras_file, config_file = check_run(run_dir)
    run = RunFolder(run_dir)
    tokenizer = run.load_tokenizer()
    if weights is not None:
        weights = resolve_weights(run_dir, str(weights))
    if keras_file.is_file() and (weights is None or not config_file.is_file()):
        model = load_keras_file(keras_file)
    else:
        model = build_model(run.read_config())
        if weights is None:
            saved = pathlib.Path(run_dir) / "model.weights.h5"
            weights = saved if saved.is_file() else resolve_weights(run_dir, "last")
    if weights is not None:
        weights = pathlib.Path(weights)
        if not weights.is_file():
            raise FileNotFoundError(f"weights file not found: {weights}")
        load_model_weights(model, weights)
    return model, tokenizer


def load_keras_file(path):
    """`keras.saving.load_model(path, compile=False)`; a damaged file is a `RunError`."""
    import zipfile

    import keras

    path = pathlib.Path(path)
    try:
        with zipfile.ZipFile(path) as archive:
            bad = archive.testzip()  # reads every member, checking its CRC
        if bad is not None:
            raise ValueError(f"member {bad} fails its CRC check")
        return keras.saving.load_model(path, compile=False)
    except (zipfile.BadZipFile, OSError, ValueError, KeyError, TypeError, EOFError) as error:
        message = str(error).splitlines()[0] if str(error) else type(error).__name__
        raise RunError(
            f"{path} is damaged ({message}); translate or export other weights of the "
            "run (--weights last, averaged, best or ckpt-<update>), or move it aside and "
            f"re-run `keras-transformer train --output-dir {path.parent}` to write it "
            "again from the run's checkpoints") from None


def load_model_weights(model, path):
    """Loads only the model's weights from a `.weights.h5` file (optimizer state ignored).

    Works for files written by a compiled model (which also hold the
    optimizer's variables) into a model that is not compiled, or whose
    optimizer must start fresh (`--init-from`).
    """
    from keras_transformer.model import build_model

    path = str(path)
    check_state_file(path)
    source = build_model(model.config)
    try:
        source.load_weights(path, skip_mismatch=False)
    except ValueError as error:
        raise RunError(f"{path} does not fit this model: {str(error).splitlines()[0]}") \
            from None
    model.set_weights(source.get_weights())
    return model


def load_state(model, path, update):
    """Loads a state file (weights + optimizer) into a compiled model; returns its update.

    Keras loads the optimizer's variables by position and silently skips them
    when their number differs, which happens when `grad_accum_steps` changed
    between the run that saved the state and this one (accumulation adds one
    gradient accumulator per weight). Then Adam's moments and velocities (the
    last variables) are copied by role, the micro-batch counter (the first)
    is set to `update` times this run's accumulation steps, and the
    accumulators start at zero, as they do at every update.

    Args:
        model: the compiled model.
        path: a state file of `update` (a backup or checkpoint).
        update: the optimizer update the file holds (from its name).

    Raises:
        RunError: the file's optimizer state does not fit this optimizer.
    """
    import warnings

    import h5py

    optimizer = model.optimizer
    optimizer.build(model.trainable_variables)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        model.load_weights(str(path))
    skipped = any("Skipping variable loading for optimizer" in str(w.message) for w in caught)
    if skipped:
        with h5py.File(path, "r") as handle:
            group = handle["optimizer/vars"] if "optimizer/vars" in handle else {}
            saved = [group[str(i)][()] for i in range(len(group))]
        current = optimizer.variables
        moments = 2 * len(model.trainable_variables)
        fits = (len(saved) > moments and len(current) > moments
                and current[0].path.endswith("iteration")
                and all(tuple(v.shape) == a.shape
                        for v, a in zip(current[-moments:], saved[-moments:])))
        if not fits:
            raise RunError(f"{path}: its optimizer state ({len(saved)} variables) does not "
                           f"fit this run's optimizer ({len(current)} variables)")
        current[0].assign(update * (optimizer.gradient_accumulation_steps or 1))
        for variable, value in zip(current[-moments:], saved[-moments:]):
            variable.assign(value)
        for variable in current[1:-moments]:
            variable.assign(np.zeros(variable.shape, variable.dtype))
    return int(np.asarray(optimizer.iterations))
