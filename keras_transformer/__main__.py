"""Command line: translate files with an exported model, export a training run.

    python -m keras_transformer translate --model saved_models/transformer/1 < in.en > out.de
    python -m keras_transformer export --run runs/demo_tiny --export-dir saved_models

`translate` runs the SavedModel's signature (tokenization, beam search and
detokenization are graph ops), one line per sentence, in batches, with
progress on stderr; it needs only TensorFlow and TensorFlow Text, not the
model code. `export` writes a training output folder (`model.keras` and
`spm.model`) as a TF Serving SavedModel, always under the TensorFlow backend
(see `keras_transformer.export`).
"""

import argparse
import pathlib
import sys
import time

PROG = "python -m keras_transformer"


class CommandError(Exception):
    """A user error: printed as `<prog> <command>: error: <message>`, exit status 1."""


# --- translate -------------------------------------------------------------------


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
    expected = ("expected a SavedModel written by `python -m keras_transformer export`: "
                "saved_models/<model_name>/<version>/ with saved_model.pb")
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
    import tensorflow as tf

    try:
        import tensorflow_text  # noqa: F401  (registers the SentencePiece ops)
    except ImportError:
        raise CommandError("tensorflow-text is needed to run the exported tokenizer: "
                           "pip install tensorflow-text") from None
    try:
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
    if "text" not in signature.structured_input_signature[1]:
        raise CommandError(f"signature {signature_name!r} of {model_dir} has no `text` input")
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


def translate_lines(signature, lines, *, batch_size=32, progress=None):
    """Yields one translation (str) per input line (bytes or str), in order.

    Args:
        signature: a loaded `serving_default` or `translate_greedy` signature.
        lines: an iterable of sentences.
        batch_size: sentences per call of the signature.
        progress: `None`, or a callable `progress(done, elapsed_seconds,
            final=False)`, called after each batch and once at the end.
    """
    import tensorflow as tf

    start, done, batch = time.time(), 0, []

    def run(batch):
        outputs = signature(text=tf.constant(batch, tf.string))
        for text in outputs["translation"].numpy():
            # One line per sentence, whatever the model generated.
            yield text.decode("utf-8", "replace").replace("\r", " ").replace("\n", " ")

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


def _stderr_progress(done, elapsed, final=False):
    rate = done / elapsed if elapsed > 0 else 0.0
    end = "\n" if final else "\r"
    sys.stderr.write(f"translated {done} sentences in {elapsed:.1f} s "
                     f"({rate:.1f} sentences/s){end}")
    sys.stderr.flush()


def run_translate(args):
    if args.batch_size < 1:
        raise CommandError(f"--batch-size must be positive, received {args.batch_size}")
    model_dir = resolve_model_dir(args.model)
    signature_name = args.signature or ("translate_greedy" if args.greedy
                                        else "serving_default")
    signature = load_signature(model_dir, signature_name)
    if args.input and args.input != "-":
        path = pathlib.Path(args.input)
        if not path.is_file():
            raise CommandError(f"--input {path} does not exist")
        source = open(path, "rb")
    else:
        source = sys.stdin.buffer
    if args.output and args.output != "-":
        out_path = pathlib.Path(args.output)
        if out_path.parent and not out_path.parent.is_dir():
            raise CommandError(f"--output folder {out_path.parent} does not exist")
        sink = open(out_path, "w", encoding="utf-8", newline="\n")
    else:
        sink = open(sys.stdout.fileno(), "w", encoding="utf-8", newline="\n", closefd=False)
    if not args.quiet:
        sys.stderr.write(f"{PROG} translate: {model_dir}, signature {signature_name}, "
                         f"batch size {args.batch_size}\n")
    progress = None if args.quiet else _stderr_progress
    try:
        for translation in translate_lines(signature, _read_lines(source),
                                           batch_size=args.batch_size, progress=progress):
            sink.write(translation + "\n")
    finally:
        if source is not sys.stdin.buffer:
            source.close()
        sink.close()
    return 0


# --- export ------------------------------------------------------------------------


def _int_list(text):
    try:
        return tuple(int(v) for v in text.split(",") if v.strip())
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"expected comma-separated integers, received {text!r}") from None


def run_export(args):
    # Under JAX or PyTorch, export_from_run re-runs this command in a
    # TensorFlow-backend subprocess (the weights are backend-portable).
    from keras_transformer.export import export_from_run

    run_dir = pathlib.Path(args.run)
    if not run_dir.is_dir():
        raise CommandError(f"--run {run_dir} does not exist; expected a training output "
                           "folder with model.keras and spm.model")
    try:
        path = export_from_run(
            run_dir, args.export_dir, model_name=args.model_name, version=args.version,
            weights=args.weights, beam_size=args.beam_size, alpha=args.alpha,
            max_source_length=args.max_source_length,
            max_extra_length=args.max_extra_length, batch_buckets=args.batch_buckets,
            length_buckets=args.length_buckets or None, overwrite=args.overwrite,
            verbose=not args.quiet)
    except (FileNotFoundError, FileExistsError, ValueError, RuntimeError) as error:
        raise CommandError(str(error)) from None
    print(path)
    return 0


# --- parser ------------------------------------------------------------------------


def build_parser():
    parser = argparse.ArgumentParser(prog=PROG, description=__doc__.split("\n\n")[0])
    commands = parser.add_subparsers(dest="command", required=True)

    t = commands.add_parser(
        "translate", help="translate lines with an exported SavedModel",
        description="Translates one sentence per line (stdin or --input) to one "
                    "translation per line (stdout or --output), with an exported "
                    "SavedModel. Needs only tensorflow and tensorflow-text.")
    t.add_argument("--model", required=True,
                   help="SavedModel folder saved_models/<name>/<version> (or "
                        "saved_models/<name>: its highest version)")
    t.add_argument("--input", "-i", help="source file (default: stdin)")
    t.add_argument("--output", "-o", help="output file (default: stdout)")
    t.add_argument("--batch-size", type=int, default=32,
                   help="sentences per signature call (default 32)")
    search = t.add_mutually_exclusive_group()
    search.add_argument("--beam", action="store_true",
                        help="beam search, the export's beam size (default)")
    search.add_argument("--greedy", action="store_true", help="greedy decoding")
    search.add_argument("--signature", help="run this signature instead")
    t.add_argument("--quiet", "-q", action="store_true", help="no progress on stderr")
    t.set_defaults(func=run_translate)

    e = commands.add_parser(
        "export", help="export a training output folder for TF Serving",
        description="Exports a training output folder (model.keras and spm.model) "
                    "as a TF Serving SavedModel <export-dir>/<model-name>/<version>/, "
                    "under the TensorFlow backend whatever backend trained it.")
    e.add_argument("--run", required=True, help="training output folder, e.g. runs/demo_tiny")
    e.add_argument("--export-dir", default="saved_models",
                   help="model server base folder (default saved_models)")
    e.add_argument("--model-name", default="transformer", help="default transformer")
    e.add_argument("--version", type=int, help="default: the next free version number")
    e.add_argument("--weights", help="a .weights.h5 file to export instead of model.keras' "
                                     "weights (e.g. averaged.weights.h5)")
    e.add_argument("--beam-size", type=int, default=4, help="default 4")
    e.add_argument("--alpha", type=float, default=0.6, help="default 0.6")
    e.add_argument("--max-source-length", type=int,
                   help="source ids kept, EOS included (default: config.max_length)")
    e.add_argument("--max-extra-length", type=int, default=50, help="default 50")
    e.add_argument("--batch-buckets", type=_int_list, default=(1, 8, 32),
                   help="traced batch sizes, comma-separated (default 1,8,32)")
    e.add_argument("--length-buckets", type=_int_list,
                   help="traced source widths (default: 16, 32, ... up to "
                        "max-source-length)")
    e.add_argument("--overwrite", action="store_true", help="replace an existing version")
    e.add_argument("--quiet", "-q", action="store_true")
    e.set_defaults(func=run_export)
    return parser


def main(argv=None):
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        return args.func(args)
    except CommandError as error:
        sys.stderr.write(f"{PROG} {args.command}: error: {error}\n")
        return 1
    except KeyboardInterrupt:
        return 130
    except BrokenPipeError:  # e.g. `| head`
        return 0


if __name__ == "__main__":
    sys.exit(main())
