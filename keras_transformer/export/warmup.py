"""TF Serving warm-up requests for an exported translation SavedModel.

TF Serving replays `<version>/assets.extra/tf_serving_warmup_requests`, a
TFRecord file of `tensorflow.serving.PredictionLog` protos, when it loads a
version, before the version takes traffic. Without it the first request of
each signature pays the one-time instantiation and optimisation of the
signature's graph (seconds on CPU; the figures are in docs/serving.md,
"Warm-up requests"), and the first requests of a new size pay their first
allocations and oneDNN kernel creation. Each signature of the
export holds one search that takes any batch size and source width, so
`write_warmup_requests` writes, per signature, a few source lengths (8, 16
and 32 ids by default, capped at `max_source_length`) at batch 1 and at the
export's `batch_size` (the largest chunk it decodes at once): the model
server pays the one-time cost and sizes its memory pools at load time.

Each request is a batch of `batch` copies of one sentence whose token count
(SentencePiece pieces + EOS, truncated at `max_source_length`, as the graph
computes it) is the requested length. The sentence is a word of the
export's own vocabulary (`assets/spm.model`) repeated, checked with
`sentencepiece`, so it works for any vocabulary; it is plain UTF-8.

Cost: the replay runs the requests one after the other at load time: the
one-time cost above, plus one decode per request. `batch_sizes` and
`lengths` choose them; TF Serving reads at most 1000 warm-up records, and a
version whose warm-up request fails does not load; `replay_warmup_requests`
replays the file through `tf.saved_model.load` to check it and to show the
cost. The file is written atomically (`files.write_atomically`: a temporary
name, flushed to disk, renamed) and readable by all (mode 0644), like the
rest of the export.

The protos are written by hand in protobuf's wire format (the few fields of
`PredictionLog.predict_log.request`: `model_spec.name`,
`model_spec.signature_name` and the `inputs` map, around the
`tensorflow.TensorProto` of `tf.make_tensor_proto`), so neither writing nor
reading needs `tensorflow-serving-api`, which is not a dependency of this
package (its releases require a TensorFlow at least as new as themselves). A
test parses the records with `tensorflow_serving.apis.prediction_log_pb2`.

Example:

>>> path = export_saved_model(translator, "saved_models", model_name="demo")
>>> write_warmup_requests(path)  # model name "demo"; what the export writes
PosixPath('saved_models/demo/1/assets.extra/tf_serving_warmup_requests')
>>> seconds = replay_warmup_requests(path)  # one float per request, in file order
>>> len(seconds)
12
"""

import json
import os
import pathlib
import time
from typing import NamedTuple

import numpy as np
import tensorflow as tf

from keras_transformer import names
from keras_transformer.files import write_atomically

__all__ = [
    "WARMUP_FILE", "WarmupRequest", "read_warmup_requests", "replay_warmup_requests",
    "warmup_sentence", "write_warmup_requests",
]

WARMUP_FILE = "tf_serving_warmup_requests"
ASSETS_EXTRA = "assets.extra"
EXPORT_OPTIONS_FILE = "export_options.json"
TOKENIZER_ASSET = names.TOKENIZER_FILE  # keras_transformer.export.saved_model.TOKENIZER_ASSET
DEFAULT_SIGNATURES = names.SIGNATURES
DEFAULT_SIGNATURE = names.BEAM_SIGNATURE  # what TF Serving runs for an empty name
DEFAULT_LENGTHS = (8, 16, 32)  # source ids (pieces + EOS) of the warm-up sentences
INPUT_NAME = names.INPUT_NAME
MAX_RECORDS = 1000  # TF Serving's WarmupConsts::kMaxNumRecords

# Field numbers of tensorflow_serving/apis/{prediction_log,predict,model}.proto.
_PREDICTION_LOG_PREDICT_LOG = 6
_PREDICT_LOG_REQUEST = 1
_REQUEST_MODEL_SPEC = 1
_REQUEST_INPUTS = 2
_MAP_KEY, _MAP_VALUE = 1, 2
_MODEL_SPEC_NAME = 1
_MODEL_SPEC_SIGNATURE_NAME = 3
_WIRE_VARINT, _WIRE_64BIT, _WIRE_BYTES, _WIRE_32BIT = 0, 1, 2, 5


class WarmupRequest(NamedTuple):
    """One warm-up request: the signature it calls and its inputs."""

    signature_name: str
    inputs: dict  # {input name: numpy array}


# --- protobuf wire format ----------------------------------------------------------


def _varint(value):
    out = bytearray()
    while True:
        byte = value & 0x7F
        value >>= 7
        if value:
            out.append(byte | 0x80)
        else:
            out.append(byte)
            return bytes(out)


def _bytes_field(number, payload):
    """A length-delimited field: key, payload length, payload (`str` as UTF-8)."""
    if isinstance(payload, str):
        payload = payload.encode("utf-8")
    return _varint(number << 3 | _WIRE_BYTES) + _varint(len(payload)) + payload


def _encode_prediction_log(model_name, signature_name, inputs):
    """Serialized `PredictionLog(predict_log=PredictLog(request=PredictRequest(...)))`.

    Fields in increasing number order and map entries sorted by key, which is
    what `SerializeToString(deterministic=True)` writes.
    """
    spec = b""
    if model_name:
        spec += _bytes_field(_MODEL_SPEC_NAME, model_name)
    if signature_name:
        spec += _bytes_field(_MODEL_SPEC_SIGNATURE_NAME, signature_name)
    request = _bytes_field(_REQUEST_MODEL_SPEC, spec)
    for key in sorted(inputs):
        tensor = tf.make_tensor_proto(inputs[key]).SerializeToString()
        entry = _bytes_field(_MAP_KEY, key) + _bytes_field(_MAP_VALUE, tensor)
        request += _bytes_field(_REQUEST_INPUTS, entry)
    predict_log = _bytes_field(_PREDICT_LOG_REQUEST, request)
    return _bytes_field(_PREDICTION_LOG_PREDICT_LOG, predict_log)


def _fields(data, where):
    """(number, wire type, value) of a message's fields; value bytes or int."""
    data, position = memoryview(data), 0

    def varint():
        nonlocal position
        result = shift = 0
        while True:
            if position >= len(data) or shift > 63:
                raise ValueError(f"{where}: truncated or invalid protobuf varint")
            byte = data[position]
            position += 1
            result |= (byte & 0x7F) << shift
            shift += 7
            if not byte & 0x80:
                return result

    while position < len(data):
        key = varint()
        number, wire = key >> 3, key & 7
        if wire == _WIRE_VARINT:
            value = varint()
        elif wire in (_WIRE_64BIT, _WIRE_32BIT, _WIRE_BYTES):
            size = {_WIRE_64BIT: 8, _WIRE_32BIT: 4}.get(wire) or varint()
            if position + size > len(data):
                raise ValueError(f"{where}: truncated protobuf field {number}")
            value = bytes(data[position:position + size])
            position += size
        else:
            raise ValueError(f"{where}: unsupported protobuf wire type {wire}")
        yield number, wire, value


def _decode_prediction_log(record, where):
    """(model name, signature name, {input name: numpy array}) of a predict log."""
    from tensorflow.core.framework import tensor_pb2

    def only(data, number):
        found = [v for n, w, v in _fields(data, where) if n == number and w == _WIRE_BYTES]
        return found[-1] if found else None  # protobuf: the last one wins

    predict_log = only(record, _PREDICTION_LOG_PREDICT_LOG)
    if predict_log is None:
        raise ValueError(f"{where} is not a PredictionLog with a predict_log "
                         "(classify, regress and other logs are not supported)")
    request = only(predict_log, _PREDICT_LOG_REQUEST) or b""
    spec = only(request, _REQUEST_MODEL_SPEC) or b""
    model_name = (only(spec, _MODEL_SPEC_NAME) or b"").decode("utf-8")
    signature = (only(spec, _MODEL_SPEC_SIGNATURE_NAME) or b"").decode(
        "utf-8")
    inputs = {}
    for number, wire, entry in _fields(request, where):
        if number == _REQUEST_INPUTS and wire == _WIRE_BYTES:
            key = (only(entry, _MAP_KEY) or b"").decode("utf-8")
            tensor = tensor_pb2.TensorProto.FromString(only(entry, _MAP_VALUE) or b"")
            inputs[key] = tf.make_ndarray(tensor)
    return model_name, signature or DEFAULT_SIGNATURE, inputs


# --- sentences ------------------------------------------------------------------------


def _processor(tokenizer):
    """A `sentencepiece.SentencePieceProcessor` of a model proto, file or Tokenizer."""
    import sentencepiece

    if isinstance(tokenizer, sentencepiece.SentencePieceProcessor):
        return tokenizer
    if isinstance(tokenizer, (str, os.PathLike)):
        tokenizer = pathlib.Path(tokenizer).read_bytes()
    proto = getattr(tokenizer, "model_proto", tokenizer)
    if not isinstance(proto, bytes):
        raise TypeError("tokenizer must be a SentencePiece model (bytes, a .model path, a "
                        "Tokenizer or a SentencePieceProcessor), received "
                        f"{type(tokenizer).__name__}")
    processor = sentencepiece.SentencePieceProcessor()
    processor.LoadFromSerializedProto(proto)
    return processor


def _candidate_words(processor):
    """Words of the vocabulary that are one piece each, most frequent first."""
    for piece_id in range(processor.GetPieceSize()):
        if (processor.IsControl(piece_id) or processor.IsUnknown(piece_id)
                or processor.IsByte(piece_id) or processor.IsUnused(piece_id)):
            continue
        word = processor.IdToPiece(piece_id).lstrip("\u2581")
        if word.isalpha():
            yield word


def warmup_sentence(tokenizer, num_pieces, *, max_candidates=1000):
    """A sentence of exactly `num_pieces` SentencePiece pieces (no EOS).

    Args:
        tokenizer: the SentencePiece model: bytes, a `.model` path, a
            `keras_transformer.data.Tokenizer` or a
            `sentencepiece.SentencePieceProcessor`.
        num_pieces: the number of pieces wanted (at least 1).
        max_candidates: how many vocabulary words to try.

    Returns:
        A `str`: one word of the vocabulary repeated, separated by spaces.

    Raises:
        ValueError: when no tried word repeats into exactly `num_pieces` pieces.
    """
    processor = _processor(tokenizer)
    if not isinstance(num_pieces, int) or num_pieces < 1:
        raise ValueError(f"num_pieces must be a positive integer, received {num_pieces!r}")
    for index, word in enumerate(_candidate_words(processor)):
        if index >= max_candidates:
            break
        text = " ".join([word] * num_pieces)
        if len(processor.EncodeAsIds(text)) == num_pieces:
            return text
    raise ValueError(f"no word of the SentencePiece vocabulary repeats into exactly "
                     f"{num_pieces} pieces (tried {max_candidates} words)")


# --- write, read, replay ----------------------------------------------------------------


def _export_options(saved_model_dir):
    path = pathlib.Path(saved_model_dir) / ASSETS_EXTRA / EXPORT_OPTIONS_FILE
    if not path.is_file():
        raise FileNotFoundError(f"{path} not found: write_warmup_requests needs an export of "
                                "keras_transformer.export.saved_model (call it after export_options.json "
                                "is written)")
    options = json.loads(path.read_text(encoding="utf-8"))
    missing = [k for k in ("batch_size", "max_source_length") if k not in options]
    if missing:
        raise ValueError(f"{path} lacks {', '.join(missing)}")
    return options


def _positive_ints(name, values, maximum):
    values = tuple(values)
    if not values or any(not isinstance(v, int) or isinstance(v, bool) or not 1 <= v <= maximum
                         for v in values):
        raise ValueError(f"{name} must be a non-empty list of integers from 1 to {maximum}, "
                         f"received {list(values)}")
    return tuple(sorted(set(values)))


def _default_model_name(saved_model_dir):
    path = pathlib.Path(saved_model_dir).resolve()
    if not path.name.isdigit():
        raise ValueError(f"{saved_model_dir} is not a TF Serving version folder "
                         "(<base>/<model_name>/<version>); pass model_name")
    return path.parent.name


def write_warmup_requests(saved_model_dir, *, model_name=None, signatures=DEFAULT_SIGNATURES,
                          batch_sizes=None, lengths=None, shapes=None, input_name=INPUT_NAME):
    """Writes `assets.extra/tf_serving_warmup_requests` into an export.

    One `PredictionLog` per (signature, batch size, length), in that order
    (every batch size at every length, or the `(batch size, length)` pairs of
    `shapes`):
    `batch` copies of a sentence of exactly `length` ids (pieces + EOS; a
    length above `max_source_length` is capped there, as truncation does).
    `max_source_length`, `batch_size` and the SentencePiece model are read
    from the export (`assets.extra/export_options.json`, `assets/spm.model`).
    The file is written to a temporary name, made readable by all (0644),
    flushed to disk and renamed into place (`files.write_atomically`).

    Args:
        saved_model_dir: a version folder written by
            `keras_transformer.export.saved_model.export_saved_model` (or its staging
            folder, before the rename, with `model_name`).
        model_name: `model_spec.name` of the requests; default the name of
            the folder above `saved_model_dir` (`<base>/<model_name>/<version>`).
            TF Serving does not check it during warm-up.
        signatures: the signatures to warm (default both).
        batch_sizes: sentences per request; default 1 and the export's
            `batch_size` (the largest chunk it decodes at once). At most
            `batch_size`.
        lengths: source ids per sentence, EOS included, at least 2 (a
            sentence has a piece); default 8, 16 and 32, capped at
            `max_source_length`. Each request is decoded once per replay: the
            longest, at the largest batch with beam 4, takes seconds on CPU
            for a base-size model.
        shapes: `(batch size, length)` pairs instead of every batch size at
            every length (an XLA export's `XlaBuckets.shapes`); not with
            `batch_sizes` or `lengths`.
        input_name: the signatures' input name.

    Returns:
        The `pathlib.Path` of the written file.

    Raises:
        FileNotFoundError: without `export_options.json` or `assets/spm.model`.
        ValueError: for sizes out of range, an empty selection, more than TF
            Serving's 1000 records, or no `model_name`.
        WriteError: the file could not be written (a full disk); nothing is
            left under its name or its temporary name.
    """
    saved_model_dir = pathlib.Path(saved_model_dir)
    options = _export_options(saved_model_dir)
    if model_name is None:
        model_name = _default_model_name(saved_model_dir)
    if isinstance(signatures, str):
        signatures = (signatures,)
    signatures = tuple(signatures)
    if not signatures or not all(isinstance(s, str) and s for s in signatures):
        raise ValueError(f"signatures must be non-empty names, received {list(signatures)}")
    max_source_length = int(options["max_source_length"])
    batch_size = int(options["batch_size"])
    if shapes is not None:
        if batch_sizes is not None or lengths is not None:
            raise ValueError("give shapes or batch_sizes and lengths, not both")
        shapes = tuple(shapes)
        if not shapes or not all(isinstance(s, (tuple, list)) and len(s) == 2
                                 for s in shapes):
            raise ValueError(f"shapes must be (batch size, length) pairs, received "
                             f"{list(shapes)}")
        _positive_ints("batch_sizes", [b for b, _ in shapes], batch_size)
        widths = _positive_ints("lengths", [n for _, n in shapes], max_source_length)
    else:
        if batch_sizes is None:
            batch_sizes = (1, batch_size)
        batches = _positive_ints("batch_sizes", batch_sizes, batch_size)
        if lengths is None:
            lengths = (min(n, max_source_length) for n in DEFAULT_LENGTHS)
        widths = _positive_ints("lengths", lengths, max_source_length)
        shapes = tuple((batch, width) for batch in batches for width in widths)
    if widths[0] < 2:
        raise ValueError(f"lengths must be at least 2 (a piece and EOS), received "
                         f"{list(widths)}")
    count = len(signatures) * len(shapes)
    if count > MAX_RECORDS:
        raise ValueError(f"{count} warm-up requests exceed TF Serving's limit of "
                         f"{MAX_RECORDS}; select fewer sizes")
    spm_file = saved_model_dir / "assets" / TOKENIZER_ASSET
    if not spm_file.is_file():
        raise FileNotFoundError(f"{spm_file} not found: the export's SentencePiece model")
    processor = _processor(spm_file.read_bytes())
    sentences = {w: warmup_sentence(processor, w - 1) for w in widths}

    def write(temporary):
        with tf.io.TFRecordWriter(temporary) as writer:
            for signature in signatures:
                for batch, width in shapes:
                    texts = np.array([sentences[width].encode("utf-8")] * batch, dtype=object)
                    writer.write(_encode_prediction_log(model_name, signature,
                                                        {input_name: texts}))
        os.chmod(temporary, 0o644)  # readable by the model server, whatever the umask

    return write_atomically(saved_model_dir / ASSETS_EXTRA / WARMUP_FILE, write,
                            what="writing the warm-up requests")


def read_warmup_requests(path):
    """The requests of a warm-up file, in file order.

    Args:
        path: a `tf_serving_warmup_requests` file, or a SavedModel folder
            holding `assets.extra/tf_serving_warmup_requests`.

    Returns:
        A list of `WarmupRequest(signature_name, inputs)`; `inputs` maps each
        input name to a numpy array (`object` arrays of `bytes` for strings),
        and an empty signature name reads as `serving_default`, as TF Serving
        runs it.

    Raises:
        FileNotFoundError: when the file does not exist.
        ValueError: for a record that is not a `PredictionLog` with a
            `predict_log`.
    """
    path = pathlib.Path(path)
    if path.is_dir():
        path = path / ASSETS_EXTRA / WARMUP_FILE
    if not path.is_file():
        raise FileNotFoundError(f"warm-up requests file not found: {path}")
    requests = []
    for index, record in enumerate(tf.data.TFRecordDataset(str(path)).as_numpy_iterator()):
        _, signature, inputs = _decode_prediction_log(record, f"{path} record {index}")
        requests.append(WarmupRequest(signature, inputs))
    return requests


def replay_warmup_requests(saved_model_dir, *, loaded=None):
    """Runs an export's warm-up requests in order, as TF Serving does at load time.

    Each output must be a `(batch,)` tensor, as the export's signatures give.

    Args:
        saved_model_dir: the SavedModel folder holding
            `assets.extra/tf_serving_warmup_requests`.
        loaded: the SavedModel already loaded with `tf.saved_model.load`;
            default load `saved_model_dir` (needs `tensorflow_text`, which
            this function imports).

    Returns:
        The seconds each request took, a list of floats in file order, i.e.
        what the model server spends on warm-up (the first request of each
        signature includes the graph optimiser's first run of it).

    Raises:
        KeyError: for a signature the SavedModel does not have.
        RuntimeError: for an output that is not one value per sentence.
    """
    import tensorflow_text  # noqa: F401  (registers the SentencePiece ops)

    requests = read_warmup_requests(saved_model_dir)
    if loaded is None:
        loaded = tf.saved_model.load(str(saved_model_dir))
    seconds = []
    for index, (signature, inputs) in enumerate(requests):
        if signature not in loaded.signatures:
            raise KeyError(f"warm-up request {index} calls signature {signature!r}, which "
                           f"{saved_model_dir} does not have ({sorted(loaded.signatures)})")
        function = loaded.signatures[signature]
        arguments = {k: tf.constant(v) for k, v in inputs.items()}
        first = next(iter(inputs.values()), None)
        batch = len(first) if first is not None and np.ndim(first) else None
        start = time.perf_counter()
        outputs = function(**arguments)
        seconds.append(time.perf_counter() - start)
        for name, value in outputs.items():
            if batch is not None and tuple(value.shape) != (batch,):
                raise RuntimeError(f"warm-up request {index} ({signature}): output {name!r} "
                                   f"has shape {tuple(value.shape)}, expected ({batch},)")
    return seconds
