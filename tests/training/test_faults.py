"""Faults a long run meets: a signal, a full disk, a diverging loss, damaged run files.

The end-to-end cases run `keras-transformer train` in real subprocesses on a
small slice of Multi30k (as tests/training/test_runs.py does); the signal handling
inside `fit` is also checked in-process under every backend, since each
backend has its own training loop.
"""

import csv
import errno
import json
import os
import pathlib
import shutil
import signal
import subprocess
import sys
import textwrap
import time

import h5py
import numpy as np
import pytest

from conftest import subprocess_env, tiny_train_command

from keras_transformer import files, runs

from keras_transformer.inference import loading



@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
    """1,000 Multi30k training pairs, 100 validation, 8 test."""
    from conftest import multi30k_head

    return multi30k_head(tmp_path_factory.mktemp("corpus"), (
        ("train", "train", 1000), ("valid", "valid", 100), ("test", "test", 8)))


def _command(corpus, run_dir, *extra):
    """The tiny training command (see conftest), with no validation BLEU."""
    return tiny_train_command(corpus, run_dir, "--validation-bleu-sentences", "0", *extra)


def _train(corpus, run_dir, *extra, expect=0, env=None):
    # In the run's parent folder: the prepared corpus goes to its runs/prepared.
    result = subprocess.run(_command(corpus, run_dir, *extra), env=env or subprocess_env(),
                            capture_output=True, text=True, timeout=900,
                            cwd=pathlib.Path(run_dir).parent)
    output = result.stdout + result.stderr
    assert result.returncode == expect, output[-5000:]
    return output


def _last_line(output):
    return output.strip().splitlines()[-1]


def _update_of(path):
    """The optimizer update count a state file holds (Keras' first optimizer variable)."""
    with h5py.File(path, "r") as handle:
        return int(handle["optimizer/vars/0"][()])


def _partials(folder):
    return sorted(str(p) for p in pathlib.Path(folder).rglob(".partial-*"))


@pytest.fixture(scope="module")
def finished_run(corpus, tmp_path_factory):
    """A finished 10-update run (exported nowhere), copied by the tests that damage it."""
    run_dir = tmp_path_factory.mktemp("finished") / "run"
    _train(corpus, run_dir, "--train-steps", "10")
    return run_dir


# --- signals ---------------------------------------------------------------------------


@pytest.mark.every_backend  # each backend has its own fit loop
def test_a_signal_inside_fit_finishes_the_update_backs_it_up_and_stops(tiny_config,
                                                                       tmp_path):
    """A real SIGINT, sent by the process to itself during update 3."""
    import keras

    from keras_transformer import build_model
    from keras_transformer.training.checkpoints import StateSaver, WeightWriter
    from keras_transformer.training.divergence import DivergenceRule
    from keras_transformer.training.guard import RunGuard
    from keras_transformer.training.log import TrainingLog
    from keras_transformer.training.stops import Outcome
    from keras_transformer.training.optimization import compile_model

    inputs, target = _one_batch(tiny_config)
    model = build_model(tiny_config)
    compile_model(model, gradient_accumulation_steps=2)
    run = runs.RunFolder(tmp_path)

    class SendSignal(keras.callbacks.Callback):
        def on_train_batch_begin(self, batch, logs=None):
            if batch == 4:  # the first micro-batch of update 3 (2 per update)
                os.kill(os.getpid(), signal.SIGINT)

    writer = WeightWriter()
    guard = RunGuard(
        start_update=0, accumulation_steps=2, writer=writer,
        saver=StateSaver(run, writer, checkpoint_every=1000, keep=5, backup_minutes=0),
        log=TrainingLog(run, every=1000, total_updates=10**6, target_tokens_per_update=24),
        divergence=DivergenceRule(tiny_config.vocab_size))
    before = signal.getsignal(signal.SIGINT)
    model.fit(_repeat(inputs, target), epochs=1, steps_per_epoch=40, verbose=0, shuffle=False,
              callbacks=[SendSignal(), guard])
    # The update in progress (both of its micro-batches) finished, then fit stopped.
    assert guard.update == 3
    assert guard.outcome == Outcome("signal", 3, signal_number=signal.SIGINT,
                                    backup=run.backup_path(3))
    assert guard.outcome.exit_status == 130
    assert [step for step, _ in run.backups()] == [3]
    # Keras counts micro-batches in its first optimizer variable: 2 per update.
    assert _update_of(run.backup_path(3)) == 3 * 2
    assert run.checkpoints() == []  # no checkpoint at an update off its grid
    # The backup holds the weights the model has now.
    restored = build_model(tiny_config)
    loading.load_model_weights(restored, run.backup_path(3))
    for mine, theirs in zip(model.get_weights(), restored.get_weights()):
        np.testing.assert_array_equal(np.asarray(mine), np.asarray(theirs))
    assert signal.getsignal(signal.SIGINT) is before  # handlers put back


def _one_batch(config):
    """A batch of 4 random pairs of 6 ids: (inputs, labels)."""
    rng = np.random.default_rng(0)
    source = rng.integers(4, config.vocab_size, (4, 6)).astype("int32")
    target = rng.integers(4, config.vocab_size, (4, 6)).astype("int32")
    return {"source_ids": source,
            "target_ids": np.concatenate([np.ones((4, 1), "int32"), target[:, :-1]], 1)}, target


def _repeat(inputs, target):
    import tensorflow as tf

    return tf.data.Dataset.from_tensors((inputs, target)).repeat()


@pytest.mark.backend_independent  # the handler itself, in a plain Python child
def test_a_second_signal_while_saving_exits_at_once_and_removes_the_partial_file(tmp_path):
    backup = tmp_path / "backup" / "state-7.weights.h5"
    backup.parent.mkdir()
    older = tmp_path / "backup" / "state-5.weights.h5"
    older.write_bytes(b"the older backup")
    files.partial_path(backup).write_bytes(b"half a file")
    script = textwrap.dedent(f"""
        import os, pathlib, signal
        from keras_transformer import runs
        from keras_transformer.training.checkpoints import StateSaver, WeightWriter
        from keras_transformer.training.divergence import DivergenceRule
        from keras_transformer.training.guard import RunGuard
        from keras_transformer.training.log import TrainingLog

        run, writer = runs.RunFolder({str(tmp_path / "run")!r}), WeightWriter()
        guard = RunGuard(start_update=0, accumulation_steps=1, writer=writer,
                         saver=StateSaver(run, writer, checkpoint_every=10, keep=5),
                         log=TrainingLog(run, every=10, total_updates=10,
                                         target_tokens_per_update=1),
                         divergence=DivergenceRule(100))
        guard.install_signal_handlers()
        writer.writing = pathlib.Path({str(backup)!r})  # "saving" the backup
        os.kill(os.getpid(), signal.SIGTERM)  # the first: noted
        assert guard.signal_number == signal.SIGTERM
        os.kill(os.getpid(), signal.SIGTERM)  # the second, while "saving": gone
        print("still running")
    """)
    result = subprocess.run([sys.executable, "-c", script], env=subprocess_env(),
                            capture_output=True, text=True, timeout=300)
    assert result.returncode == 143, result.stderr[-3000:]
    assert "still running" not in result.stdout
    assert result.stderr.strip().splitlines()[-1] == (
        "SIGTERM again: exiting at once; the states written before are intact")
    assert not files.partial_path(backup).exists()
    assert older.read_bytes() == b"the older backup"


@pytest.mark.slow
def test_sigterm_to_train_backs_up_the_update_and_the_rerun_continues(corpus, tmp_path):
    run_dir = tmp_path / "run"
    # No backup or checkpoint before the signal: everything saved is its doing.
    command = _command(corpus, run_dir, "--train-steps", "300", "--checkpoint-every",
                       "1000", "--backup-minutes", "0", "--log-every", "1")
    log_path = tmp_path / "first.log"
    with open(log_path, "w") as log:
        process = subprocess.Popen(command, env=subprocess_env(), stdout=log,
                                   stderr=subprocess.STDOUT, cwd=tmp_path)
        deadline = time.time() + 600
        try:
            while "update 3/300" not in log_path.read_text():
                assert process.poll() is None, log_path.read_text()[-3000:]
                assert time.time() < deadline, "no update 3 within 10 minutes"
                time.sleep(0.05)
            process.send_signal(signal.SIGTERM)
            status = process.wait(timeout=300)
        finally:
            if process.poll() is None:
                process.kill()
    output = log_path.read_text()
    assert status == 143, output[-3000:]
    run = runs.RunFolder(run_dir)
    [(update, path)] = run.backups()
    assert 3 <= update < 300 and _update_of(path) == update
    assert f"SIGTERM received: stopped after update {update} (backup at update {update}: " \
        in output
    assert _last_line(output) == (
        f"keras-transformer train: stopped by SIGTERM after update {update}, backed up in "
        f"{path}; run the same command to continue from it")
    assert "Traceback" not in output and not run.results_file.exists()

    output = _train(corpus, run_dir, "--train-steps", str(update + 2), "--checkpoint-every",
                    "1000", "--backup-minutes", "0", "--log-every", "1")
    assert f"Continuing {run_dir} at update {update} (of {update + 2})" in output
    results = json.loads(run.results_file.read_text())
    assert (results["final_step"], results["steps_this_run"]) == (update + 2, 2)


# --- a full disk -------------------------------------------------------------------------


# A write hook: `os.fsync` of a file whose name contains $KT_TEST_ENOSPC fails
# with ENOSPC, as the write of a full disk does (files.write_bytes flushes and
# syncs every file it writes before renaming it).
_ENOSPC_HOOK = """
import errno, os

_fsync, _target = os.fsync, os.environ.get("KT_TEST_ENOSPC")


def fsync(fd):
    if _target and _target in os.readlink(f"/proc/self/fd/{fd}"):
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
    return _fsync(fd)


os.fsync = fsync
"""


@pytest.mark.backend_independent
def test_a_failed_weights_write_removes_its_partial_file_and_keeps_the_old_one(
        tiny_config, tmp_path, monkeypatch):
    from keras_transformer import build_model

    model = build_model(tiny_config)
    path = tmp_path / "state-4.weights.h5"
    files.save_weights(model, path)
    good = path.read_bytes()
    # The bytes are those of Keras' own save_weights: the file loads back.
    restored = build_model(tiny_config)
    restored.load_weights(path)
    for mine, theirs in zip(model.get_weights(), restored.get_weights()):
        np.testing.assert_array_equal(np.asarray(mine), np.asarray(theirs))

    def full(fd):
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    # Other weights, whose bytes differ from the file's: the failed write must not leave them.
    assert files.weights_bytes(model) == good
    variable = model.weights[0]
    variable.assign(np.zeros(tuple(variable.shape), dtype=variable.dtype))
    assert files.weights_bytes(model) != good
    monkeypatch.setattr(os, "fsync", full)
    with pytest.raises(files.WriteError, match=r"^writing the backup failed: No space left on "
                                              r"device$") as caught:
        files.save_weights(model, path, what="writing the backup")
    assert caught.value.error.errno == errno.ENOSPC
    assert path.read_bytes() == good
    assert os.listdir(tmp_path) == [path.name]  # no partial file


@pytest.mark.slow
def test_a_full_disk_stops_the_run_in_one_line_and_the_rerun_continues(finished_run, corpus,
                                                                      tmp_path):
    run_dir = tmp_path / "run"
    shutil.copytree(finished_run, run_dir)  # 10 updates; a larger budget continues it
    before = (run_dir / "backup" / "state-10.weights.h5").read_bytes()
    hook = tmp_path / "hook"
    hook.mkdir()
    (hook / "sitecustomize.py").write_text(_ENOSPC_HOOK)
    env = subprocess_env(hook, KT_TEST_ENOSPC="ckpt-20.weights.h5")
    output = _train(corpus, run_dir, "--train-steps", "30", env=env, expect=1)
    assert "Traceback" not in output
    assert _last_line(output) == (
        "keras-transformer train: error: writing the checkpoint of update 20 "
        "(checkpoints/ckpt-20.weights.h5) failed: No space left on device; the newest good "
        "state is backup/state-10.weights.h5 (update 10). Free space (or fix the folder) "
        "and run the same command to continue")
    # The previous backup, byte for byte; no partial file; nothing after it.
    assert (run_dir / "backup" / "state-10.weights.h5").read_bytes() == before
    assert _partials(run_dir) == []
    assert [step for step, _ in runs.RunFolder(run_dir).state_files()] == [10, 10]

    # Space freed: the same command continues from update 10.
    output = _train(corpus, run_dir, "--train-steps", "30")
    assert f"Continuing {run_dir} at update 10 (of 30)" in output
    assert json.loads((run_dir / runs.RESULTS_FILE).read_text())["final_step"] == 30


@pytest.mark.slow
def test_a_full_disk_at_model_keras_stops_in_one_line_and_the_rerun_finishes(
        finished_run, corpus, tmp_path):
    run_dir = tmp_path / "run"
    shutil.copytree(finished_run, run_dir)
    for name in (runs.RESULTS_FILE, runs.MODEL_FILE):  # as if the run had stopped there
        (run_dir / name).unlink()
    hook = tmp_path / "hook"
    hook.mkdir()
    (hook / "sitecustomize.py").write_text(_ENOSPC_HOOK)
    output = _train(corpus, run_dir, "--train-steps", "10", expect=1,
                    env=subprocess_env(hook, KT_TEST_ENOSPC=runs.MODEL_FILE))
    assert "Traceback" not in output and "Segmentation" not in output
    assert _last_line(output) == (
        "keras-transformer train: error: writing the final model (model.keras) failed: No "
        "space left on device; training is complete at update 10 and the newest good state "
        "is backup/state-10.weights.h5 (update 10). Free space (or fix the folder) and run "
        "the same command to finish the run (final weights, test, export)")
    assert not (run_dir / runs.MODEL_FILE).exists() and _partials(run_dir) == []
    output = _train(corpus, run_dir, "--train-steps", "10")
    assert loading.load_keras_file(run_dir / runs.MODEL_FILE).count_params() > 0
    assert json.loads((run_dir / runs.RESULTS_FILE).read_text())["final_step"] == 10


@pytest.mark.slow
@pytest.mark.backend_independent  # the export's temporary weights exist under JAX and torch
def test_a_full_disk_at_the_exports_temporary_weights_is_one_line(finished_run, corpus,
                                                                  tmp_path):
    run_dir, export_dir = tmp_path / "run", tmp_path / "exports"
    shutil.copytree(finished_run, run_dir)
    (run_dir / runs.RESULTS_FILE).unlink()  # as if the export had not run yet
    hook = tmp_path / "hook"
    hook.mkdir()
    (hook / "sitecustomize.py").write_text(_ENOSPC_HOOK)
    # Under JAX the job hands the weights to a TensorFlow child through a file.
    output = _train(corpus, run_dir, "--train-steps", "10", "--export-dir", str(export_dir),
                    expect=1, env=subprocess_env(hook, KT_TEST_ENOSPC="model.weights.h5",
                                                 KERAS_BACKEND="jax"))
    assert "Traceback" not in output and "Segmentation" not in output
    assert _last_line(output).startswith(
        "keras-transformer train: error: writing the export's temporary weights failed: No "
        "space left on device; training is complete at update 10 and ")
    assert [p for p in export_dir.rglob("*") if p.is_file()] == []


@pytest.mark.backend_independent
def test_a_killed_writers_staging_folder_is_removed_by_the_next_writer(tmp_path):
    """`kill -9` during an export leaves its staging folder; the next export removes it."""
    writer = textwrap.dedent(f"""
        import time
        from keras_transformer import files
        with files.staging_dir({str(tmp_path)!r}, "1") as folder:
            (folder / "model").mkdir()
            print(folder, flush=True)
            time.sleep(600)
    """)
    child = subprocess.Popen([sys.executable, "-c", writer], stdout=subprocess.PIPE,
                             text=True, env=subprocess_env())
    try:
        killed = pathlib.Path(child.stdout.readline().strip())
        assert killed.parent == tmp_path and killed.name.startswith(".tmp-1-")
        with files.staging_dir(tmp_path, "2"):  # a live writer's folder is left alone
            assert (killed / "model").is_dir()
    finally:
        child.kill()
        child.wait()
    assert (killed / "model").is_dir()  # kill -9 ran no clean-up
    with files.staging_dir(tmp_path, "1") as mine:
        assert not killed.exists() and mine.is_dir()
    assert list(tmp_path.iterdir()) == []


@pytest.fixture
def small_disk(tmp_path):
    """A 1 MiB tmpfs (a real full disk); skipped where mounting is not permitted."""
    folder = tmp_path / "small_disk"
    folder.mkdir()
    if shutil.which("mount") is None or subprocess.run(
            ["mount", "-t", "tmpfs", "-o", "size=1m", "tmpfs", str(folder)],
            capture_output=True).returncode != 0:
        pytest.skip("mounting a tmpfs needs root (CI runs as root)")
    try:
        yield folder
    finally:
        subprocess.run(["umount", str(folder)], capture_output=True)


@pytest.mark.slow
@pytest.mark.every_backend  # under JAX and PyTorch the export runs in a TensorFlow child
def test_a_full_disk_during_the_export_leaves_no_version_and_the_rerun_finishes(
        finished_run, corpus, tmp_path, small_disk, capsys):
    run_dir = tmp_path / "run"
    shutil.copytree(finished_run, run_dir)
    (run_dir / runs.RESULTS_FILE).unlink()  # as if the export had not run yet
    output = _train(corpus, run_dir, "--train-steps", "10", "--export-dir", str(small_disk),
                    expect=1)
    assert "Traceback" not in output
    line = _last_line(output)
    assert line == (
        f"keras-transformer train: error: writing the SavedModel {small_disk}/run/1 failed: "
        "No space left on device; training is complete at update 10 and the newest good "
        "state is backup/state-10.weights.h5 (update 10). Free space (or fix the folder) and "
        "run the same command to finish the run (final weights, test, export)")
    # Nothing half-written is left on the full disk: no version, no staging folder.
    assert [p.name for p in small_disk.rglob("*") if p.is_file()] == []
    assert not (run_dir / runs.RESULTS_FILE).exists()
    # The export command: the same line, nothing left.
    status, _, err = _command_main(capsys, "export", "--run", str(run_dir), "--export-dir",
                                   str(small_disk), "--quiet")
    assert status == 1 and len(err.strip().splitlines()) == 1, err
    assert err.strip() == (f"keras-transformer export: error: writing the SavedModel "
                           f"{small_disk}/run/1 failed: No space left on device")
    assert [p.name for p in small_disk.rglob("*") if p.is_file()] == []
    output = _train(corpus, run_dir, "--train-steps", "10", "--export-dir", "")
    assert "Training is complete at update 10; finishing the run" in output
    assert json.loads((run_dir / runs.RESULTS_FILE).read_text())["final_step"] == 10


# --- two exports at once -------------------------------------------------------------------


def _complete_version(folder):
    """Whether `folder` holds a whole SavedModel export (what TF Serving loads)."""
    return all((folder / name).exists() for name in (
        "saved_model.pb", "variables/variables.index", "assets/spm.model",
        "assets.extra/export_options.json", "assets.extra/tf_serving_warmup_requests"))


@pytest.mark.slow
@pytest.mark.backend_independent  # the export runs under TensorFlow in its own processes
def test_two_exports_at_once_to_one_model_name_get_a_version_each(finished_run, tmp_path):
    base = tmp_path / "saved_models"
    # A version that was there before: never replaced, never touched.
    old = base / "m" / "1"
    old.mkdir(parents=True)
    (old / "marker").write_text("version 1")
    inode = old.stat().st_ino
    command = [sys.executable, "-m", "keras_transformer", "export", "--run", str(finished_run),
               "--export-dir", str(base), "--model-name", "m", "--quiet"]
    children = [subprocess.Popen(command, env=subprocess_env(), stdout=subprocess.PIPE,
                                 stderr=subprocess.PIPE, text=True) for _ in range(2)]
    outputs = [child.communicate(timeout=600) for child in children]
    for child, (out, err) in zip(children, outputs):
        assert child.returncode == 0, err[-3000:]
    printed = sorted(out.strip().splitlines()[-1] for out, _ in outputs)
    # Each export says its own version; both are there, whole, beside version 1.
    assert printed == [str(base / "m" / "2"), str(base / "m" / "3")], outputs
    assert sorted(p.name for p in (base / "m").iterdir() if not p.name.startswith(".")) == [
        "1", "2", "3"]
    assert all(_complete_version(base / "m" / v) for v in ("2", "3"))
    assert old.stat().st_ino == inode and (old / "marker").read_text() == "version 1"
    assert not list((base / "m").glob(files.STAGING_PREFIX + "*"))


@pytest.mark.backend_independent  # file renames under a lock
def test_a_version_taken_while_an_export_ran_is_never_replaced(tmp_path):
    from keras_transformer.export.saved_model import publish_version

    model_dir = tmp_path / "m"
    (model_dir / "2").mkdir(parents=True)
    (model_dir / "2" / "saved_model.pb").write_text("the first export")
    with files.staging_dir(model_dir, "2") as staging:
        staged = staging / "model"
        staged.mkdir()
        (staged / "saved_model.pb").write_text("the second export")
        # Asked for version 2, which another export took meanwhile: refused.
        with pytest.raises(FileExistsError, match=r"m/2 was written by another export while "
                           r"this one ran; this export is not kept \(nothing was replaced\)"):
            publish_version(staged, model_dir, 2)
        assert (model_dir / "2" / "saved_model.pb").read_text() == "the first export"
        # No version asked for: the next free one.
        assert publish_version(staged, model_dir) == model_dir / "3"
    assert (model_dir / "3" / "saved_model.pb").read_text() == "the second export"
    assert (model_dir / "2" / "saved_model.pb").read_text() == "the first export"


# --- a diverging loss ----------------------------------------------------------------------


def _rows(rule, losses, every=5, start=0):
    """Feeds log rows every `every` updates; returns each row's verdict."""
    return [rule.check_row(dict(step=start + every * (i + 1), loss=loss))
            for i, loss in enumerate(losses)]


@pytest.mark.backend_independent
def test_divergence_rule_three_rows_above_twice_ln_v():
    from keras_transformer.training.divergence import DivergenceRule

    limit = 2 * np.log(500)  # 12.43
    rule = DivergenceRule(500)
    rule.begin(0)
    # Two rows above, one below: the streak restarts; a fresh model's ln V + 0.5 is fine.
    assert _rows(rule, [6.7, limit + 1, limit + 1, 5.0, limit + 1, limit + 1]) == [None] * 6
    assert rule.last_good == 20
    assert _rows(rule, [1e6], start=30) == [
        f"above {limit:.1f} (2 x ln 500) for 3 logged updates in a row"]
    assert rule.last_good == 20
    # A validation row without training batches since the last row counts neither way.
    rule.begin(0)
    assert _rows(rule, [limit + 1, limit + 1, float("nan"), limit + 1])[-1] is not None

    # Off: a finite loss never stops the run, a non-finite one still does.
    rule = DivergenceRule(500, enabled=False)
    rule.begin(0)
    assert _rows(rule, [1e6] * 5) == [None] * 5
    assert rule.check_loss(1e6) is None and rule.check_loss(12.0) is None
    assert rule.check_loss(float("nan")) == rule.check_loss(float("inf")) == (
        "the loss is not finite")


@pytest.mark.backend_independent
def test_a_diverged_update_is_not_saved_and_fit_says_so(tiny_config, tmp_path):
    """The guard's order: the row's verdict comes before the saver, so the update that
    diverged writes no state; the ones before it did."""
    from keras_transformer import build_model
    from keras_transformer.training.checkpoints import StateSaver, WeightWriter
    from keras_transformer.training.divergence import DivergenceRule
    from keras_transformer.training.guard import RunGuard
    from keras_transformer.training.log import TrainingLog
    from keras_transformer.training.optimization import compile_model

    inputs, target = _one_batch(tiny_config)
    model = compile_model(build_model(tiny_config))
    run = runs.RunFolder(tmp_path)
    # A fresh model's loss is about ln V: above 0.5 ln V at every row, so with a
    # patience of 2 the rule fires at the second row (update 2).
    writer = WeightWriter()
    guard = RunGuard(
        start_update=0, accumulation_steps=1, writer=writer,
        saver=StateSaver(run, writer, checkpoint_every=1, keep=5, backup_minutes=0),
        log=TrainingLog(run, every=1, total_updates=10, target_tokens_per_update=24),
        divergence=DivergenceRule(tiny_config.vocab_size, factor=0.5, patience=2))
    model.fit(_repeat(inputs, target), epochs=1, steps_per_epoch=10, verbose=0, shuffle=False,
              callbacks=[guard])
    outcome = guard.outcome
    assert (outcome.kind, outcome.update, outcome.last_good) == ("diverged", 2, 0)
    assert outcome.exit_status == 1 and outcome.loss > 0.5 * np.log(tiny_config.vocab_size)
    assert [step for step, _ in run.checkpoints()] == [1]  # update 2 wrote nothing
    assert [step for step, _ in run.backups()] == [1]
    with open(run.log_file, newline="") as handle:
        assert [int(r["step"]) for r in csv.DictReader(handle)] == [1, 2]


@pytest.mark.slow
def test_a_diverging_learning_rate_stops_the_run_exports_nothing_and_sets_states_aside(
        corpus, tmp_path):
    run_dir = tmp_path / "run"
    export_dir = tmp_path / "saved_models"
    # A log row every 2 updates, so the rule (3 rows in a row) decides at update 6:
    # this learning rate makes the loss NaN later (update 11 in bf16, 13 in float32 on
    # some CPUs), which would stop the run by the other rule ("the loss is not finite").
    output = _train(corpus, run_dir, "--train-steps", "200", "--learning-rate-factor", "1e6",
                    "--log-every", "2", "--checkpoint-every", "4",
                    "--export-dir", str(export_dir), "--mixed-precision", "none", expect=1)
    assert "Traceback" not in output
    line = _last_line(output)
    with open(run_dir / runs.ROLLED_BACK_LOG_FILE, newline="") as handle:
        rows = [(int(r["step"]), float(r["loss"])) for r in csv.DictReader(handle)]
    # The rule: 3 logged rows above 2 ln 500; this learning rate is past it in
    # the first row (the loss of a fresh model is about ln 500 = 6.2).
    assert [step for step, _ in rows] == [2, 4, 6]
    assert all(loss > 2 * np.log(500) for _, loss in rows)
    assert line == (
        f"keras-transformer train: error: training diverged at update 6: loss "
        f"{rows[-1][1]:.4g}, above 12.4 (2 x ln 500) for 3 logged updates in a row; no "
        "state was written before it, and what was written after update 0 is set aside in "
        "rolled_back/. Nothing was exported. Lower --learning-rate-factor and run again to "
        "start again from update 0, or turn this check off with --no-divergence-check")
    assert not export_dir.exists() and not (run_dir / runs.MODEL_FILE).exists()
    assert not (run_dir / runs.RESULTS_FILE).exists()
    assert (run_dir / "checkpoints" / "rolled_back" / "ckpt-4.weights.h5").is_file()
    assert runs.RunFolder(run_dir).state_files() == []


# --- damaged run files ------------------------------------------------------------------


def _command_main(capsys, *argv):
    """`keras-transformer ARGV` in this process: (status, stdout, stderr)."""
    from keras_transformer.commands import main

    status = main(list(argv))
    captured = capsys.readouterr()
    return status, captured.out, captured.err


@pytest.mark.slow
def test_a_truncated_spm_model_is_restored_from_the_prepared_corpus(
        finished_run, corpus, tmp_path, capsys):
    run_dir = tmp_path / "run"
    shutil.copytree(finished_run, run_dir)
    spm = run_dir / runs.TOKENIZER_FILE
    original = spm.read_bytes()
    spm.write_bytes(original[:1000])

    # translate --run: restored (its sha256 is the recorded one), then translates.
    source = tmp_path / "in.en"
    source.write_text("A dog.\n")
    status, _, err = _command_main(capsys, "translate", "--run", str(run_dir), "--quiet",
                                   "--input", str(source), "--output", str(tmp_path / "out"))
    assert status == 0, err
    assert len((tmp_path / "out").read_text().splitlines()) == 1
    assert spm.read_bytes() == original
    assert (run_dir / "damaged" / "spm.model").read_bytes() == original[:1000]

    # train on the folder: restored the same way, not "prepared again".
    spm.write_bytes(original[:1000])
    output = _train(corpus, run_dir, "--train-steps", "10")
    assert f"{spm} was damaged" in output and "prepared again" not in output
    assert spm.read_bytes() == original
    assert (run_dir / "damaged" / "spm.model.1").read_bytes() == original[:1000]

    # Its source gone: one line saying which file to copy back.
    info = json.loads((run_dir / runs.VOCABULARY_INFO_FILE).read_text())
    info["source"] = str(tmp_path / "gone" / "spm.model")
    (run_dir / runs.VOCABULARY_INFO_FILE).write_text(json.dumps(info))
    spm.write_bytes(original[:1000])
    for argv in (["translate", "--run", str(run_dir), "--input", str(source)],
                 ["evaluate", "--run", str(run_dir), "--data", str(corpus)],
                 ["export", "--run", str(run_dir), "--export-dir", str(tmp_path / "out")]):
        status, out, err = _command_main(capsys, *argv)
        assert status == 1
        assert err.strip() == (
            f"keras-transformer {argv[0]}: error: {spm} is damaged (its sha256 is not the "
            f"{info['sha256'][:12]}... that vocabulary.json recorded); copy back the spm.model "
            f"whose sha256 is {info['sha256']} (the run copied it from {info['source']}, "
            "which is gone)"), argv


@pytest.mark.backend_independent
@pytest.mark.parametrize("name, damage, expected", [
    ("config.json", b'{"num_layers": 2', "config.json is damaged: not valid JSON"),
    ("config.json", b'{"num_layers": 2, "bogus": 1}', "config.json is damaged: not a model "
                                                       "configuration"),
    ("model.keras", None, "model.keras is damaged"),
    ("best.json", b'["update", 3]', "best.json is damaged: it holds a list"),
    ("settings.json", b'{"preset": "tiny", "train_steps": "ten"}',
     "settings.json is damaged: --train-steps must be a positive integer"),
])
def test_damaged_run_files_are_one_line_naming_the_file(tmp_path, capsys, name, damage,
                                                        expected):
    from keras_transformer import build_model
    from keras_transformer.model.config import TransformerConfig

    run = runs.RunFolder(tmp_path / "run")
    run.root.mkdir()
    config = TransformerConfig.preset("tiny", vocab_size=300, num_layers=1, d_model=16,
                                      num_heads=2, d_ff=32, max_length=32)
    model = build_model(config)
    model.save(run.model_file)
    run.write_json(runs.CONFIG_FILE, config.to_dict())
    run.write_json(runs.SETTINGS_FILE, {"preset": "tiny", "output_dir": str(run.root)})
    run.write_json(runs.BEST_INFO_FILE, {"update": 3, "bleu": 1.0})
    from keras_transformer import data as kt_data

    text = tmp_path / "text.txt"
    text.write_text("ein hund läuft. eine katze sitzt. a dog runs.\n" * 50)
    kt_data.train_tokenizer([text], 300, run.tokenizer_file)
    target = run / name
    if damage is None:  # truncated
        damage = target.read_bytes()[: target.stat().st_size // 2]
    target.write_bytes(damage)
    if name == "settings.json":
        from keras_transformer.training.settings import load_settings

        with pytest.raises(runs.RunError) as caught:
            load_settings({"output_dir": str(run.root)})
        message = str(caught.value)
    elif name == "best.json":
        with pytest.raises(runs.RunError) as caught:
            run.read_best()
        message = str(caught.value)
    else:
        (tmp_path / "in.en").write_text("a dog\n")
        argv = ["translate", "--run", str(run.root), "--input", str(tmp_path / "in.en")]
        if name == "config.json":
            run.model_file.unlink()  # config.json is what the run is built from then
            (run.checkpoint_dir).mkdir()
            model.save_weights(run.checkpoint_path(3))
        status, _, err = _command_main(capsys, *argv)
        assert status == 1 and len(err.strip().splitlines()) == 1, err
        assert err.startswith("keras-transformer translate: error: ")
        message = err
    assert expected in message and str(target) in message, message


@pytest.mark.backend_independent
def test_every_failed_write_is_said_by_one_function(tmp_path):
    from keras_transformer.training.stops import write_failure

    run = runs.RunFolder(tmp_path)
    full = OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), str(tmp_path / "x.bin"))
    mine = files.WriteError(tmp_path / "y.h5", OSError(errno.EDQUOT, "quota"), "writing y")
    empty = f"{tmp_path} holds no backup or checkpoint yet"
    assert str(write_failure(full, run, "continue")) == (
        f"writing {tmp_path}/x.bin failed: No space left on device; {empty}. Free space (or "
        "fix the folder) and run the same command to continue")
    assert str(write_failure(mine, run, "finish", update=7)) == (
        f"writing y failed: {os.strerror(errno.EDQUOT)}; training is complete at update 7 "
        f"and {empty}. Free space (or fix the folder) and run the same command to finish "
        "the run (final weights, test, export)")
    assert str(write_failure(OSError("lost mount"), run, "write")) == (
        "writing failed: lost mount; the run is otherwise complete: run the same command to "
        "write it")
    assert isinstance(write_failure(full, run, "write"), runs.RunError)
