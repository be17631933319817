"""Exports a `Translator` as a SavedModel that TensorFlow Serving runs as it is.

The SavedModel holds a `TranslationModule` (`keras_transformer.export.translation_module`:
its signatures, input handling and shapes): the whole translation in one
TensorFlow graph of core ops and TensorFlow Text's SentencePiece ops, with
the SentencePiece model as its asset and, in `assets.extra/`, the export's
options (`export_options.json`) and TF Serving's warm-up requests
(`keras_transformer.export.warmup`). The graph is checked for ops TF Serving
cannot run (`keras_transformer.export.op_audit`) before the version is
renamed into place.

It is written in TF Serving's layout `<base>/<model_name>/<version>/`
(`saved_model.pb`, `variables/`, `assets/spm.model`), into a hidden staging
folder first and renamed into place, so a model server watching `<base>`
never loads a half-written version. A version folder, once there, is never
replaced (unless `overwrite` asks for it): the version number of an export
without `version` is chosen when the finished export is renamed into place,
under a lock on `<base>/<model_name>` (`.publish.lock`), so exports that run
at the same time, of one run or of several, each get a version of their own
(`publish_version`).

Training backend: the export always runs under the TensorFlow backend. A
model trained under JAX or PyTorch is exported from its weights, which are
backend-portable: `export_saved_model` and `export_from_run`, called under
another backend, save the weights, config and tokenizer to a temporary
folder and call `export_from_run` in a subprocess with
`KERAS_BACKEND=tensorflow` (`python -m keras_transformer.export.saved_model`, its
arguments as JSON), which rebuilds the model under TensorFlow and exports it.

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

import dataclasses
import json
import os
import pathlib
import re
import subprocess
import sys
import tempfile

import tensorflow as tf

from keras_transformer import names
from keras_transformer.export.op_audit import forbidden_ops, saved_model_ops
from keras_transformer.export.translation_module import (BEAM_SIGNATURE, DEFAULT_BATCH_SIZE,
                                                         GREEDY_SIGNATURE, TranslationModule,
                                                         XlaBuckets)
from keras_transformer.export.warmup import write_warmup_requests
from keras_transformer.files import (WriteError, file_lock, replace_with_staged, save_weights,
                                     staging_dir)
from keras_transformer.inference.loading import check_run, load_run, resolve_weights
from keras_transformer.model.config import DecodingOptions
from keras_transformer.model.transformer import (DECODING_DTYPES, QUANTIZATION_MODES, quantized,
                                                 with_dtype)
from keras_transformer.runs import RunError

DEFAULT_BASE = names.EXPORT_ROOT
DEFAULT_MODEL_NAME = "transformer"
# 2: one search per signature, any batch size and width (1: one per bucket).
EXPORT_FORMAT_VERSION = 2
TOKENIZER_ASSET = names.TOKENIZER_FILE

__all__ = ["BEAM_SIGNATURE", "DEFAULT_BASE", "DEFAULT_MODEL_NAME", "GREEDY_SIGNATURE",
           "export_from_run", "export_saved_model", "next_version", "publish_version",
           "serving_decoding"]


# --- version folders -------------------------------------------------------------


def next_version(model_dir):
    """The next TF Serving version number under `<base>/<model_name>`: 1 + the largest."""
    model_dir = pathlib.Path(model_dir)
    versions = [int(p.name) for p in model_dir.glob("*") if p.is_dir() and p.name.isdigit()]
    return max(versions, default=0) + 1


PUBLISH_LOCK = ".publish.lock"


def _check_version(export_dir, model_name, version, overwrite):
    """`(model_dir, version)` of an export, checked before it is written.

    `version` None stays None: the next free version is chosen when the
    export is renamed into place (`publish_version`).

    Raises:
        ValueError: a model name that is not a plain folder name, or a version
            that is not a positive integer.
        FileExistsError: the version folder exists and `overwrite` is false.
    """
    if not model_name or "/" in model_name or model_name in (".", ".."):
        raise ValueError(f"model_name must be a plain folder name, received {model_name!r}")
    model_dir = pathlib.Path(export_dir) / model_name
    if version is not None and (not isinstance(version, int) or isinstance(version, bool)
                                or version < 1):
        raise ValueError(f"version must be a positive integer, received {version!r}")
    if version is not None and (model_dir / str(version)).exists() and not overwrite:
        raise FileExistsError(f"{model_dir / str(version)} already exists; pass another "
                              "version, or overwrite=True (--overwrite) to replace it")
    return model_dir, version


def publish_version(staged, model_dir, version=None, overwrite=False):
    """Renames a finished export `staged` to `<model_dir>/<version>`; returns that path.

    Under an exclusive lock on `model_dir` (`.publish.lock`), so that two
    exports never take the same number: `version` None takes the next free
    one at this moment. A version folder that exists is never replaced
    unless `overwrite` is true.

    Args:
        staged: the complete SavedModel folder, inside a `staging_dir` of
            `model_dir`.
        model_dir: `<base>/<model_name>`.
        version: the version asked for, or None for the next free one.
        overwrite: replace `<model_dir>/<version>` if it exists.

    Raises:
        FileExistsError: `version` exists (another export took it while this
            one was written) and `overwrite` is false; nothing is replaced.
    """
    with file_lock(model_dir / PUBLISH_LOCK,
                   waiting=f"Waiting for another export into {model_dir} ..."):
        if version is None:
            version = next_version(model_dir)
        target = model_dir / str(version)
        if target.exists() or target.is_symlink():
            if not overwrite:
                raise FileExistsError(
                    f"{target} was written by another export while this one ran; this "
                    "export is not kept (nothing was replaced): run it again without "
                    "--version for the next free version, or with --overwrite")
            return replace_with_staged(staged, target)
        # Nothing is at `target` and every exporter holds the lock: a plain
        # rename, which never replaces a version folder.
        os.rename(staged, target)
        return target


# --- export ----------------------------------------------------------------------


def _resolve_options(config, decoding, max_source_length, batch_size, quantize, dtype,
                     xla=False, xla_batch_sizes=None, xla_widths=None):
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
    if not xla and (xla_batch_sizes is not None or xla_widths is not None):
        raise ValueError("xla_batch_sizes and xla_widths are the buckets of an XLA export: "
                         "give xla=True too")
    options = dict(beam_size=decoding.beam_size, alpha=decoding.alpha,
                   max_extra_length=decoding.max_extra_length,
                   max_source_length=max_source_length, batch_size=batch_size,
                   quantize=quantize, dtype=dtype, xla=bool(xla))
    if xla:
        buckets = XlaBuckets.resolve(xla_batch_sizes, xla_widths, batch_size=batch_size,
                                     max_source_length=max_source_length)
        options.update(xla_batch_sizes=list(buckets.batch_sizes),
                       xla_widths=list(buckets.widths))
    return options


def export_saved_model(translator, export_dir=DEFAULT_BASE, *, model_name=DEFAULT_MODEL_NAME,
                       version=None, beam_size=None, alpha=None, max_source_length=None,
                       max_extra_length=None, batch_size=DEFAULT_BATCH_SIZE, quantize=None,
                       dtype=None, xla=False, xla_batch_sizes=None, xla_widths=None,
                       overwrite=False, verbose=False):
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
        version: the version folder (a positive integer), refused if it
            exists; default one more than the largest existing version (or
            1), taken when the export is complete (`publish_version`), so
            that exports at the same time never share one.
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
        xla: compile the searches with XLA (`translation_module`'s
            docstring), for the bucket shapes below; the model server must
            run compiled functions (`tensorflow_model_server
            --xla_cpu_compilation_enabled=true` on CPU). The warm-up
            requests cover every bucket of both signatures.
        xla_batch_sizes: with `xla`, the chunk sizes compiled for (default
            `DEFAULT_XLA_BATCH_SIZES`, and always `batch_size`).
        xla_widths: with `xla`, the source widths compiled for (default
            `DEFAULT_XLA_WIDTHS`, and always `max_source_length`, the only
            one for a one-sentence chunk: `XlaBuckets.shapes`).
        overwrite: replace an existing version folder (never done otherwise).
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
                               quantize, dtype, xla, xla_batch_sizes, xla_widths)
    model_dir, version = _check_version(export_dir, model_name, version, overwrite)
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
        with staging_dir(model_dir, str(version or "next")) as staging:
            target = _write_version(staging, model_dir, version, overwrite, model, tokenizer,
                                    decoding, options, dtype, model_dtype, quantize, already,
                                    model_name)
    except FileExistsError:
        raise  # the version was taken meanwhile: `publish_version`'s line
    except (OSError, tf.errors.OpError) as error:
        # A full disk, a lost mount: one line naming the export; the staging
        # folder is gone, so no half-written version is left. A file of the
        # staging folder that failed (the warm-up requests) is the export's.
        cause = _as_os_error(error.error if isinstance(error, WriteError) else error)
        # The version it was writing: the one asked for, else the one it
        # would have taken (`publish_version` takes it only when complete).
        name = model_dir / str(version if version is not None else next_version(model_dir))
        raise WriteError(name, cause, f"writing the SavedModel {name}") from error
    if verbose:
        weights = quantize or already or (dtype if dtype != "float32" else None)
        weights = f", {weights} weights" if weights else ""
        compiled = (f", XLA-compiled for batches of {options['xla_batch_sizes']} and source "
                    f"widths {options['xla_widths']}" if options["xla"] else "")
        print(f"Exported {BEAM_SIGNATURE} (beam {options['beam_size']}, alpha "
              f"{options['alpha']}{weights}) and {GREEDY_SIGNATURE}{compiled} to {target}")
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


def _write_version(staging, model_dir, version, overwrite, model, tokenizer, decoding, options,
                   dtype, model_dtype, quantize, already, model_name):
    """Writes the SavedModel in `staging`, then publishes it (`publish_version`); returns its path."""
    asset_source = staging / "_asset_source"
    asset_source.mkdir()
    asset_file = asset_source / TOKENIZER_ASSET
    asset_file.write_bytes(tokenizer.model_proto)
    if dtype != model_dtype:
        model = with_dtype(model, dtype)
    if quantize:
        model = quantized(model, quantize)
    buckets = (XlaBuckets(tuple(options["xla_batch_sizes"]), tuple(options["xla_widths"]))
               if options["xla"] else None)
    module = TranslationModule(
        model, tokenizer, decoding, tokenizer_file=asset_file,
        max_source_length=options["max_source_length"], batch_size=options["batch_size"],
        xla_buckets=buckets)
    out = staging / "model"
    tf.saved_model.save(module, str(out), signatures=module.signatures())
    bad = forbidden_ops(saved_model_ops(out, outside_compiled=True))
    if bad:
        raise RuntimeError(f"the exported graph contains ops TF Serving cannot run: {bad}")
    (out / "assets.extra").mkdir(exist_ok=True)
    (out / "assets.extra" / "export_options.json").write_text(json.dumps(
        dict(options, quantize=quantize or already, format_version=EXPORT_FORMAT_VERSION,
             config=model.config.to_dict(), tensorflow=tf.__version__,
             tensorflow_text=_tf_text_version()), indent=2))
    # TF Serving replays these requests when it loads the version: a few
    # lengths per signature at batch 1 and at batch_size; for an XLA export
    # every compiled shape, so that no request pays a compilation.
    if options["xla"]:
        write_warmup_requests(out, model_name=model_name, shapes=buckets.shapes)
    else:
        write_warmup_requests(out, model_name=model_name)
    return publish_version(out, model_dir, version, overwrite)


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
    with tempfile.TemporaryDirectory(prefix="kt_export_result_") as tmp:
        # The child writes the version folder it published here (the version
        # is chosen when the export is renamed into place).
        spec[_RESULT_KEY] = str(pathlib.Path(tmp) / "result.json")
        # stdout (what `verbose` prints) passes through; stderr is kept for the error.
        result = subprocess.run([sys.executable, "-m", "keras_transformer.export.saved_model"],
                                input=json.dumps(spec), env=env, text=True,
                                stdout=None if verbose else subprocess.PIPE,
                                stderr=subprocess.PIPE)
        published = (json.loads(pathlib.Path(spec[_RESULT_KEY]).read_text())
                     if result.returncode == 0 else None)
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
    return pathlib.Path(published["path"])


def serving_decoding(run_dir, *, beam_size=None, alpha=None, max_extra_length=None):
    """The decoding `export_from_run` gives `serving_default`: a `loading.RunDecoding`.

    The values given, else the run's `settings.json`, else the paper's
    (`loading.run_decoding`), except that a run that recorded greedy
    decoding (beam 1) is exported with beam 2, as the job's own export
    does: `serving_default` is a beam search (`translate_greedy` is beam 1).
    """
    from keras_transformer.inference.loading import FROM_RUN, run_decoding

    decoding = run_decoding(run_dir, beam_size=beam_size, alpha=alpha,
                            max_extra_length=max_extra_length)
    if beam_size is None and decoding.values["beam_size"] == 1:
        values = dict(decoding.values, beam_size=2)
        sources = dict(decoding.sources,
                       beam_size=f"{FROM_RUN} say greedy; {BEAM_SIGNATURE} is a beam search")
        decoding = dataclasses.replace(decoding, values=values, sources=sources)
    return decoding


def export_from_run(run_dir, export_dir=DEFAULT_BASE, *, model_name=None,
                    version=None, weights=None, beam_size=None, alpha=None,
                    max_source_length=None, max_extra_length=None,
                    batch_size=DEFAULT_BATCH_SIZE, quantize=None, dtype=None, xla=False,
                    xla_batch_sizes=None, xla_widths=None, overwrite=False, verbose=False):
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
            quantize, dtype, xla, xla_batch_sizes, xla_widths, overwrite,
            verbose: as in
            `export_saved_model`, except that `beam_size`, `alpha` and
            `max_extra_length` default (`None`) to the run's: its
            `settings.json`, else the paper's `DecodingOptions()`
            (`loading.run_decoding`).

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
        _check_version(export_dir, model_name, version, overwrite)
        return _export_in_subprocess(
            run_dir, export_dir, model_name=model_name, version=version,
            overwrite=overwrite, verbose=verbose, beam_size=beam_size, alpha=alpha,
            max_source_length=max_source_length, max_extra_length=max_extra_length,
            batch_size=batch_size, quantize=quantize, dtype=dtype, xla=xla,
            xla_batch_sizes=xla_batch_sizes, xla_widths=xla_widths, weights=weights)

    from keras_transformer.inference.translator import Translator

    model, tokenizer = load_run(run_dir, weights)
    # What is not given is the run's settings.json, else the paper's.
    decoding = serving_decoding(run_dir, beam_size=beam_size, alpha=alpha,
                                max_extra_length=max_extra_length).options
    translator = Translator(model, tokenizer, decoding)
    return export_saved_model(
        translator, export_dir, model_name=model_name, version=version,
        max_source_length=max_source_length, batch_size=batch_size, quantize=quantize,
        xla=xla, xla_batch_sizes=xla_batch_sizes, xla_widths=xla_widths,
        dtype=dtype, overwrite=overwrite, verbose=verbose)


_RUN_ERROR_STATUS = 3
_WRITE_ERROR_STATUS = 4
_RESULT_KEY = "_result_file"

if __name__ == "__main__":
    # `_export_in_subprocess`: export_from_run's arguments as JSON on stdin.
    try:
        arguments = json.loads(sys.stdin.read())
        result_file = arguments.pop(_RESULT_KEY)
        path = export_from_run(**arguments)
        pathlib.Path(result_file).write_text(json.dumps({"path": str(path)}))
    except WriteError as error:  # a full disk, a lost mount: the parent raises it again
        sys.stderr.write(json.dumps({"path": str(error.path), "what": error.what,
                                     "reason": error.reason}) + "\n")
        sys.exit(_WRITE_ERROR_STATUS)
    except (RunError, OSError) as error:  # OSError: FileNotFoundError, ...
        sys.stderr.write(f"{error}\n")
        sys.exit(_RUN_ERROR_STATUS)
