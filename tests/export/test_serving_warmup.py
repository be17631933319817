"""TF Serving warm-up requests: wire format, the requested sizes, file mode, replay.

A tiny model (test_export.py's `_build`) is exported once for the module with
batch size 2 and at most 16 source ids. The records are parsed with the real
`tensorflow_serving.apis` protos; writing and reading must not need them.
"""

import json
import os
import pathlib
import shutil
import subprocess
import sys

import numpy as np
import pytest
import tensorflow as tf

from keras_transformer.export.saved_model import BEAM_SIGNATURE, GREEDY_SIGNATURE, export_saved_model
from keras_transformer.export.warmup import (
    WARMUP_FILE,
    WarmupRequest,
    _decode_prediction_log,
    _encode_prediction_log,
    read_warmup_requests,
    replay_warmup_requests,
    warmup_sentence,
    write_warmup_requests,
)
from exported_model import BEAM_SIZE, _build

prediction_log_pb2 = pytest.importorskip("tensorflow_serving.apis.prediction_log_pb2")
from tensorflow_serving.apis import model_pb2, predict_pb2  # noqa: E402

pytestmark = pytest.mark.backend_independent

REPO = pathlib.Path(__file__).resolve().parents[2]
MODEL_NAME = "warm"
BATCH_SIZE, MAX_SOURCE_LENGTH = 2, 16
# The default requests: batch 1 and the export's batch size; 8, 16, 32 ids
# capped at MAX_SOURCE_LENGTH.
BATCHES, LENGTHS = (1, BATCH_SIZE), (8, 16)


@pytest.fixture(scope="module")
def export(tmp_path_factory):
    work = tmp_path_factory.mktemp("warmup")
    translator, _ = _build(work)
    path = export_saved_model(translator, work / "saved_models", model_name=MODEL_NAME,
                              beam_size=BEAM_SIZE, max_source_length=MAX_SOURCE_LENGTH,
                              batch_size=BATCH_SIZE)
    return dict(path=path, tokenizer=translator.tokenizer)


@pytest.fixture(scope="module")
def warmup_file(export):
    return write_warmup_requests(export["path"])


def _real_log(model_name, signature, texts):
    request = predict_pb2.PredictRequest(
        model_spec=model_pb2.ModelSpec(name=model_name, signature_name=signature),
        inputs={"text": tf.make_tensor_proto(texts)})
    return prediction_log_pb2.PredictionLog(
        predict_log=prediction_log_pb2.PredictLog(request=request))


def _records(path):
    return [prediction_log_pb2.PredictionLog.FromString(r)
            for r in tf.data.TFRecordDataset(str(path)).as_numpy_iterator()]


def _graph_width(tokenizer, texts):
    """The row lengths `TranslationModule._encode` computes: pieces + EOS, truncated."""
    pieces = tokenizer.tokenize(tf.constant(texts)).row_lengths().numpy()
    return np.minimum(pieces, MAX_SOURCE_LENGTH - 1) + 1


# --- wire format --------------------------------------------------------------------------


@pytest.mark.parametrize("model_name,signature", [
    ("demo", "translate_greedy"), ("", "serving_default"), ("d\u00e9mo", "")])
def test_hand_encoding_equals_tensorflow_serving_apis(model_name, signature):
    texts = np.array(["Grüße aus Köln".encode(), b"x" * 300, b""], dtype=object)
    real = _real_log(model_name, signature, texts)
    mine = _encode_prediction_log(model_name, signature, {"text": texts})
    assert mine == real.SerializeToString(deterministic=True)
    parsed = prediction_log_pb2.PredictionLog.FromString(mine)
    assert parsed.WhichOneof("log_type") == "predict_log"
    assert parsed.predict_log.request.model_spec.name == model_name
    assert parsed.predict_log.request.model_spec.signature_name == signature
    # The hand decoder reads the real serialization; an empty name is the default.
    name, read_signature, inputs = _decode_prediction_log(real.SerializeToString(), "x")
    assert (name, read_signature) == (model_name, signature or "serving_default")
    assert list(inputs) == ["text"] and inputs["text"].tolist() == texts.tolist()


def test_read_rejects_a_record_that_is_not_a_predict_log(tmp_path):
    path = tmp_path / WARMUP_FILE
    log = prediction_log_pb2.PredictionLog()
    log.classify_log.request.model_spec.name = "m"
    with tf.io.TFRecordWriter(str(path)) as writer:
        writer.write(_real_log("m", "serving_default", [b"a"]).SerializeToString())
        writer.write(log.SerializeToString())
    with pytest.raises(ValueError, match="record 1 is not a PredictionLog with a predict_log"):
        read_warmup_requests(path)
    with pytest.raises(FileNotFoundError, match="warm-up requests file not found"):
        read_warmup_requests(tmp_path / "missing")


def test_warmup_sentence_has_exactly_the_pieces_asked_for(export):
    tokenizer = export["tokenizer"]
    for num_pieces in (1, 2, 7, 15, 60):
        text = warmup_sentence(tokenizer, num_pieces)
        text.encode("utf-8")
        assert tokenizer.tokenize(tf.constant([text])).row_lengths().numpy().tolist() == [
            num_pieces]
    with pytest.raises(ValueError, match="num_pieces must be a positive integer"):
        warmup_sentence(tokenizer, 0)
    with pytest.raises(TypeError, match="tokenizer must be a SentencePiece model"):
        warmup_sentence(3, 4)


# --- the export's requests -------------------------------------------------------------------


def test_export_writes_the_file_readable_by_all(export):
    path = export["path"] / "assets.extra" / WARMUP_FILE
    # The export's own (default) requests, written with the export's files' mode.
    assert len(_records(path)) == 2 * len(BATCHES) * len(LENGTHS)
    assert path.stat().st_mode & 0o777 == 0o644
    # Like every other file of the export: a model server running as another
    # user reads them all.
    files = [f for f in export["path"].rglob("*") if f.is_file()]
    assert len(files) > 4 and all(f.stat().st_mode & 0o004 for f in files)


def test_one_request_per_signature_batch_and_length(export, warmup_file):
    assert warmup_file == export["path"] / "assets.extra" / WARMUP_FILE
    assert warmup_file.stat().st_mode & 0o777 == 0o644
    records = _records(warmup_file)
    expected = [(s, b, w) for s in (BEAM_SIGNATURE, GREEDY_SIGNATURE)
                for b in BATCHES for w in LENGTHS]
    assert len(records) == len(expected)
    for record, (signature, batch, width) in zip(records, expected):
        request = record.predict_log.request
        assert request.model_spec.name == MODEL_NAME  # the folder above the version
        assert request.model_spec.signature_name == signature
        assert list(request.inputs) == ["text"]
        tensor = request.inputs["text"]
        assert tensor.dtype == tf.string.as_datatype_enum
        texts = tf.make_ndarray(tensor)
        assert texts.shape == (batch,)
        [text.decode("utf-8") for text in texts]  # valid UTF-8
        # Every row has exactly the requested number of ids, as the graph counts them.
        assert _graph_width(export["tokenizer"], texts).tolist() == [width] * batch
    # The hand-decoded requests are the same ones.
    requests = read_warmup_requests(export["path"])
    assert [(r.signature_name, len(r.inputs["text"])) for r in requests] == [
        (s, b) for s, b, _ in expected]
    assert all(isinstance(r, WarmupRequest) for r in requests)


def test_replay_runs_every_request_through_the_saved_model(export, warmup_file):
    loaded = tf.saved_model.load(str(export["path"]))
    seconds = replay_warmup_requests(export["path"], loaded=loaded)
    assert len(seconds) == 2 * len(BATCHES) * len(LENGTHS)
    assert all(s > 0 for s in seconds)
    for signature, inputs in read_warmup_requests(warmup_file):
        outputs = loaded.signatures[signature](text=tf.constant(inputs["text"]))
        batch = len(inputs["text"])
        assert outputs["translation"].dtype == tf.string
        assert outputs["translation"].shape == (batch,)
        assert outputs["score"].dtype == tf.float32 and outputs["score"].shape == (batch,)
        [t.decode("utf-8") for t in outputs["translation"].numpy()]


def test_selected_sizes_and_signatures_only(export, tmp_path):
    copy = tmp_path / "staging"  # like export_saved_model's folder before the rename
    shutil.copytree(export["path"], copy)
    path = write_warmup_requests(copy, model_name="other", signatures=GREEDY_SIGNATURE,
                                 batch_sizes=[2], lengths=[16])
    [record] = _records(path)
    assert record.predict_log.request.model_spec.name == "other"
    assert record.predict_log.request.model_spec.signature_name == GREEDY_SIGNATURE
    texts = tf.make_ndarray(record.predict_log.request.inputs["text"])
    assert _graph_width(export["tokenizer"], texts).tolist() == [16, 16]
    assert sorted(p.name for p in path.parent.iterdir()) == [
        "export_options.json", WARMUP_FILE]  # no temporary file left
    assert len(replay_warmup_requests(copy)) == 1


def test_write_errors(export, tmp_path):
    copy = tmp_path / "model"
    shutil.copytree(export["path"], copy)
    with pytest.raises(ValueError, match="not a TF Serving version folder.*pass model_name"):
        write_warmup_requests(copy)
    with pytest.raises(ValueError, match=r"batch_sizes must be .* from 1 to 2, received \[8\]"):
        write_warmup_requests(copy, model_name="m", batch_sizes=[8])
    with pytest.raises(ValueError, match="lengths must be a non-empty list"):
        write_warmup_requests(copy, model_name="m", lengths=[])
    with pytest.raises(ValueError, match="lengths must be at least 2"):
        write_warmup_requests(copy, model_name="m", lengths=[1, 8])
    with pytest.raises(ValueError, match="signatures must be non-empty names"):
        write_warmup_requests(copy, model_name="m", signatures=())
    with pytest.raises(ValueError, match="give shapes or batch_sizes and lengths, not both"):
        write_warmup_requests(copy, model_name="m", shapes=[(1, 8)], lengths=[8])
    with pytest.raises(ValueError, match=r"shapes must be \(batch size, length\) pairs"):
        write_warmup_requests(copy, model_name="m", shapes=[(1,)])
    with pytest.raises(ValueError, match="lengths must be at least 2"):
        write_warmup_requests(copy, model_name="m", shapes=[(1, 1)])
    write_warmup_requests(copy, model_name="m", signatures=["nope"], batch_sizes=[1],
                          lengths=[8])
    with pytest.raises(KeyError, match="signature 'nope'"):
        replay_warmup_requests(copy)
    (copy / "assets.extra" / "export_options.json").unlink()
    with pytest.raises(FileNotFoundError, match="export_options.json not found"):
        write_warmup_requests(copy, model_name="m")
    (copy / "assets.extra" / "export_options.json").write_text(json.dumps({}))
    with pytest.raises(ValueError, match="lacks batch_size, max_source_length"):
        write_warmup_requests(copy, model_name="m")


_WITHOUT_SERVING_API = r"""
import sys
sys.modules["tensorflow_serving"] = None  # as if tensorflow-serving-api were absent
from keras_transformer.export.warmup import read_warmup_requests, write_warmup_requests
path = write_warmup_requests(sys.argv[1], batch_sizes=[1], lengths=[8])
print(len(read_warmup_requests(path)))
"""


def test_write_and_read_without_tensorflow_serving_api(export, tmp_path):
    copy = tmp_path / MODEL_NAME / "3"
    shutil.copytree(export["path"], copy)
    result = subprocess.run([sys.executable, "-c", _WITHOUT_SERVING_API, str(copy)],
                            capture_output=True, text=True, cwd=REPO,
                            env={**os.environ, "TF_CPP_MIN_LOG_LEVEL": "3"})
    assert result.returncode == 0, result.stderr[-3000:]
    assert result.stdout.split()[-1] == "2"
    assert len(_records(copy / "assets.extra" / WARMUP_FILE)) == 2
