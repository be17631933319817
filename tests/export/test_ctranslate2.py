"""CTranslate2 export (`keras_transformer.export.ctranslate2`, `export --format ctranslate2`).

Tolerances, on per-token log-probabilities of a teacher-forced pass
(CTranslate2's `score_batch` against our model's log-softmax in NumPy):

- float32 export: 1e-4 absolute: the same weights in float32 arithmetic.
- int8 export, its weights: loaded with `compute_type="float32"` (CTranslate2
  dequantizes the stored int8 weights), against our model whose weights are
  rounded to int8 in NumPy as CTranslate2 rounds them (one scale per output
  row): 1e-4 as well, since both hold the same weights.
- int8 export, its int8 arithmetic: 0.15 absolute per token, 0.02 on the
  mean absolute error, against the float model: activations are rounded to
  int8 per row as the weights are. Run with CTranslate2's GEMM library
  pinned to Intel MKL (`CT2_USE_MKL=1`), which sums the int8 products in 32
  bits: on CPUs without VNNI that are not Intel's (an AVX2-only AMD CPU)
  CTranslate2 otherwise takes oneDNN's int8 product, which sums pairs of
  products in saturating 16-bit integers (oneDNN's "Nuances of int8
  Computations"), an error of that CPU's kernel, not of the export.

Greedy decoding must give our `greedy_decode`'s tokens exactly. Random tied
weights make a model echo its input token, so the greedy test uses an untied
output projection (doubled, with an EOS bias, so that some outputs end in
EOS and others at the length limit) and checks that every step's best token
leads the runner-up by far more than the float32 error, so no tie can flip.
"""

import json
import os
import pathlib
import subprocess
import sys
import warnings

import keras
import numpy as np
import pytest
import sentencepiece

ctranslate2 = pytest.importorskip("ctranslate2")  # the test extra installs it

import keras_transformer as kt  # noqa: E402
from keras_transformer.commands import main  # noqa: E402
from keras_transformer.inference.decoding import greedy_decode  # noqa: E402
from keras_transformer.export.ctranslate2_runtime import CTranslate2Translator  # noqa: E402
from keras_transformer.export.ctranslate2 import export_ctranslate2, position_table  # noqa: E402
from keras_transformer.inference.translator import Translator  # noqa: E402

REPO = pathlib.Path(__file__).resolve().parents[2]
VOCAB_SIZE = 500
FLOAT32_TOLERANCE = 1e-4
INT8_TOLERANCE = 0.15
INT8_MEAN_TOLERANCE = 0.02
# CTranslate2's int8 weights: round(w * 127 / max|w|) per output row.
INT8_LEVELS = 127
MAX_EXTRA_LENGTH = 8  # short outputs: fast, and the length limit is exercised


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
    """Demo pairs and a 500-piece SentencePiece model trained on them (offline)."""
    from keras_transformer.data import generate_pairs, train_tokenizer

    folder = tmp_path_factory.mktemp("ct2_corpus")
    pairs = generate_pairs(500, seed=3)
    for i, lang in enumerate(("en", "de")):
        (folder / f"train.{lang}").write_text("\n".join(p[i] for p in pairs) + "\n",
                                              encoding="utf-8")
    tokenizer = train_tokenizer([folder / "train.en", folder / "train.de"], VOCAB_SIZE,
                                folder / "spm.model")
    return dict(folder=folder, pairs=pairs, tokenizer=tokenizer)


def _model(**overrides):
    keras.utils.set_random_seed(0)
    return kt.build_model(preset="tiny", vocab_size=VOCAB_SIZE, max_length=64, dropout=0.0,
                          **overrides)


def _perturb_norms_and_biases(model, scale=0.3):
    """LayerNorm gammas/betas, biases and learned positions away from their init."""
    rng = np.random.default_rng(0)
    for weight in model.weights:
        name = weight.path.split("/")[-1]
        if name in ("gamma", "beta", "bias", "position_embeddings"):
            value = keras.ops.convert_to_numpy(weight)
            weight.assign(value + rng.normal(0, scale, value.shape).astype("float32"))


def _teacher_forced_log_probs(model, source_ids, target_ids):
    """Our model's log P(y_t | y_<t, x) of each target id, then of EOS (NumPy)."""
    config = model.config
    rows = []
    for source, target in zip(source_ids, target_ids):
        logits = model({"source_ids": np.array([source], "int32"),
                        "target_ids": np.array([[config.bos_id] + target], "int32")})
        logits = keras.ops.convert_to_numpy(logits)[0].astype("float64")
        log_probs = logits - logits.max(-1, keepdims=True)
        log_probs -= np.log(np.exp(log_probs).sum(-1, keepdims=True))
        rows.append(log_probs[np.arange(len(target) + 1), target + [config.eos_id]])
    return rows


def _pairs_ids(corpus, model, count=8):
    tokenizer = corpus["tokenizer"]
    sources, targets = zip(*corpus["pairs"][:count])
    source_ids = Translator(model, tokenizer).encode(list(sources))
    target_ids = [list(map(int, row)) for row in tokenizer.tokenize(list(targets)).to_list()]
    return source_ids, target_ids


def _ct2_log_probs(translator, source_ids, target_ids):
    """CTranslate2's teacher-forced log P of each target id, then of EOS (`score_batch`).

    Args:
        translator: a `CTranslate2Translator` (its pieces; CTranslate2
            appends the source's EOS itself).
        source_ids: EOS-terminated source id lists.
        target_ids: target id lists without BOS or EOS.
    """
    results = translator.translator.score_batch(
        translator._source_pieces(source_ids), [translator._pieces(t) for t in target_ids],
        max_input_length=0)
    return [np.asarray(r.log_probs, "float64") for r in results]


def _output_ids(translator, source_ids, beam_size, alpha=0.6, length_penalty=None):
    """Output ids of `decode_rows` (the step `translate` decodes with), cut at EOS."""
    rows, _ = translator.decode_rows(source_ids, (beam_size, alpha, length_penalty))
    return translator.tokenizer.output_ids(rows).to_list()


def _max_error(expected, found):
    assert [len(e) for e in expected] == [len(f) for f in found]
    return max(float(np.abs(e - f).max()) for e, f in zip(expected, found))


# --- numerics -------------------------------------------------------------------------


@pytest.mark.parametrize("overrides", [
    {},  # the paper: post-norm, shared tied embeddings, sinusoids
    dict(norm_first=True, position_embedding="learned", layer_norm_epsilon=0.5),
    dict(share_embeddings=False, tie_output_embeddings=False, key_dim=16),
], ids=["paper", "pre_norm_learned_eps", "untied_head_dim_16"])
def test_float32_log_probs_equal_the_teacher_forced_model(corpus, tmp_path, overrides):
    model = _model(**overrides)
    _perturb_norms_and_biases(model)
    path = export_ctranslate2(model, corpus["tokenizer"], tmp_path / "ct2")
    assert {"model.bin", "config.json", "spm.model", "keras_transformer.json"} <= {
        p.name for p in path.iterdir()}
    source_ids, target_ids = _pairs_ids(corpus, model)
    expected = _teacher_forced_log_probs(model, source_ids, target_ids)
    found = _ct2_log_probs(CTranslate2Translator(path, intra_threads=1), source_ids, target_ids)
    assert _max_error(expected, found) < FLOAT32_TOLERANCE


def test_position_table_is_the_papers_interleaved_sinusoid_from_position_0():
    model = _model(d_model=8, num_heads=2, d_ff=16, num_layers=1)
    table = position_table(model.decoder, 3)
    assert table.shape == (3, 8)
    # PE(pos, 2i) = sin(pos / 10000^(2i/d)), PE(pos, 2i+1) = cos(...); BOS is position 0.
    np.testing.assert_allclose(table[0], [0, 1, 0, 1, 0, 1, 0, 1], atol=1e-6)
    np.testing.assert_allclose(table[1, :4], [np.sin(1.0), np.cos(1.0),
                                              np.sin(0.1), np.cos(0.1)], atol=1e-6)
    learned = _model(d_model=8, num_heads=2, d_ff=16, num_layers=1,
                     position_embedding="learned")
    np.testing.assert_array_equal(
        position_table(learned.encoder, 3),  # a learned table keeps its max_length rows
        keras.ops.convert_to_numpy(learned.encoder.positional_encoding.position_embeddings))


@pytest.mark.backend_independent
def test_greedy_tokens_and_translations_equal_ours(corpus, tmp_path):
    model = _model(tie_output_embeddings=False)
    projection = model.output_projection
    bias = keras.ops.convert_to_numpy(projection.bias)
    bias[model.config.eos_id] = 1.0
    projection.bias.assign(bias)
    projection.kernel.assign(2 * keras.ops.convert_to_numpy(projection.kernel))
    tokenizer = corpus["tokenizer"]
    sources = [source for source, _ in corpus["pairs"][:16]]
    translator = Translator(model, tokenizer, max_extra_length=MAX_EXTRA_LENGTH)
    source_ids = translator.encode(sources)
    batch = np.zeros((len(source_ids), max(map(len, source_ids))), "int32")
    for row, ids in enumerate(source_ids):
        batch[row, :len(ids)] = ids
    tokens = keras.ops.convert_to_numpy(
        greedy_decode(model, batch, max_extra_length=MAX_EXTRA_LENGTH))
    eos = model.config.eos_id
    # Our output ids: before the first EOS, pad and BOS dropped (plain Python).
    ours = []
    for row in tokens.tolist():
        row = row[:row.index(eos)] if eos in row else row
        ours.append([t for t in row if t not in (model.config.pad_id, model.config.bos_id)])
    ended = [eos in row for row in tokens.tolist()]
    assert 0 < sum(ended) < len(ended)  # both ways of ending are exercised

    # Every greedy choice leads the runner-up by far more than the export's error.
    for source, row, end in zip(source_ids, tokens.tolist(), ended):
        generated = row[:row.index(eos) + 1] if end else row[:len(source) + MAX_EXTRA_LENGTH]
        logits = keras.ops.convert_to_numpy(model({
            "source_ids": np.array([source], "int32"),
            "target_ids": np.array([[model.config.bos_id] + generated[:-1]], "int32")}))[0]
        assert (logits.argmax(-1) == generated).all()
        top2 = np.sort(logits, axis=-1)[:, -2:]
        assert (top2[:, 1] - top2[:, 0]).min() > 1e-3

    path = export_ctranslate2(model, tokenizer, tmp_path / "ct2")
    ct2 = CTranslate2Translator(path, intra_threads=1, max_extra_length=MAX_EXTRA_LENGTH)
    # Source ids: the sentencepiece library's pieces, cut to max_length - 1, then EOS.
    processor = sentencepiece.SentencePieceProcessor(model_proto=tokenizer.model_proto)
    keep = model.config.max_length - 1
    assert ct2.encode(sources) == source_ids == [
        processor.EncodeAsIds(s)[:keep] + [eos] for s in sources]
    assert _output_ids(ct2, source_ids, beam_size=1) == ours
    assert ct2.translate(sources + ["  "], beam_size=1) == translator.translate(
        sources, beam_size=1) + [""]
    # Beam search: of CTranslate2's finished hypotheses, the one our GNMT
    # penalty ranks first, by log-probabilities from an independent
    # teacher-forced pass (score_batch). Its agreement with our own search is
    # what examples/compare_inference.py compares on a trained model. A strong
    # alpha (2) makes the GNMT choice differ from the most probable one.
    alpha = 2.0
    beams = _output_ids(ct2, source_ids, beam_size=4, alpha=alpha)
    assert all(len(ids) <= len(s) + MAX_EXTRA_LENGTH for ids, s in zip(beams, source_ids))
    raw = ct2.translator.translate_batch(
        ct2._source_pieces(source_ids), beam_size=4, num_hypotheses=4, length_penalty=0.0,
        patience=1, max_input_length=0, min_decoding_length=0, return_end_token=True,
        max_decoding_length=max(len(s) + MAX_EXTRA_LENGTH for s in source_ids))
    checked = reranked = 0
    for source, beam, result in zip(source_ids, beams, raw):
        candidates = [ct2._ids(h) for h in result.hypotheses]
        if not all(c[-1:] == [eos] and len(c) <= len(source) + MAX_EXTRA_LENGTH
                   for c in candidates):
            continue  # a candidate cut at the length limit has no EOS to score
        outputs = [c[:-1] for c in candidates]
        log_probs = _ct2_log_probs(ct2, [source] * len(outputs), outputs)
        gnmt = [float(lp.sum()) / ((5 + len(lp)) / 6) ** alpha for lp in log_probs]
        assert beam == outputs[int(np.argmax(gnmt))]
        checked += 1
        reranked += int(np.argmax(gnmt)) != int(np.argmax([lp.sum() for lp in log_probs]))
    assert checked >= 3 and reranked >= 1, (checked, reranked)
    own = _output_ids(ct2, source_ids, beam_size=4, length_penalty=0.6)
    assert all(len(ids) <= len(s) + MAX_EXTRA_LENGTH for ids, s in zip(own, source_ids))


def _rounded_like_ctranslate2(model):
    """A copy of `model` whose weights are rounded to int8 as CTranslate2's export rounds them.

    Every Dense kernel and embedding table, one scale per output row
    (`ctranslate2.specs.model_spec`): `round(w * 127 / max|w_row|)`, back to
    float by the same scale. A Keras kernel is `(in, out)`: CTranslate2's
    `(out, in)` rows are its columns. Found from the layers' types, not from
    the exporter's mapping, so a weight the export left out or misplaced
    shows.
    """
    def rounded(rows):
        rows = np.asarray(rows, "float32")
        amax = np.abs(rows).max(axis=1, keepdims=True)
        scale = INT8_LEVELS / np.where(amax == 0, INT8_LEVELS, amax)
        return np.rint(rows * scale) / scale

    copy = _model()
    copy.set_weights(model.get_weights())
    count = 0
    for layer in copy._flatten_layers():
        if isinstance(layer, keras.layers.Dense):
            kernel = keras.ops.convert_to_numpy(layer.kernel)
            layer.kernel.assign(rounded(kernel.T).T)
            count += 1
        elif isinstance(layer, keras.layers.Embedding):
            layer.embeddings.assign(rounded(keras.ops.convert_to_numpy(layer.embeddings)))
            count += 1
    assert count > 0
    return copy


# CTranslate2's int8 arithmetic in a fresh process, its int8 GEMM pinned to
# Intel MKL (read once, when CTranslate2 first picks its backends).
_INT8_SCORE_SCRIPT = """
import json, sys
import ctranslate2
request = json.loads(sys.stdin.read())
translator = ctranslate2.Translator(request["path"], intra_threads=1)
results = translator.score_batch(request["sources"], request["targets"], max_input_length=0)
print(json.dumps([r.log_probs for r in results]))
"""


def _int8_log_probs_with_mkl(translator, source_ids, target_ids):
    """`_ct2_log_probs` of `translator`'s folder at its own (int8) compute type, under MKL."""
    request = {"path": str(translator.model_dir),
               "sources": translator._source_pieces(source_ids),
               "targets": [translator._pieces(t) for t in target_ids]}
    result = subprocess.run([sys.executable, "-c", _INT8_SCORE_SCRIPT],
                            input=json.dumps(request), capture_output=True, text=True,
                            env=dict(os.environ, CT2_USE_MKL="1"), timeout=300)
    assert result.returncode == 0, result.stderr[-3000:]
    return [np.asarray(row, "float64") for row in json.loads(result.stdout)]


@pytest.mark.backend_independent
def test_int8_export_holds_the_rounded_weights_and_stays_close(corpus, tmp_path):
    model = _model()
    _perturb_norms_and_biases(model)
    float_path = export_ctranslate2(model, corpus["tokenizer"], tmp_path / "float32")
    int8_path = export_ctranslate2(model, corpus["tokenizer"], tmp_path / "int8",
                                   quantization="int8")
    assert json.loads((int8_path / "keras_transformer.json").read_text())[
        "quantization"] == "int8"
    # int8 weights: a quarter of the float32 bytes, plus one scale per row.
    assert (int8_path / "model.bin").stat().st_size < 0.4 * (
        float_path / "model.bin").stat().st_size
    source_ids, target_ids = _pairs_ids(corpus, model)

    # The stored weights, computed in float32: exactly our weights rounded to int8.
    dequantized = CTranslate2Translator(int8_path, compute_type="float32", intra_threads=1)
    rounded = _teacher_forced_log_probs(_rounded_like_ctranslate2(model), source_ids,
                                        target_ids)
    assert _max_error(rounded, _ct2_log_probs(dequantized, source_ids, target_ids)) \
        < FLOAT32_TOLERANCE

    # The int8 arithmetic (activations rounded too), its products summed in 32 bits.
    expected = _teacher_forced_log_probs(model, source_ids, target_ids)
    found = _int8_log_probs_with_mkl(dequantized, source_ids, target_ids)
    assert _max_error(expected, found) < INT8_TOLERANCE
    assert np.mean(np.abs(np.concatenate(expected) - np.concatenate(found))) \
        < INT8_MEAN_TOLERANCE
    assert ct2_special_ids(int8_path) == {"<pad>": 0, "<s>": 1, "</s>": 2, "<unk>": 3}


def ct2_special_ids(path):
    """Ids of the special pieces in an export's vocabulary and config.json."""
    vocabulary = json.loads((path / "shared_vocabulary.json").read_text())
    config = json.loads((path / "config.json").read_text())
    assert config["add_source_eos"] and not config["add_source_bos"]
    assert config["decoder_start_token"] == config["bos_token"]
    names = [vocabulary[0], config["bos_token"], config["eos_token"], config["unk_token"]]
    return {name: vocabulary.index(name) for name in names}


# --- the command ------------------------------------------------------------------------


@pytest.fixture(scope="module")
def run_dir(corpus, tmp_path_factory):
    """A tiny run folder as training leaves it: spm.model and model.keras."""
    folder = tmp_path_factory.mktemp("ct2_run") / "tiny_run"
    folder.mkdir()
    (folder / "spm.model").write_bytes(corpus["tokenizer"].model_proto)
    keras.utils.set_random_seed(1)
    kt.build_model(preset="tiny", vocab_size=VOCAB_SIZE, num_layers=1, d_model=32,
                   num_heads=2, d_ff=64, max_length=48).save(folder / "model.keras")
    return folder


def _export(*argv):
    return main(["export", "--format", "ctranslate2", *map(str, argv)])


@pytest.mark.backend_independent
def test_command_writes_a_folder_that_ctranslate2_loads(run_dir, corpus, tmp_path, capsys):
    from keras_transformer.inference.loading import load_run

    assert _export("--run", run_dir, "--export-dir", tmp_path, "--quiet") == 0
    path = tmp_path / "tiny_run-ct2"
    assert capsys.readouterr().out.strip() == str(path)
    assert _export("--run", run_dir, "--export-dir", tmp_path, "--quantize", "int8",
                   "--model-name", "m", "-q") == 0
    assert (tmp_path / "m-ct2-int8" / "model.bin").is_file()
    info = json.loads((path / "keras_transformer.json").read_text())
    assert info["source"]["run"] == str(run_dir.resolve()) and info["quantization"] is None

    model, tokenizer = load_run(run_dir)
    sources = [source for source, _ in corpus["pairs"][:4]]
    source_ids, target_ids = _pairs_ids(corpus, model, count=4)
    expected = _teacher_forced_log_probs(model, source_ids, target_ids)
    loaded = ctranslate2.Translator(str(path), intra_threads=1)  # plain CTranslate2
    pieces = [[tokenizer.id_to_token(i) for i in ids[:-1]] for ids in source_ids]
    scored = loaded.score_batch(pieces, [[tokenizer.id_to_token(i) for i in t]
                                         for t in target_ids])
    found = [np.array(r.log_probs) for r in scored]
    assert _max_error(expected, found) < FLOAT32_TOLERANCE
    translator = Translator(model, tokenizer, max_extra_length=MAX_EXTRA_LENGTH)
    ct2 = CTranslate2Translator(path, intra_threads=1, max_extra_length=MAX_EXTRA_LENGTH)
    assert ct2.translate(sources, beam_size=1) == translator.translate(sources, beam_size=1)

    # An existing folder is kept unless --overwrite.
    before = (path / "model.bin").stat().st_mtime_ns
    assert _export("--run", run_dir, "--export-dir", tmp_path) == 1
    assert capsys.readouterr().err.splitlines() == [
        f"keras-transformer export: error: {path} already exists; pass --overwrite to "
        "replace it"]
    assert (path / "model.bin").stat().st_mtime_ns == before
    assert _export("--run", run_dir, "--export-dir", tmp_path, "--overwrite", "-q") == 0
    assert sorted(p.name for p in tmp_path.iterdir()) == ["m-ct2-int8", "tiny_run-ct2"]


@pytest.mark.backend_independent
def test_the_export_records_the_run_s_decoding_and_translates_with_it(run_dir, corpus,
                                                                      tmp_path, capsys):
    """A run trained to decode greedily with at most 3 extra ids: the CTranslate2 folder
    records that, and `CTranslate2Translator` decodes so by default, as our
    `Translator` does when given those values (greedy tokens are equal)."""
    import shutil

    from keras_transformer.inference.loading import load_run
    from keras_transformer.model.config import DecodingOptions
    from keras_transformer.training.settings import Settings

    run = tmp_path / "recorded"
    shutil.copytree(run_dir, run)
    settings = Settings(preset="tiny", data="demo", output_dir=str(run), beam_size=1,
                        alpha=1.0, max_extra_length=3)
    (run / "settings.json").write_text(json.dumps(settings.to_dict()))
    assert _export("--run", run, "--export-dir", tmp_path / "out") == 0
    assert capsys.readouterr().out.splitlines()[0].endswith(
        "decode it with greedy, alpha 1.0, max extra length 3 (the run's settings)")
    path = tmp_path / "out" / "recorded-ct2"
    recorded = json.loads((path / "keras_transformer.json").read_text())["decoding"]
    assert (recorded["beam_size"], recorded["alpha"], recorded["max_extra_length"]) == (1, 1.0, 3)

    model, tokenizer = load_run(run)
    sources = [source for source, _ in corpus["pairs"][:6]]
    reference = Translator(model, tokenizer, DecodingOptions(beam_size=1, max_extra_length=3))
    ct2 = CTranslate2Translator(path, intra_threads=1)
    assert ct2.decoding == DecodingOptions(beam_size=1, alpha=1.0, max_extra_length=3)
    assert ct2.translate(sources) == reference.translate(sources)


@pytest.mark.backend_independent
@pytest.mark.parametrize("argv, message", [
    (["--beam-size", "5", "--version", "2"],
     "--version, --beam-size apply to --format saved_model only"),
    (["--alpha", "1"], "--alpha applies to --format saved_model only"),
    (["--weights", "best"], "weights 'best' not found"),
])
def test_command_errors_are_one_line(run_dir, tmp_path, capsys, argv, message):
    assert _export("--run", run_dir, "--export-dir", tmp_path, *argv) == 1
    lines = capsys.readouterr().err.splitlines()
    assert len(lines) == 1 and lines[0].startswith("keras-transformer export: error: ")
    assert message in lines[0]
    assert not list(tmp_path.iterdir())


@pytest.mark.backend_independent
def test_other_bad_input_is_one_line(run_dir, corpus, tmp_path, capsys, monkeypatch):
    assert main(["export", "--run", str(run_dir), "--quantize", "float16"]) == 1
    assert capsys.readouterr().err.strip() == (
        "keras-transformer export: error: --quantize float16 applies to --format ctranslate2 "
        "only; a SavedModel takes --quantize int8")

    # Keys and values of different widths have no CTranslate2 layout.
    model = _model(num_layers=1, key_dim=16, value_dim=32)
    with pytest.raises(ValueError, match="CTranslate2 needs value_dim == key_dim"):
        export_ctranslate2(model, corpus["tokenizer"], tmp_path / "bad")
    assert not (tmp_path / "bad").exists()
    # A model Keras quantized: CTranslate2 quantizes the float weights instead.
    model = _model(num_layers=1)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # layers without a quantize method
        model.quantize("int8")
    with pytest.raises(ValueError, match="quantized by Keras"):
        export_ctranslate2(model, corpus["tokenizer"], tmp_path / "bad")
    assert not (tmp_path / "bad").exists()

    # Without the package: one line that says how to install it.
    monkeypatch.setitem(sys.modules, "ctranslate2", None)
    assert _export("--run", run_dir, "--export-dir", tmp_path) == 1
    assert capsys.readouterr().err.strip() == (
        "keras-transformer export: error: CTranslate2 needs the ctranslate2 package: "
        "pip install ctranslate2 (or pip install 'keras-transformer[ctranslate2]')")


@pytest.mark.backend_independent
def test_translator_uses_no_keras_code_of_the_package(run_dir, tmp_path):
    """CTranslate2Translator in a fresh process: TensorFlow for the tokenizer, no model code.

    TensorFlow imports the `keras` package itself when it is imported, so
    that cannot be asserted; none of the package's Keras modules is loaded.
    """
    assert _export("--run", run_dir, "--export-dir", tmp_path, "--model-name", "m", "-q") == 0
    code = (
        "import sys, json\n"
        "from keras_transformer.export.ctranslate2_runtime import CTranslate2Translator\n"
        "light = sorted(m for m in sys.modules if m.split('.')[0] in "
        "('keras', 'tensorflow', 'keras_transformer'))\n"
        "translator = CTranslate2Translator(sys.argv[1], intra_threads=1)\n"
        "out = translator.translate(['Hello world.', '', b'caf\\xe9'], beam_size=2)\n"
        "print(json.dumps({'light': light, 'out': out, 'modules': sorted(\n"
        "    m for m in sys.modules if m.startswith('keras_transformer'))}))\n")
    result = subprocess.run([sys.executable, "-c", code, str(tmp_path / "m-ct2")],
                            capture_output=True, text=True, cwd=REPO, timeout=300)
    assert result.returncode == 0, result.stderr[-3000:]
    found = json.loads(result.stdout.strip().splitlines()[-1])
    # Importing the module loads neither TensorFlow nor Keras ...
    assert not any(m.split(".")[0] in ("keras", "tensorflow") for m in found["light"])
    # ... and translating loads the tokenizer, not the model, layers or decoding.
    assert "keras_transformer.data.tokenizer" in found["modules"]
    assert not {"keras_transformer.model.transformer", "keras_transformer.inference.decoding",
                "keras_transformer.model.layers", "keras_transformer.inference.translator",
                "keras_transformer.runs"} & set(found["modules"])
    assert len(found["out"]) == 3 and found["out"][1] == ""


# --- the comparison script -------------------------------------------------------------


@pytest.mark.slow
@pytest.mark.backend_independent  # every worker sets its own KERAS_BACKEND
def test_compare_script_prints_bleu_agreement_and_speed(run_dir, corpus, tmp_path):
    data = tmp_path / "data"
    data.mkdir()
    for i, lang in enumerate(("en", "de")):
        (data / f"test.{lang}").write_text(
            "\n".join(pair[i] for pair in corpus["pairs"][:6]) + "\n", encoding="utf-8")
    systems = ["translator", "saved-model", "saved-model-bf16", "saved-model-xla", "ct2",
               "ct2-int8"]
    result = subprocess.run(
        [sys.executable, str(REPO / "examples" / "compare_inference.py"), "--run",
         str(run_dir), "--data", str(data), "--split", "test", "--beam-size", "1",
         "--batch-size", "4", "--rounds", "1", "--threads", "1", "--systems", *systems,
         "--latency-sentences", "3",
         "--json", str(tmp_path / "out.json")],
        capture_output=True, text=True, timeout=900, cwd=REPO)
    assert result.returncode == 0, result.stderr[-3000:]
    figures = json.loads((tmp_path / "out.json").read_text())
    rows = figures["systems"]
    assert list(rows) == systems
    for name, row in rows.items():
        assert "error" not in row, (name, row)
        assert row["sentences"] == 6 and row["sentences_per_second"] > 0
        assert 0 <= row["bleu"] <= 100 and f"| {name} |" in result.stdout
        # Batch 1: three timed requests, answered as in the batches.
        assert 0 < row["p50_ms"] <= row["p90_ms"], (name, row)
        assert row["batch1_same_outputs"], name
        # The first answer comes after the load, which reads the whole model.
        assert row["first_answer_seconds"] > 0 and row["peak_rss_mib"] > 100, (name, row)
    # Greedy: the served graph and the CTranslate2 export give Translator's outputs.
    assert rows["saved-model"]["identical"] == 1.0 and rows["ct2"]["identical"] == 1.0
    assert rows["saved-model-xla"]["identical"] == 1.0
    for name in ("saved-model", "saved-model-xla"):
        assert rows[name]["info"]["foreign_modules"] == []  # only tf and tf_text
    assert rows["saved-model-xla"]["info"]["warmup_replay_seconds"] > 0
    assert "ct2-int8 vs ct2: BLEU" in result.stdout
    assert "saved-model vs translator: speed" in result.stdout
    assert "saved-model-xla vs translator: speed" in result.stdout
    assert "batch-1 p50" in result.stdout and "peak RSS MiB" in result.stdout
    assert "saved-model-bf16 vs saved-model: BLEU" in result.stdout
