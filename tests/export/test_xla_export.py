"""The XLA-compiled export (`export --xla`): the same answers, compiled on bucket shapes.

The export always runs under TensorFlow (in a subprocess under JAX and
PyTorch) and its references are the session export's `Translator` outputs,
so these tests run under the first backend only.
"""

import json
import pathlib
import subprocess
import sys

import numpy as np
import pytest
import tensorflow as tf

from exported_model import ALPHA, BEAM_SIZE
from exported_model import export  # noqa: F401 (fixture)
from test_export import _in_fresh_process
from keras_transformer.commands import main
from keras_transformer.export.op_audit import forbidden_ops, saved_model_ops
from keras_transformer.export.saved_model import export_saved_model
from keras_transformer.export.translation_module import XlaBuckets
from keras_transformer.export.warmup import read_warmup_requests

pytestmark = pytest.mark.backend_independent

# Few shapes (each compiles once per signature): chunks of 8 sentences at
# most, padded to 4 or 8 rows at widths 8, 16 and the model's 32; one
# sentence at width 32 only.
BATCHES, WIDTHS = (1, 4), (8, 16)
SHAPES = ((1, 32), (4, 8), (4, 16), (4, 32), (8, 8), (8, 16), (8, 32))


@pytest.fixture(scope="module")
def xla_export(export, tmp_path_factory):
    base = tmp_path_factory.mktemp("xla")
    return export_saved_model(export["translator"], base, beam_size=BEAM_SIZE, alpha=ALPHA,
                              batch_size=8, xla=True, xla_batch_sizes=BATCHES,
                              xla_widths=WIDTHS)


def test_answers_equal_the_translator_s_in_a_fresh_process(export, xla_export, tmp_path):
    """Raw strings in, translations out, in a process with TensorFlow and tf-text only.

    The sentences hold blank lines, a long (truncated) input, non-ASCII text
    and chunks of 8, 8 and 2 sentences (padded to 4 rows) of several widths.
    """
    sentences = export["sentences"]
    out = _in_fresh_process(xla_export, sentences, tmp_path)
    assert out["serving_default"] == export["beam"]
    assert out["translate_greedy"] == export["greedy"]
    _, expected_scores = export["translator"].translate_with_scores(
        sentences, beam_size=BEAM_SIZE, alpha=ALPHA)
    np.testing.assert_allclose(out["serving_default_score"], expected_scores,
                               rtol=1e-4, atol=1e-4)
    blank = [i for i, s in enumerate(sentences) if not s.strip()]
    assert blank and all(out["serving_default_score"][i] == 0.0 for i in blank)


def test_a_request_larger_than_the_batch_and_invalid_utf8(export, xla_export):
    loaded = tf.saved_model.load(str(xla_export))
    sentences = export["sentences"] * 2  # 40 sentences: five chunks of 8
    out = loaded.signatures["serving_default"](text=tf.constant(sentences))
    assert [t.decode() for t in out["translation"].numpy()] == export["beam"] * 2
    # One sentence (the one-row bucket, compiled at the largest width only),
    # short and long.
    for index in (0, int(np.argmax([len(s) for s in export["sentences"]]))):
        one = loaded.signatures["serving_default"](text=tf.constant(sentences[index:index + 1]))
        assert one["translation"].numpy()[0].decode() == export["beam"][index]
    broken = loaded.signatures["translate_greedy"](text=tf.constant([b"caf\xe9 \xff"]))
    assert broken["translation"].numpy()[0].decode("utf-8") == \
        export["translator"].translate(["caf\ufffd \ufffd"], beam_size=1)[0]


def test_options_ops_and_warmup_cover_every_compiled_shape(export, xla_export):
    options = json.loads((xla_export / "assets.extra" / "export_options.json").read_text())
    assert (options["xla"], options["xla_batch_sizes"], options["xla_widths"]) == \
        (True, [1, 4, 8], [8, 16, 32])
    # XLA's own update op runs inside the compiled functions only.
    assert "XlaDynamicUpdateSlice" in saved_model_ops(xla_export)
    assert forbidden_ops(saved_model_ops(xla_export, outside_compiled=True)) == []
    # One warm-up request per signature and compiled (batch, width) shape,
    # each sentence exactly the bucket's width in ids (pieces + EOS).
    tokenizer = export["translator"].tokenizer
    shapes = []
    for request in read_warmup_requests(xla_export):
        (texts,) = request.inputs.values()
        ids = tokenizer.encode_source(tf.constant(list(texts)), options["max_source_length"])
        widths = set(ids.row_lengths().numpy().tolist())
        assert len(widths) == 1
        shapes.append((request.signature_name, len(texts), widths.pop()))
    assert sorted(shapes) == sorted((signature, batch, width)
                                    for signature in ("serving_default", "translate_greedy")
                                    for batch, width in SHAPES)


def test_the_plain_export_compiles_nothing(export):
    options = json.loads((export["path"] / "assets.extra" / "export_options.json").read_text())
    assert options["xla"] is False and "xla_widths" not in options
    assert not any(op.startswith("Xla") for op in saved_model_ops(export["path"]))


def test_buckets_are_sorted_checked_and_end_at_the_limits():
    defaults = XlaBuckets.resolve(None, None, batch_size=32, max_source_length=128)
    assert defaults == XlaBuckets((1, 32), (32, 40, 64, 128))
    # One sentence at the largest width only; other batches at every width.
    assert defaults.shapes == ((1, 128), (32, 32), (32, 40), (32, 64), (32, 128))
    assert XlaBuckets((2, 8), (10, 40)).shapes == ((2, 10), (2, 40), (8, 10), (8, 40))
    assert XlaBuckets.resolve([16, 2, 64], [100, 10, 40], batch_size=8,
                              max_source_length=40) == XlaBuckets((2, 8), (10, 40))
    with pytest.raises(ValueError, match="xla widths must be integers of at least 2"):
        XlaBuckets.resolve(None, [1, 8], batch_size=8, max_source_length=32)
    with pytest.raises(ValueError, match="xla batch sizes"):
        XlaBuckets.resolve([0], None, batch_size=8, max_source_length=32)


def test_bucket_flags_without_xla_are_one_line_errors(export, tmp_path, capsys):
    base = tmp_path / "never"
    for argv, message in [
            (["--xla-widths", "8"], "xla_batch_sizes and xla_widths are the buckets of an "
                                    "XLA export: give xla=True too"),
            (["--xla", "--xla-batch-sizes", "0"], "xla batch sizes must be integers of at "
                                                  "least 1, received [0]"),
            (["--format", "ctranslate2", "--xla"], "--xla applies to --format saved_model")]:
        assert main(["export", "--run", str(export["run"]), "--export-dir", str(base),
                     "--quiet", *argv]) == 1
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1 and message in err[0], err
    assert not base.exists()


def test_concurrent_requests_script_answers_as_one_at_a_time(export, xla_export, tmp_path):
    """examples/benchmark_serving_threads.py on the XLA export: two requests at a
    time (as TF Serving's num_batch_threads 2 runs them) are answered as one at a
    time; the script fails otherwise, and refuses a folder that is no SavedModel."""
    script = pathlib.Path(__file__).resolve().parents[2] / "examples" / \
        "benchmark_serving_threads.py"
    sentences = tmp_path / "in.txt"
    sentences.write_text("\n".join(export["sentences"][:12]) + "\n", encoding="utf-8")
    result = subprocess.run(
        [sys.executable, str(script), "--model", str(xla_export), "--input", str(sentences),
         "--batch-size", "3", "--threads", "1", "2", "--rounds", "1"],
        capture_output=True, text=True, timeout=600)
    assert result.returncode == 0, result.stderr[-3000:]
    rows = [line for line in result.stdout.splitlines() if line.startswith("| ")]
    assert [row.split("|")[1].strip() for row in rows[1:]] == ["1", "2"]
    bad = subprocess.run([sys.executable, str(script), "--model", str(tmp_path),
                          "--input", str(sentences)], capture_output=True, text=True,
                         timeout=120)
    assert bad.returncode == 2 and "no saved_model.pb" in bad.stderr.strip().splitlines()[-1]
