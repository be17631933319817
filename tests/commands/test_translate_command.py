"""`keras-transformer translate`: terminal input, `--scores` and `--run`.

The SavedModel part uses the session's tiny export from test_export.py (built
once per session, also used by test_cli.py); its outputs are checked against
the SavedModel loaded with `tf.saved_model.load`. The `--run` part translates
the export's run folder in this process on the current backend and checks it
against references that do not use the command's own path: the exported
SavedModel (beam and greedy), and greedy decoding written out here with the
model's logits, NumPy's argmax and SentencePiece's own library. Where the
flags go (beam size, alpha, length limit, batch size, int8) is checked with a
recording stand-in for `Translator`.
"""

import os
import pathlib
import select
import shutil
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
from keras_transformer.model.config import DecodingOptions
from exported_model import ALPHA, BEAM_SIZE, export, loaded  # noqa: F401 (fixtures)
from exported_model import MAX_EXTRA as EXPORT_MAX_EXTRA

REPO = pathlib.Path(__file__).resolve().parents[2]
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


@pytest.mark.backend_independent  # plain Python
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


@pytest.mark.backend_independent  # the SavedModel in a subprocess, against the SavedModel
def test_a_terminal_gets_each_translation_before_the_next_line(export, loaded, tmp_path):
    sentences = export["sentences"][:2]
    outputs = loaded.signatures["serving_default"](text=tf.constant(sentences))
    expected = [t.decode("utf-8") for t in outputs["translation"].numpy()]
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
    assert [a.split("\t", 1)[1] for a in answers] == expected + [""]
    assert all(expected)
    np.testing.assert_allclose(scores[:2], expected_scores, rtol=1e-5, atol=1e-5)
    assert scores[2] == 0.0
    stderr = stderr_path.read_text()
    assert "interactive" in stderr and "translated" not in stderr


# --- scores of the SavedModel command ----------------------------------------------------


def _signature_outputs(loaded, signature, sentences):
    outputs = loaded.signatures[signature](text=tf.constant(sentences))
    return ([t.decode("utf-8") for t in outputs["translation"].numpy()],
            outputs["score"].numpy())


@pytest.mark.backend_independent  # the SavedModel against the SavedModel
def test_scores_of_the_saved_model_command(export, loaded, tmp_path):
    source, target = tmp_path / "in.en", tmp_path / "out.de"
    _write_lines(source, export["sentences"])
    assert main(["translate", "--model", str(export["path"]), "--greedy", "--scores",
                 "--input", str(source), "--output", str(target), "--quiet"]) == 0
    scores, translations = _scored_lines(target)
    expected, expected_scores = _signature_outputs(loaded, "translate_greedy",
                                                   export["sentences"])
    assert translations == expected
    np.testing.assert_allclose(scores, expected_scores, rtol=1e-5, atol=1e-5)


@pytest.mark.backend_independent  # argument checks before any model is loaded
def test_saved_model_refuses_decoding_options(export, tmp_path, capsys):
    for option in (["--beam-size", "2"], ["--alpha", "1.0"], ["--max-extra-length", "3"],
                   ["--weights", "best"], ["--quantize", "int8"], ["--dtype", "bfloat16"]):
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

MAX_EXTRA = 8
BLANK = ("", "   ")  # export["sentences"] has both: they translate to "" and score 0


def _special_and_byte_ids(spm_file):
    import sentencepiece

    sp = sentencepiece.SentencePieceProcessor(model_file=str(spm_file))
    return [i for i in range(sp.get_piece_size())
            if i < 4 or sp.is_byte(i) or sp.is_control(i) or sp.is_unknown(i)]


@pytest.fixture(scope="module")
def run(export, tmp_path_factory):
    """A copy of the export's run folder (spm.model, model.keras) with a checkpoint.

    `checkpoints/ckpt-10.weights.h5` holds other weights: each variable of
    model.keras shuffled (same values, other places), the special and byte
    pieces' embedding rows zeroed again, as test_export's model has them.
    """
    run_dir = tmp_path_factory.mktemp("translate_run") / "run"
    shutil.copytree(export["run"], run_dir)
    model = keras.saving.load_model(run_dir / "model.keras", compile=False)
    rng = np.random.RandomState(2)
    zeroed = _special_and_byte_ids(run_dir / "spm.model")
    for variable in model.weights:
        value = keras.ops.convert_to_numpy(variable.value)
        value = rng.permutation(value.reshape(-1)).reshape(value.shape)
        if tuple(value.shape) == (model.config.vocab_size, model.config.d_model):
            value[zeroed] = 0.0
        variable.assign(value)
    (run_dir / "checkpoints").mkdir()
    model.save_weights(run_dir / "checkpoints" / "ckpt-10.weights.h5")
    return run_dir


def _translate_run(run_dir, source, target, *flags):
    assert main(["translate", "--run", str(run_dir), "--input", str(source),
                 "--output", str(target), *flags]) == 0
    return target.read_text(encoding="utf-8")


def test_run_folder_translations_and_scores_equal_the_saved_model(export, loaded, tmp_path,
                                                                   capsys):
    """`--run` of the export's run folder decodes as its SavedModel (beam and greedy)."""
    sentences = export["sentences"]
    source, target = tmp_path / "in.en", tmp_path / "out.de"
    _write_lines(source, sentences)
    # The export's decoding: beam BEAM_SIZE, ALPHA, length limit EXPORT_MAX_EXTRA.
    fixed = ["--alpha", str(ALPHA), "--max-extra-length", str(EXPORT_MAX_EXTRA),
             "--scores", "--quiet"]  # all in one batch (the default 32): one compiled search
    for flags, signature in ((["--beam-size", str(BEAM_SIZE)], "serving_default"),
                             (["--greedy"], "translate_greedy")):
        _translate_run(export["run"], source, target, *flags, *fixed)
        scores, translations = _scored_lines(target)
        expected, expected_scores = _signature_outputs(loaded, signature, sentences)
        assert translations == expected
        np.testing.assert_allclose(scores, expected_scores, rtol=1e-4, atol=1e-4)
        for sentence, translation, score in zip(sentences, translations, scores):
            if sentence in BLANK:
                assert translation == "" and score == 0.0
            else:
                assert translation and np.isfinite(score) and score < 0
    assert capsys.readouterr().err == ""


def _greedy_reference(model, spm_file, sentences, *, max_extra_length, alpha):
    """Greedy decoding written out: `(translations, scores)`.

    Independent of the package's decoding and tokenizer: SentencePiece's own
    library, a full teacher-forced model call per step (no cache; the
    decoder input has one width throughout, its future positions pad, which
    the causal mask hides), NumPy's argmax of the log-softmax, the output
    cut at EOS or at source length + `max_extra_length` ids, and the score
    log P(Y) / ((5 + |Y|) / 6) ** alpha with |Y| counting EOS. Blank
    sentences give "" and 0.
    """
    import sentencepiece

    sp = sentencepiece.SentencePieceProcessor(model_file=str(spm_file))
    config = model.config
    rows = [i for i, s in enumerate(sentences) if s.strip()]
    sources = [sp.encode(sentences[i])[:config.max_length - 1] + [config.eos_id]
               for i in rows]
    source = np.zeros((len(rows), max(map(len, sources))), "int32")
    for row, ids in enumerate(sources):
        source[row, :len(ids)] = ids
    limits = np.array([len(ids) + max_extra_length for ids in sources])
    width = int(limits.max())
    decoder_input = np.full((len(rows), width), config.pad_id, "int32")
    decoder_input[:, 0] = config.bos_id
    tokens = np.full((len(rows), width), config.pad_id, "int64")
    token_log_probs = np.zeros((len(rows), width))
    for step in range(width):
        logits = keras.ops.convert_to_numpy(model(
            {"source_ids": source, "target_ids": decoder_input}, training=False))[:, step]
        logits = logits.astype("float64")
        log_probs = logits - logits.max(-1, keepdims=True)
        log_probs -= np.log(np.exp(log_probs).sum(-1, keepdims=True))
        tokens[:, step] = log_probs.argmax(-1)
        token_log_probs[:, step] = log_probs[np.arange(len(rows)), tokens[:, step]]
        ended = (tokens[:, :step + 1] == config.eos_id).any(-1) | (step + 1 >= limits)
        if ended.all():
            break
        if step + 1 < width:
            decoder_input[:, step + 1] = tokens[:, step]
    translations, scores = [""] * len(sentences), [0.0] * len(sentences)
    for row, i in enumerate(rows):
        output = tokens[row, :limits[row]].tolist()
        length = output.index(config.eos_id) + 1 if config.eos_id in output else len(output)
        log_p = token_log_probs[row, :length].sum()
        scores[i] = log_p / ((5.0 + length) / 6.0) ** alpha
        translations[i] = sp.decode([t for t in output[:length] if t != config.eos_id])
    return translations, scores


def test_run_greedy_output_is_the_argmax_decoding_of_its_weights(export, run, tmp_path):
    """`--greedy` with `--weights` and `--alpha` against greedy decoding written out here."""
    # One batch of 8 (one compiled search per model): six sentences, one with
    # byte pieces, and the blank ones.
    sentences = export["sentences"][:5] + list(BLANK) + ["Grüße aus Köln – 東京 🙂"]
    assert sentences[-1] in export["sentences"]
    source, target = tmp_path / "in.en", tmp_path / "out.de"
    _write_lines(source, sentences)
    outputs = {}
    for weights, alpha in ((None, 0.0), ("ckpt-10", 0.8)):
        flags = ["--weights", weights] if weights else []
        _translate_run(run, source, target, "--greedy", "--scores", "--quiet",
                       "--alpha", str(alpha), "--max-extra-length", str(MAX_EXTRA),
                       "--batch-size", "8", *flags)
        scores, translations = _scored_lines(target)
        model = keras.saving.load_model(run / "model.keras", compile=False)
        if weights:
            model.load_weights(run / "checkpoints" / f"{weights}.weights.h5")
        expected, expected_scores = _greedy_reference(
            model, run / "spm.model", sentences, max_extra_length=MAX_EXTRA, alpha=alpha)
        assert translations == expected, weights
        np.testing.assert_allclose(scores, expected_scores, rtol=1e-4, atol=1e-4)
        assert sum(bool(t) for t in translations) == len(sentences) - len(BLANK)
        outputs[weights] = translations
    assert outputs[None] != outputs["ckpt-10"]  # --weights chose other weights


_MADE = []  # the _RecordingTranslator instances


class _RecordingTranslator:
    """Stands in for `Translator` in `translate --run`: records what reaches it.

    Takes lines as str or bytes; translates a sentence `s` to `<s>` with score
    -(its position + 1) / 8.
    """

    def __init__(self, model, tokenizer, options=None, *, batch_size=32, **kwargs):
        self.model, self.tokenizer, self.kwargs = model, tokenizer, kwargs
        self.options = DecodingOptions() if options is None else options
        self.batch_size, self.calls = batch_size, []
        _MADE.append(self)

    def translate_with_scores(self, sentences, *, beam_size=None, alpha=None, progress=False):
        sentences = [s.decode("utf-8") if isinstance(s, bytes) else s for s in sentences]
        self.calls.append((sentences, self.options.replace(beam_size=beam_size, alpha=alpha)))
        done = sum(len(batch) for batch, _ in self.calls[:-1])
        return ([f"<{s}>" for s in sentences],
                [-(done + i + 1) / 8 for i in range(len(sentences))])


@pytest.mark.backend_independent  # plumbing: the model is loaded, never run
def test_run_flags_reach_the_translator(run, tmp_path, monkeypatch, capsys):
    import keras_transformer.model.transformer
    import keras_transformer.inference.translator

    quantized_calls = []

    def fake_quantized(model, mode):
        quantized_calls.append((model, mode))
        return ("int8 copy of", model)

    monkeypatch.setattr(keras_transformer.inference.translator, "Translator", _RecordingTranslator)
    monkeypatch.setattr(keras_transformer.model.transformer, "quantized", fake_quantized)
    sentences = ["one", "two", "", "four", "five", "six"]
    source, target = tmp_path / "in.en", tmp_path / "out.de"
    _write_lines(source, sentences)

    def translate(*flags):
        _MADE.clear()
        text = _translate_run(run, source, target, *flags)
        (translator,) = _MADE
        return translator, text, capsys.readouterr().err

    # The defaults: DecodingOptions() (the paper's), batches of 32, the float32 model.
    translator, text, err = translate("--quiet")
    assert [options for _, options in translator.calls] == [DecodingOptions()]
    assert translator.batch_size == 32 and not quantized_calls
    assert type(translator.model).__name__ == "Transformer"
    assert text == "".join(f"<{s}>\n" for s in sentences) and err == ""

    # Every decoding flag, and the batch size: the lines go in order, 4 then 2.
    translator, text, err = translate("--beam-size", "3", "--alpha", "0.8",
                                      "--max-extra-length", "5", "--batch-size", "4",
                                      "--scores")
    assert translator.calls == [
        (sentences[:4], DecodingOptions(beam_size=3, alpha=0.8, max_extra_length=5)),
        (sentences[4:], DecodingOptions(beam_size=3, alpha=0.8, max_extra_length=5))]
    scores, translations = _scored_lines(target)
    assert translations == [f"<{s}>" for s in sentences]
    assert scores == [-(i + 1) / 8 for i in range(len(sentences))]
    assert str(run) in err and "weights final" in err and "beam 3" in err
    assert "alpha 0.8" in err and "batch size 4" in err and "translated 6 sentences" in err

    # --greedy is beam size 1; --quantize int8 decodes with quantized(model, "int8").
    translator, _, err = translate("--greedy", "--quantize", "int8", "--quiet")
    assert [options for _, options in translator.calls] == [
        DecodingOptions(beam_size=1)]
    ((model, mode),) = quantized_calls
    assert mode == "int8" and type(model).__name__ == "Transformer"
    assert translator.model == ("int8 copy of", model)

    # --dtype bfloat16 decodes with a bf16 copy of the model.
    translator, _, err = translate("--dtype", "bfloat16")
    assert translator.model.dtype_policy.name == "bfloat16"
    assert {str(w.dtype).split(".")[-1] for w in translator.model.weights} == {"bfloat16"}
    assert "bfloat16 weights" in err


@pytest.mark.backend_independent  # argument and run-folder checks
def test_run_folder_errors(run, tmp_path, capsys):
    source = tmp_path / "in.en"
    _write_lines(source, ["one"])

    def error(*argv):
        assert main(["translate", *argv, "--input", str(source), "--output",
                     str(tmp_path / "never.de")]) == 1
        err = capsys.readouterr().err
        assert err.count("\n") == 1 and err.startswith("keras-transformer translate: error: ")
        return err

    assert "run folder not found" in error("--run", str(tmp_path / "nowhere"))
    err = error("--run", str(run), "--weights", "ckpt-99")
    assert "'ckpt-99' not found" in err and "ckpt-10" in err
    assert "needs --model" in error("--run", str(run), "--signature", "x")
    assert "--beam-size 1" in error("--run", str(run), "--greedy", "--beam-size", "4")
    # The decoding flags' messages are DecodingOptions.check's, naming the flag.
    assert error("--run", str(run), "--alpha", "-1") == \
        "keras-transformer translate: error: --alpha must be >= 0, received -1\n"
    assert "--beam-size must be >= 1, received 0" in error("--run", str(run), "--beam-size", "0")
    assert "--max-extra-length must be >= 0, received -1" in error(
        "--run", str(run), "--max-extra-length", "-1")
    assert "int8 weights or bf16 weights" in error("--run", str(run), "--quantize", "int8",
                                                   "--dtype", "bfloat16")
    assert not (tmp_path / "never.de").exists()


# --- a run's decoding settings are the defaults of translate --run and evaluate ----------


class _RecordingDecoder(_RecordingTranslator):
    """`_RecordingTranslator` with `translate` too (what `evaluate` calls)."""

    def translate(self, sentences, *, beam_size=None, alpha=None, progress=False):
        return self.translate_with_scores(sentences, beam_size=beam_size, alpha=alpha)[0]


@pytest.fixture
def recorded_run(export, tmp_path, monkeypatch):
    """A copy of the export's run whose settings.json (as `train` writes it) records
    beam 3, alpha 1.0 and at most 5 extra ids; `Translator` records what reaches it."""
    import json

    import keras_transformer.inference.translator
    from keras_transformer.training.settings import Settings

    run_dir = tmp_path / "recorded_run"
    shutil.copytree(export["run"], run_dir)
    settings = Settings(preset="tiny", data="demo", output_dir=str(run_dir), beam_size=3,
                        alpha=1.0, max_extra_length=5)
    (run_dir / "settings.json").write_text(json.dumps(settings.to_dict(), indent=2))
    monkeypatch.setattr(keras_transformer.inference.translator, "Translator",
                        _RecordingDecoder)
    _MADE.clear()
    return run_dir


@pytest.mark.backend_independent  # plumbing: the model is loaded, never run
def test_run_decodes_with_its_recorded_settings_unless_a_flag_says(recorded_run, run,
                                                                   tmp_path, capsys):
    source, target = tmp_path / "in.en", tmp_path / "out.de"
    _write_lines(source, ["one", "two"])

    def translate(run_dir, *flags):
        _MADE.clear()
        _translate_run(run_dir, source, target, *flags)
        (translator,) = _MADE
        ((_, options),) = translator.calls
        return options, capsys.readouterr().err.splitlines()[0]

    options, line = translate(recorded_run)
    assert options == DecodingOptions(beam_size=3, alpha=1.0, max_extra_length=5)
    assert line == (f"keras-transformer translate: {recorded_run}, weights final, beam 3, "
                    "alpha 1.0, max extra length 5 (the run's settings), batch size 32")
    options, line = translate(recorded_run, "--alpha", "0.6", "--greedy")
    assert options == DecodingOptions(beam_size=1, alpha=0.6, max_extra_length=5)
    assert line.endswith("greedy (--greedy), alpha 0.6 (--alpha), max extra length 5 "
                         "(the run's settings), batch size 32")
    # A run that records none (this one has no settings.json) keeps the paper's, and says so.
    options, line = translate(run)
    assert options == DecodingOptions()
    assert line.endswith("beam 4, alpha 0.6, max extra length 50 (the paper's defaults: the "
                         "run has no settings.json), batch size 32")


@pytest.mark.backend_independent  # plumbing: the model is loaded, never run
def test_evaluate_decodes_with_the_run_s_recorded_settings(recorded_run, tmp_path, capsys):
    import json

    data = tmp_path / "data"
    data.mkdir()
    _write_lines(data / "test.en", ["one", "two"])
    _write_lines(data / "test.de", ["<one>", "<two>"])

    def evaluate(*flags):
        _MADE.clear()
        assert main(["evaluate", "--run", str(recorded_run), "--data", str(data),
                     "--json", str(tmp_path / "rows.json"), *flags]) == 0
        (translator,) = _MADE
        rows = json.loads((tmp_path / "rows.json").read_text())
        return translator, rows, capsys.readouterr().err

    translator, rows, err = evaluate()
    assert [options for _, options in translator.calls] == [
        DecodingOptions(beam_size=3, alpha=1.0, max_extra_length=5)]
    assert [(r["beam_size"], r["alpha"]) for r in rows] == [(3, 1.0)]
    assert "decoding: beam 3, alpha 1.0, max extra length 5 (the run's settings)" in err
    translator, rows, err = evaluate("--beam-sizes", "1", "2", "--alpha", "0.5")
    assert [options for _, options in translator.calls] == [
        DecodingOptions(beam_size=b, alpha=0.5, max_extra_length=5) for b in (1, 2)]
    assert ("decoding: beam 1 or 2 (--beam-sizes), alpha 0.5 (--alpha), max extra length 5 "
            "(the run's settings)") in err
