"""The end-to-end job: settings, corpus folders, and a killed run that resumes."""

import json
import os
import pathlib
import signal
import subprocess
import sys
import time

import h5py
import pytest

from keras_transformer.experiment import (
    JobSettings,
    evaluate_run,
    prepare_corpus,
    read_backup_step,
    resolve_weights,
)

REPO = pathlib.Path(__file__).resolve().parents[1]


def test_settings_fill_preset_defaults_and_reject_bad_values():
    settings = JobSettings(data="demo", preset="tiny")
    assert settings.train_steps == 500 and settings.vocab_size == 4000
    assert JobSettings(preset="base").tokens_per_batch == 25_000
    assert JobSettings(preset="tiny", train_steps=7).train_steps == 7
    with pytest.raises(ValueError, match="Unknown preset 'huge'"):
        JobSettings(preset="huge")
    with pytest.raises(ValueError, match="distribute"):
        JobSettings(preset="tiny", distribute="horovod")
    with pytest.raises(ValueError, match="train_steps must be >= 1"):
        JobSettings(preset="tiny", train_steps=0)


def test_corpus_folder_must_have_all_splits(tmp_path):
    (tmp_path / "train.en").write_text("a\n")
    with pytest.raises(FileNotFoundError, match="missing: .*train.de"):
        prepare_corpus(str(tmp_path), tmp_path / "work")


def test_shared_corpus_folder_is_accepted(shared_data, tmp_path):
    paths = prepare_corpus(str(shared_data / "multi30k"), tmp_path)
    assert paths["test"][0].name == "test.en"


def _command(output_dir):
    return [sys.executable, str(REPO / "examples" / "wmt_ende.py"), "--data", "demo",
            "--preset", "tiny", "--train-steps", "22", "--checkpoint-every", "6",
            "--average-last", "2", "--tokens-per-batch", "512", "--eval-sentences", "4",
            "--beam-size", "2", "--output-dir", str(output_dir), "--verbose", "2",
            "--export-dir", str(output_dir / "saved_models")]


@pytest.mark.slow
def test_example_script_resumes_after_sigkill(tmp_path):
    """Smoke test of examples/wmt_ende.py, killed with SIGKILL after a backup and re-run."""
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(REPO),
                                                        os.environ.get("PYTHONPATH", "")]),
               TF_CPP_MIN_LOG_LEVEL="2", PYTHONUNBUFFERED="1")
    output_dir = tmp_path / "run"
    log = open(tmp_path / "first.log", "w")
    first = subprocess.Popen(_command(output_dir), env=env, stdout=log, stderr=subprocess.STDOUT)
    deadline = time.time() + 600
    try:
        while read_backup_step(output_dir / "backup") < 2:
            assert first.poll() is None, (tmp_path / "first.log").read_text()[-3000:]
            assert time.time() < deadline, "no backup within 10 minutes"
            time.sleep(0.2)
    finally:
        first.send_signal(signal.SIGKILL)
        first.wait()
        log.close()
    killed_at = read_backup_step(output_dir / "backup")
    assert killed_at >= 2
    first_log = (tmp_path / "first.log").read_text()
    assert "Starting training at step 0" in first_log

    second = subprocess.run(_command(output_dir), env=env, capture_output=True, text=True,
                            timeout=900)
    output = second.stdout + second.stderr
    assert second.returncode == 0, output[-4000:]
    assert "Resuming from the backup at epoch" in output, output[-4000:]
    results = json.loads((output_dir / "results.json").read_text())
    # 22 updates in epochs of 6: the fourth epoch stops early (StopAtUpdate).
    assert results["final_step"] == 22
    assert results["steps_this_run"] < 22
    assert results["train_target_tokens_per_second"] > 0
    assert results["train_peak_memory_mib"] > 100
    # Fewer epochs ran the second time: it did not start over.
    assert output.count("Epoch ") <= 4 - killed_at + 1, output[-4000:]
    # Every checkpoint left behind is a complete HDF5 file.
    checkpoints = sorted((output_dir / "checkpoints").glob("*.weights.h5"))
    assert [p.name for p in checkpoints] == ["ckpt-18.weights.h5", "ckpt-22.weights.h5"]
    for path in checkpoints + [output_dir / "averaged.weights.h5"]:
        with h5py.File(path, "r") as handle:
            assert "layers" in handle or len(handle.keys()) > 0
    for name in ["model.keras", "spm.model", "training.png", "test.hyp.de",
                 "training_log.csv"]:
        assert (output_dir / name).exists(), name
    assert "BLEU" in output and "Sample translations" in output
    # The TF Serving export of the finished run.
    assert (output_dir / "saved_models" / "transformer" / "1" / "saved_model.pb").exists()
    assert results["settings"]["export_dir"] == str(output_dir / "saved_models")


def _fake_run(shared_data, run_dir):
    """A run folder as `run` leaves it: tokenizer, model.keras, 2 checkpoints, average."""
    import keras

    import keras_transformer as kt
    from keras_transformer.data import train_tokenizer

    corpus = shared_data / "multi30k"
    train_tokenizer([corpus / "valid.en", corpus / "valid.de"], vocab_size=600,
                    model_file=run_dir / "spm.model")
    config = kt.TransformerConfig.preset("tiny", vocab_size=600, num_layers=1, d_model=32,
                                         num_heads=2, d_ff=64, max_length=48)
    model = kt.build_model(config)
    model.save(run_dir / "model.keras")
    (run_dir / "checkpoints").mkdir()
    for step, seed in ((10, 1), (20, 2)):
        keras.utils.set_random_seed(seed)
        kt.build_model(config).save_weights(run_dir / "checkpoints" / f"ckpt-{step}.weights.h5")
    kt.average_checkpoints(sorted((run_dir / "checkpoints").glob("*.h5")),
                           run_dir / "averaged.weights.h5")
    return corpus, config


def test_evaluate_run_scores_each_weights_file(shared_data, tmp_path):
    import keras
    import sacrebleu

    import keras_transformer as kt
    from keras_transformer.data import Tokenizer

    corpus, config = _fake_run(shared_data, tmp_path)
    rows = evaluate_run(tmp_path, corpus, splits=["test", "test_2017_mscoco"],
                        weights=["averaged", "ckpt-10"], beam_sizes=[1],
                        max_sentences=3, verbose=False)
    assert [(r["weights"], r["split"]) for r in rows] == [
        ("averaged", "test"), ("averaged", "test_2017_mscoco"),
        ("ckpt-10", "test"), ("ckpt-10", "test_2017_mscoco")]
    # Independent path for one row: fresh model, checkpoint, greedy, sacrebleu.
    model = kt.build_model(config)
    model.load_weights(tmp_path / "checkpoints" / "ckpt-10.weights.h5")
    sources = (corpus / "test_2017_mscoco.en").read_text().splitlines()[:3]
    references = (corpus / "test_2017_mscoco.de").read_text().splitlines()[:3]
    hypotheses = kt.Translator(model, Tokenizer.load(tmp_path / "spm.model")).translate(
        sources, beam_size=1)
    expected = sacrebleu.corpus_bleu(hypotheses, [references]).score
    assert rows[3]["num_sentences"] == 3
    assert abs(rows[3]["bleu"] - expected) < 1e-9


def test_resolve_weights_names_and_errors(shared_data, tmp_path):
    _fake_run(shared_data, tmp_path)
    assert resolve_weights(tmp_path, "last").name == "ckpt-20.weights.h5"
    assert resolve_weights(tmp_path, "averaged").name == "averaged.weights.h5"
    with pytest.raises(FileNotFoundError, match="ckpt-10, ckpt-20"):
        resolve_weights(tmp_path, "ckpt-30")
    with pytest.raises(FileNotFoundError, match="split 'nope'"):
        evaluate_run(tmp_path, shared_data / "multi30k", splits=["nope"], verbose=False)
    with pytest.raises(FileNotFoundError, match="training output folder not found"):
        evaluate_run(tmp_path / "missing", shared_data / "multi30k", verbose=False)
