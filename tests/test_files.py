"""keras_transformer.files: every write atomic and flushed, weights made in memory.

The weights writer must never let HDF5 write to disk itself (a full disk
under HDF5 crashes the interpreter): the tests here watch every file opened
for writing while weights are saved, and compare the bytes written with
what Keras' own public `save_weights` writes.
"""

import builtins
import errno
import io
import os

import h5py
import numpy as np
import pytest

from keras_transformer import files


def _model(config, optimizer=True):
    """A built tiny model, compiled with Adam whose variables exist (a state file's content)."""
    import keras

    from keras_transformer import build_model

    keras.utils.set_random_seed(0)
    model = build_model(config)
    if optimizer:
        model.compile(optimizer=keras.optimizers.Adam(1e-3))
        model.optimizer.build(model.trainable_variables)
    return model


def _h5_tree(data):
    """`{name: (kind, dtype, shape, values, attributes)}` of every group and dataset of HDF5 bytes."""
    tree = {}
    with h5py.File(io.BytesIO(data), "r") as handle:
        def visit(name, item):
            attributes = {k: np.asarray(v).tolist() for k, v in item.attrs.items()}
            if isinstance(item, h5py.Dataset):
                tree[name] = ("dataset", item.dtype.str, item.shape, item[()].tobytes(),
                              attributes)
            else:
                tree[name] = ("group", attributes)

        handle.visititems(visit)
        tree["/"] = ("file", {k: np.asarray(v).tolist() for k, v in handle.attrs.items()})
    return tree


class _WriteWatcher:
    """Records every file opened for writing: by Python (`open`, `os.open`) and by HDF5."""

    _WRITE_FLAGS = os.O_WRONLY | os.O_RDWR | os.O_CREAT | os.O_APPEND | os.O_TRUNC

    def __init__(self, monkeypatch):
        self.python, self.hdf5_paths, self.hdf5_in_memory = [], [], 0
        real_open, real_os_open, real_file = builtins.open, os.open, h5py.File
        watcher = self

        def watched_open(file, mode="r", *args, **kwargs):
            if isinstance(file, (str, bytes, os.PathLike)) and set(mode) & set("wax+"):
                watcher.python.append(os.path.abspath(os.fsdecode(file)))
            return real_open(file, mode, *args, **kwargs)

        def watched_os_open(path, flags, *args, **kwargs):
            if flags & self._WRITE_FLAGS:
                watcher.python.append(os.path.abspath(os.fsdecode(path)))
            return real_os_open(path, flags, *args, **kwargs)

        class WatchedFile(real_file):
            def __init__(self, name, *args, **kwargs):
                if isinstance(name, (str, bytes, os.PathLike)):
                    watcher.hdf5_paths.append(os.path.abspath(os.fsdecode(name)))
                elif hasattr(name, "read"):
                    watcher.hdf5_in_memory += 1
                super().__init__(name, *args, **kwargs)

        monkeypatch.setattr(builtins, "open", watched_open)
        monkeypatch.setattr(io, "open", watched_open)
        monkeypatch.setattr(os, "open", watched_os_open)
        monkeypatch.setattr(h5py, "File", WatchedFile)


def test_weights_are_made_in_memory_and_are_keras_own_file(tiny_config, tmp_path,
                                                           monkeypatch):
    import keras

    model = _model(tiny_config)
    target = tmp_path / "state-7.weights.h5"
    with monkeypatch.context() as patch:
        watcher = _WriteWatcher(patch)
        files.save_weights(model, target)
    # HDF5 wrote into memory only; the one file opened for writing is the
    # partial file, renamed to the target.
    assert watcher.hdf5_in_memory >= 1 and watcher.hdf5_paths == []
    assert [p for p in watcher.python if p.startswith(str(tmp_path))] == [
        str(files.partial_path(target))]
    assert sorted(os.listdir(tmp_path)) == [target.name]

    # The same groups, datasets, values and attributes as Keras' own file.
    reference = tmp_path / "keras" / "state-7.weights.h5"
    reference.parent.mkdir()
    model.save_weights(reference)
    assert _h5_tree(target.read_bytes()) == _h5_tree(reference.read_bytes())
    # And it loads back, the optimizer's state included.
    restored = _model(tiny_config)
    restored.load_weights(target)
    for ours, theirs in zip(model.weights + model.optimizer.variables,
                            restored.weights + restored.optimizer.variables):
        np.testing.assert_array_equal(keras.ops.convert_to_numpy(ours),
                                      keras.ops.convert_to_numpy(theirs))


def test_model_weights_only_leave_the_optimizer_out(tiny_config, tmp_path):
    model = _model(tiny_config)
    files.save_weights(model, tmp_path / "best.weights.h5", optimizer=False)
    files.save_weights(model, tmp_path / "state.weights.h5")
    weights_only = _h5_tree((tmp_path / "best.weights.h5").read_bytes())
    state = _h5_tree((tmp_path / "state.weights.h5").read_bytes())
    assert not any(name.startswith("optimizer") for name in weights_only)
    assert any(name.startswith("optimizer") for name in state)
    assert {n: v for n, v in state.items() if not n.startswith("optimizer")} == weights_only


@pytest.mark.parametrize("missing", ["H5IOStore", "_save_state", "save_model"])
def test_without_keras_in_memory_saving_nothing_is_written(tiny_config, tmp_path, monkeypatch,
                                                          missing):
    from keras.src.saving import saving_lib

    model = _model(tiny_config, optimizer=False)
    monkeypatch.delattr(saving_lib, missing)
    for save, name in ((files.save_weights, "a.weights.h5"), (files.save_model, "a.keras")):
        with pytest.raises(files.WriteError) as caught:
            save(model, tmp_path / name, what=f"writing {name}")
        message = str(caught.value)
        assert "\n" not in message and message.startswith(f"writing {name} failed: Keras ")
        assert f"no {missing}" in message
    assert os.listdir(tmp_path) == []  # never written straight to disk instead


def test_write_atomically_flushes_the_file_before_the_rename(tmp_path, monkeypatch):
    synced = []
    real_fsync = os.fsync

    def fsync(descriptor):
        synced.append(os.readlink(f"/proc/self/fd/{descriptor}"))
        return real_fsync(descriptor)

    monkeypatch.setattr(os, "fsync", fsync)
    target = tmp_path / "warmup.tfrecord"

    def write(path):  # a writer that opens the file itself (TFRecordWriter, savefig)
        with open(path, "wb") as handle:
            handle.write(b"records")

    files.write_atomically(target, write)
    assert synced == [str(files.partial_path(target))]
    assert target.read_bytes() == b"records" and os.listdir(tmp_path) == [target.name]

    def full(descriptor):
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    monkeypatch.setattr(os, "fsync", full)
    with pytest.raises(files.WriteError, match="^writing it failed: No space left on device$"):
        files.write_atomically(target, lambda path: open(path, "wb").close(), "writing it")
    assert target.read_bytes() == b"records" and os.listdir(tmp_path) == [target.name]


def test_append_bytes_cuts_a_failed_append_off(tmp_path, monkeypatch):
    log = tmp_path / "log.csv"
    files.append_bytes(log, b"step,loss\r\n")
    files.append_bytes(log, b"1,2.5\r\n")
    assert log.read_bytes() == b"step,loss\r\n1,2.5\r\n"

    def full(descriptor):
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    monkeypatch.setattr(os, "fsync", full)
    with pytest.raises(files.WriteError, match="^writing the log failed: No space left"):
        files.append_bytes(log, b"2,2.4\r\n", what="writing the log")
    assert log.read_bytes() == b"step,loss\r\n1,2.5\r\n"  # no half row
    with pytest.raises(files.WriteError):
        files.append_bytes(tmp_path / "new.csv", b"step\r\n")
    assert sorted(os.listdir(tmp_path)) == ["log.csv"]  # the file it created is gone


@pytest.mark.parametrize("kind", ["folder", "file"])
def test_replace_with_staged_moves_the_old_target_into_the_staging_folder(tmp_path, kind):
    target = tmp_path / "1"

    def make(path, text):
        if kind == "folder":
            path.mkdir()
            (path / "saved_model.pb").write_text(text)
        else:
            path.write_text(text)

    def read(path):
        return (path / "saved_model.pb").read_text() if kind == "folder" else path.read_text()

    with files.staging_dir(tmp_path, "1") as staging:  # nothing there yet
        make(staging / "model", "first")
        assert files.replace_with_staged(staging / "model", target) == target
    assert read(target) == "first"
    with files.staging_dir(tmp_path, "1") as staging:
        make(staging / "model", "second")
        files.replace_with_staged(staging / "model", target)
        assert read(target) == "second"
        assert sorted(os.listdir(staging)) == [files.WRITER_LOCK]  # the old one is gone
    assert sorted(os.listdir(tmp_path)) == ["1"]


def test_a_failed_rename_puts_the_old_target_back(tmp_path):
    target = tmp_path / "corpus"
    target.mkdir()
    (target / "manifest.json").write_text("old")
    with files.staging_dir(tmp_path, "corpus") as staging:
        with pytest.raises(FileNotFoundError):
            files.replace_with_staged(staging / "never-written", target)
    assert (target / "manifest.json").read_text() == "old"
    assert sorted(os.listdir(tmp_path)) == ["corpus"]
