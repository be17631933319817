"""Writing files safely: atomic writes, weights made in memory, locks, setting aside.

Every file the package writes goes through here, so that a killed process,
a full disk or a lost mount never leaves a half-written file under a real
name and never crashes the interpreter:

- `write_atomically` / `write_bytes`: the file is written under a
  temporary name (`partial_path`), flushed to disk (`fsync`) and renamed;
  any failure removes the temporary file and raises `WriteError`, which
  names what was being written and why.
- `append_bytes`: bytes added to the end of a file (a log), flushed to
  disk; a failed append is cut off again, so no half line is left.
- `save_weights` / `save_model`: HDF5 that hits a full disk halfway leaves
  the library in a state in which freeing its objects crashes the
  interpreter (a segmentation fault after "No space left on device"), so
  weights and `.keras` files are made in memory first and written with
  plain file I/O; HDF5 never writes to disk itself.
- `set_aside(path, folder)`: moves a file out of the way under a name that
  is not taken; nothing set aside is ever overwritten.
- `file_lock`: an exclusive lock the kernel releases when its holder dies.
- `staging_dir` / `replace_with_staged` / `remove_abandoned`: a hidden
  folder a writer fills, the rename of its result into place (whatever was
  there set aside into the staging folder first, never half removed under
  its name), and the removal of staging folders whose writer is gone (a
  `kill -9` during an export).

Two kinds of file are written by their own libraries, into folders of their
own: TensorBoard's event files (`<run>/tensorboard/`, appended record by
record by its `EventFileWriter`; `training.log.TrainingLog` turns a failure of
it into a `WriteError`) and the SavedModel's and CTranslate2's files, which
their libraries write into a `staging_dir` that `replace_with_staged` renames
into place only when complete.

This module knows nothing of run folders, corpora or models' meaning: the
run folder (`keras_transformer.runs`), the prepared corpora
(`keras_transformer.data.preparation`), training and the exports use it.
"""

import contextlib
import hashlib
import io
import logging
import os
import pathlib
import shutil
import socket
import sys
import tempfile
import time

logger = logging.getLogger("keras_transformer")

WRITER_LOCK = ".writer"


class WriteError(OSError):
    """Writing a file failed (a full disk, a lost mount, no permission).

    An `OSError`, so that a command shows it as one line, and whose message
    is "<what> failed: <reason>".

    Attributes:
        path: the file that was being written.
        error: the underlying exception.
        what: what was being written ("writing the backup ..."), for messages.
        reason: why it failed ("No space left on device"), for messages.
    """

    def __init__(self, path, error, what=None):
        self.path, self.error = pathlib.Path(path), error
        self.reason = (os.strerror(error.errno) if isinstance(error, OSError) and error.errno
                       else str(error).splitlines()[0] if str(error)
                       else type(error).__name__)
        self.what = what or f"writing {self.path}"
        super().__init__(f"{self.what} failed: {self.reason}")

    def __reduce__(self):  # an OSError subclass with its own arguments must say how to pickle
        return type(self), (self.path, self.error, self.what)


def partial_path(path):
    """The temporary name `write_atomically` writes `path` under."""
    path = pathlib.Path(path)
    return path.with_name(f".partial-{path.name}")


def write_atomically(path, write, what=None):
    """Calls `write(temporary_path)`, flushes the file to disk, then renames it to `path`.

    A failure (an `OSError` such as a full disk, or any error of `write`)
    removes the temporary file and raises `WriteError`; `path` keeps its
    previous content, if any.

    Args:
        path: the file to write.
        write: `write(temporary_path)` writes the whole file.
        what: what is written, for the error message (default the path).

    Returns:
        `path` as a `pathlib.Path`.
    """
    path = pathlib.Path(path)
    partial = partial_path(path)
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        write(str(partial))
        _flush_to_disk(partial)
        os.replace(partial, path)
    except Exception as error:  # noqa: BLE001 (any failure: clean up, then say it)
        with contextlib.suppress(OSError):
            os.remove(partial)
        if isinstance(error, WriteError):
            raise
        raise WriteError(path, error, what) from error
    return path


def _flush_to_disk(path):
    """`fsync` of a written file: its bytes are on disk (or the disk's error is raised)."""
    descriptor = os.open(path, os.O_RDONLY)
    try:
        os.fsync(descriptor)
    finally:
        os.close(descriptor)


def write_bytes(path, data, what=None):
    """Writes `data` to `path` atomically, flushed to disk (`fsync`) before the rename."""
    def write(tmp):
        with open(tmp, "wb") as handle:
            handle.write(data)

    return write_atomically(path, write, what)


def append_bytes(path, data, what=None):
    """Appends `data` to `path` (created if missing), flushed to disk (`fsync`).

    A failure (a full disk) cuts the file back to its previous length (or
    removes a file it created) and raises `WriteError`: no partial record is
    left at its end.

    Args:
        path: the file, e.g. a CSV log.
        data: the bytes to add, e.g. whole lines.
        what: what is written, for the error message (default the path).

    Returns:
        `path` as a `pathlib.Path`.
    """
    path = pathlib.Path(path)
    size = path.stat().st_size if path.is_file() else None
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        with open(path, "ab") as handle:
            handle.write(data)
            handle.flush()
            os.fsync(handle.fileno())
    except OSError as error:
        with contextlib.suppress(OSError):
            if size is None:
                os.remove(path)
            else:
                os.truncate(path, size)
        raise WriteError(path, error, what) from error
    return path


class InMemorySavingUnavailable(RuntimeError):
    """This Keras lacks the saving internals that make a file's bytes in memory."""


_SAVING_INTERNALS = ("H5IOStore", "_save_state", "save_model")


def _unavailable(reason):
    import keras

    return InMemorySavingUnavailable(
        f"Keras {keras.__version__} cannot make the file in memory "
        f"(keras.src.saving.saving_lib: {reason}); install a Keras 3 release whose "
        f"saving_lib has {', '.join(_SAVING_INTERNALS)}")


def _saving_lib():
    """Keras' `saving_lib`, whose stores write HDF5 into a `BytesIO`.

    Raises:
        InMemorySavingUnavailable: this Keras has moved or removed them.
    """
    try:
        from keras.src.saving import saving_lib
    except ImportError as error:
        raise _unavailable(error) from None
    missing = [name for name in _SAVING_INTERNALS if not hasattr(saving_lib, name)]
    if missing:
        raise _unavailable(f"no {', '.join(missing)}")
    return saving_lib


def weights_bytes(model, optimizer=True):
    """The bytes `model.save_weights` would write, made in memory.

    Made in memory: see the module docstring for why HDF5 must not meet a
    full disk. The HDF5 file holds the groups, datasets and attributes that
    `model.save_weights` writes (a test compares them).

    Args:
        model: a Keras model.
        optimizer: also the optimizer's variables (Adam's moments, the
            update count) when the model is compiled, as `save_weights`
            does; `False` for the model's weights only (a third of the
            bytes with Adam).

    Raises:
        InMemorySavingUnavailable: this Keras cannot make them in memory.
    """
    saving_lib = _saving_lib()
    buffer = io.BytesIO()
    try:
        store = saving_lib.H5IOStore(buffer, mode="w")
    except TypeError as error:  # another signature: it may not take a BytesIO
        raise _unavailable(f"H5IOStore: {error}") from None
    try:
        # Saveables already "visited" are skipped: that leaves the optimizer out.
        skip = set() if optimizer or getattr(model, "optimizer", None) is None \
            else {id(model.optimizer)}
        saving_lib._save_state(model, weights_store=store, assets_store=None,
                               inner_path="", visited_saveables=skip)
    finally:
        store.close()
    return buffer.getvalue()


def save_weights(model, path, what=None, optimizer=True):
    """`model.save_weights(path)`, atomically, made in memory first.

    Args:
        model: a Keras model.
        path: the `.weights.h5` file.
        what: what is written, for the error message.
        optimizer: as in `weights_bytes`.

    Raises:
        WriteError: the file could not be written, or this Keras cannot make
            its bytes in memory (never written straight to disk instead);
            no partial file is left.
    """
    try:
        data = weights_bytes(model, optimizer=optimizer)
    except InMemorySavingUnavailable as error:
        raise WriteError(path, error, what) from None
    return write_bytes(path, data, what)


def save_model(model, path, what=None):
    """`model.save(path)` (a `.keras` file), atomically, made in memory first.

    Raises:
        WriteError: the file could not be written, or this Keras cannot make
            its bytes in memory (never written straight to disk instead);
            no partial file is left.
    """
    try:
        saving_lib = _saving_lib()
    except InMemorySavingUnavailable as error:
        raise WriteError(path, error, what) from None
    buffer = io.BytesIO()
    saving_lib.save_model(model, buffer)  # a file object: the archive made in memory
    return write_bytes(path, buffer.getvalue(), what)


def file_sha256(path):
    """The sha256 of a file's bytes, as hex."""
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        for block in iter(lambda: handle.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def unused_name(path):
    """`path`, or `path.1`, `path.2` ... the first that does not exist."""
    path = pathlib.Path(path)
    candidate, number = path, 0
    while candidate.exists():
        number += 1
        candidate = path.with_name(f"{path.name}.{number}")
    return candidate


def set_aside(path, folder):
    """Moves `path` into `folder` under its own name, or the first unused `name.N`.

    Nothing set aside is overwritten: a second file of the same name set
    aside into the same folder becomes `name.1`, then `name.2`, ...

    Returns:
        The new path.
    """
    folder = pathlib.Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    target = unused_name(folder / pathlib.Path(path).name)
    os.replace(path, target)
    return target


@contextlib.contextmanager
def file_lock(path, *, busy=None, waiting=None, error=RuntimeError):
    """Holds an exclusive `fcntl.flock` on `path`, which names its holder.

    The lock is released by the kernel when its process ends, `kill -9`
    included, so a crash never leaves a stale lock. The file says
    "process <pid> on <host>" while it is held.

    Args:
        path: the lock file (created, with its folder).
        busy: when another process holds the lock, raise `error` with
            `busy(holder)` as its message instead of waiting.
        waiting: otherwise, the line logged before waiting for the holder.
        error: the exception class `busy` raises.
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
                raise error(busy(holder)) from None
            logger.info(waiting or f"Waiting for {holder}, which holds {path} ...")
            fcntl.flock(handle, fcntl.LOCK_EX)
        handle.seek(0)
        handle.truncate()
        handle.write(f"process {os.getpid()} on {socket.gethostname()}\n")
        handle.flush()
        yield
    finally:
        handle.close()  # releases the lock


def _writer_alive(folder):
    """Whether a live process holds `folder`'s writer lock (`staging_dir`)."""
    try:
        import fcntl
    except ImportError:  # not POSIX: assume it is
        return True
    lock = folder / WRITER_LOCK
    if not lock.is_file():
        # A folder made by code before the lock, or one whose writer has not
        # opened its lock yet: gone only when nothing touched it for a while.
        return time.time() - folder.stat().st_mtime < 600
    with open(lock, "a+") as handle:
        try:
            fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            return True
    return False


def remove_abandoned(parent, prefix):
    """Removes the staging folders `<parent>/<prefix>*` whose writer is gone.

    A writer holds its staging folder's lock while it runs (`staging_dir`);
    the kernel releases the lock when the writer dies, however it dies.

    Returns:
        The removed folders.
    """
    parent = pathlib.Path(parent)
    removed = []
    if not parent.is_dir():
        return removed
    for folder in sorted(parent.glob(f"{prefix}*")):
        with contextlib.suppress(OSError):
            if folder.is_dir() and not _writer_alive(folder):
                shutil.rmtree(folder)
                removed.append(folder)
    if removed:
        logger.info(f"Removed {len(removed)} staging folder(s) left by a writer that "
                    f"stopped: {', '.join(str(f) for f in removed)}")
    return removed


STAGING_PREFIX = ".tmp-"


@contextlib.contextmanager
def staging_dir(parent, name):
    """A hidden folder `<parent>/.tmp-<name>-<random>` to write into, removed on exit.

    Hidden, so that a model server scanning `parent` ignores it. Staging
    folders of earlier writers that are gone (killed) are removed first
    (`remove_abandoned`). The writer renames what it wrote out of the
    folder into place before the block ends; whatever is left is removed,
    on success and failure alike.

    Yields:
        The staging folder, a `pathlib.Path`.
    """
    parent = pathlib.Path(parent)
    parent.mkdir(parents=True, exist_ok=True)
    remove_abandoned(parent, STAGING_PREFIX)
    folder = pathlib.Path(tempfile.mkdtemp(prefix=f"{STAGING_PREFIX}{name}-", dir=parent))
    try:
        with file_lock(folder / WRITER_LOCK):
            yield folder
    finally:
        shutil.rmtree(folder, ignore_errors=True)


def replace_with_staged(staged, target):
    """Renames `staged` (a file or folder inside a `staging_dir`) to `target`.

    What `target` holds is first renamed into the staging folder (`staged`'s
    parent), then `staged` is renamed to `target`, then the old one is
    removed: `target` is never half removed under its own name, and if the
    process dies in between, the staging folder takes the old one with it
    (`remove_abandoned`). Both are in `target`'s folder, so both renames are
    atomic; when the second fails, the old one is renamed back.

    Args:
        staged: what was written, in a folder of `staging_dir(target.parent, ...)`.
        target: its final path; replaced if it exists.

    Returns:
        `target` as a `pathlib.Path`.
    """
    staged, target = pathlib.Path(staged), pathlib.Path(target)
    old = None
    if target.exists() or target.is_symlink():
        old = unused_name(staged.parent / f"replaced-{target.name}")
        os.replace(target, old)
    try:
        os.replace(staged, target)
    except OSError:
        if old is not None:
            with contextlib.suppress(OSError):
                os.replace(old, target)
        raise
    if old is not None:
        if old.is_dir() and not old.is_symlink():
            shutil.rmtree(old, ignore_errors=True)
        else:
            with contextlib.suppress(OSError):
                os.remove(old)
    return target


@contextlib.contextmanager
def native_stderr_silenced():
    """Sends file descriptor 2 to /dev/null while the block runs.

    For C++ libraries that write to stderr past any Python or TensorFlow log
    setting: TensorFlow's start-up notices (`commands.common.quiet_tensorflow`),
    and tf-text's bundled SentencePiece, which logs `normalizer.cc(51)
    LOG(INFO) precompiled_charsmap is empty. use identity normalization.`
    whenever it loads a model with identity normalization (ours: a
    `data.Tokenizer`, or a SavedModel's tokenizer op) and offers no switch
    for it. Python exceptions raised in the block still reach the caller.
    """
    sys.stderr.flush()
    saved, devnull = os.dup(2), os.open(os.devnull, os.O_WRONLY)
    os.dup2(devnull, 2)
    try:
        yield
    finally:
        os.dup2(saved, 2)
        os.close(saved)
        os.close(devnull)
