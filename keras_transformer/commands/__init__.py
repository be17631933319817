"""The `keras-transformer` command (also `python -m keras_transformer`).

    keras-transformer prepare --data ../shared/data/multi30k --preset small
    keras-transformer train --data demo --preset tiny
    keras-transformer train --output-dir runs/demo_tiny --train-steps 1000   # continue
    keras-transformer evaluate --run runs/demo_tiny --data demo
    keras-transformer average --run runs/demo_tiny --last 3
    keras-transformer translate --run runs/demo_tiny < in.en > out.de
    keras-transformer export --run runs/demo_tiny

Each sub-command lives in its own module of this package; this one only
dispatches and turns user errors into one line on stderr.
"""

import argparse
import os
import sys

import keras_transformer
from keras_transformer.commands import (average, evaluate, export, prepare, train,
                                        translate)
from keras_transformer.commands.common import PROG, CommandError, quiet_tensorflow, say

COMMANDS = (prepare, train, evaluate, average, translate, export)


def build_parser():
    parser = argparse.ArgumentParser(prog=PROG, description=__doc__.split("\n\n")[0])
    parser.add_argument("--version", action="version",
                        version=f"%(prog)s {keras_transformer.__version__}")
    commands = parser.add_subparsers(dest="command", required=True)
    for module in COMMANDS:
        module.add_parser(commands)
    return parser


def _user_errors():
    """Exceptions that mean "the input is wrong", shown as one line."""
    from keras_transformer.data.readers import CorpusError
    from keras_transformer.runs import RunError
    from keras_transformer.training.settings import SettingsError

    # OSError: a file that cannot be read or written (a full disk, no
    # permission) is named with its reason, never shown as a traceback.
    return (CommandError, SettingsError, RunError, CorpusError, OSError)


def main(argv=None, prog=PROG):
    """Runs one sub-command; returns the exit status (1 for a user error)."""
    parser = build_parser()
    argv = sys.argv[1:] if argv is None else list(argv)
    if prog == PROG:
        args = parser.parse_args(argv)
    else:  # a script wrapping one sub-command, e.g. examples/wmt_ende.py
        subcommands = next(a for a in parser._actions
                           if isinstance(a, argparse._SubParsersAction))
        command = subcommands.choices[argv[0]]
        command.prog = prog
        args = command.parse_args(argv[1:])
        args.command = ""
    quiet_tensorflow(verbose=getattr(args, "verbose", 1) == 2)
    args.called_as = " ".join(filter(None, (prog, args.command)))
    try:
        return args.func(args)
    except _user_errors() as error:
        if os.environ.get("KT_TRACEBACK"):
            raise
        say(args.called_as, str(error).strip() or type(error).__name__)
        return 1
    except KeyboardInterrupt:
        return 130
    except BrokenPipeError:  # e.g. `| head`
        return 0
