"""`keras-transformer train`: the whole job, resumable (see `keras_transformer.training.job`)."""

from keras_transformer.commands.common import say, setup_logging
from keras_transformer.training.settings import add_arguments, given_from_args

DESCRIPTION = (
    "Trains, averages, tests and exports a Transformer in a run folder. Re-running "
    "the same command continues the run from its newest backup; a larger "
    "--train-steps continues a finished run; --init-from fine-tunes other weights. "
    "Settings come from the preset, the run folder's settings.json, --config FILE "
    "and the flags, in that order.")


def add_parser(commands):
    parser = commands.add_parser("train", help="train a model in a run folder (resumable)",
                                 description=DESCRIPTION)
    add_arguments(parser)
    parser.set_defaults(func=run_train)
    return parser


def run_train(args):
    given, model, config_file = given_from_args(args)
    setup_logging(given.get("verbose", 1))
    from keras_transformer.training import job
    from keras_transformer.training.settings import load_settings
    from keras_transformer.training.stops import Stopped

    try:
        job.train(load_settings(given, model, config_file))
    except Stopped as stop:
        # A signal is not an error: the run stopped where it says, resumable;
        # exit status 128 + its number. A diverged run is (exit status 1).
        say(args.called_as, str(stop), error=stop.outcome.kind == "diverged")
        return stop.outcome.exit_status
    return 0

