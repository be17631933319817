"""`keras-transformer translate`: one sentence per line in, one translation per line out.

Two ways to run a model:

- `--model DIR`: an exported SavedModel's signature (tokenization, beam
  search and detokenization are graph ops), needing only TensorFlow and
  TensorFlow Text; its beam size, alpha and length limit were fixed at export.
- `--run DIR`: a training run folder's model in this process (`Translator`,
  on the current Keras backend), no export needed; `--weights`,
  `--beam-size`, `--alpha` and `--max-extra-length` choose the decoding,
  which is otherwise the run's (`settings.json`), else the paper's
  (`keras_transformer.inference.loading.run_decoding`); the start line says
  which values it used and where each came from.

When the input is a terminal each line is translated and printed as soon as
it is entered (as fairseq-interactive does); from a pipe or a file lines are
translated in batches of `--batch-size`. `--scores` prints
`score<TAB>translation`, the score being the length-normalised
log-probability `log P(Y) / lp(|Y|)` of the output (0 for an empty line).
"""

import pathlib
import sys
import time

from keras_transformer import names
from keras_transformer.commands.common import PROG, CommandError, check_decoding_argument
from keras_transformer.files import native_stderr_silenced
from keras_transformer.model.config import DecodingOptions


def resolve_model_dir(path):
    """The SavedModel folder for `--model`: itself, or its highest numeric version.

    Args:
        path: a SavedModel folder (`<base>/<name>/<version>`, holding
            `saved_model.pb`) or a model folder `<base>/<name>` holding
            numeric version folders, as TF Serving reads them.

    Returns:
        The `pathlib.Path` of the SavedModel folder.

    Raises:
        CommandError: the path is missing or holds no SavedModel.
    """
    path = pathlib.Path(path)
    expected = (f"expected a SavedModel written by `{PROG} export`: "
                f"{names.EXPORT_ROOT}/<model_name>/<version>/ with saved_model.pb")
    if not path.exists():
        raise CommandError(f"--model {path} does not exist; {expected}")
    if not path.is_dir():
        raise CommandError(f"--model {path} is a file, not a folder; {expected}")
    if (path / "saved_model.pb").is_file():
        return path
    versions = sorted((int(p.name), p) for p in path.iterdir()
                      if p.is_dir() and p.name.isdigit() and (p / "saved_model.pb").is_file())
    if versions:
        return versions[-1][1]
    raise CommandError(f"--model {path} holds no saved_model.pb (nor version folders "
                       f"with one); {expected}")


def load_signature(model_dir, signature_name):
    """Loads a SavedModel with TensorFlow and TensorFlow Text only; returns the signature."""
    import importlib

    import tensorflow as tf

    try:
        importlib.import_module("tensorflow_text")  # registers the SentencePiece ops
    except ImportError:
        raise CommandError("tensorflow-text is needed to run the exported tokenizer: "
                           "pip install tensorflow-text") from None
    try:
        # Loading runs tf-text's SentencePiece op, whose C++ logs a
        # LOG(INFO) line on stderr (see files.native_stderr_silenced).
        with native_stderr_silenced():
            loaded = tf.saved_model.load(str(model_dir))
    except Exception as error:  # a corrupt or foreign SavedModel
        raise CommandError(f"could not load the SavedModel in {model_dir}: "
                           f"{str(error).strip().splitlines()[0]}") from None
    signatures = dict(loaded.signatures)
    if signature_name not in signatures:
        raise CommandError(
            f"{model_dir} has no signature {signature_name!r} (it has "
            f"{sorted(signatures)}); export it with `{PROG} export`")
    signature = signatures[signature_name]
    if names.INPUT_NAME not in signature.structured_input_signature[1]:
        raise CommandError(f"signature {signature_name!r} of {model_dir} has no "
                           f"`{names.INPUT_NAME}` input")
    # Keep the loaded object alive as long as the signature.
    signature._loaded_object = loaded
    return signature


def _read_lines(stream):
    """Lines as bytes without their end (`\\n` or `\\r\\n`)."""
    for line in stream:
        if line.endswith(b"\n"):
            line = line[:-1]
            if line.endswith(b"\r"):
                line = line[:-1]
        yield line


def interactive_settings(interactive, batch_size):
    """`(batch_size, flush_each_batch)` for an input stream.

    A terminal (`interactive`) is answered line by line: batches of one
    sentence, each translation flushed as soon as it is written, so that a
    user typing sentences sees each translation before typing the next. A
    pipe or a file keeps `batch_size` and flushes once at the end.
    """
    return (1, True) if interactive else (batch_size, False)


def is_interactive(stream):
    """Whether `stream` is a terminal (`isatty()`; False when it cannot say)."""
    try:
        return bool(stream.isatty())
    except (AttributeError, OSError, ValueError):
        return False


def _one_line(text):
    # One line per sentence, whatever the model generated.
    return text.replace("\r", " ").replace("\n", " ")


def signature_translate_fn(signature):
    """`fn(list of bytes) -> (translations, scores)` running a SavedModel signature.

    Scores are the signature's `score` output, or `None` when it has none.
    """
    import tensorflow as tf

    def translate_batch(batch):
        outputs = signature(text=tf.constant(batch, tf.string))
        texts = [_one_line(t.decode("utf-8", "replace"))
                 for t in outputs["translation"].numpy()]
        scores = outputs["score"].numpy().tolist() if "score" in outputs else None
        return texts, scores

    return translate_batch


def translator_translate_fn(translator):
    """`fn(list of bytes) -> (translations, scores)` running a `Translator`.

    It decodes as the translator's `options` say.

    The lines go to the translator as they are: its tokenizer's
    `encode_source` replaces bytes that are not valid UTF-8 by U+FFFD, as the
    export's graph does.
    """

    def translate_batch(batch):
        texts, scores = translator.translate_with_scores(list(batch))
        return [_one_line(t) for t in texts], scores

    return translate_batch


def translate_batches(translate_batch, lines, *, batch_size=32, progress=None):
    """Yields `(translation, score)` per input line, in order.

    Args:
        translate_batch: `fn(list of bytes) -> (translations, scores)`
            (`scores` may be `None`), e.g. from `signature_translate_fn`.
        lines: an iterable of sentences (bytes or str).
        batch_size: sentences per call; a batch is translated as soon as it
            is full, so 1 answers each line before the next one is read.
        progress: `None`, or a callable `progress(done, elapsed_seconds,
            final=False)`, called after each batch and once at the end.
    """
    start, done, batch = time.time(), 0, []

    def run(batch):
        texts, scores = translate_batch(batch)
        if scores is None:
            scores = [None] * len(texts)
        yield from zip(texts, scores)

    for line in lines:
        batch.append(line.encode("utf-8") if isinstance(line, str) else line)
        if len(batch) == batch_size:
            yield from run(batch)
            done += len(batch)
            batch = []
            if progress is not None:
                progress(done, time.time() - start)
    if batch:
        yield from run(batch)
        done += len(batch)
    if progress is not None:
        progress(done, time.time() - start, final=True)


def format_line(translation, score, with_score):
    """An output line without its end: the translation, or `score<TAB>translation`."""
    if not with_score:
        return translation
    return f"{score:.6f}\t{translation}"


def _stderr_progress(done, elapsed, final=False):
    rate = done / elapsed if elapsed > 0 else 0.0
    end = "\n" if final else "\r"
    sys.stderr.write(f"translated {done} sentences in {elapsed:.1f} s "
                     f"({rate:.1f} sentences/s){end}")
    sys.stderr.flush()


# Decoding options of --run; a SavedModel fixed them at export.
_RUN_OPTIONS = (("weights", "--weights"), ("beam_size", "--beam-size"),
                ("alpha", "--alpha"), ("max_extra_length", "--max-extra-length"),
                ("quantize", "--quantize"), ("dtype", "--dtype"))


def _check_options(args):
    if args.batch_size < 1:
        raise CommandError(f"--batch-size must be positive, received {args.batch_size}")
    if args.model is not None:
        given = [flag for name, flag in _RUN_OPTIONS if getattr(args, name) is not None]
        if given:
            raise CommandError(
                f"{', '.join(given)} only apply to --run: a SavedModel's weights, beam size, "
                "alpha and length limit were fixed when it was exported (--beam, --greedy or "
                "--signature select one of its signatures)")
        return
    if args.signature:
        raise CommandError("--signature selects a SavedModel signature; it needs --model")
    for name in ("beam_size", "alpha", "max_extra_length"):
        if getattr(args, name) is not None:
            check_decoding_argument(name, getattr(args, name))
    if args.greedy and args.beam_size not in (None, 1):
        raise CommandError(f"--greedy is --beam-size 1, not --beam-size {args.beam_size}")
    if args.quantize and args.dtype not in (None, "float32"):
        raise CommandError(f"--quantize {args.quantize} and --dtype {args.dtype} are "
                           "alternatives: int8 weights or bf16 weights")


def _open_input(args):
    if not args.input or args.input == "-":
        return sys.stdin.buffer
    path = pathlib.Path(args.input)
    # Not only regular files: /dev/stdin, a named pipe or `<(command)` too.
    if not path.exists():
        raise CommandError(f"--input {path} does not exist")
    if path.is_dir():
        raise CommandError(f"--input {path} is a folder, not a text file")
    return open(path, "rb")


def _check_output(args):
    if args.output and args.output != "-":
        out_path = pathlib.Path(args.output)
        if out_path.parent and not out_path.parent.is_dir():
            raise CommandError(f"--output folder {out_path.parent} does not exist")


def _open_output(args):
    if args.output and args.output != "-":
        return open(args.output, "w", encoding="utf-8", newline="\n")
    return open(sys.stdout.fileno(), "w", encoding="utf-8", newline="\n", closefd=False)


def _load_saved_model(args):
    model_dir = resolve_model_dir(args.model)
    signature_name = args.signature or (names.GREEDY_SIGNATURE if args.greedy
                                        else names.BEAM_SIGNATURE)
    signature = load_signature(model_dir, signature_name)
    if args.scores and "score" not in signature.structured_outputs:
        raise CommandError(f"signature {signature_name!r} of {model_dir} has no `score` "
                           "output; leave out --scores")
    return signature_translate_fn(signature), f"{model_dir}, signature {signature_name}"


def _load_run(args, batch_size):
    from keras_transformer.model.transformer import quantized, with_dtype
    from keras_transformer.inference.loading import load_run, run_decoding
    from keras_transformer.inference.translator import Translator

    run_dir = pathlib.Path(args.run)
    weights = args.weights or "final"
    model, tokenizer = load_run(run_dir, None if weights == "final" else weights)
    if args.quantize:
        model = quantized(model, args.quantize)
    if args.dtype and args.dtype != "float32":
        model = with_dtype(model, args.dtype)
    # What is not given is the run's (settings.json), else the paper's.
    decoding = run_decoding(run_dir, beam_size=1 if args.greedy else args.beam_size,
                            alpha=args.alpha, max_extra_length=args.max_extra_length,
                            labels={"beam_size": "--greedy"} if args.greedy else None)
    translator = Translator(model, tokenizer, decoding.options, batch_size=batch_size)
    stored = args.quantize or (args.dtype if args.dtype not in (None, "float32") else None)
    stored = f", {stored} weights" if stored else ""
    return (translator_translate_fn(translator),
            f"{run_dir}, weights {weights}{stored}, {decoding.describe()}")


def run_translate(args):
    _check_options(args)
    if args.model is not None:
        resolve_model_dir(args.model)  # a wrong --model is reported before --input
    _check_output(args)
    source = _open_input(args)
    try:
        interactive = is_interactive(source)
        batch_size, flush = interactive_settings(interactive, args.batch_size)
        # Load before opening the output: a failed start leaves --output untouched.
        if args.model is not None:
            translate_batch, what = _load_saved_model(args)
        else:
            translate_batch, what = _load_run(args, batch_size)
        if not args.quiet:
            mode = ("interactive: one sentence per line, Ctrl-D ends" if interactive
                    else f"batch size {batch_size}")
            sys.stderr.write(f"{PROG} translate: {what}, {mode}\n")
            sys.stderr.flush()
        progress = None if (args.quiet or interactive) else _stderr_progress
        with _open_output(args) as sink:
            for translation, score in translate_batches(
                    translate_batch, _read_lines(source), batch_size=batch_size,
                    progress=progress):
                sink.write(format_line(translation, score, args.scores) + "\n")
                if flush:
                    sink.flush()
    finally:
        if source is not sys.stdin.buffer:
            source.close()
    return 0


def add_parser(commands):
    decoding = DecodingOptions()
    t = commands.add_parser(
        "translate", help="translate lines with an exported SavedModel or a run folder",
        description="Translates one sentence per line (stdin or --input) to one "
                    "translation per line (stdout or --output), with an exported "
                    "SavedModel (--model; needs only tensorflow and tensorflow-text) or "
                    "a training run folder's model (--run). On a terminal each line is "
                    "answered as soon as it is entered.")
    source = t.add_mutually_exclusive_group(required=True)
    source.add_argument("--model",
                        help=f"SavedModel folder {names.EXPORT_ROOT}/<name>/<version> (or "
                             f"{names.EXPORT_ROOT}/<name>: its highest version)")
    source.add_argument("--run", help=f"a training run folder (model.keras, "
                                      f"{names.TOKENIZER_FILE}): translate without exporting")
    t.add_argument("--input", "-i", help="source file (default: stdin)")
    t.add_argument("--output", "-o", help="output file (default: stdout)")
    t.add_argument("--batch-size", type=int, default=32,
                   help="sentences per batch (default 32; 1 on a terminal)")
    t.add_argument("--scores", action="store_true",
                   help="print score<TAB>translation: the length-normalised "
                        "log-probability log P(Y) / lp(Y)")
    search = t.add_mutually_exclusive_group()
    search.add_argument("--beam", action="store_true",
                        help=f"beam search (default): with --model its "
                             f"{names.BEAM_SIGNATURE} signature")
    search.add_argument("--greedy", action="store_true",
                        help="greedy decoding (with --run: --beam-size 1)")
    search.add_argument("--signature", help="with --model: run this signature instead")
    run = t.add_argument_group(
        "decoding with --run (a SavedModel fixed these at export); the defaults are the "
        "run's settings.json (what its test score used), else the paper's")
    run.add_argument("--weights",
                     help="final (model.keras, default), averaged, best, last, "
                          "ckpt-<update> or a .weights.h5 path")
    run.add_argument("--beam-size", type=int,
                     help=f"default the run's, else {decoding.beam_size}; 1 = greedy")
    run.add_argument("--alpha", type=float,
                     help=f"length-penalty strength (default the run's, else "
                          f"{decoding.alpha:g})")
    run.add_argument("--max-extra-length", type=int,
                     help="outputs have at most source length + this many ids (default "
                          f"the run's, else {decoding.max_extra_length})")
    run.add_argument("--quantize", choices=names.KERAS_QUANTIZATIONS,
                     help="decode with int8 weights (Keras' model.quantize on a copy)")
    run.add_argument("--dtype", choices=names.DECODING_DTYPES,
                     help="decode in this dtype, weights and arithmetic (default float32; "
                          "bfloat16: a bf16 copy, keras_transformer.model.transformer.with_dtype)")
    t.add_argument("--quiet", "-q", action="store_true", help="no progress on stderr")
    t.set_defaults(func=run_translate)
    return t
