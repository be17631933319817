"""`keras-transformer export`: a run folder as a TF Serving SavedModel or a CTranslate2 model."""

import pathlib

from keras_transformer import names
from keras_transformer.commands.common import (PROG, CommandError, check_decoding_argument,
                                               say)
from keras_transformer.model.config import DecodingOptions
from keras_transformer.training.settings import flag

FORMATS = ("saved_model", "ctranslate2")
# CTranslate2's weight types, from `names` so that building the parser
# imports neither export module.
QUANTIZATIONS = names.CTRANSLATE2_QUANTIZATIONS
# Options of the SavedModel's searches: CTranslate2 decides them when it
# translates, so they mean nothing to its export. Their parser defaults are
# None so that a value given with --format ctranslate2 is refused, not ignored.
_SAVED_MODEL_ONLY = ("version", "beam_size", "alpha", "max_source_length",
                     "max_extra_length", "batch_size", "dtype", "xla", "xla_batch_sizes",
                     "xla_widths")
# The SavedModel's own weight quantization (Keras' model.quantize).
SAVED_MODEL_QUANTIZATIONS = names.KERAS_QUANTIZATIONS


def run_export(args):
    run_dir = pathlib.Path(args.run)
    if not run_dir.is_dir():
        raise CommandError(f"--run {run_dir} does not exist; expected a training run "
                           f"folder with model.keras and {names.TOKENIZER_FILE}")
    if args.format == "ctranslate2":
        return _export_ctranslate2(args, run_dir)
    if args.quantize is not None and args.quantize not in SAVED_MODEL_QUANTIZATIONS:
        raise CommandError(f"--quantize {args.quantize} applies to --format ctranslate2 only; "
                           f"a SavedModel takes --quantize "
                           f"{' or '.join(SAVED_MODEL_QUANTIZATIONS)}")
    return _export_saved_model(args, run_dir)


def _export_saved_model(args, run_dir):
    # Under JAX or PyTorch, export_from_run exports in a TensorFlow-backend
    # subprocess (the weights are backend-portable).
    from keras_transformer.export.saved_model import export_from_run, serving_decoding
    from keras_transformer.inference.loading import check_run

    # What is not given takes export_from_run's defaults; its decoding is the
    # run's settings.json, else the paper's: the same serving_decoding, said here.
    options = {name: getattr(args, name) for name in _SAVED_MODEL_ONLY
               if getattr(args, name) is not None}
    for name in ("beam_size", "alpha", "max_extra_length"):
        if getattr(args, name) is not None:
            check_decoding_argument(name, getattr(args, name))
    try:
        check_run(run_dir)
        decoding = serving_decoding(run_dir, beam_size=args.beam_size, alpha=args.alpha,
                                    max_extra_length=args.max_extra_length)
    except FileNotFoundError as error:
        raise CommandError(str(error)) from None
    try:
        path = export_from_run(
            run_dir, args.export_dir, model_name=args.model_name, weights=args.weights,
            quantize=args.quantize, overwrite=args.overwrite, verbose=not args.quiet,
            **options)
    except (FileNotFoundError, FileExistsError, ValueError, RuntimeError) as error:
        raise CommandError(str(error)) from None
    if not args.quiet:  # once written: a failed export's error is its only line
        say(f"{PROG} export", f"decoding: {decoding.describe()}", error=False)
    print(path)
    return 0


def _export_ctranslate2(args, run_dir):
    # Any backend: the weights are read as NumPy arrays in this process.
    from keras_transformer.export.ctranslate2_runtime import CTranslate2NotInstalled
    from keras_transformer.export.ctranslate2 import export_ctranslate2_from_run

    given = [flag(name) for name in _SAVED_MODEL_ONLY if getattr(args, name) is not None]
    if given:
        raise CommandError(
            f"{', '.join(given)} {'applies' if len(given) == 1 else 'apply'} to --format "
            "saved_model only; CTranslate2 takes the beam size, length penalty and "
            "length limits when it translates")
    try:
        path = export_ctranslate2_from_run(
            run_dir, args.export_dir, model_name=args.model_name, weights=args.weights,
            quantization=args.quantize, overwrite=args.overwrite, verbose=not args.quiet)
    except (CTranslate2NotInstalled, FileNotFoundError, FileExistsError,
            ValueError) as error:
        raise CommandError(str(error)) from None
    print(path)
    return 0


def add_parser(commands):
    decoding = DecodingOptions()
    e = commands.add_parser(
        "export", help="export a run folder for TF Serving or CTranslate2",
        description=f"Exports a training output folder (model.keras and {names.TOKENIZER_FILE}). "
                    "--format saved_model (default): a TF Serving SavedModel "
                    "<export-dir>/<model-name>/<version>/, under the TensorFlow backend "
                    "whatever backend trained it. --format ctranslate2: a CTranslate2 "
                    "model folder <export-dir>/<model-name>-ct2[-<quantize>]/ (model.bin, "
                    f"config.json, shared_vocabulary.json, {names.TOKENIZER_FILE}) that "
                    "ctranslate2.Translator loads; beam size and length penalty are "
                    "then chosen when translating.")
    e.add_argument("--run", required=True, help="training output folder, e.g. runs/demo_tiny")
    e.add_argument("--format", choices=FORMATS, default="saved_model",
                   help="saved_model (TF Serving, default) or ctranslate2")
    e.add_argument("--quantize", choices=QUANTIZATIONS,
                   help="store the weights quantized (default: float32): "
                        f"{' or '.join(SAVED_MODEL_QUANTIZATIONS)} for a SavedModel (Keras' "
                        "model.quantize: variables 3.9x smaller, same BLEU, but on CPU "
                        "about half the float32 SavedModel's speed, 16.7 against 33.6 "
                        "sentences/s on the Multi30k model, docs/results.md; for int8 "
                        "speed use --format ctranslate2 --quantize int8, 3.2x the "
                        "Translator there); any of these for ctranslate2")
    e.add_argument("--dtype", choices=names.DECODING_DTYPES,
                   help="saved_model: the weights' and arithmetic's dtype (default float32); "
                        "bfloat16 runs on any CPU but is faster than float32 only where it has "
                        "avx512_bf16 or amx_bf16 (figures: docs/bf16.md); CTranslate2 takes "
                        "--quantize bfloat16")
    e.add_argument("--export-dir", default=names.EXPORT_ROOT,
                   help=f"base folder (default {names.EXPORT_ROOT}): <export-dir>/<model-name>/"
                        "<version>/ for a SavedModel, <export-dir>/<model-name>-ct2"
                        "[-<quantize>]/ for CTranslate2")
    e.add_argument("--model-name", help="the served model's name (default: the run "
                                        "folder's name)")
    e.add_argument("--version", type=int, help="saved_model: default the next free version "
                                               "number")
    e.add_argument("--weights", help="export other weights than model.keras': best, last, "
                                     "ckpt-<update> or a .weights.h5 path")
    e.add_argument("--beam-size", type=int, help=f"saved_model: of {names.BEAM_SIGNATURE} "
                                                 "(default the run's settings.json, else "
                                                 f"{decoding.beam_size})")
    e.add_argument("--alpha", type=float,
                   help="saved_model: length penalty (default the run's settings.json, "
                        f"else {decoding.alpha:g})")
    e.add_argument("--max-source-length", type=int,
                   help="saved_model: source ids kept, EOS included (default: "
                        "config.max_length)")
    e.add_argument("--max-extra-length", type=int,
                   help="saved_model: outputs have at most source length + this many ids "
                        f"(default the run's settings.json, else {decoding.max_extra_length})")
    e.add_argument("--batch-size", type=int,
                   help="saved_model: sentences decoded at once; a larger request is "
                        "decoded in chunks of this many (default 32)")
    e.add_argument("--xla", action="store_const", const=True,
                   help="saved_model: compile the searches with XLA for a few bucket shapes "
                        "(as the in-process Translator runs); TF Serving must run with "
                        "--xla_cpu_compilation_enabled=true; its warm-up requests compile "
                        "every bucket at load (docs/serving.md, XLA)")
    e.add_argument("--xla-batch-sizes", type=int, nargs="+", metavar="N",
                   help="saved_model --xla: chunk sizes compiled for; a chunk is padded up to "
                        "the next (default 1 and --batch-size)")
    e.add_argument("--xla-widths", type=int, nargs="+", metavar="N",
                   help="saved_model --xla: source widths (ids, EOS included) compiled for; "
                        "a chunk is padded up to the next; a one-sentence chunk to the "
                        "largest (default 32 64 and --max-source-length)")
    e.add_argument("--overwrite", action="store_true",
                   help="replace an existing version (saved_model) or folder (ctranslate2)")
    e.add_argument("--quiet", "-q", action="store_true")
    e.set_defaults(func=run_export)
    return e
