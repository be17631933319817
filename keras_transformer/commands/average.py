"""`keras-transformer average`: the mean of a run's last checkpoints (section 6.1)."""

import pathlib

from keras_transformer.commands.common import CommandError, setup_logging


def add_parser(commands):
    p = commands.add_parser(
        "average", help="average a run's last checkpoints",
        description="Writes the mean of a run's last N checkpoints (of its current "
                    "trajectory) to a .weights.h5 file, for evaluate --weights or "
                    "translate --weights.")
    p.add_argument("--run", required=True, help="a training run folder")
    p.add_argument("--last", type=int, default=5, help="checkpoints averaged (default 5)")
    p.add_argument("--output", help="default: <run>/averaged-<first>-<last>.weights.h5")
    p.set_defaults(func=run_average)
    return p


def run_average(args):
    setup_logging()
    from keras_transformer import runs
    from keras_transformer.inference import loading
    from keras_transformer.training.averaging import average_checkpoints

    if args.last < 1:
        raise CommandError(f"--last must be >= 1, received {args.last}")
    run = runs.RunFolder(args.run)
    loading.check_run(run.root)
    checkpoints = run.checkpoints()[-args.last:]
    if not checkpoints:
        raise CommandError(f"{run.checkpoint_dir} holds no ckpt-<update>.weights.h5")
    output = pathlib.Path(args.output) if args.output else \
        run / f"averaged-{checkpoints[0][0]}-{checkpoints[-1][0]}.weights.h5"
    average_checkpoints([p for _, p in checkpoints], output)
    print(output)
    return 0
