"""Writing files safely: atomic writes, weights made in memory, locks, setting aside.

Every file the package writes goes through here, so that a killed process,
a full disk or a lost mount never leaves a half-written file under a real
name and never crashes the interpreter:

- `write_atomically` / `write_bytes`: the file is written under a
  temporary name (`partial_path`), flushed to disk (`fsync`) and renamed;
  any failure removes the temporary file and raises `WriteError`, which
  names what was being written and why.
- `save_weights` / `save_model`: HDF5 that hits a full disk halfway leaves
  the library in a state in which freeing its objects crashes the
  interpreter (measured: a segmentation fault after "No space left on
  device"), so weights and `.keras` files are made in memory first and
  written with plain file I/O.
- `set_aside(path, folder)`: moves a file out of the way under a name that
  is not taken; nothing set aside is ever overwritten.
- `file_lock`: an exclusive lock the kernel releases when its holder dies.
- `staging_dir` / `remove_abandoned`: a hidden folder a writer fills
  before renaming its result into place, and the removal of those whose
  writer is gone (a `kill -9` during an export).

This module knows nothing of run folders, corpora or models' meaning: the
run folder (`keras_transformer.runs`), the prepared corpora
(`keras_transformer.data.prepared`), training and the exports use it.
"""

import contextlib
import hashlib
import io
import logging
import os
import pathlib
import shutil
import socket
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
    """Calls `write(temporary_path)` then renames the result to `path`.

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


def weights_bytes(model, optimizer=True):
    """The bytes `model.save_weights` would write, made in memory.

    Made in memory: see the module docstring for why HDF5 must not meet a
    full disk.

    Args:
        model: a Keras model.
        optimizer: also the optimizer's variables (Adam's moments, the
            update count) when the model is compiled, as `save_weights`
            does; `False` for the model's weights only (a third of the
            bytes with Adam).
    """
    from keras.src.saving import saving_lib

    buffer = io.BytesIO()
    store = saving_lib.H5IOStore(buffer, mode="w")
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
        WriteError: the file could not be written; no partial file is left.
    """
    try:
        data = weights_bytes(model, optimizer=optimizer)
    except (ImportError, AttributeError, TypeError):
        # Keras moved its saving internals: write through its public API.
        return write_atomically(path, model.save_weights, what)
    return write_bytes(path, data, what)


def save_model(model, path, what=None):
    """`model.save(path)` (a `.keras` file), atomically, made in memory first.

    Raises:
        WriteError: the file could not be written; no partial file is left.
    """
    try:
        from keras.src.saving import saving_lib

        buffer = io.BytesIO()
        saving_lib.save_model(model, buffer)  # a file object: the archive made in memory
    except (ImportError, AttributeError, TypeError):
        # Keras moved its saving internals: write through its public API.
        return write_atomically(path, model.save, what)
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
