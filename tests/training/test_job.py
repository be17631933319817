"""The end-to-end job: corpus folders, the example script, scoring a finished run."""

import json
import os
import pathlib
import subprocess
import sys

import h5py
import numpy as np
import pytest

from keras_transformer.inference.evaluation import evaluate_run
from keras_transformer.data.corpora import corpus_inputs
from keras_transformer.inference.loading import resolve_weights

REPO = pathlib.Path(__file__).resolve().parents[2]


def test_corpus_folder_must_have_all_splits(tmp_path):
    (tmp_path / "train.en").write_text("a\n")
    with pytest.raises(FileNotFoundError, match="missing: .*train.de"):
        corpus_inputs(str(tmp_path), tmp_path / "work")
    (tmp_path / "train.de").write_text("b\n")
    with pytest.raises(FileNotFoundError, match="missing: valid, test"):
        corpus_inputs(str(tmp_path), tmp_path / "work")


def test_shared_corpus_folder_is_accepted(shared_data, tmp_path):
    inputs = corpus_inputs(str(shared_data / "multi30k"), tmp_path)
    assert inputs.name == "multi30k" and inputs.test[0].name == "test.en"


@pytest.mark.backend_independent
def test_a_linear_decay_shorter_than_the_warm_up_is_refused_before_anything_is_written(
        tmp_path):
    from keras_transformer.training import job
    from keras_transformer.training.settings import Settings, SettingsError

    settings = Settings(preset="tiny", data="demo", lr_decay="linear", train_steps=400,
                        output_dir=str(tmp_path / "run"), prepared_dir=str(tmp_path / "p"))
    with pytest.raises(SettingsError, match="--lr-decay linear decays to zero at "
                       "--train-steps 400, which must be more than the 400 warm-up"):
        job.train(settings.with_preset_defaults())
    assert not any(tmp_path.iterdir())


@pytest.mark.slow
def test_example_script_keeps_its_flags_and_exports_under_the_run_name(tmp_path):
    """examples/wmt_ende.py with every flag it had before `keras-transformer train`."""
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(REPO),
                                                        os.environ.get("PYTHONPATH", "")]),
               PYTHONUNBUFFERED="1")
    output_dir = tmp_path / "demo_run"
    command = [sys.executable, str(REPO / "examples" / "wmt_ende.py"), "--data", "demo",
               "--preset", "tiny", "--train-steps", "12", "--checkpoint-every", "6",
               "--average-last", "2", "--tokens-per-batch", "512", "--vocab-size", "1000",
               "--max-length", "16", "--grad-accum-steps", "1", "--mixed-precision", "none",
               "--distribute", "none", "--seed", "3", "--beam-size", "2", "--alpha", "0.6",
               "--eval-sentences", "4", "--jit-compile", "auto", "--verbose", "1",
               "--output-dir", str(output_dir), "--export-dir", str(tmp_path / "served"),
               "--model-name", "demo_model", "--validation-bleu-sentences", "8"]
    result = subprocess.run(command, env=env, capture_output=True, text=True, timeout=900,
                            cwd=tmp_path)
    output = result.stdout + result.stderr
    assert result.returncode == 0, output[-4000:]
    results = json.loads((output_dir / "results.json").read_text())
    assert (results["final_step"], results["steps_this_run"]) == (12, 12)
    assert results["settings"]["vocab_size"] == 1000 and results["settings"]["seed"] == 3
    assert results["train_target_tokens_per_second"] > 0
    # The checkpoints averaged are the last two, each a complete weights file
    # whose optimizer state is that of its update.
    checkpoints = sorted((output_dir / "checkpoints").glob("ckpt-*.weights.h5"))
    assert [p.name for p in checkpoints] == ["ckpt-12.weights.h5", "ckpt-6.weights.h5"]
    for path in checkpoints:
        with h5py.File(path, "r") as handle:
            assert int(handle["optimizer/vars/0"][()]) == int(path.name[5:-11])
    # averaged.weights.h5 is the mean of the two checkpoints, weight by weight.
    with h5py.File(checkpoints[0]) as a, h5py.File(checkpoints[1]) as b, \
            h5py.File(output_dir / "averaged.weights.h5") as averaged:
        names = [n for n in _datasets(averaged) if n.startswith("layers/")]
        assert len(names) > 10
        for name in names:
            np.testing.assert_allclose(averaged[name][()], (a[name][()] + b[name][()]) / 2,
                                       rtol=1e-5, atol=1e-7)
    for name in ["model.keras", "spm.model", "training.png", "test.hyp.de",
                 "training_log.csv", "settings.json", "config.json"]:
        assert (output_dir / name).exists(), name
    assert "BLEU" in output and "Sample translations" in output
    assert (tmp_path / "served" / "demo_model" / "1" / "saved_model.pb").exists()
    # Without --model-name the export is named after the run folder.
    result = subprocess.run(
        [sys.executable, "-m", "keras_transformer", "export", "--run", str(output_dir),
         "--export-dir", str(tmp_path / "served"), "--quiet"],
        env=env, capture_output=True, text=True, timeout=600)
    assert result.returncode == 0, result.stderr[-3000:]
    assert result.stdout.strip() == str(tmp_path / "served" / "demo_run" / "1")


def _datasets(handle):
    names = []
    handle.visititems(lambda name, obj: names.append(name)
                      if isinstance(obj, h5py.Dataset) else None)
    return names


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


def test_evaluate_run_gives_a_row_per_alpha(shared_data, tmp_path, monkeypatch):
    import types

    from keras_transformer.inference import evaluation

    corpus, _ = _fake_run(shared_data, tmp_path)
    calls = []

    def fake_evaluate_bleu(translator, source, reference, *, beam_size, alpha, **_):
        calls.append((source.name, beam_size, alpha))
        return types.SimpleNamespace(bleu=10 * alpha + beam_size, chrf=0.0, num_sentences=1,
                                     bleu_signature="sig", chrf_signature="chrf-sig")

    monkeypatch.setattr(evaluation, "evaluate_bleu", fake_evaluate_bleu)
    rows = evaluate_run(tmp_path, corpus, splits=["valid", "test"], weights=["ckpt-20"],
                        beam_sizes=[1, 4], alpha=[0.0, 1.5], verbose=False)
    expected = [(split + ".en", beam, alpha) for beam in (1, 4) for alpha in (0.0, 1.5)
                for split in ("valid", "test")]
    assert calls == expected
    assert [(r["split"] + ".en", r["beam_size"], r["alpha"]) for r in rows] == expected
    assert [r["bleu"] for r in rows] == [10 * a + b for _, b, a in expected]
    # One value or none: one alpha, the paper's 0.6 by default.
    calls.clear()
    rows = evaluate_run(tmp_path, corpus, splits=["valid"], weights=["ckpt-20"], verbose=False)
    assert calls == [("valid.en", 4, 0.6)] and rows[0]["alpha"] == 0.6


def test_resolve_weights_names_and_errors(shared_data, tmp_path):
    _fake_run(shared_data, tmp_path)
    assert resolve_weights(tmp_path, "last").name == "ckpt-20.weights.h5"
    assert resolve_weights(tmp_path, "averaged").name == "averaged.weights.h5"
    with pytest.raises(FileNotFoundError, match="ckpt-10, ckpt-20"):
        resolve_weights(tmp_path, "ckpt-30")
    with pytest.raises(FileNotFoundError, match="split 'nope'"):
        evaluate_run(tmp_path, shared_data / "multi30k", splits=["nope"], verbose=False)
    with pytest.raises(FileNotFoundError, match="run folder not found"):
        evaluate_run(tmp_path / "missing", shared_data / "multi30k", verbose=False)
