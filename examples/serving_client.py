"""Translates sentences through a running TensorFlow Serving instance (REST or gRPC).

Start the model server on an export (see docs/serving.md):

    docker run --rm -p 8500:8500 -p 8501:8501 \\
        -v "$PWD/saved_models:/models" -e MODEL_NAME=transformer tensorflow/serving

then

    python examples/serving_client.py --rest http://localhost:8501 "Hello world."
    python examples/serving_client.py --grpc localhost:8500 --greedy < sentences.en

REST needs only the standard library. gRPC needs the `tensorflow-serving-api`
package (`pip install "keras-transformer[serving]"`, or
`pip install tensorflow-serving-api==<your tensorflow version>`).

The request formats, as TF Serving's predict API defines them:

- REST: `POST <url>/v1/models/<model>[/versions/<n>]:predict` with the JSON
  body `{"signature_name": "serving_default", "instances": [{"text": "..."}]}`
  (row format). Bytes that are not UTF-8 are sent as `{"b64": "..."}`. The
  answer is `{"predictions": [{"translation": "...", "score": -0.42}, ...]}`.
- gRPC: a `tensorflow.serving.PredictRequest` with `model_spec.name`,
  `model_spec.signature_name` and the input `text`, a `DT_STRING` tensor of
  shape `(batch,)`.
"""

import argparse
import base64
import json
import sys
import urllib.error
import urllib.request

INSTALL_HINT = ("gRPC needs the tensorflow-serving-api package: "
                "pip install 'keras-transformer[serving]' (or "
                "pip install tensorflow-serving-api==<your tensorflow version>)")


def _as_bytes(sentence):
    if isinstance(sentence, bytes):
        return sentence
    if isinstance(sentence, str):
        return sentence.encode("utf-8")
    raise TypeError(f"sentences must be str or bytes, received {type(sentence).__name__}")


def _check_sentences(sentences):
    if isinstance(sentences, (str, bytes)):
        raise TypeError("expected a list of sentences; wrap one sentence in a list")
    return list(sentences)


# --- REST ----------------------------------------------------------------------


def build_rest_request(sentences, signature_name="serving_default"):
    """The JSON body (a dict) of a REST predict request, in TF Serving's row format.

    Args:
        sentences: a list of str (or bytes; bytes that are not UTF-8 travel
            base64-encoded as `{"b64": ...}`, which TF Serving decodes).
        signature_name: `"serving_default"` (beam search) or
            `"translate_greedy"`.

    Returns:
        `{"signature_name": ..., "instances": [{"text": ...}, ...]}`.

    Example:

    >>> build_rest_request(["Hello."])
    {'signature_name': 'serving_default', 'instances': [{'text': 'Hello.'}]}
    """
    instances = []
    for sentence in _check_sentences(sentences):
        data = _as_bytes(sentence)
        try:
            value = data.decode("utf-8")
        except UnicodeDecodeError:
            value = {"b64": base64.b64encode(data).decode("ascii")}
        instances.append({"text": value})
    return {"signature_name": signature_name, "instances": instances}


def _decode_value(value):
    if isinstance(value, dict) and "b64" in value:
        return base64.b64decode(value["b64"]).decode("utf-8", "replace")
    return value


def parse_rest_response(response):
    """`(translations, scores)` from a REST predict response (dict or JSON text).

    Args:
        response: the decoded JSON answer, or its text.

    Returns:
        A list of str and a list of float, in request order.

    Raises:
        RuntimeError: the server answered with an `error`.
    """
    if isinstance(response, (str, bytes)):
        response = json.loads(response)
    if "error" in response:
        raise RuntimeError(f"TF Serving error: {response['error']}")
    if "predictions" in response:  # row format: one object per sentence
        rows = response["predictions"]
        return ([_decode_value(r["translation"]) for r in rows],
                [float(r["score"]) for r in rows])
    outputs = response["outputs"]  # columnar format
    return ([_decode_value(t) for t in outputs["translation"]],
            [float(s) for s in outputs["score"]])


def rest_url(url, model_name="transformer", version=None):
    """`<url>/v1/models/<model_name>[/versions/<version>]:predict`."""
    url = url.rstrip("/")
    if not url.startswith(("http://", "https://")):
        url = "http://" + url
    versioned = f"/versions/{int(version)}" if version is not None else ""
    return f"{url}/v1/models/{model_name}{versioned}:predict"


def translate_rest(url, sentences, *, model_name="transformer",
                   signature_name="serving_default", version=None, timeout=60.0):
    """Translates sentences with TF Serving's REST API.

    Args:
        url: the server, e.g. `"http://localhost:8501"`.
        sentences: a list of str.
        model_name: the served model's name (`MODEL_NAME` of the container).
        signature_name: `"serving_default"` or `"translate_greedy"`.
        version: a version number, or `None` for the latest.
        timeout: seconds.

    Returns:
        `(translations, scores)`.

    Example:

    >>> translate_rest("http://localhost:8501", ["Hello world."])
    (['Hallo Welt.'], [-0.31])
    """
    body = json.dumps(build_rest_request(sentences, signature_name)).encode("utf-8")
    request = urllib.request.Request(rest_url(url, model_name, version), data=body,
                                     headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(request, timeout=timeout) as answer:
            return parse_rest_response(answer.read())
    except urllib.error.HTTPError as error:
        detail = error.read().decode("utf-8", "replace")
        raise RuntimeError(f"TF Serving answered HTTP {error.code}: {detail}") from None


# --- gRPC ----------------------------------------------------------------------


def text_tensor_proto(sentences):
    """The `text` input as a `DT_STRING` `TensorProto` of shape `(batch,)`."""
    import tensorflow as tf

    values = [_as_bytes(s) for s in _check_sentences(sentences)]
    return tf.make_tensor_proto(values, dtype=tf.string, shape=[len(values)])


def _serving_apis():
    try:
        from tensorflow_serving.apis import predict_pb2, prediction_service_pb2_grpc
    except ImportError:
        raise ImportError(INSTALL_HINT) from None
    return predict_pb2, prediction_service_pb2_grpc


def build_grpc_request(sentences, model_name="transformer",
                       signature_name="serving_default", version=None):
    """A `PredictRequest` for the model's `text` input.

    Args:
        sentences: a list of str or bytes.
        model_name: the served model's name.
        signature_name: `"serving_default"` or `"translate_greedy"`.
        version: a version number, or `None` for the latest.

    Returns:
        A `tensorflow_serving.apis.predict_pb2.PredictRequest`.

    Example:

    >>> request = build_grpc_request(["Hello."], "transformer")
    >>> tf.make_ndarray(request.inputs["text"])
    array([b'Hello.'], dtype=object)
    """
    predict_pb2, _ = _serving_apis()
    request = predict_pb2.PredictRequest()
    request.model_spec.name = model_name
    request.model_spec.signature_name = signature_name
    if version is not None:
        request.model_spec.version.value = int(version)
    request.inputs["text"].CopyFrom(text_tensor_proto(sentences))
    return request


def parse_grpc_response(response):
    """`(translations, scores)` from a `PredictResponse`."""
    import tensorflow as tf

    translations = tf.make_ndarray(response.outputs["translation"])
    scores = tf.make_ndarray(response.outputs["score"])
    return ([t.decode("utf-8", "replace") for t in translations.reshape(-1)],
            [float(s) for s in scores.reshape(-1)])


def translate_grpc(target, sentences, *, model_name="transformer",
                   signature_name="serving_default", version=None, timeout=60.0):
    """Translates sentences with TF Serving's gRPC `PredictionService.Predict`.

    Args:
        target: `host:port` of the gRPC endpoint, e.g. `"localhost:8500"`.
        sentences, model_name, signature_name, version, timeout: as in
            `translate_rest`.

    Returns:
        `(translations, scores)`.
    """
    _, prediction_service_pb2_grpc = _serving_apis()
    import grpc

    request = build_grpc_request(sentences, model_name, signature_name, version)
    with grpc.insecure_channel(target) as channel:
        stub = prediction_service_pb2_grpc.PredictionServiceStub(channel)
        return parse_grpc_response(stub.Predict(request, timeout=timeout))


# --- command line ----------------------------------------------------------------


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    where = parser.add_mutually_exclusive_group(required=True)
    where.add_argument("--rest", help="REST endpoint, e.g. http://localhost:8501")
    where.add_argument("--grpc", help="gRPC endpoint, e.g. localhost:8500")
    parser.add_argument("--model-name", default="transformer")
    parser.add_argument("--version", type=int, help="default: the latest")
    parser.add_argument("--greedy", action="store_true",
                        help="use the translate_greedy signature")
    parser.add_argument("--scores", action="store_true", help="print scores too")
    parser.add_argument("sentences", nargs="*", help="default: lines of stdin")
    args = parser.parse_args(argv)
    sentences = args.sentences or [line.rstrip("\r\n") for line in sys.stdin]
    signature = "translate_greedy" if args.greedy else "serving_default"
    try:
        if args.rest:
            translations, scores = translate_rest(args.rest, sentences,
                                                  model_name=args.model_name,
                                                  signature_name=signature,
                                                  version=args.version)
        else:
            translations, scores = translate_grpc(args.grpc, sentences,
                                                  model_name=args.model_name,
                                                  signature_name=signature,
                                                  version=args.version)
    except (ImportError, RuntimeError, OSError) as error:  # OSError: URLError too
        print(f"error: {error}", file=sys.stderr)
        return 1
    except Exception as error:  # grpc.RpcError (grpc is imported lazily)
        if type(error).__module__.startswith("grpc"):
            print(f"error: gRPC call to {args.grpc} failed: {error}", file=sys.stderr)
            return 1
        raise
    for translation, score in zip(translations, scores):
        print(f"{score:.4f}\t{translation}" if args.scores else translation)
    return 0


if __name__ == "__main__":
    sys.exit(main())
