"""What every sub-command shares: the program name, user errors, quiet start-up."""

import importlib
import logging
import os
import sys

from keras_transformer.files import native_stderr_silenced

PROG = "keras-transformer"


class CommandError(Exception):
    """A user error: printed as `<prog> <command>: error: <message>`, exit status 1."""


def check_decoding_argument(name, value, flag=None):
    """`DecodingOptions.check` of a command's flag: a bad value is a `CommandError`.

    Args:
        name: the decoding argument, e.g. `"beam_size"`.
        value: the value the flag was given.
        flag: how the message names it (default `--<name>` with dashes).

    Raises:
        CommandError: one line naming the flag and the value, e.g.
            `--alpha must be >= 0, received -1`.
    """
    from keras_transformer.model.config import DecodingOptions
    from keras_transformer.training.settings import flag as flag_of

    try:
        DecodingOptions.check(name, value, label=flag or flag_of(name))
    except ValueError as error:
        raise CommandError(str(error)) from None


def say(command, message, *, error=True):
    """Writes the command's one line on stderr: `<command>: [error: ]<message>`.

    Args:
        command: how the user called it (`keras-transformer train`).
    """
    sys.stderr.write(f"{command}: {'error: ' if error else ''}{message}\n")


def quiet_tensorflow(verbose=False):
    """Loads TensorFlow and Keras without their C++ start-up noise on a terminal.

    On a machine without GPU, TensorFlow prints cuInit/cudart and oneDNN
    notices while it is imported, before its log level applies; they go to
    /dev/null here (the import's own Python errors still show). `verbose=True`
    leaves everything as it is. Call it before anything imports Keras.
    """
    if verbose:
        return
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
    with native_stderr_silenced():
        importlib.import_module("keras")  # imports the backend, TensorFlow too
        importlib.import_module("tensorflow")


def setup_logging(verbose=1):
    """Timestamped `keras_transformer` log lines on stderr."""
    level = logging.WARNING if verbose == 0 else logging.INFO
    logger = logging.getLogger("keras_transformer")
    if not any(getattr(h, "_kt_handler", False) for h in logger.handlers):
        handler = logging.StreamHandler(sys.stderr)
        handler.setFormatter(logging.Formatter("%(asctime)s %(message)s", "%Y-%m-%d %H:%M:%S"))
        handler._kt_handler = True
        logger.addHandler(handler)
    logger.setLevel(level)
    logger.propagate = False
    return logger
