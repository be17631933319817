"""`keras-transformer translate`: terminal input, `--scores` and `--run`.

The SavedModel part uses the session's tiny export from test_export.py (built
once per session, also used by test_cli.py); the `--run` part a tiny run
folder built here, translated in this process on the current backend.
"""

import os
import pathlib
import select
import subprocess
import sys
import time

import keras
import numpy as np
import pytest
import tensorflow as tf

from keras_transformer.commands import main
from keras_transformer.commands.translate import (
    interactive_settings,
    is_interactive,
    translate_batches,
)
from keras_transformer.translate import Translator
from test_export import ALPHA, BEAM_SIZE, export, loaded  # noqa: F401 (fixtures)

REPO = pathlib.Path(__file__).resolve().parents[1]
pty = pytest.importorskip("pty")  # pseudo-terminals: POSIX only
termios = pytest.importorskip("termios")


def _env():
    return dict(os.environ, PYTHONPATH=os.pathsep.join(
        p for p in (str(REPO), os.environ.get("PYTHONPATH", "")) if p))


def _write_lines(path, lines):
    path.write_bytes(b"".join(line.encode("utf-8") + b"\n" for line in lines))


def _scored_lines(path):
    """(scores, translations) of a `--scores` output file."""
    rows = [line.split("\t", 1) for line in path.read_text(encoding="utf-8").split("\n")[:-1]]
    return [float(score) for score, _ in rows], [text for _, text in rows]


# --- terminal or pipe --------------------------------------------------------------------


def test_a_terminal_is_answered_line_by_line_and_a_pipe_in_batches():
    assert interactive_settings(True, 32) == (1, True)
    assert interactive_settings(False, 32) == (32, False)
    master, slave = pty.openpty()
    read_end, write_end = os.pipe()
    try:
        with open(slave, "rb", closefd=False) as terminal, \
                open(read_end, "rb", closefd=False) as pipe:
            assert is_interactive(terminal) and not is_interactive(pipe)
    finally:
        for fd in (master, slave, read_end, write_end):
            os.close(fd)
    assert not is_interactive(object())

    # Batches of one: each line is translated before the next one is read.
    events = []

    def lines():
        for line in (b"a", b"b", b"c"):
            events.append(("read", line))
            yield line

    def translate_batch(batch):
        events.append(("translate", tuple(batch)))
        return [s.decode().upper() for s in batch], [-1.0] * len(batch)

    batch_size, _ = interactive_settings(True, 32)
    outputs = []
    for translation, score in translate_batches(translate_batch, lines(),
                                                batch_size=batch_size):
        outputs.append(translation)
        events.append(("write", translation))
    assert outputs == ["A", "B", "C"]
    assert events == [("read", b"a"), ("translate", (b"a",)), ("write", "A"),
                      ("read", b"b"), ("translate", (b"b",)), ("write", "B"),
                      ("read", b"c"), ("translate", (b"c",)), ("write", "C")]
    events.clear()
    batch_size, _ = interactive_settings(False, 32)
    list(translate_batches(translate_batch, lines(), batch_size=batch_size))
    assert [e[0] for e in events] == ["read"] * 3 + ["translate"]


def _read_line(fd, buffer, timeout):
    """The next line (without `\\n`) from a pipe fd; fails after `timeout` seconds."""
    deadline = time.monotonic() + timeout
    while b"\n" not in buffer:
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            raise AssertionError(f"no line within {timeout} s (received {bytes(buffer)!r})")
        ready, _, _ = select.select([fd], [], [], remaining)
        if ready:
            chunk = os.read(fd, 4096)
            if not chunk:
                raise AssertionError(f"output closed before a line (received "
                                     f"{bytes(buffer)!r})")
            buffer += chunk
    line, _, rest = bytes(buffer).partition(b"\n")
    buffer[:] = rest
    return line.decode("utf-8")


def test_a_terminal_gets_each_translation_before_the_next_line(export, loaded, tmp_path):
    sentences = export["sentences"][:2]
    outputs = loaded.signatures["serving_default"](text=tf.constant(sentences))
    expected_scores = outputs["score"].numpy()
    master, slave = pty.openpty()
    attributes = termios.tcgetattr(slave)
    attributes[3] &= ~termios.ECHO  # lflag: the test reads stdout only
    termios.tcsetattr(slave, termios.TCSANOW, attributes)
    stderr_path = tmp_path / "stderr.txt"
    with open(stderr_path, "wb") as stderr:
        process = subprocess.Popen(
            [sys.executable, "-m", "keras_transformer", "translate",
             "--model", str(export["path"]), "--scores"],
            stdin=slave, stdout=subprocess.PIPE, stderr=stderr, env=_env(), cwd=tmp_path)
    os.close(slave)
    buffer = bytearray()
    try:
        answers = []
        for sentence in sentences + [""]:
            os.write(master, sentence.encode("utf-8") + b"\n")
            # The translation comes back while stdin is still open.
            answers.append(_read_line(process.stdout.fileno(), buffer, timeout=300))
            assert process.poll() is None
        os.write(master, b"\x04")  # Ctrl-D at the start of a line: end of input
        assert process.wait(timeout=120) == 0, stderr_path.read_text()[-3000:]
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()
        process.stdout.close()
        os.close(master)
    assert process.stdout.closed and not buffer
    scores = [float(a.split("\t", 1)[0]) for a in answers]
    assert [a.split("\t", 1)[1] for a in answers] == export["beam"][:2] + [""]
    np.testing.assert_allclose(scores[:2], expected_scores, rtol=1e-5, atol=1e-5)
    assert scores[2] == 0.0
    stderr = stderr_path.read_text()
    assert "interactive" in stderr and "translated" not in stderr


# --- scores ------------------------------------------------------------------------------


def test_in_process_scores_equal_the_saved_model_scores(export, loaded):
    translator, sentences = export["translator"], export["sentences"]
    for signature, beam_size, reference in (("serving_default", BEAM_SIZE, export["beam"]),
                                            ("translate_greedy", 1, export["greedy"])):
        outputs = loaded.signatures[signature](text=tf.constant(sentences))
        translations, scores = translator.translate_with_scores(
            sentences, beam_size=beam_size, alpha=ALPHA)
        assert translations == reference
        assert [t.decode() for t in outputs["translation"].numpy()] == reference
        np.testing.assert_allclose(scores, outputs["score"].numpy(), rtol=1e-4, atol=1e-4)
        for sentence, score in zip(sentences, scores):
            if sentence.strip():
                assert np.isfinite(score) and score < 0
            else:
                assert score == 0.0


def test_greedy_score_is_the_normalised_log_probability_of_the_output(export):
    from keras_transformer.decoding import greedy_decode, length_penalty

    translator = export["translator"]
    config = translator.model.config
    sentence = export["sentences"][0]
    _, (score,) = translator.translate_with_scores([sentence], beam_size=1, alpha=ALPHA)
    _, (plain,) = translator.translate_with_scores([sentence], beam_size=1, alpha=0.0)
    # log P(Y) of the greedy output (EOS included if generated) under one
    # teacher-forced model call.
    source = translator._batch_array(translator.encode([sentence]))[:1]
    tokens = keras.ops.convert_to_numpy(greedy_decode(
        translator.model, source, max_extra_length=translator.max_extra_length))[0]
    length = int((tokens != config.pad_id).sum())
    target = tokens[:length].astype("int32")
    decoder_input = np.concatenate([[config.bos_id], target[:-1]]).astype("int32")[None]
    logits = keras.ops.convert_to_numpy(translator.model(
        {"source_ids": source, "target_ids": decoder_input}, training=False))[0]
    logits = logits.astype("float64")
    log_probs = logits - logits.max(-1, keepdims=True)
    log_probs -= np.log(np.exp(log_probs).sum(-1, keepdims=True))
    log_p = log_probs[np.arange(length), target].sum()
    assert plain == pytest.approx(log_p, rel=1e-4, abs=1e-4)
    assert score == pytest.approx(log_p / length_penalty(length, ALPHA), rel=1e-4, abs=1e-4)
    assert np.isfinite(score) and score < 0


def test_scores_of_the_saved_model_command(export, loaded, tmp_path):
    source, target = tmp_path / "in.en", tmp_path / "out.de"
    _write_lines(source, export["sentences"])
    assert main(["translate", "--model", str(export["path"]), "--greedy", "--scores",
                 "--input", str(source), "--output", str(target), "--quiet"]) == 0
    scores, translations = _scored_lines(target)
    assert translations == export["greedy"]
    outputs = loaded.signatures["translate_greedy"](text=tf.constant(export["sentences"]))
    np.testing.assert_allclose(scores, outputs["score"].numpy(), rtol=1e-5, atol=1e-5)


def test_saved_model_refuses_decoding_options(export, tmp_path, capsys):
    for option in (["--beam-size", "2"], ["--alpha", "1.0"], ["--max-extra-length", "3"],
                   ["--weights", "best"]):
        assert main(["translate", "--model", str(export["path"]), "--input", os.devnull]
                    + option) == 1
        err = capsys.readouterr().err
        assert err.count("\n") == 1 and "fixed when it was exported" in err
        assert err.startswith("keras-transformer translate: error: " + option[0])
    with pytest.raises(SystemExit):  # --run and --model are exclusive
        main(["translate", "--model", str(export["path"]), "--run", str(export["run"])])
    with pytest.raises(SystemExit):  # one of them is needed
        main(["translate"])


# --- --run: a training run folder, no export ---------------------------------------------

_RUN = {}
MAX_EXTRA = 8


def _tiny_run(shared_data, run_dir):
    """A run folder as training leaves it: spm.model, model.keras, one checkpoint."""
    import keras_transformer as kt
    from keras_transformer.data import train_tokenizer

    corpus = shared_data / "multi30k"
    tokenizer = train_tokenizer([corpus / "valid.en", corpus / "valid.de"], vocab_size=600,
                                model_file=run_dir / "spm.model")
    config = kt.TransformerConfig.preset("tiny", vocab_size=600, num_layers=1, d_model=32,
                                         num_heads=2, d_ff=64, max_length=48)

    def build(seed):
        keras.utils.set_random_seed(seed)
        model = kt.build_model(config)
        # Zero embeddings (logit 0) for the special ids and byte pieces: the
        # random model then writes word pieces, never an empty output.
        zeroed = [i for i in range(config.vocab_size)
                  if i < 4 or tokenizer.id_to_token(i).startswith("<0x")]
        for variable in model.weights:
            if tuple(variable.shape) == (config.vocab_size, config.d_model):
                value = keras.ops.convert_to_numpy(variable.value).copy()
                value[zeroed] = 0.0
                variable.assign(value)
        return model

    build(1).save(run_dir / "model.keras")
    (run_dir / "checkpoints").mkdir()
    build(2).save_weights(run_dir / "checkpoints" / "ckpt-10.weights.h5")
    sentences = (corpus / "test.en").read_text(encoding="utf-8").splitlines()[:4]
    return sentences[:2] + ["", "  "] + sentences[2:]


@pytest.fixture
def run(shared_data, tmp_path_factory):
    if "run" not in _RUN:
        run_dir = tmp_path_factory.mktemp("run")
        _RUN["run"] = run_dir, _tiny_run(shared_data, run_dir)
    return _RUN["run"]


def _reference(run_dir, weights=None, **kwargs):
    from keras_transformer.runs import load_run

    model, tokenizer = load_run(run_dir, weights)
    return Translator(model, tokenizer, batch_size=8, max_extra_length=MAX_EXTRA,
                      **kwargs)


def test_run_folder_translates_as_translator(run, tmp_path, capsys):
    run_dir, sentences = run
    source, target = tmp_path / "in.en", tmp_path / "out.de"
    _write_lines(source, sentences)
    assert main(["translate", "--run", str(run_dir), "--input", str(source),
                 "--output", str(target), "--beam-size", "3", "--alpha", "0.8",
                 "--max-extra-length", str(MAX_EXTRA), "--batch-size", "8"]) == 0
    expected = _reference(run_dir).translate(sentences, beam_size=3, alpha=0.8)
    assert target.read_text(encoding="utf-8").split("\n") == expected + [""]
    assert expected[2:4] == ["", ""] and all(expected[:2] + expected[4:])
    err = capsys.readouterr().err
    assert str(run_dir) in err and "beam 3" in err and "translated 6 sentences" in err


def test_run_folder_scores_equal_translator_scores(run, tmp_path, capsys):
    run_dir, sentences = run
    source, target = tmp_path / "in.en", tmp_path / "out.de"
    _write_lines(source, sentences)
    translator = _reference(run_dir)
    for decoding, beam_size in ((["--greedy"], 1), ([], 4)):
        assert main(["translate", "--run", str(run_dir), "--input", str(source),
                     "--output", str(target), "--scores", "--quiet",
                     "--max-extra-length", str(MAX_EXTRA), "--batch-size", "8"]
                    + decoding) == 0
        scores, translations = _scored_lines(target)
        expected, expected_scores = translator.translate_with_scores(
            sentences, beam_size=beam_size, alpha=0.6)
        assert translations == expected
        assert expected == translator.translate(sentences, beam_size=beam_size, alpha=0.6)
        np.testing.assert_allclose(scores, expected_scores, rtol=1e-5, atol=1e-5)
        assert scores[2:4] == [0.0, 0.0]
        assert all(np.isfinite(s) and s < 0 for s in scores[:2] + scores[4:])
    assert capsys.readouterr().err == ""


def test_run_folder_weights_and_errors(run, tmp_path, capsys):
    run_dir, sentences = run
    source, target = tmp_path / "in.en", tmp_path / "out.de"
    _write_lines(source, sentences)
    assert main(["translate", "--run", str(run_dir), "--weights", "ckpt-10", "--greedy",
                 "--input", str(source), "--output", str(target), "--quiet",
                 "--max-extra-length", str(MAX_EXTRA), "--batch-size", "8"]) == 0
    expected = _reference(run_dir, "ckpt-10").translate(sentences, beam_size=1)
    assert target.read_text(encoding="utf-8").split("\n") == expected + [""]
    assert expected != _reference(run_dir).translate(sentences, beam_size=1)

    def error(*argv):
        assert main(["translate", *argv, "--input", str(source), "--output",
                     str(tmp_path / "never.de")]) == 1
        err = capsys.readouterr().err
        assert err.count("\n") == 1 and err.startswith("keras-transformer translate: error: ")
        return err

    assert "run folder not found" in error("--run", str(tmp_path / "nowhere"))
    err = error("--run", str(run_dir), "--weights", "ckpt-99")
    assert "'ckpt-99' not found" in err and "ckpt-10" in err
    assert "needs --model" in error("--run", str(run_dir), "--signature", "x")
    assert "--beam-size 1" in error("--run", str(run_dir), "--greedy", "--beam-size", "4")
    assert "--alpha must be >= 0" in error("--run", str(run_dir), "--alpha", "-1")
    assert not (tmp_path / "never.de").exists()
