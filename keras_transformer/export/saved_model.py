"""Exports a `Translator` as a SavedModel that TensorFlow Serving runs as it is.

TF Serving (`tensorflow_model_server`) runs no Python, so the whole
translation is one TensorFlow graph made of core ops and TensorFlow Text's
SentencePiece ops (which the model server links): source ids
(`Tokenizer.encode_source`: sanitise the UTF-8 -> tokenize -> truncate and
append EOS) -> sort by length -> cached beam search (or greedy decoding) in
chunks of similar length -> text (`Tokenizer.decode_output`: cut at EOS ->
detokenize). The front end is `Translator`'s: the same two graph functions of
the tokenizer, traced into the signatures. The SavedModel has two signatures, both `text` (`tf.string`, `(batch,)`) ->
`translation` (`tf.string`, `(batch,)`) and `score` (`float32`, `(batch,)`):

- `serving_default`: beam search (the paper's beam 4, alpha 0.6 by default);
- `translate_greedy`: greedy decoding.

`score` is the length-normalised log-probability `log P(Y) / lp(Y)` of the
output (`keras_transformer.model.config.length_penalty`, the exported `alpha`,
EOS counted), and 0 for an empty input.

It is written in TF Serving's layout `<base>/<model_name>/<version>/`
(`saved_model.pb`, `variables/`, `assets/spm.model`), into a hidden temporary
folder first and renamed into place, so a model server watching `<base>`
never loads a half-written version.

Input handling, in the graph (`Tokenizer.encode_source` and `decode_output`):

- Bytes that are not valid UTF-8 are replaced by U+FFFD before tokenizing
  (`tf.strings.unicode_transcode(..., errors="replace")`); the request is
  answered, never rejected. Outputs are valid UTF-8 as well.
- A sentence is truncated to `max_source_length` ids, EOS included (default
  `config.max_length`, as `Translator` does): longer inputs lose their end
  and are still answered, in the time of a `max_source_length`-id sentence.
- An empty or all-whitespace sentence (whitespace as Python's `str.isspace`
  defines it, as for `Translator`) translates to `""` with score 0 without
  decoding; a batch of zero sentences gives zero outputs.

Shapes: each signature holds one traced search, with a dynamic batch size
and source width (`keras_transformer.inference.decoding` reads sizes with `ops.shape`;
in this plain, uncompiled TensorFlow graph they are tensors, and the
self-attention cache grows inside the search loop). The graph sorts the
batch by length (as `Translator` does), drops the blank sentences, and
decodes the rest in chunks of at most `batch_size` sentences (default 32),
each cut to the width of its longest sentence, so a short request costs what
its own sentences cost. Padding rows and columns do not change any
sentence's output. No static shape is needed: earlier exports
(`export_options.json` without `format_version`) traced one search per
(batch bucket, width bucket) pair behind a `tf.switch_case`, 12 per
signature, and measured against this one on the quick start's model
(`examples/benchmark_export.py`, 2 CPU cores) that was a 19x larger graph
(32.6 against 1.7 MB), 5x the export time and 2.5x its memory, and 48.5
against 1.7 s for loading and answering a first request in a fresh process,
with no gain in latency (22 against 12 ms at batch 1) or throughput (169
against 205 sentences/s at batch 32).

Training backend: the export always runs under the TensorFlow backend. A
model trained under JAX or PyTorch is exported from its weights, which are
backend-portable: `export_saved_model` and `export_from_run`, called under
another backend, save the weights, config and tokenizer to a temporary
folder and call `export_from_run` in a subprocess with
`KERAS_BACKEND=tensorflow` (`python -m keras_transformer.export.saved_model`, its
arguments as JSON), which rebuilds the model under TensorFlow and exports it.

The searches are traced uncompiled (no `jit_compile`), since the stock model
server does not run XLA clusters by default; their buffer updates then use
the core op `TensorStridedSliceUpdate` rather than the XLA-only
`XlaDynamicUpdateSlice` (`keras_transformer.model.layers.updates.slice_update`).
The exported graph is checked for ops TF Serving cannot run
(`forbidden_ops`).

Example:

>>> translator = Translator(model, Tokenizer.load("runs/demo/spm.model"))
>>> path = export_saved_model(translator, "saved_models", beam_size=4, alpha=0.6)
>>> path
PosixPath('saved_models/transformer/1')
>>> loaded = tf.saved_model.load(str(path))  # needs only tensorflow_text
>>> loaded.signatures["serving_default"](text=tf.constant(["Hello."]))
{'translation': <tf.Tensor: shape=(1,), dtype=string, numpy=array([b'Hallo.'])>,
 'score': <tf.Tensor: ...>}
"""

import json
import os
import pathlib
import re
import shutil
import subprocess
import sys
import tempfile

import tensorflow as tf

from keras_transformer import names
from keras_transformer.model.config import DecodingOptions
from keras_transformer.model.transformer import DECODING_DTYPES, QUANTIZATION_MODES, quantized, with_dtype
from keras_transformer.files import WriteError, save_weights, staging_dir
from keras_transformer.inference.loading import check_run, load_run, resolve_weights
from keras_transformer.runs import RunError
from keras_transformer.export.warmup import write_warmup_requests

DEFAULT_BASE = names.EXPORT_ROOT
DEFAULT_MODEL_NAME = "transformer"
# 2: one search per signature, any batch size and width (1: one per bucket).
EXPORT_FORMAT_VERSION = 2
BEAM_SIGNATURE = names.BEAM_SIGNATURE
GREEDY_SIGNATURE = names.GREEDY_SIGNATURE
INPUT_NAME = names.INPUT_NAME
TOKENIZER_ASSET = names.TOKENIZER_FILE
DEFAULT_BATCH_SIZE = 32

# Ops TF Serving cannot run: Python callbacks, TF Addons custom ops, and
# XLA-only ops outside a compiled cluster.
_FORBIDDEN_OPS = ("PyFunc", "PyFuncStateless", "EagerPyFunc")
_FORBIDDEN_PREFIXES = ("Addons>", "Xla", "_Xla")

__all__ = [
    "BEAM_SIGNATURE", "DEFAULT_BASE", "DEFAULT_MODEL_NAME", "GREEDY_SIGNATURE",
    "TranslationModule", "export_from_run", "export_saved_model", "forbidden_ops",
    "next_version", "saved_model_ops",
]


# --- helpers -----------------------------------------------------------------


def next_version(model_dir):
    """The next TF Serving version number under `<base>/<model_name>`: 1 + the largest."""
    model_dir = pathlib.Path(model_dir)
    versions = [int(p.name) for p in model_dir.glob("*") if p.is_dir() and p.name.isdigit()]
    return max(versions, default=0) + 1


# --- the serving module --------------------------------------------------------


class _Untracked:
    """Holds an object out of `tf.Module`'s attribute tracking."""

    def __init__(self, value):
        self.value = value



class TranslationModule(tf.Module):
    """A `tf.Module` with the translation signatures of a model and a tokenizer.

    Args:
        model: a `keras_transformer.Transformer` built under the TensorFlow
            backend.
        tokenizer: a `keras_transformer.data.Tokenizer`.
        options: the `DecodingOptions` of `serving_default` (its beam size,
            at least 2, alpha and length limit); `translate_greedy` is the
            same with beam size 1.
        max_source_length: source ids kept per sentence, EOS included.
        batch_size: sentences decoded at once; a larger request is decoded
            in chunks of this many (longest first).

    Example:

    >>> module = TranslationModule(model, tokenizer, DecodingOptions(),
    ...                            max_source_length=256)
    >>> module.translate_beam(["Hello."])["translation"]
    """

    def __init__(self, model, tokenizer, options, *, max_source_length,
                 batch_size=DEFAULT_BATCH_SIZE, tokenizer_file=None, name="translation"):
        super().__init__(name=name)
        config = model.config
        # Not tracked as a Keras object (only its variables are saved): the
        # SavedModel holds the translation functions, not Keras' own endpoints.
        self._untracked = _Untracked(model)
        self.tokenizer = tokenizer
        # Keras variables, tracked so that the SavedModel holds them.
        self.model_variables = list(model.variables)
        if tokenizer_file is not None:
            self.tokenizer_model = tf.saved_model.Asset(str(tokenizer_file))
        self._config = config
        self._options = options
        self._max_source_length = max_source_length
        self._batch_size = batch_size
        self._output_width = self._buffer_length(max_source_length)
        spec = [tf.TensorSpec([None], tf.string, name=INPUT_NAME)]
        # Out of attribute tracking: saved once, as signatures (tracked
        # tf.functions would be traced a second time by `tf.saved_model.save`).
        self._functions = _Untracked({
            BEAM_SIGNATURE: tf.function(lambda text: self._translate(text, options.beam_size),
                                        input_signature=spec, autograph=False),
            GREEDY_SIGNATURE: tf.function(lambda text: self._translate(text, 1),
                                          input_signature=spec, autograph=False),
        })

    def signatures(self):
        """`{name: concrete function}` of both signatures (traced on first call)."""
        return {name: function.get_concrete_function()
                for name, function in self._functions.value.items()}

    def translate_beam(self, text):
        """Beam search: `(batch,)` strings -> dict of `translation` and `score`."""
        return self.signatures()[BEAM_SIGNATURE](text=tf.convert_to_tensor(text, tf.string))

    def translate_greedy(self, text):
        """Greedy decoding: `(batch,)` strings -> dict of `translation` and `score`."""
        return self.signatures()[GREEDY_SIGNATURE](text=tf.convert_to_tensor(text, tf.string))

    def _buffer_length(self, width):
        length = width + self._options.max_extra_length
        if self._config.position_embedding == "learned":
            length = min(length, self._config.max_length)
        return max(length, 1)

    # --- pieces of the graph ---------------------------------------------------

    def _encode(self, text):
        """Strings -> int32 `(batch, max_source_length)` ids (pad-filled) and their lengths.

        `Tokenizer.encode_source`, as `Translator` encodes: a blank sentence
        has length 0.
        """
        ids = self.tokenizer.encode_source(text, self._max_source_length)
        lengths = tf.cast(ids.row_lengths(), tf.int32)
        ids = ids.to_tensor(default_value=self._config.pad_id,
                            shape=[None, self._max_source_length])
        return ids, lengths

    def _search(self, source_ids, beam_size):
        """int32 (b, w) ids, both sizes dynamic -> (b, output width) tokens, (b,) scores."""
        from keras_transformer.inference.decoding import decode

        options = self._options.replace(beam_size=beam_size)
        tokens, scores = decode(self._untracked.value, source_ids, options, jit_compile=False)
        tokens = tf.convert_to_tensor(tokens)
        pad = self._output_width - tf.shape(tokens)[1]
        tokens = tf.pad(tokens, [[0, 0], [0, pad]], constant_values=self._config.pad_id)
        return tf.ensure_shape(tokens, [None, self._output_width]), tf.convert_to_tensor(scores)

    def _translate(self, text, beam_size):
        config = self._config
        text = tf.convert_to_tensor(text, tf.string)
        ids, lengths = self._encode(text)
        count = tf.shape(text)[0]
        # Longest first (stable), as Translator does: chunks of similar length.
        # Blank rows (length 0) come last and are not decoded.
        order = tf.argsort(-lengths, stable=True)
        ids, lengths_sorted = tf.gather(ids, order), tf.gather(lengths, order)
        todo = tf.reduce_sum(tf.cast(lengths > 0, tf.int32))
        chunk = self._batch_size
        num_chunks = (todo + chunk - 1) // chunk
        output_width = self._output_width

        def body(i, all_tokens, all_scores):
            start = i * chunk
            end = tf.minimum(start + chunk, todo)
            # The chunk cut to its longest sentence: one search, any shape.
            tokens, scores = self._search(ids[start:end, :lengths_sorted[start]], beam_size)
            return (i + 1, tf.concat([all_tokens, tokens], 0),
                    tf.concat([all_scores, scores], 0))

        _, tokens, scores = tf.while_loop(
            lambda i, *_: i < num_chunks, body,
            (tf.constant(0), tf.zeros([0, output_width], tf.int32), tf.zeros([0], tf.float32)),
            shape_invariants=(tf.TensorShape([]), tf.TensorShape([None, output_width]),
                              tf.TensorShape([None])))
        tokens = tf.concat([tokens, tf.fill([count - todo, output_width], config.pad_id)], 0)
        scores = tf.concat([scores, tf.zeros([count - todo], tf.float32)], 0)
        inverse = tf.math.invert_permutation(order)
        tokens, scores = tf.gather(tokens, inverse), tf.gather(scores, inverse)

        # As Translator answers: cut at EOS, pad/BOS dropped, detokenized, valid
        # UTF-8 (a blank sentence's all-pad row gives "").
        translation = self.tokenizer.decode_output(tokens)
        return {"translation": tf.ensure_shape(translation, [None]),
                "score": tf.ensure_shape(tf.cast(scores, tf.float32), [None])}


# --- op lists ------------------------------------------------------------------


def saved_model_ops(export_dir):
    """The set of op types in a SavedModel's graphs and function library.

    Args:
        export_dir: a SavedModel directory (with `saved_model.pb`).

    Returns:
        A sorted list of op type names.
    """
    from tensorflow.core.protobuf import saved_model_pb2

    path = pathlib.Path(export_dir) / "saved_model.pb"
    proto = saved_model_pb2.SavedModel()
    proto.ParseFromString(path.read_bytes())
    ops = set()
    for meta_graph in proto.meta_graphs:
        graph = meta_graph.graph_def
        ops.update(node.op for node in graph.node)
        for function in graph.library.function:
            ops.update(node.op for node in function.node_def)
    return sorted(ops)



def forbidden_ops(ops):
    """The ops among `ops` that TF Serving cannot run (PyFunc, Addons, XLA-only)."""
    return sorted(op for op in ops
                  if op in _FORBIDDEN_OPS or op.startswith(_FORBIDDEN_PREFIXES))


# --- export ----------------------------------------------------------------------


def _resolve_options(config, decoding, max_source_length, batch_size, quantize, dtype):
    if decoding.greedy:
        raise ValueError("beam_size (of serving_default) must be an integer >= 2 "
                         "(translate_greedy is the beam-1 search), received 1")
    if max_source_length is None:
        max_source_length = config.max_length
    if not isinstance(max_source_length, int) or not 2 <= max_source_length <= config.max_length:
        raise ValueError(
            "max_source_length must be an integer between 2 and the model's "
            f"config.max_length={config.max_length}, received {max_source_length!r}")
    if quantize is not None and quantize not in QUANTIZATION_MODES:
        raise ValueError(f"quantize must be one of {', '.join(QUANTIZATION_MODES)}, "
                         f"received {quantize!r}")
    if dtype not in DECODING_DTYPES:
        raise ValueError(f"dtype must be one of {', '.join(DECODING_DTYPES)}, "
                         f"received {dtype!r}")
    if quantize and dtype != "float32":
        raise ValueError(f"quantize={quantize!r} and dtype={dtype!r} are alternatives: "
                         "int8 weights or bf16 weights")
    if batch_size is None:
        batch_size = DEFAULT_BATCH_SIZE
    if not isinstance(batch_size, int) or isinstance(batch_size, bool) or batch_size < 1:
        raise ValueError(f"batch_size must be a positive integer, received {batch_size!r}")
    return dict(beam_size=decoding.beam_size, alpha=decoding.alpha,
                max_extra_length=decoding.max_extra_length,
                max_source_length=max_source_length, batch_size=batch_size,
                quantize=quantize, dtype=dtype)


def _version_dir(export_dir, model_name, version, overwrite):
    if not model_name or "/" in model_name or model_name in (".", ".."):
        raise ValueError(f"model_name must be a plain folder name, received {model_name!r}")
    model_dir = pathlib.Path(export_dir) / model_name
    if version is None:
        version = next_version(model_dir)
    if not isinstance(version, int) or version < 1:
        raise ValueError(f"version must be a positive integer, received {version!r}")
    target = model_dir / str(version)
    if target.exists() and not overwrite:
        raise FileExistsError(f"{target} already exists; pass another version, or "
                              "overwrite=True (--overwrite) to replace it")
    return model_dir, version, target


def export_saved_model(translator, export_dir=DEFAULT_BASE, *, model_name=DEFAULT_MODEL_NAME,
                       version=None, beam_size=None, alpha=None, max_source_length=None,
                       max_extra_length=None, batch_size=DEFAULT_BATCH_SIZE, quantize=None,
                       dtype=None, overwrite=False, verbose=False):
    """Writes a translator as a TF Serving SavedModel `<export_dir>/<model_name>/<version>/`.

    See the module docstring for the signatures and the input handling. Under
    the JAX or PyTorch backend the model's weights, config and tokenizer are
    saved to a temporary folder and exported by a TensorFlow-backend
    subprocess (`python -m keras_transformer.export.saved_model`).

    Args:
        translator: a `keras_transformer.inference.translator.Translator` whose tokenizer
            is a `keras_transformer.data.Tokenizer`.
        export_dir: the model server's base folder (default `saved_models`).
        model_name: the model's folder name, which is the name clients use
            (`/v1/models/<model_name>:predict`).
        version: the version folder (a positive integer); default one more
            than the largest existing version, or 1.
        beam_size: beam width of `serving_default` (at least 2); default
            the translator's `options` (the paper's 4).
        alpha: length penalty of the beam search and of both scores; default
            the translator's.
        max_source_length: source ids kept per sentence, EOS included;
            longer inputs are truncated. Default `config.max_length`
            (what `Translator` keeps).
        max_extra_length: outputs have at most source length + this many
            ids; default the translator's.
        batch_size: sentences decoded at once (default 32): a request is
            decoded in chunks of at most this many, which bounds the
            memory a large request takes. Not a traced shape: the searches
            take any batch size and width.
        quantize: `"int8"` exports a weight-quantized copy of the model
            (`keras_transformer.model.transformer.quantized`); default float32.
        dtype: `"bfloat16"` exports a bf16 copy of the model (weights and
            arithmetic, `keras_transformer.model.transformer.with_dtype`); `"float32"`
            a float32 one; default the translator's model as it is. A bf16
            SavedModel runs on any CPU; without bf16 instructions
            (avx512_bf16, amx_bf16) it is slower than float32 (figures:
            docs/bf16.md).
        overwrite: replace an existing version folder.
        verbose: print what is written.

    Returns:
        The `pathlib.Path` of the written version folder.

    Example:

    >>> export_saved_model(Translator(model, tokenizer), "saved_models")
    PosixPath('saved_models/transformer/1')
    """
    import keras

    model, tokenizer = _translator_parts(translator)
    decoding = getattr(translator, "options", None) or DecodingOptions()
    decoding = decoding.replace(beam_size=beam_size, alpha=alpha,
                                max_extra_length=max_extra_length)
    # The model's dtype policy: float32, bfloat16 (`with_dtype`), or a
    # training model's mixed_bfloat16, exported as float32 unless asked.
    model_dtype = model.dtype_policy.name
    dtype = dtype or (model_dtype if model_dtype in DECODING_DTYPES else "float32")
    options = _resolve_options(model.config, decoding, max_source_length, batch_size,
                               quantize, dtype)
    model_dir, version, target = _version_dir(export_dir, model_name, version, overwrite)
    already = getattr(model.target_embedding, "quantization_mode", None)
    if already and quantize:
        raise ValueError(f"the translator's model is quantized already ({already}); "
                         "export it without quantize, or quantize the float32 model")

    if keras.backend.backend() != "tensorflow":
        if already:
            raise ValueError("under the JAX or PyTorch backend, export the float32 model "
                             f"with quantize={already!r} instead of a quantized one")
        if model_dtype != "float32":
            raise ValueError("under the JAX or PyTorch backend, export the float32 model "
                             f"(dtype={dtype!r} casts it) instead of a {model_dtype} one")
        return _export_through_tensorflow(model, tokenizer, export_dir, model_name=model_name,
                                          version=version, overwrite=overwrite,
                                          verbose=verbose, **options)

    # A hidden (non-numeric) folder: TF Serving ignores it until the rename;
    # a killed export's is removed by the next export into model_dir.
    try:
        with staging_dir(model_dir, str(version)) as staging:
            _write_version(staging, target, model, tokenizer, decoding, options, dtype,
                           model_dtype, quantize, already, model_name)
    except (OSError, tf.errors.OpError) as error:
        # A full disk, a lost mount: one line naming the export; the staging
        # folder is gone, so no half-written version is left.
        if isinstance(error, WriteError):
            raise
        raise WriteError(target, _as_os_error(error), f"writing the SavedModel {target}") \
            from error
    if verbose:
        weights = quantize or already or (dtype if dtype != "float32" else None)
        weights = f", {weights} weights" if weights else ""
        print(f"Exported {BEAM_SIGNATURE} (beam {options['beam_size']}, alpha "
              f"{options['alpha']}{weights}) and {GREEDY_SIGNATURE} to {target}")
    return target


def _translator_parts(translator):
    """`(model, tokenizer)` of a `Translator`; `TypeError` for anything else."""
    model = getattr(translator, "model", None)
    tokenizer = getattr(translator, "tokenizer", None)
    if model is None or not hasattr(model, "config"):
        raise TypeError("translator must be a keras_transformer Translator (with .model "
                        f"and .tokenizer), received {type(translator).__name__}")
    if not hasattr(tokenizer, "model_proto") or not isinstance(tokenizer, tf.Module):
        raise TypeError(
            "the translator's tokenizer must be a keras_transformer.data.Tokenizer "
            "(SentencePiece ops in the graph); received "
            f"{type(tokenizer).__name__}")
    return model, tokenizer


def _export_through_tensorflow(model, tokenizer, export_dir, **arguments):
    """Under JAX or PyTorch: the weights to a temporary folder, exported by a TensorFlow child."""
    with tempfile.TemporaryDirectory(prefix="kt_export_") as tmp:
        tmp = pathlib.Path(tmp)
        save_weights(model, tmp / "model.weights.h5",
                     what="writing the export's temporary weights")
        (tmp / names.CONFIG_FILE).write_text(json.dumps(model.config.to_dict()))
        (tmp / TOKENIZER_ASSET).write_bytes(tokenizer.model_proto)
        return _export_in_subprocess(tmp, export_dir, weights=tmp / "model.weights.h5",
                                     **arguments)


def _write_version(staging, target, model, tokenizer, decoding, options, dtype, model_dtype,
                   quantize, already, model_name):
    """Writes the SavedModel in `staging`, then renames it to `target`."""
    asset_source = staging / "_asset_source"
    asset_source.mkdir()
    asset_file = asset_source / TOKENIZER_ASSET
    asset_file.write_bytes(tokenizer.model_proto)
    if dtype != model_dtype:
        model = with_dtype(model, dtype)
    if quantize:
        model = quantized(model, quantize)
    module = TranslationModule(
        model, tokenizer, decoding, tokenizer_file=asset_file,
        max_source_length=options["max_source_length"], batch_size=options["batch_size"])
    out = staging / "model"
    tf.saved_model.save(module, str(out), signatures=module.signatures())
    bad = forbidden_ops(saved_model_ops(out))
    if bad:
        raise RuntimeError(f"the exported graph contains ops TF Serving cannot run: {bad}")
    (out / "assets.extra").mkdir(exist_ok=True)
    (out / "assets.extra" / "export_options.json").write_text(json.dumps(
        dict(options, quantize=quantize or already, format_version=EXPORT_FORMAT_VERSION,
             config=model.config.to_dict(), tensorflow=tf.__version__,
             tensorflow_text=_tf_text_version()), indent=2))
    # TF Serving replays these requests when it loads the version: a few
    # lengths per signature at batch 1 and at batch_size.
    write_warmup_requests(out, model_name=model_name)
    if target.exists():
        shutil.rmtree(target)
    os.replace(out, target)


def _as_os_error(error):
    """An `OSError` for a TensorFlow file error, without TensorFlow's op context."""
    if isinstance(error, OSError):
        return error
    message = getattr(error, "message", str(error)).splitlines()[0]
    # "{{function_node ...}} " and " [Op:SaveV2]"
    message = re.sub(r"\{\{[^}]*\}\}\s*|\s*\[Op:\w+\]", "", message)
    # TensorFlow's file errors read "<temporary file>; <reason>": the reason.
    path, _, reason = message.partition("; ")
    return OSError(reason if reason and os.sep in path else message)


def _tf_text_version():
    import tensorflow_text

    return getattr(tensorflow_text, "__version__", "unknown")


def _export_in_subprocess(run_dir, export_dir, **options):
    """Calls `export_from_run` in a TensorFlow-backend subprocess; options as JSON."""
    package_root = str(pathlib.Path(__file__).resolve().parents[1])
    env = dict(os.environ, KERAS_BACKEND="tensorflow")
    env.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
    env["PYTHONPATH"] = os.pathsep.join(
        p for p in (package_root, os.environ.get("PYTHONPATH", "")) if p)
    spec = dict(options, run_dir=str(run_dir), export_dir=str(export_dir))
    if spec.get("weights") is not None:
        spec["weights"] = str(spec["weights"])
    verbose = options.get("verbose", False)
    # stdout (what `verbose` prints) passes through; stderr is kept for the error.
    result = subprocess.run([sys.executable, "-m", "keras_transformer.export.saved_model"],
                            input=json.dumps(spec), env=env, text=True,
                            stdout=None if verbose else subprocess.PIPE,
                            stderr=subprocess.PIPE)
    lines = result.stderr.strip().splitlines()
    if result.returncode == _WRITE_ERROR_STATUS:  # the child's WriteError, as JSON
        failed = json.loads(lines[-1])
        # Raised here as the same WriteError, so that the caller says what is
        # intact and what to do, as after an export in this process.
        raise WriteError(failed["path"], OSError(failed["reason"]), failed["what"])
    if result.returncode == _RUN_ERROR_STATUS:  # a user error, its line on stderr
        raise RunError(lines[-1] if lines else "export under the TensorFlow backend failed")
    if result.returncode != 0:
        raise RuntimeError(f"export under the TensorFlow backend failed (exit "
                           f"{result.returncode}):\n{result.stderr[-4000:]}")
    return pathlib.Path(export_dir) / options["model_name"] / str(options["version"])


def export_from_run(run_dir, export_dir=DEFAULT_BASE, *, model_name=None,
                    version=None, weights=None, beam_size=None, alpha=None,
                    max_source_length=None, max_extra_length=None,
                    batch_size=DEFAULT_BATCH_SIZE, quantize=None, dtype=None,
                    overwrite=False, verbose=False):
    """Exports a training output folder (`model.keras` + `spm.model`) for TF Serving.

    Works from any Keras backend: outside TensorFlow it re-runs itself in a
    TensorFlow-backend subprocess (the saved weights are backend-portable).

    Args:
        run_dir: the training job's `output_dir` (`keras_transformer.training.job`):
            `model.keras` (or `config.json` + `model.weights.h5`) and
            `spm.model`.
        export_dir: the model server's base folder.
        model_name: the served model's name; default the run folder's name,
            so that each run is its own model on the server.
        version: as in `export_saved_model`.
        weights: weights to export instead of `model.keras`': a name of
            `loading.resolve_weights` (`best`, `last`, `ckpt-<update>`, ...) or
            a `.weights.h5` path.
        beam_size, alpha, max_source_length, max_extra_length, batch_size,
            quantize, dtype, overwrite, verbose: as in
            `export_saved_model` (decoding defaults: `DecodingOptions`').

    Returns:
        The `pathlib.Path` of the written version folder.

    Example:

    >>> export_from_run("runs/demo_tiny", "saved_models", version=1)
    PosixPath('saved_models/demo_tiny/1')
    """
    import keras

    run_dir = pathlib.Path(run_dir)
    check_run(run_dir)
    if model_name is None:
        model_name = run_dir.resolve().name
    if weights is not None:
        weights = resolve_weights(run_dir, str(weights))
    if keras.backend.backend() != "tensorflow":
        _, version, _ = _version_dir(export_dir, model_name, version, overwrite)
        return _export_in_subprocess(
            run_dir, export_dir, model_name=model_name, version=version,
            overwrite=overwrite, verbose=verbose, beam_size=beam_size, alpha=alpha,
            max_source_length=max_source_length, max_extra_length=max_extra_length,
            batch_size=batch_size, quantize=quantize, dtype=dtype, weights=weights)

    from keras_transformer.inference.translator import Translator

    model, tokenizer = load_run(run_dir, weights)
    decoding = DecodingOptions().replace(beam_size=beam_size, alpha=alpha,
                                         max_extra_length=max_extra_length)
    translator = Translator(model, tokenizer, decoding)
    return export_saved_model(
        translator, export_dir, model_name=model_name, version=version,
        max_source_length=max_source_length, batch_size=batch_size, quantize=quantize,
        dtype=dtype, overwrite=overwrite, verbose=verbose)


_RUN_ERROR_STATUS = 3
_WRITE_ERROR_STATUS = 4

if __name__ == "__main__":
    # `_export_in_subprocess`: export_from_run's arguments as JSON on stdin.
    try:
        export_from_run(**json.loads(sys.stdin.read()))
    except WriteError as error:  # a full disk, a lost mount: the parent raises it again
        sys.stderr.write(json.dumps({"path": str(error.path), "what": error.what,
                                     "reason": error.reason}) + "\n")
        sys.exit(_WRITE_ERROR_STATUS)
    except (RunError, OSError) as error:  # OSError: FileNotFoundError, ...
        sys.stderr.write(f"{error}\n")
        sys.exit(_RUN_ERROR_STATUS)
