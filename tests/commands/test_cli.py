"""`python -m keras_transformer translate|export`: files in, files out, clear errors.

Uses the session's tiny export from test_export.py (built once per session).
"""

import os
import pathlib
import subprocess
import sys

import pytest
import tensorflow as tf

from keras_transformer.commands import main
from keras_transformer.commands.translate import resolve_model_dir
from exported_model import BEAM_SIZE, MAX_EXTRA, exported

REPO = pathlib.Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def export(tmp_path_factory):
    return exported(tmp_path_factory)


def _env():
    return dict(os.environ, PYTHONPATH=os.pathsep.join(
        p for p in (str(REPO), os.environ.get("PYTHONPATH", "")) if p))


def _write_lines(path, lines):
    path.write_bytes(b"".join(line.encode("utf-8") + b"\n" for line in lines))


def test_translate_stdin_to_stdout_in_batches(export, tmp_path):
    source = tmp_path / "in.en"
    _write_lines(source, export["sentences"])
    # As a user's shell runs it: without the TF_CPP_MIN_LOG_LEVEL=2 that
    # tests/run_all_backends.sh exports, so that the command's own default (3)
    # applies; at 2, TensorFlow's ERROR-level notes (e.g. oneDNN's "supports
    # DT_INT64 only on platforms with AVX-512" on some EPYCs) reach stderr.
    env = _env()
    env.pop("TF_CPP_MIN_LOG_LEVEL", None)
    with open(source, "rb") as stdin:
        result = subprocess.run(
            [sys.executable, "-m", "keras_transformer", "translate",
             "--model", str(export["path"]), "--batch-size", "4"],
            stdin=stdin, capture_output=True, env=env, cwd=tmp_path, timeout=300)
    assert result.returncode == 0, result.stderr.decode()[-3000:]
    assert result.stdout.decode("utf-8").split("\n") == export["beam"] + [""]
    stderr = result.stderr.decode()
    assert f"translated {len(export['sentences'])} sentences" in stderr
    assert "serving_default" in stderr
    # Only the command's own lines: its start line and its progress (lines
    # rewritten with \r). Loading the SavedModel no longer adds tf-text's
    # SentencePiece `normalizer.cc(51) LOG(INFO) precompiled_charsmap is empty`.
    lines = [line for line in stderr.replace("\r", "\n").split("\n") if line]
    assert all(line.startswith(("keras-transformer translate: ", "translated "))
               for line in lines), lines


def test_translate_greedy_files_and_model_folder(export, tmp_path, capsys):
    source, target = tmp_path / "in.en", tmp_path / "out.de"
    # CRLF line ends are stripped like LF ones.
    source.write_bytes(b"".join(s.encode() + b"\r\n" for s in export["sentences"]))
    # The model folder (not the version folder): its highest version is used.
    code = main(["translate", "--model", str(export["path"].parent), "--greedy",
                 "--input", str(source), "--output", str(target), "--batch-size", "3"])
    assert code == 0
    assert target.read_text(encoding="utf-8").split("\n") == export["greedy"] + [""]
    assert "translate_greedy" in capsys.readouterr().err


def test_translate_errors_name_the_path_and_what_was_expected(export, tmp_path, capsys):
    missing = tmp_path / "saved_models" / "transformer" / "1"
    assert main(["translate", "--model", str(missing)]) == 1
    err = capsys.readouterr().err
    assert str(missing) in err and "does not exist" in err and "saved_model.pb" in err

    # A training output folder is not an export.
    assert main(["translate", "--model", str(export["run"])]) == 1
    err = capsys.readouterr().err
    assert str(export["run"]) in err and "no saved_model.pb" in err

    assert main(["translate", "--model", str(export["run"] / "spm.model")]) == 1
    assert "is a file" in capsys.readouterr().err

    assert main(["translate", "--model", str(export["path"]),
                 "--signature", "nope", "--input", os.devnull]) == 1
    err = capsys.readouterr().err
    assert "no signature 'nope'" in err and "serving_default" in err

    assert main(["translate", "--model", str(export["path"]),
                 "--input", str(tmp_path / "nowhere.en")]) == 1
    assert "nowhere.en does not exist" in capsys.readouterr().err
    assert resolve_model_dir(export["path"]) == export["path"]


def test_export_from_a_training_run(export, tmp_path):
    base = tmp_path / "saved_models"
    result = subprocess.run(
        [sys.executable, "-m", "keras_transformer", "export", "--run", str(export["run"]),
         "--export-dir", str(base), "--model-name", "demo", "--version", "3",
         "--beam-size", str(BEAM_SIZE), "--max-extra-length", str(MAX_EXTRA),
         "--batch-size", "8", "--quiet"],
        capture_output=True, text=True, env=_env(), cwd=tmp_path, timeout=600)
    assert result.returncode == 0, result.stderr[-3000:]
    path = base / "demo" / "3"
    assert result.stdout.strip().splitlines()[-1] == str(path)
    loaded = tf.saved_model.load(str(path))
    outputs = loaded.signatures["serving_default"](text=tf.constant(export["sentences"]))
    assert [t.decode() for t in outputs["translation"].numpy()] == export["beam"]


def test_export_errors(tmp_path, capsys):
    assert main(["export", "--run", str(tmp_path / "nowhere")]) == 1
    err = capsys.readouterr().err
    assert "nowhere does not exist" in err and "model.keras" in err
    (tmp_path / "run").mkdir()
    (tmp_path / "run" / "spm.model").write_bytes(b"x")
    assert main(["export", "--run", str(tmp_path / "run")]) == 1
    assert "neither model.keras nor config.json" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        main(["export", "--run", "x", "--batch-size", "a"])


def test_evaluate_refuses_a_negative_alpha_in_one_line(tmp_path, capsys):
    assert main(["evaluate", "--run", str(tmp_path), "--data", str(tmp_path),
                 "--alpha", "0.6", "-1"]) == 1
    err = capsys.readouterr().err.strip().splitlines()
    assert err == ["keras-transformer evaluate: error: --alpha must be >= 0, received -1"]
