"""The run folder's lifecycle: continue, complete, kill -9, damaged files, fine-tuning.

The lifecycle tests run `keras-transformer train` in real subprocesses (under
this process' Keras backend) on a small slice of Multi30k.
"""

import csv
import json
import os
import pathlib
import signal
import subprocess
import sys
import time

import h5py
import numpy as np
import pytest

from conftest import subprocess_env, tiny_train_command

from keras_transformer import runs

from keras_transformer.inference import loading



# --- the run folder on its own (no training) ------------------------------------------


def _weights_file(path, value=1.0):
    with h5py.File(path, "w") as handle:
        handle.create_dataset("layers/dense/vars/0", data=np.full((2, 2), value))
    return path


@pytest.mark.backend_independent
def test_latest_state_prefers_the_newest_readable_file_and_sets_damaged_ones_aside(tmp_path):
    run = runs.RunFolder(tmp_path)
    run.checkpoint_dir.mkdir()
    run.backup_dir.mkdir()
    _weights_file(run.checkpoint_path(10))
    _weights_file(run.checkpoint_path(20))
    _weights_file(run.backup_path(25))
    damaged = run.backup_path(30)
    damaged.write_bytes(_weights_file(tmp_path / "x.h5").read_bytes()[:100])
    messages = []
    assert run.latest_state(say=messages.append) == (25, run.backup_path(25))
    assert "state-30.weights.h5 is unreadable" in messages[0]
    assert "Falling back to" in messages[1] and "update 25" in messages[1]
    # Moved, not deleted, with its bytes.
    moved = run.backup_dir / runs.DAMAGED_DIR / damaged.name
    assert moved.read_bytes() == (tmp_path / "x.h5").read_bytes()[:100]
    assert not damaged.exists()


@pytest.mark.backend_independent
@pytest.mark.parametrize("before, after, refused", [
    (("linear", 4500), ("linear", 4500), None),  # resuming the same budget
    (("linear", 4500), ("linear", 6500), "linearly to zero at update 4500"),
    (("linear", 4500), ("inverse_sqrt", 6500), "linearly to zero at update 4500"),
    (("inverse_sqrt", 4500), ("linear", 6500), "inverse square root"),
    (("inverse_sqrt", 4500), ("inverse_sqrt", 6500), None),  # budget-free: continues
])
def test_a_run_continues_only_on_its_own_schedule(tmp_path, before, after, refused):
    from keras_transformer.training.continuation import check_schedule
    from keras_transformer.training.settings import Settings, SettingsError

    run = runs.RunFolder(tmp_path)
    old = Settings(output_dir=str(tmp_path), lr_decay=before[0], train_steps=before[1])
    new = Settings(output_dir=str(tmp_path), lr_decay=after[0], train_steps=after[1])
    run.write_json(runs.SETTINGS_FILE, old.to_dict())
    check_schedule(run, new)  # no state yet: a new run, any schedule
    run.checkpoint_dir.mkdir()
    _weights_file(run.checkpoint_path(200))
    if refused is None:
        check_schedule(run, new)
        return
    with pytest.raises(SettingsError, match=refused) as error:
        check_schedule(run, new)
    assert "Nothing was changed" in str(error.value) and "\n" not in str(error.value)
    assert json.loads(run.settings_file.read_text()) == old.to_dict()


@pytest.mark.backend_independent
def test_latest_state_refuses_to_start_over_when_nothing_is_readable(tmp_path):
    run = runs.RunFolder(tmp_path)
    run.backup_dir.mkdir()
    run.backup_path(40).write_bytes(b"\x89HDF\r\n\x1a\n truncated")
    with pytest.raises(runs.RunError, match=r"state-40\.weights\.h5 is unreadable.*"
                                            r"Nothing was changed"):
        run.latest_state()
    assert run.backup_path(40).exists()
    assert runs.RunFolder(tmp_path / "new").latest_state() == (0, None)


@pytest.mark.backend_independent
def test_roll_back_sets_aside_checkpoints_rows_and_best_of_another_trajectory(tmp_path):
    run = runs.RunFolder(tmp_path)
    run.checkpoint_dir.mkdir()
    for step in (10, 20, 30):
        _weights_file(run.checkpoint_path(step))
    run.log_file.write_text("step,loss\n10,5.0\n20,4.0\n25,3.5\n30,3.0\n")
    run.write_json(runs.BEST_INFO_FILE, dict(update=30, bleu=12.0))
    _weights_file(run / runs.BEST_FILE)
    run.roll_back_to(20, say=lambda message: None)
    assert [step for step, _ in run.checkpoints()] == [10, 20]
    assert (run.checkpoint_dir / runs.ROLLED_BACK_DIR / "ckpt-30.weights.h5").exists()
    assert run.log_file.read_text().splitlines() == ["step,loss", "10,5.0", "20,4.0"]
    assert (run / runs.ROLLED_BACK_LOG_FILE).read_text().splitlines() == [
        "step,loss", "25,3.5", "30,3.0"]
    assert not (run / runs.BEST_FILE).exists()
    assert (run.checkpoint_dir / runs.ROLLED_BACK_DIR / runs.BEST_FILE).exists()


@pytest.mark.backend_independent
def test_rolling_back_twice_past_one_update_and_restoring_spm_twice_overwrite_nothing(
        tmp_path):
    from keras_transformer import run_vocabulary
    from keras_transformer.data.tokenizer import train_tokenizer

    run = runs.RunFolder(tmp_path / "run")
    run.checkpoint_dir.mkdir(parents=True)
    run.backup_dir.mkdir()
    expected = {}  # set-aside path -> the bytes it must hold
    for trajectory in (1, 2):  # two trajectories past update 20, each rolled back
        for step in (10, 20, 30):
            _weights_file(run.checkpoint_path(step), value=trajectory * 100 + step)
        _weights_file(run.backup_path(30), value=trajectory)
        _weights_file(run / runs.BEST_FILE, value=-trajectory)
        run.write_json(runs.BEST_INFO_FILE, dict(update=30, bleu=float(trajectory)))
        suffix = "" if trajectory == 1 else ".1"
        for path, folder in ((run.checkpoint_path(30), run.checkpoint_dir),
                             (run.backup_path(30), run.backup_dir),
                             (run / runs.BEST_FILE, run.checkpoint_dir),
                             (run / runs.BEST_INFO_FILE, run.checkpoint_dir)):
            expected[folder / runs.ROLLED_BACK_DIR / (path.name + suffix)] = path.read_bytes()
        run.roll_back_to(20, say=lambda message: None)
    assert [step for step, _ in run.state_files()] == [20, 10]
    for path, data in expected.items():
        assert path.read_bytes() == data, path
    assert len(list((run.checkpoint_dir / runs.ROLLED_BACK_DIR).iterdir())) == 6

    # The vocabulary damaged twice: each damaged copy is kept.
    text = tmp_path / "text"
    text.write_text("ein hund läuft. eine katze sitzt. a dog runs.\n" * 50)
    source = tmp_path / "prepared" / "spm.model"
    train_tokenizer([text], 300, source)
    run.tokenizer_file.write_bytes(source.read_bytes())
    run_vocabulary._record(run, source)
    damaged = []
    for cut in (1000, 500):
        run.tokenizer_file.write_bytes(source.read_bytes()[:cut])
        damaged.append(run.tokenizer_file.read_bytes())
        run_vocabulary.restore(run, say=lambda message: None)
        assert run.tokenizer_file.read_bytes() == source.read_bytes()
    assert (run / runs.DAMAGED_DIR / "spm.model").read_bytes() == damaged[0]
    assert (run / runs.DAMAGED_DIR / "spm.model.1").read_bytes() == damaged[1]


@pytest.mark.backend_independent
def test_a_second_process_cannot_train_in_a_locked_run_folder(tmp_path):
    run = runs.RunFolder(tmp_path / "run")
    with run.lock():
        # flock is per open file: a second open, as by another process, is refused.
        with pytest.raises(runs.RunError, match=rf"in use: process {os.getpid()} on "):
            with runs.RunFolder(tmp_path / "run").lock():
                pass
    with run.lock():  # released when the holder ends
        pass


# --- settings: config files, flags, batch plan ---------------------------------------


ROW_A = """
[model]
num_heads = 16
key_dim = 32
value_dim = 32

[training]
train_steps = 1234
"""


def _train_args(*argv):
    from keras_transformer.commands import build_parser
    from keras_transformer.training.settings import given_from_args

    return given_from_args(build_parser().parse_args(["train", *argv]))


def test_table_3_row_a_config_file_builds_16_heads_of_32_dims(tmp_path):
    from keras_transformer.training.settings import load_settings
    from keras_transformer.model.layers import MultiHeadAttention
    from keras_transformer.model.transformer import build_model

    config_file = tmp_path / "row_a.toml"
    config_file.write_text(ROW_A)
    settings = load_settings(*_train_args("--config", str(config_file), "--output-dir",
                                          str(tmp_path / "run"), "--vocab-size", "64"))
    assert settings.train_steps == 1234 and settings.tokens_per_batch == 25_000  # base
    model = build_model(settings.model_config())
    attention = [layer for layer in model._flatten_layers()
                 if isinstance(layer, MultiHeadAttention)]
    assert len(attention) == 6 + 2 * 6  # encoder self, decoder self and cross
    for layer in attention:
        assert (layer.num_heads, layer.key_dim, layer.value_dim) == (16, 32, 32)
        # The keys and values attention sees: (batch, h, T, d_k) per head.
        keys, values = layer.compute_key_value(np.zeros((2, 5, 512), "float32"))
        assert tuple(keys.shape) == (2, 16, 5, 32) and tuple(values.shape) == (2, 16, 5, 32)

    # A flag overrides the file; the file's other values stay.
    settings = load_settings(*_train_args("--config", str(config_file), "--output-dir",
                                          str(tmp_path / "run"), "--key-dim", "64",
                                          "--train-steps", "7"))
    config = settings.model_config()
    assert (config.num_heads, config.key_dim, config.value_dim) == (16, 64, 32)
    assert settings.train_steps == 7


@pytest.mark.backend_independent
@pytest.mark.parametrize("text, message", [
    ("[model]\nnum_hedas = 4\n", "num_hedas is not a TransformerConfig field"),
    ("[training]\nbeam_size = 4\n", "beam_size belongs in \\[decoding\\]"),
    ("[optimizer]\nlr = 1\n", "unknown section \\[optimizer\\]"),
    ("[training\n", "not valid TOML"),
    ("[training]\ntrain_steps = -3\n", "--train-steps must be a positive integer"),
    ("[training]\nbucket_multiple = 0\n", "--bucket-multiple must be a positive integer"),
])
def test_bad_config_files_name_the_problem(tmp_path, text, message):
    from keras_transformer.training.settings import load_settings
    from keras_transformer.training.settings import SettingsError

    config_file = tmp_path / "bad.toml"
    config_file.write_text(text)
    with pytest.raises(SettingsError, match=message):
        load_settings(*_train_args("--config", str(config_file), "--output-dir",
                                   str(tmp_path / "run")))


@pytest.mark.backend_independent
def test_saved_settings_are_the_defaults_and_fixed_ones_cannot_change(tmp_path):
    from keras_transformer.training.settings import load_settings
    from keras_transformer.training.settings import SettingsError

    run = runs.RunFolder(tmp_path)
    first = load_settings(*_train_args("--output-dir", str(tmp_path), "--preset", "tiny",
                                       "--data", "demo", "--dropout", "0.3",
                                       "--train-steps", "50"))
    run.write_json(runs.SETTINGS_FILE, first.to_dict())
    again = load_settings(*_train_args("--output-dir", str(tmp_path), "--train-steps", "80"))
    assert (again.preset, again.data, again.model, again.train_steps) == (
        "tiny", "demo", {"dropout": 0.3}, 80)
    with pytest.raises(SettingsError, match="--preset cannot change.*'tiny'.*'small'"):
        load_settings(*_train_args("--output-dir", str(tmp_path), "--preset", "small"))
    with pytest.raises(SettingsError, match="num_layers cannot change.*2.*3"):
        load_settings(*_train_args("--output-dir", str(tmp_path), "--num-layers", "3"))
    with pytest.raises(SettingsError, match="--vocab-size cannot change"):
        load_settings(*_train_args("--output-dir", str(tmp_path), "--vocab-size", "999"))


@pytest.mark.backend_independent
def test_tokens_per_update_do_not_depend_on_replicas_or_accumulation(shared_data, tmp_path):
    from keras_transformer.data import preparation
    from keras_transformer.training.strategy import plan_batches

    # Multi30k's validation pairs as the training split of a prepared corpus.
    folder = shared_data / "multi30k"
    inputs = preparation.CorpusInputs("m30k-valid",
                                      train=(folder / "valid.en", folder / "valid.de"))
    corpus = preparation.ensure_prepared(inputs, tmp_path / "prepared", vocab_size=500)
    per_update = {}
    for replicas in (1, 2):
        for accumulation in (1, 4):
            plan = plan_batches(4096, grad_accum_steps=accumulation, replicas=replicas,
                                max_length=64)
            assert plan.tokens_per_update == 4096
            assert plan.micro_batch_tokens * accumulation == 4096
            assert plan.replica_tokens * replicas == plan.micro_batch_tokens
            dataset = corpus.dataset("train", training=True, repeat=True, seed=0,
                                     max_length=64, num_replicas=replicas,
                                     tokens_per_batch=plan.micro_batch_tokens)
            slots = []
            for inputs, _ in dataset.take(64 * accumulation).as_numpy_iterator():
                source, target = inputs["source_ids"], inputs["target_ids"]
                assert source.shape[0] % replicas == 0
                assert max(source.size, target.size) <= plan.micro_batch_tokens
                slots.append(target.size)
            # Token slots per optimizer update: `accumulation` micro-batches.
            per_update[replicas, accumulation] = np.mean(slots) * accumulation
    values = list(per_update.values())
    assert max(values) / min(values) < 1.15, per_update
    assert min(values) > 0.7 * 4096, per_update
    from keras_transformer.training.settings import SettingsError

    with pytest.raises(SettingsError, match="fewer than one sequence"):
        plan_batches(512, grad_accum_steps=8, replicas=1, max_length=128)


# --- the lifecycle, in subprocesses ----------------------------------------------------


@pytest.fixture(scope="module")
def small_corpus(tmp_path_factory):
    """1,000 Multi30k training pairs, 100 validation, 8 test."""
    from conftest import multi30k_head

    return multi30k_head(tmp_path_factory.mktemp("corpus"), (
        ("train", "train", 1000), ("valid", "valid", 100), ("test", "test", 8)))


def _train(corpus, run_dir, *extra, expect=0):
    # In the run's parent folder: the prepared corpus goes to its runs/prepared.
    result = subprocess.run(tiny_train_command(corpus, run_dir, *extra), env=subprocess_env(),
                            capture_output=True, text=True, timeout=900,
                            cwd=pathlib.Path(run_dir).parent)
    output = result.stdout + result.stderr
    assert result.returncode == expect, output[-5000:]
    return output


def _log_steps(run_dir):
    with open(run_dir / runs.LOG_FILE, newline="") as handle:
        return [int(row["step"]) for row in csv.DictReader(handle)]


def _results(run_dir):
    return json.loads((run_dir / runs.RESULTS_FILE).read_text())


def _files(folder):
    return {p.relative_to(folder): p.read_bytes() for p in folder.rglob("*") if p.is_file()}


@pytest.mark.slow
@pytest.mark.every_backend  # resuming a run: the optimizer state of each backend
def test_continue_a_finished_run_then_complete(small_corpus, tmp_path):
    run_dir = tmp_path / "run"
    # No validation BLEU (the validation loss stays): under JAX each greedy
    # search of a new shape compiles, and this test is about resuming.
    no_bleu = ("--validation-bleu-sentences", "0")
    output = _train(small_corpus, run_dir, "--train-steps", "20", *no_bleu)
    assert "Starting training at update 0" in output
    assert _results(run_dir)["final_step"] == 20
    assert _results(run_dir)["steps_this_run"] == 20
    first_checkpoint = (run_dir / "checkpoints" / "ckpt-20.weights.h5").read_bytes()

    # A larger --train-steps continues the finished run at update 20.
    output = _train(small_corpus, run_dir, "--train-steps", "40", *no_bleu)
    assert "Continuing" in output and "at update 20 (of 40)" in output, output[-3000:]
    results = _results(run_dir)
    assert (results["final_step"], results["steps_this_run"]) == (40, 20)
    steps = _log_steps(run_dir)
    assert steps == sorted(set(steps)) and steps[-1] == 40 and 20 in steps and 25 in steps
    # Averaged (tiny: the last 3): the first invocation's update-20 checkpoint,
    # untouched, and the continuation's; each holds the optimizer state of
    # its update (Keras' first optimizer variable is its update count).
    assert results["final_weights"] == ("the average of 3 checkpoints (ckpt-20.weights.h5, "
                                        "ckpt-30.weights.h5, ckpt-40.weights.h5)")
    assert (run_dir / "checkpoints" / "ckpt-20.weights.h5").read_bytes() == first_checkpoint
    for step in (20, 30, 40):
        with h5py.File(run_dir / "checkpoints" / f"ckpt-{step}.weights.h5", "r") as handle:
            assert int(handle["optimizer/vars/0"][()]) == step
    # The schedule continued: the row of update 25 logs the rate of the next
    # update, the paper's formula at step 26 (d_model 128, warm-up 400), not 6.
    with open(run_dir / runs.LOG_FILE, newline="") as handle:
        rows = {int(r["step"]): r for r in csv.DictReader(handle)}
    np.testing.assert_allclose(float(rows[25]["learning_rate"]),
                               128 ** -0.5 * min(26 ** -0.5, 26 * 400 ** -1.5), rtol=1e-5)
    # Each row's training loss is the mean over its own updates, validations
    # (every 10) between rows included: label-smoothed cross-entropy of a
    # vocabulary of 500 starts near ln(500) = 6.2 and stays positive.
    losses = [float(row["loss"]) for row in rows.values()]
    assert all(0.5 < loss < 7.5 for loss in losses), losses
    assert losses[-1] < losses[0]

    # The same command again: complete, nothing trained. (The run folder's
    # logic, not the backend's: checked under the first backend only.)
    if os.environ.get("KERAS_BACKEND", "tensorflow") != "tensorflow":
        return
    output = _train(small_corpus, run_dir, "--train-steps", "40", *no_bleu)
    assert "is complete" in output and "Training updates" not in output, output[-3000:]
    assert (_results(run_dir)["final_step"], _results(run_dir)["steps_this_run"]) == (40, 0)

    # Switching the finished run to a linear decay (to any budget past the
    # warm-up) would change the schedule of its 40 updates: one line naming
    # the problem, and no file changed.
    before = _files(run_dir)
    output = _train(small_corpus, run_dir, "--train-steps", "500", "--lr-decay", "linear",
                    *no_bleu, expect=1)
    assert "inverse square root schedule" in output and "Traceback" not in output, output[-3000:]
    after = _files(run_dir)
    for files in (before, after):  # the lock names the process that held it last
        files.pop(pathlib.Path(runs.LOCK_FILE))
    assert after == before


@pytest.mark.slow
@pytest.mark.backend_independent  # file handling; resuming runs per backend above
def test_damaged_backup_and_fine_tuning(small_corpus, tmp_path):
    run_dir = tmp_path / "run"
    _train(small_corpus, run_dir, "--train-steps", "40", "--validation-bleu-sentences", "0")
    with open(run_dir / runs.LOG_FILE, newline="") as handle:
        rows = {int(r["step"]): r for r in csv.DictReader(handle)}

    # Truncate the newest backup: the run falls back to the newest readable
    # state (the update-40 checkpoint), saying so, and loses no file.
    backup = run_dir / "backup" / "state-40.weights.h5"
    backup.write_bytes(backup.read_bytes()[:4096])
    before = _files(run_dir)
    # (--average-last 10: no checkpoint is pruned by the usual retention.)
    output = _train(small_corpus, run_dir, "--train-steps", "45", "--average-last", "10",
                    "--validation-bleu-sentences", "0")
    assert "state-40.weights.h5 is unreadable" in output, output[-3000:]
    assert "Falling back to" in output and "ckpt-40.weights.h5 (update 40)" in output
    assert _results(run_dir)["final_step"] == 45
    after = _files(run_dir)
    damaged = pathlib.Path("backup") / "damaged" / "state-40.weights.h5"
    assert after[damaged] == before[pathlib.Path("backup") / "state-40.weights.h5"]
    # Every other backup and checkpoint is still there, unchanged.
    for path, content in before.items():
        if path.parts[0] in ("backup", "checkpoints") and path != pathlib.Path(
                "backup/state-40.weights.h5"):
            assert after.get(path) == content, path

    # Fine-tuning a run whose vocabulary differs is refused before training.
    from keras_transformer import data as kt_data

    other = tmp_path / "other"
    other.mkdir()
    kt_data.train_tokenizer([small_corpus / "valid.en", small_corpus / "valid.de"], 450,
                            other / "spm.model")
    output = _train(small_corpus, other, "--init-from", str(run_dir), "--train-steps", "5",
                    "--validation-bleu-sentences", "0", expect=1)
    assert output.strip().endswith("(it takes the vocabulary of the weights it starts from)")
    assert "its vocabulary" in output and "Training updates" not in output
    assert "Traceback" not in output
    assert not (other / "checkpoints").exists()

    # In a new folder it takes the run's vocabulary and weights, with a
    # fresh schedule: the learning rate of its update 5 is that of update 5.
    tuned = tmp_path / "tuned"
    output = _train(small_corpus, tuned, "--init-from", str(run_dir), "--train-steps", "5",
                    "--final-weights", "last", "--validation-bleu-sentences", "0")
    assert "Initialised from" in output
    assert (tuned / "spm.model").read_bytes() == (run_dir / "spm.model").read_bytes()
    with open(tuned / runs.LOG_FILE, newline="") as handle:
        first = next(csv.DictReader(handle))
    assert int(first["step"]) == 5
    np.testing.assert_allclose(float(first["learning_rate"]), float(rows[5]["learning_rate"]),
                               rtol=1e-6)
    # Its loss starts where the trained run is, far below a fresh model's.
    assert float(first["loss"]) < float(rows[5]["loss"]) - 0.5


@pytest.mark.slow
def test_kill_9_after_a_wall_clock_backup_resumes(small_corpus, tmp_path):
    run_dir = tmp_path / "run"
    command = tiny_train_command(small_corpus, run_dir, "--train-steps", "60",
                             "--checkpoint-every", "1000", "--backup-minutes", "0.005",
                             "--validation-bleu-sentences", "0")
    log = open(tmp_path / "first.log", "w")
    first = subprocess.Popen(command, env=subprocess_env(), stdout=log, stderr=subprocess.STDOUT,
                             cwd=tmp_path)
    deadline = time.time() + 600
    run = runs.RunFolder(run_dir)
    try:
        while not any(step >= 12 for step, _ in run.backups()):
            assert first.poll() is None, (tmp_path / "first.log").read_text()[-3000:]
            assert time.time() < deadline, "no backup within 10 minutes"
            time.sleep(0.05)
    finally:
        first.send_signal(signal.SIGKILL)
        first.wait()
        log.close()
    killed_at = run.backups()[-1][0]
    assert 0 < killed_at < 60 and killed_at % 1000 != 0
    output = _train(small_corpus, run_dir, "--train-steps", "60", "--checkpoint-every",
                    "1000", "--validation-bleu-sentences", "0")
    assert f"at update {killed_at} (of 60)" in output, output[-3000:]
    results = _results(run_dir)
    assert results["final_step"] == 60 and results["steps_this_run"] == 60 - killed_at
    steps = _log_steps(run_dir)
    assert steps == sorted(set(steps)) and steps[-1] == 60
    # TensorBoard drops the points the killed process logged after its backup
    # (the restart's SessionLog.START purges them): one curve, each step once.
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    events = EventAccumulator(str(run_dir / "tensorboard"), purge_orphaned_data=True)
    events.Reload()
    board_steps = [event.step for event in events.Scalars("loss")]
    assert board_steps == steps, (board_steps, steps)


@pytest.mark.backend_independent
@pytest.mark.parametrize("problem", ["missing_folder", "misaligned", "config", "init_from",
                                     "vocabulary"])
def test_train_errors_are_one_line_without_tensorflow_noise(tmp_path, problem):
    corpus = tmp_path / "corpus"
    corpus.mkdir()
    for split in ("train", "valid", "test"):
        (corpus / f"{split}.en").write_text("A dog runs.\nA cat sits.\n" * 20)
        (corpus / f"{split}.de").write_text("Ein Hund rennt.\nEine Katze sitzt.\n" * 20)
    extra, expected = [], None
    if problem == "missing_folder":
        corpus = tmp_path / "nowhere"
        expected = "nowhere must hold train/valid/test"
    elif problem == "misaligned":
        (corpus / "train.de").write_text("Ein Hund rennt.\n" * 39)
        expected = "train.de"
    elif problem == "config":
        (tmp_path / "bad.toml").write_text("[training]\nwarmup = 10\n")
        extra, expected = ["--config", str(tmp_path / "bad.toml")], "unknown setting 'warmup'"
    elif problem == "init_from":
        extra, expected = ["--init-from", str(tmp_path / "no_run")], "no_run does not exist"
    else:
        extra, expected = ["--vocab-size", "60"], "--vocab-size 60: SentencePiece training"
    env = subprocess_env()
    env.pop("TF_CPP_MIN_LOG_LEVEL", None)  # as in a user's shell
    result = subprocess.run(
        [sys.executable, "-m", "keras_transformer", "train", "--data", str(corpus),
         "--preset", "tiny", "--vocab-size", "300", "--verbose", "0", "--output-dir",
         str(tmp_path / "run"), *extra], env=env, capture_output=True, text=True, timeout=300,
        cwd=tmp_path)
    assert result.returncode == 1, result.stderr[-3000:]
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1, result.stderr
    assert lines[0].startswith("keras-transformer train: error: ") and expected in lines[0]


def test_state_loads_across_a_change_of_gradient_accumulation(tiny_config, tmp_path):
    """A run continued with another --grad-accum-steps keeps its update count and moments."""
    import keras

    from keras_transformer import build_model
    from keras_transformer.training.optimization import compile_model

    def compiled(accumulation):
        model = build_model(tiny_config)
        compile_model(model, gradient_accumulation_steps=accumulation)
        model.optimizer.build(model.trainable_variables)
        return model

    one = compiled(1)
    one.optimizer.iterations.assign(7)
    for i, variable in enumerate(one.optimizer.variables[1:]):
        variable.assign(np.full(variable.shape, 0.001 * (i + 1), "float32"))
    one.save_weights(tmp_path / "state-7.weights.h5")
    four = compiled(4)
    assert len(four.optimizer.variables) > len(one.optimizer.variables)
    assert loading.load_state(four, tmp_path / "state-7.weights.h5", 7) == 7
    moments = 2 * len(four.trainable_variables)
    for mine, theirs in zip(four.optimizer.variables[-moments:],
                            one.optimizer.variables[-moments:]):
        np.testing.assert_array_equal(keras.ops.convert_to_numpy(mine),
                                      keras.ops.convert_to_numpy(theirs))
    for accumulator in four.optimizer.variables[1:-moments]:
        assert not np.any(keras.ops.convert_to_numpy(accumulator))
    # And back: 4 -> 1.
    four.save_weights(tmp_path / "state-7b.weights.h5")
    assert loading.load_state(compiled(1), tmp_path / "state-7b.weights.h5", 7) == 7


def test_log_rows_hold_the_training_loss_of_their_own_updates(tiny_config, tmp_path):
    """Rows after a validation still report training loss (evaluate shares Keras' metrics).

    With a learning rate of ~0 and no dropout, every update sees the same
    batch with the same weights, so every row's loss is that batch's loss,
    which `model.evaluate` gives independently; the validation batch has
    another loss, which must not leak into the training rows.
    """
    import tensorflow as tf

    from keras_transformer import build_model
    from keras_transformer.training.checkpoints import StateSaver, WeightWriter
    from keras_transformer.training.divergence import DivergenceRule
    from keras_transformer.training.guard import RunGuard
    from keras_transformer.training.log import TrainingLog
    from keras_transformer.training.validation import Validator
    from keras_transformer.training.optimization import compile_model

    rng = np.random.default_rng(0)

    def batch(length):
        source = rng.integers(4, tiny_config.vocab_size, (4, length)).astype("int32")
        target = rng.integers(4, tiny_config.vocab_size, (4, length)).astype("int32")
        decoder_input = np.concatenate([np.ones((4, 1), "int32"), target[:, :-1]], axis=1)
        return {"source_ids": source, "target_ids": decoder_input}, target

    train_batch, valid_batch = batch(7), batch(5)
    model = build_model(tiny_config)
    compile_model(model, learning_rate=1e-12)
    run = runs.RunFolder(tmp_path)
    valid = tf.data.Dataset.from_tensors(valid_batch)
    writer = WeightWriter()
    callbacks = [RunGuard(
        start_update=0, accumulation_steps=1, writer=writer,
        saver=StateSaver(run, writer, checkpoint_every=1000, keep=1, backup_minutes=0),
        log=TrainingLog(run, every=1, total_updates=6, target_tokens_per_update=28),
        divergence=DivergenceRule(tiny_config.vocab_size),
        validator=Validator(run, writer, every=2, dataset=valid))]
    model.fit(tf.data.Dataset.from_tensors(train_batch).repeat(), epochs=1, steps_per_epoch=6,
              shuffle=False, callbacks=callbacks, verbose=0)
    train_loss = model.evaluate(*train_batch, verbose=0, return_dict=True)["loss"]
    valid_loss = model.evaluate(valid.repeat(1), verbose=0, return_dict=True)["loss"]
    assert abs(train_loss - valid_loss) > 0.05  # the check below can tell them apart
    with open(run.log_file, newline="") as handle:
        rows = list(csv.DictReader(handle))
    assert [int(r["step"]) for r in rows] == [1, 2, 3, 4, 5, 6]
    for row in rows:
        np.testing.assert_allclose(float(row["loss"]), train_loss, rtol=1e-4)
    for row in rows[1::2]:
        np.testing.assert_allclose(float(row["val_loss"]), valid_loss, rtol=1e-4)
@pytest.mark.backend_independent
def test_best_weights_hold_the_model_weights_only(tiny_config, tmp_path):
    """Nothing resumes from best.weights.h5: no optimizer state in it (a third of the bytes)."""
    import keras

    from keras_transformer import build_model
    from keras_transformer.training.checkpoints import WeightWriter
    from keras_transformer.training.validation import Validator
    from keras_transformer.training.optimization import compile_model

    class _Echo:  # a translator that returns the references: every BLEU is 100
        def translate(self, sources, beam_size=1):
            return list(sources)

    model = build_model(tiny_config)
    compile_model(model)
    model.optimizer.build(model.trainable_variables)
    run = runs.RunFolder(tmp_path)
    validator = Validator(run, WeightWriter(), every=1, translator=_Echo(),
                          sources=["Ein Hund läuft."], references=["Ein Hund läuft."])
    assert validator.validate(model, 5)["val_bleu"] == pytest.approx(100.0)
    model.save_weights(tmp_path / "state.weights.h5")  # Keras' own file, optimizer included
    with h5py.File(run / runs.BEST_FILE, "r") as best, \
            h5py.File(tmp_path / "state.weights.h5", "r") as state:
        assert "optimizer" in state and "optimizer" not in best
        assert set(best) == set(state) - {"optimizer"}
    assert (run / runs.BEST_FILE).stat().st_size < 0.5 * (
        tmp_path / "state.weights.h5").stat().st_size
    assert run.read_best()["update"] == 5
    assert run.read_best()["bleu"] == pytest.approx(100.0)
    fresh = build_model(tiny_config)
    loading.load_model_weights(fresh, run / runs.BEST_FILE)
    for mine, theirs in zip(fresh.weights, model.weights):
        np.testing.assert_array_equal(keras.ops.convert_to_numpy(mine),
                                      keras.ops.convert_to_numpy(theirs))
