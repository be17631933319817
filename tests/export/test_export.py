"""SavedModel export for TF Serving: fresh-process equality, op list, inputs, wire formats.

The tiny export they share with the command tests is tests/exported_model.py's.
"""

import base64
import importlib.util
import json
import os
import pathlib
import shutil
import subprocess
import sys
import threading
import types

import keras
import numpy as np
import pytest
import sentencepiece
import tensorflow as tf

from exported_model import ALPHA, BEAM_SIZE, LONG_INPUT, MAX_EXTRA, MAX_LENGTH
from exported_model import export, loaded  # noqa: F401 (fixtures)
from keras_transformer.export.op_audit import forbidden_ops, saved_model_ops
from keras_transformer.export.saved_model import (BEAM_SIGNATURE, GREEDY_SIGNATURE,
                                                  export_saved_model, next_version)
from keras_transformer.model.transformer import quantized, with_dtype
from keras_transformer.inference.translator import Translator

REPO = pathlib.Path(__file__).resolve().parents[2]

def _call(loaded, texts, signature=BEAM_SIGNATURE):
    outputs = loaded.signatures[signature](text=tf.constant(texts, tf.string))
    return ([t.decode("utf-8") for t in outputs["translation"].numpy()],
            outputs["score"].numpy())


# --- layout and fresh process ----------------------------------------------------------


@pytest.mark.backend_independent  # the SavedModel only: TensorFlow under any backend
def test_layout_is_tf_serving_model_version(export):
    path = export["path"]
    assert path == export["base"] / "transformer" / "1"
    assert (path / "saved_model.pb").is_file() and (path / "variables").is_dir()
    asset = path / "assets" / "spm.model"
    assert asset.read_bytes() == export["translator"].tokenizer.model_proto
    # Only the version folder is left: no half-written staging folder (and the
    # lock file exports publish under, a hidden file TF Serving ignores).
    assert sorted(p.name for p in path.parent.iterdir()) == [".publish.lock", "1"]
    assert (path.parent / ".publish.lock").is_file()
    assert next_version(path.parent) == 2
    options = json.loads((path / "assets.extra" / "export_options.json").read_text())
    assert options["beam_size"] == BEAM_SIZE and options["max_source_length"] == MAX_LENGTH


@pytest.mark.backend_independent  # the SavedModel only: TensorFlow under any backend
def test_signatures_and_files_are_the_names_module_s(export, loaded):
    """The export's signature names, input name and tokenizer asset are `names`'."""
    from keras_transformer import names

    assert sorted(loaded.signatures) == sorted(names.SIGNATURES)
    for signature in loaded.signatures.values():
        assert list(signature.structured_input_signature[1]) == [names.INPUT_NAME]
    assert (export["path"] / "assets" / names.TOKENIZER_FILE).is_file()


_CHILD = r"""
import json, sys
import tensorflow as tf
import tensorflow_text  # registers the SentencePiece ops
loaded = tf.saved_model.load(sys.argv[1])
texts = json.load(open(sys.argv[2], encoding="utf-8"))
result = {"modules": sorted(m for m in sys.modules if m.startswith("keras_transformer")),
          "asset": loaded.tokenizer_model.asset_path.numpy().decode()}
for name in ("serving_default", "translate_greedy"):
    out = loaded.signatures[name](text=tf.constant(texts))
    result[name] = [t.decode("utf-8") for t in out["translation"].numpy()]
    result[name + "_score"] = out["score"].numpy().tolist()
json.dump(result, open(sys.argv[3], "w", encoding="utf-8"))
"""


def _in_fresh_process(path, sentences, tmp_path):
    """Loads a copy of the export in a process with only tf and tf_text; its outputs."""
    copy = tmp_path / "elsewhere" / "transformer" / path.name
    shutil.copytree(path, copy)
    hidden = path.with_name("hidden")
    path.rename(hidden)  # the original moved away: the copy is self-contained
    try:
        (tmp_path / "texts.json").write_text(json.dumps(sentences), encoding="utf-8")
        (tmp_path / "child.py").write_text(_CHILD)
        env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
        result = subprocess.run(
            [sys.executable, str(tmp_path / "child.py"), str(copy),
             str(tmp_path / "texts.json"), str(tmp_path / "out.json")],
            env=env, cwd=tmp_path, capture_output=True, text=True, timeout=300)
    finally:
        hidden.rename(path)
    assert result.returncode == 0, result.stderr[-3000:]
    out = json.loads((tmp_path / "out.json").read_text(encoding="utf-8"))
    assert out["modules"] == []  # the model code is not needed
    assert pathlib.Path(out["asset"]).resolve() == (copy / "assets" / "spm.model").resolve()
    return out


def test_fresh_process_with_only_tf_text_matches_translator(export, tmp_path):
    out = _in_fresh_process(export["path"], export["sentences"], tmp_path)
    assert out["serving_default"] == export["beam"]
    assert out["translate_greedy"] == export["greedy"]
    # Non-trivial outputs: not all empty, not all equal.
    nonblank = [t for s, t in zip(export["sentences"], export["beam"]) if s.strip()]
    assert all(nonblank) and len(set(nonblank)) > 1
    scores = np.array(out["serving_default_score"])
    assert np.all(np.isfinite(scores)) and np.all(scores[[14, 15]] == 0.0)


@pytest.mark.slow  # int8 per backend: test_quantization.py
def test_int8_export_matches_the_quantized_translator_in_a_fresh_process(export, tmp_path):
    translator = export["translator"]
    path = export_saved_model(translator, tmp_path / "int8", beam_size=BEAM_SIZE,
                              alpha=ALPHA, batch_size=8, quantize="int8")
    options = json.loads((path / "assets.extra" / "export_options.json").read_text())
    assert options["quantize"] == "int8"
    # The weights are stored as int8: the variables of the SavedModel say so.
    dtypes = {tf.as_dtype(v.dtype).name for v in tf.saved_model.load(str(path)).model_variables}
    assert "int8" in dtypes and "float32" in dtypes
    model8 = quantized(translator.model, "int8")
    reference = Translator(model8, translator.tokenizer, translator.options, batch_size=8)
    sentences = export["sentences"]
    out = _in_fresh_process(path, sentences, tmp_path)
    assert out["serving_default"] == reference.translate(sentences, beam_size=BEAM_SIZE)
    assert out["translate_greedy"] == reference.translate(sentences, beam_size=1)
    # The translator's own model stayed float32.
    assert getattr(translator.model.target_embedding, "quantization_mode", None) is None


@pytest.mark.slow  # bf16 per backend: test_precision.py
def test_bf16_export_matches_the_bf16_translator_in_a_fresh_process(export, tmp_path):
    translator = export["translator"]
    path = export_saved_model(translator, tmp_path / "bf16", beam_size=BEAM_SIZE,
                              alpha=ALPHA, batch_size=8, dtype="bfloat16")
    options = json.loads((path / "assets.extra" / "export_options.json").read_text())
    assert (options["dtype"], options["quantize"]) == ("bfloat16", None)
    dtypes = {tf.as_dtype(v.dtype).name for v in tf.saved_model.load(str(path)).model_variables}
    assert dtypes == {"bfloat16"}
    model16 = with_dtype(translator.model, "bfloat16")
    # The exported graph runs without XLA: so does the reference.
    reference = Translator(model16, translator.tokenizer, translator.options, batch_size=8,
                           jit_compile=False)
    sentences = export["sentences"]
    out = _in_fresh_process(path, sentences, tmp_path)
    assert out["serving_default"] == reference.translate(sentences, beam_size=BEAM_SIZE)
    assert out["translate_greedy"] == reference.translate(sentences, beam_size=1)
    # A bf16 translator's model exports as it is, bf16 again.
    again = export_saved_model(reference, tmp_path / "again", beam_size=BEAM_SIZE, alpha=ALPHA)
    assert json.loads((again / "assets.extra" / "export_options.json").read_text()
                      )["dtype"] == "bfloat16"
    assert translator.model.dtype_policy.name == "float32"


def test_scores_are_length_normalised_log_probabilities(export, loaded):
    from keras_transformer.inference.decoding import beam_search

    translator = export["translator"]
    sentence = export["sentences"][0]
    # The (8, 32) shape the translator has compiled already (its first batch).
    source = np.zeros((8, MAX_LENGTH), "int32")
    ids = translator.encode([sentence])[0]
    source[0, :len(ids)] = ids
    _, scores = beam_search(translator.model, source, beam_size=BEAM_SIZE, alpha=ALPHA,
                            max_extra_length=MAX_EXTRA)
    _, served = _call(loaded, [sentence])
    np.testing.assert_allclose(served[0], keras.ops.convert_to_numpy(scores)[0], rtol=1e-4)
    # Independently: log P(Y) of the output under one teacher-forced model call,
    # over GNMT's ((5 + |Y|) / 6) ** alpha written out (|Y| counts EOS if generated).
    config = translator.model.config
    processor = sentencepiece.SentencePieceProcessor(
        model_proto=translator.tokenizer.model_proto)
    for signature, beam_size in ((BEAM_SIGNATURE, BEAM_SIZE), (GREEDY_SIGNATURE, 1)):
        (text,), (score,) = _call(loaded, [sentence], signature)
        (ours,), (record,) = translator.translate([sentence], beam_size=beam_size,
                                                  alpha=ALPHA, return_attention=True)
        assert ours == text
        output = [processor.piece_to_id(piece) for piece in record["target_tokens"]]
        logits = keras.ops.convert_to_numpy(translator.model(
            {"source_ids": np.array([ids], "int32"),
             "target_ids": np.array([[config.bos_id] + output[:-1]], "int32")},
            training=False))[0].astype("float64")
        log_probs = logits - logits.max(-1, keepdims=True)
        log_probs -= np.log(np.exp(log_probs).sum(-1, keepdims=True))
        log_p = sum(log_probs[t, y] for t, y in enumerate(output))
        assert score == pytest.approx(log_p / ((5 + len(output)) / 6) ** ALPHA,
                                      rel=1e-4, abs=1e-4)


# --- graph contents ----------------------------------------------------------------------


def _saved_model_cli():
    exe = shutil.which("saved_model_cli")
    if exe:
        return [exe]
    return [sys.executable, "-m", "tensorflow.python.tools.saved_model_cli"]


@pytest.mark.backend_independent  # the SavedModel only: TensorFlow under any backend
def test_saved_model_cli_and_op_list(export):
    result = subprocess.run(_saved_model_cli() + ["show", "--all", "--dir", str(export["path"])],
                            capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr[-3000:]
    text = result.stdout
    for name in (BEAM_SIGNATURE, GREEDY_SIGNATURE):
        block = text.split(f"signature_def['{name}']:")[1].split("signature_def[")[0]
        inputs, outputs = block.split("output(s):")
        assert "inputs['text'] tensor_info:" in inputs
        assert "dtype: DT_STRING" in inputs and "shape: (-1)" in inputs
        assert "outputs['translation'] tensor_info:" in outputs
        assert "outputs['score'] tensor_info:" in outputs
        assert "DT_FLOAT" in outputs.split("outputs['score']")[1]
    ops = saved_model_ops(export["path"])
    assert "SentencepieceOp" in ops and "SentencepieceTokenizeOp" in ops
    assert "StatelessWhile" in ops or "While" in ops
    assert forbidden_ops(ops) == []
    assert not [op for op in ops if "PyFunc" in op or op.startswith(("Addons>", "Xla"))]


@pytest.mark.backend_independent  # the SavedModel only: TensorFlow under any backend
def test_one_search_per_signature(export):
    from tensorflow.core.protobuf import saved_model_pb2

    proto = saved_model_pb2.SavedModel.FromString(
        (export["path"] / "saved_model.pb").read_bytes())
    graph = proto.meta_graphs[0].graph_def
    nodes = list(graph.node) + [n for f in graph.library.function for n in f.node_def]
    counts = {}
    for node in nodes:
        counts[node.op] = counts.get(node.op, 0) + 1
    # Per signature: the loop over chunks and the search's own loop, whose
    # cache grows inside it; no branch per traced shape.
    assert counts.get("While", 0) + counts.get("StatelessWhile", 0) == 4
    assert counts.get("Case", 0) + counts.get("StatelessCase", 0) == 0


@pytest.mark.backend_independent  # the SavedModel only: TensorFlow under any backend
def test_forbidden_ops_names_python_addons_and_xla_ops():
    assert forbidden_ops(["MatMul", "EagerPyFunc", "PyFunc", "Addons>GatherTree",
                          "XlaDynamicUpdateSlice", "SentencepieceOp"]) == [
        "Addons>GatherTree", "EagerPyFunc", "PyFunc", "XlaDynamicUpdateSlice"]


# --- bad inputs ----------------------------------------------------------------------------


@pytest.mark.backend_independent  # the SavedModel only: TensorFlow under any backend
def test_empty_inputs(loaded):
    for signature in (BEAM_SIGNATURE, GREEDY_SIGNATURE):
        texts, scores = _call(loaded, ["", "  ", "Hello."], signature)
        assert texts[:2] == ["", ""] and list(scores[:2]) == [0.0, 0.0]
        outputs = loaded.signatures[signature](text=tf.constant([], tf.string))
        assert outputs["translation"].shape == (0,) and outputs["score"].shape == (0,)
        assert outputs["translation"].dtype == tf.string


@pytest.mark.backend_independent  # the SavedModel only: TensorFlow under any backend
def test_long_input_is_truncated_to_max_source_length(export, loaded):
    tokenizer = export["translator"].tokenizer
    pieces = tokenizer.tokenize([LONG_INPUT]).to_list()[0]
    assert len(pieces) >= 5000
    # Truncated to MAX_LENGTH - 1 pieces + EOS: any prefix with more pieces
    # than that gives the same translation.
    words = 2
    while len(tokenizer.tokenize(["word " * words]).to_list()[0]) < MAX_LENGTH:
        words += 1
    texts, scores = _call(loaded, [LONG_INPUT, "word " * words])
    assert texts[0] == texts[1] and np.isfinite(scores[0])
    assert texts[0] == export["beam"][export["sentences"].index(LONG_INPUT)]


@pytest.mark.backend_independent  # the SavedModel only: TensorFlow under any backend
def test_bytes_that_are_not_utf8_are_replaced(loaded):
    bad = [b"caf\xe9 au lait", b"\xff\xfe\x00 The cat.", b"\xc3"]
    replaced = [b.decode("utf-8", "replace") for b in bad]
    for signature in (BEAM_SIGNATURE, GREEDY_SIGNATURE):
        texts, _ = _call(loaded, bad, signature)
        assert texts == _call(loaded, replaced, signature)[0]


# --- concurrency --------------------------------------------------------------------------


@pytest.mark.backend_independent  # the SavedModel only: TensorFlow under any backend
def test_concurrent_calls_match_sequential_calls(export, loaded):
    sentences = [s for s in export["sentences"] if s != LONG_INPUT]
    distinct = [sentences[i:i + 1 + i % 3] for i in range(0, 15, 2)]  # 8 requests
    signature = loaded.signatures[BEAM_SIGNATURE]

    def run(texts):
        return signature(text=tf.constant(texts))["translation"].numpy().tolist()

    expected = [run(texts) for texts in distinct]  # sequential
    results, errors = {}, []

    def worker(t):
        try:
            for i in range(20):
                k = (t + i) % len(distinct)
                results[(t, i)] = (k, run(distinct[k]))
        except Exception as error:  # reported below
            errors.append(error)

    threads = [threading.Thread(target=worker, args=(t,)) for t in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert not errors
    assert len(results) == 160
    assert all(out == expected[k] for k, out in results.values())


# --- wire formats -------------------------------------------------------------------------


def _client():
    spec = importlib.util.spec_from_file_location("serving_client",
                                                  REPO / "examples" / "serving_client.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _tf_serving_rest(loaded, body_text):
    """What TF Serving does with a row-format REST body (a test stand-in)."""
    body = json.loads(body_text)
    values = []
    for instance in body["instances"]:
        value = instance["text"] if isinstance(instance, dict) else instance
        if isinstance(value, dict):
            values.append(base64.b64decode(value["b64"]))
        else:
            values.append(value.encode("utf-8"))
    outputs = loaded.signatures[body.get("signature_name", BEAM_SIGNATURE)](
        text=tf.constant(values, tf.string))
    predictions = [{"translation": t.decode("utf-8"), "score": float(s)}
                   for t, s in zip(outputs["translation"].numpy(), outputs["score"].numpy())]
    return json.dumps({"predictions": predictions})


@pytest.mark.backend_independent  # the SavedModel only: TensorFlow under any backend
def test_rest_body_through_the_signature_gives_the_translations(export, loaded):
    client = _client()
    sentences = export["sentences"]
    for signature, expected in ((BEAM_SIGNATURE, export["beam"]),
                                (GREEDY_SIGNATURE, export["greedy"])):
        body = client.build_rest_request(sentences, signature_name=signature)
        assert body["signature_name"] == signature
        assert body["instances"][0] == {"text": sentences[0]}
        translations, scores = client.parse_rest_response(
            _tf_serving_rest(loaded, json.dumps(body)))
        assert translations == expected and len(scores) == len(sentences)
    # Bytes that are not UTF-8 travel as base64.
    body = client.build_rest_request([b"caf\xe9"])
    assert body["instances"] == [{"text": {"b64": base64.b64encode(b"caf\xe9").decode()}}]
    assert client.parse_rest_response(_tf_serving_rest(loaded, json.dumps(body)))[0] == \
        _call(loaded, ["caf\ufffd"])[0]
    with pytest.raises(RuntimeError, match="bad input"):
        client.parse_rest_response({"error": "bad input"})
    assert client.rest_url("localhost:8501", "transformer", 3) == \
        "http://localhost:8501/v1/models/transformer/versions/3:predict"


@pytest.mark.backend_independent  # the SavedModel only: TensorFlow under any backend
def test_grpc_request_converts_to_the_same_tensors(export, loaded):
    client = _client()
    sentences = export["sentences"]
    proto = client.text_tensor_proto(sentences)
    values = tf.make_ndarray(proto)
    assert values.shape == (len(sentences),)
    assert values.tolist() == [s.encode("utf-8") for s in sentences]
    outputs = loaded.signatures[BEAM_SIGNATURE](text=tf.constant(values))
    assert [t.decode() for t in outputs["translation"].numpy()] == export["beam"]

    pytest.importorskip("tensorflow_serving.apis.predict_pb2",
                        reason="PredictRequest needs tensorflow-serving-api (the `serving` "
                               "extra): pip install tensorflow-serving-api")
    from tensorflow_serving.apis import predict_pb2

    request = client.build_grpc_request(sentences, "transformer", GREEDY_SIGNATURE,
                                        version=1)
    assert request.model_spec.name == "transformer"
    assert request.model_spec.signature_name == GREEDY_SIGNATURE
    assert request.model_spec.version.value == 1
    request = predict_pb2.PredictRequest.FromString(request.SerializeToString())
    values = tf.make_ndarray(request.inputs["text"])
    assert values.tolist() == [s.encode("utf-8") for s in sentences]
    outputs = loaded.signatures[request.model_spec.signature_name](text=tf.constant(values))
    response = predict_pb2.PredictResponse()
    for name, tensor in outputs.items():
        response.outputs[name].CopyFrom(tf.make_tensor_proto(tensor.numpy()))
    translations, _ = client.parse_grpc_response(response)
    assert translations == export["greedy"]


# --- argument errors ------------------------------------------------------------------------


@pytest.mark.backend_independent  # the SavedModel only: TensorFlow under any backend
def test_export_argument_errors(export, tmp_path):
    translator = export["translator"]
    with pytest.raises(FileExistsError, match="already exists"):
        export_saved_model(translator, export["base"], version=1)
    with pytest.raises(ValueError, match="max_source_length"):
        export_saved_model(translator, tmp_path, max_source_length=MAX_LENGTH + 1)
    with pytest.raises(ValueError, match="beam_size"):
        export_saved_model(translator, tmp_path, beam_size=1)
    with pytest.raises(ValueError, match="batch_size must be a positive integer"):
        export_saved_model(translator, tmp_path, batch_size=0)
    with pytest.raises(TypeError, match="Tokenizer"):  # Translator refuses it already
        export_saved_model(types.SimpleNamespace(model=translator.model, tokenizer=object()),
                           tmp_path)
    with pytest.raises(ValueError, match="quantize must be one of int8"):
        export_saved_model(translator, tmp_path, quantize="int4")
    with pytest.raises(ValueError, match="dtype must be one of float32, bfloat16"):
        export_saved_model(translator, tmp_path, dtype="float16")
    with pytest.raises(ValueError, match="int8 weights or bf16 weights"):
        export_saved_model(translator, tmp_path, quantize="int8", dtype="bfloat16")
    assert not any(tmp_path.iterdir())


# --- a run's decoding settings are export --run's defaults --------------------------------


def _run_recording(export, folder, **decoding):
    """A copy of the export's run folder whose settings.json records `decoding`.

    settings.json is what `keras-transformer train` writes: `Settings.to_dict()`.
    """
    from keras_transformer.training.settings import Settings

    run = folder / "run"
    shutil.copytree(export["run"], run)
    settings = Settings(preset="tiny", data="demo", output_dir=str(run),
                        export_dir=str(folder / "job_export"), **decoding)
    (run / "settings.json").write_text(json.dumps(settings.to_dict(), indent=2))
    return run, settings


def test_export_run_decodes_with_the_run_s_settings_unless_a_flag_says(export, tmp_path,
                                                                      capsys, monkeypatch):
    """`export --run` of a run trained with alpha 1.0 exports alpha 1.0; `--alpha` overrides.

    The references: the job's own export of the run (`job.export_run`, what
    `train` writes at its end), and a `Translator` given the run's values
    explicitly (beam 3, alpha 1.0, at most 5 extra ids, none of them a
    default): their translations, and their scores, which depend on alpha.
    """
    from keras_transformer import runs
    from keras_transformer.commands import main
    from keras_transformer.export import saved_model
    from keras_transformer.model.config import DecodingOptions
    from keras_transformer.training import job

    run, settings = _run_recording(export, tmp_path, beam_size=3, alpha=1.0,
                                   max_extra_length=5)
    # One batch (one compiled search for the reference): 7 sentences, a blank one.
    base, sentences = tmp_path / "saved_models", export["sentences"][:5] + ["", "Hello world."]

    def export_options(*flags):
        assert main(["export", "--run", str(run), "--export-dir", str(base),
                     "--batch-size", "8", *flags]) == 0
        out, err = capsys.readouterr()
        path = pathlib.Path(out.strip().splitlines()[-1])
        options = path / "assets.extra" / "export_options.json"
        return path, json.loads(options.read_text()) if options.exists() else None, err

    path, options, err = export_options()
    assert "keras-transformer export: decoding: beam 3, alpha 1.0, max extra length 5 " \
        "(the run's settings)\n" in err
    assert (options["beam_size"], options["alpha"], options["max_extra_length"]) == (3, 1.0, 5)
    model, tokenizer = export["translator"].model, export["translator"].tokenizer
    reference = Translator(model, tokenizer, DecodingOptions(beam_size=3, alpha=1.0,
                                                             max_extra_length=5), batch_size=8)
    expected, expected_scores = reference.translate_with_scores(sentences)
    translations, scores = _call(tf.saved_model.load(str(path)), sentences)
    assert translations == expected
    np.testing.assert_allclose(scores, expected_scores, rtol=1e-4, atol=1e-4)
    assert sum(bool(t) for t in translations) == 6 and scores[5] == 0.0
    # The job's own export of the same run: the same options, the same answers.
    job_path = job.export_run(Translator(model, tokenizer, settings.decoding_options()),
                              runs.RunFolder(run), settings)
    job_options = json.loads((job_path / "assets.extra" / "export_options.json").read_text())
    decoding_keys = ("beam_size", "alpha", "max_extra_length", "max_source_length")
    assert {k: options[k] for k in decoding_keys} == {k: job_options[k] for k in decoding_keys}
    job_translations, job_scores = _call(tf.saved_model.load(str(job_path)), sentences)
    assert job_translations == translations
    np.testing.assert_allclose(job_scores, scores, rtol=1e-5, atol=1e-5)

    # A flag overrides one value; the others stay the run's. The command says which.
    # (What reaches export_saved_model is recorded: export_from_run calls it in
    # this process under TensorFlow, in a TensorFlow child under JAX or PyTorch.)
    made = []
    if keras.backend.backend() == "tensorflow":
        monkeypatch.setattr(saved_model, "export_saved_model",
                            lambda translator, *_, **__: made.append(translator.options)
                            or base / "run" / "2")
    path, options, err = export_options("--alpha", "0.6")
    if made:
        assert made == [DecodingOptions(beam_size=3, alpha=0.6, max_extra_length=5)]
    else:
        assert (options["beam_size"], options["alpha"], options["max_extra_length"]) == \
            (3, 0.6, 5)
    assert ("decoding: beam 3 (the run's settings), alpha 0.6 (--alpha), max extra length 5 "
            "(the run's settings)") in err


@pytest.mark.backend_independent  # reads settings.json; nothing is decoded
def test_a_run_that_recorded_greedy_decoding_is_exported_with_beam_2(export, tmp_path):
    """As the job's own export: serving_default is a beam search; a flag still decides."""
    from keras_transformer.export.saved_model import serving_decoding
    from keras_transformer.model.config import DecodingOptions

    run, _ = _run_recording(export, tmp_path, beam_size=1, alpha=1.0)
    decoding = serving_decoding(run)
    assert decoding.options == DecodingOptions(beam_size=2, alpha=1.0)
    assert decoding.describe() == (
        "beam 2 (the run's settings say greedy; serving_default is a beam search), "
        "alpha 1.0 (the run's settings), max extra length 50 (the run's settings)")
    assert serving_decoding(run, beam_size=5).options.beam_size == 5
