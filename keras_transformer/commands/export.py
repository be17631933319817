"""`keras-transformer export`: a run folder as a TF Serving SavedModel."""

import argparse
import pathlib

from keras_transformer.commands.common import CommandError



def _int_list(text):
    try:
        return tuple(int(v) for v in text.split(",") if v.strip())
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"expected comma-separated integers, received {text!r}") from None


def run_export(args):
    # Under JAX or PyTorch, export_from_run exports in a TensorFlow-backend
    # subprocess (the weights are backend-portable).
    from keras_transformer.export import export_from_run

    run_dir = pathlib.Path(args.run)
    if not run_dir.is_dir():
        raise CommandError(f"--run {run_dir} does not exist; expected a training run "
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




def add_parser(commands):
    e = commands.add_parser(
        "export", help="export a run folder for TF Serving",
        description="Exports a training output folder (model.keras and spm.model) "
                    "as a TF Serving SavedModel <export-dir>/<model-name>/<version>/, "
                    "under the TensorFlow backend whatever backend trained it.")
    e.add_argument("--run", required=True, help="training output folder, e.g. runs/demo_tiny")
    e.add_argument("--export-dir", default="saved_models",
                   help="model server base folder (default saved_models)")
    e.add_argument("--model-name", help="the served model's name (default: the run "
                                        "folder's name)")
    e.add_argument("--version", type=int, help="default: the next free version number")
    e.add_argument("--weights", help="export other weights than model.keras': best, last, "
                                     "ckpt-<update> or a .weights.h5 path")
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
    return e
