"""Loading a run for inference, and weights or states into a model.

Evaluation, translation, the exports and `--init-from` load a run folder's
model and vocabulary through `load_run`; `resolve_weights` turns the names
users pass (`final`, `averaged`, `best`, `last`, `ckpt-<update>`, a path)
into files. `load_model_weights` reads only a model's weights (optimizer
state ignored), `load_state` a state file's weights and optimizer into a
compiled model for resuming. A damaged file is a `RunError` naming it.
`run_decoding` is how a run decodes unless told otherwise: the beam size,
alpha and length limit its `settings.json` records (what its test BLEU and
its own export used), else the paper's (`DecodingOptions()`).
"""

import dataclasses
import pathlib

import numpy as np

from keras_transformer import run_vocabulary
from keras_transformer.model.config import DecodingOptions
from keras_transformer.runs import (AVERAGED_FILE, BEST_FILE, CHECKPOINT_DIR, CONFIG_FILE,
                                    DECODING_SETTINGS, MODEL_FILE, SETTINGS_FILE,
                                    TOKENIZER_FILE, VOCABULARY_INFO_FILE, RunError,
                                    RunFolder, check_state_file)

# Where a decoding value came from, as `RunDecoding.describe` says it.
FROM_RUN = "the run's settings"
FROM_PAPER = "the paper's default"
_LABELS = {"beam_size": "beam", "alpha": "alpha", "max_extra_length": "max extra length"}


@dataclasses.dataclass(frozen=True)
class RunDecoding:
    """The decoding a command uses with a run, and where each value came from.

    Attributes:
        values: `{name: value}` for `beam_size`, `alpha` and
            `max_extra_length`; a value may be a list where the caller gave
            several (`evaluate --beam-sizes 1 4`).
        sources: `{name: where}`: the flag (or argument) that gave it,
            `FROM_RUN` or `FROM_PAPER`.
        note: why the paper's defaults apply, when the run records none.
    """

    values: dict
    sources: dict
    note: str = ""

    @property
    def options(self):
        """The `DecodingOptions` of these values (each a single value)."""
        return DecodingOptions(**self.values)

    def describe(self):
        """One phrase for a command's stderr line, e.g.

        `beam 4, alpha 1.0, max extra length 50 (the run's settings)`, or
        `beam 4 (the run's settings), alpha 0.6 (--alpha), max extra length
        50 (the run's settings)`.
        """
        def shown(name, value):
            values = value if isinstance(value, (list, tuple)) else [value]
            if name == "beam_size" and list(values) == [1]:
                return "greedy"
            return f"{_LABELS[name]} {' or '.join(str(v) for v in values)}"

        parts = [shown(name, self.values[name]) for name in DECODING_SETTINGS]
        sources = [self.sources[name] for name in DECODING_SETTINGS]
        if len(set(sources)) > 1:
            return ", ".join(f"{part} ({where})" for part, where in zip(parts, sources))
        where = sources[0]
        if where == FROM_PAPER:
            where = "the paper's defaults" + (f": {self.note}" if self.note else "")
        return f"{', '.join(parts)} ({where})"


def run_decoding(run_dir, *, beam_size=None, alpha=None, max_extra_length=None, labels=None):
    """How a run decodes: the values given, else the run's settings, else the paper's.

    The one place that reads a run's decoding defaults, for `export --run`,
    `translate --run`, `evaluate` and `export_from_run`: the `beam_size`,
    `alpha` and `max_extra_length` that `settings.json` records (the
    job's test score and export used them), read as JSON keys; a value the
    run does not record is `DecodingOptions()`' (the paper's).

    Args:
        run_dir: a run folder.
        beam_size, alpha, max_extra_length: given values (`None`: not
            given); a list stands for several (one row each in `evaluate`).
        labels: `{name: how the caller was given it}` for `describe`
            (default the flag, `--beam-size`, `--alpha`, `--max-extra-length`).

    Returns:
        A `RunDecoding`.

    Raises:
        RunError: `settings.json` is damaged, or records a value that is not
            a decoding value (`alpha` -1).
    """
    run = RunFolder(run_dir)
    recorded = run.recorded_decoding()
    given = dict(beam_size=beam_size, alpha=alpha, max_extra_length=max_extra_length)
    labels = labels or {}
    values, sources = {}, {}
    for name in DECODING_SETTINGS:
        if given[name] is not None:
            values[name] = given[name]
            sources[name] = labels.get(name, "--" + name.replace("_", "-"))
        elif name in recorded:
            try:
                values[name] = DecodingOptions.check(name, recorded[name])
            except ValueError as error:
                raise RunError(f"{run.settings_file} is damaged: {error}; correct it, or "
                               f"give the value (--{name.replace('_', '-')})") from None
            sources[name] = FROM_RUN
        else:
            values[name] = getattr(DecodingOptions, name)
            sources[name] = FROM_PAPER
        if name == "alpha" and not isinstance(values[name], (list, tuple)):
            values[name] = float(values[name])  # 1 in the JSON is alpha 1.0
    note = ""
    if not recorded:
        note = (f"{run.settings_file} records no decoding settings"
                if run.settings_file.is_file() else f"the run has no {SETTINGS_FILE}")
    return RunDecoding(values, sources, note)


def check_run(run_dir):
    """The tokenizer, model.keras and config.json paths of a run folder; raises if unusable."""
    run_dir = pathlib.Path(run_dir)
    if not run_dir.is_dir():
        raise FileNotFoundError(
            f"run folder not found: {run_dir} (expected the --output-dir of a "
            f"training run, with {TOKENIZER_FILE} and {CONFIG_FILE} or {MODEL_FILE})")
    spm = run_dir / TOKENIZER_FILE
    if not spm.is_file() and not (run_dir / VOCABULARY_INFO_FILE).is_file():
        raise FileNotFoundError(f"{run_dir} has no {TOKENIZER_FILE} (the SentencePiece "
                                "model a training run writes)")
    keras_file, config_file = run_dir / MODEL_FILE, run_dir / CONFIG_FILE
    if not keras_file.is_file() and not config_file.is_file():
        raise FileNotFoundError(
            f"{run_dir} has neither {MODEL_FILE} nor {CONFIG_FILE}; expected the "
            "--output-dir of a training run")
    return spm, keras_file, config_file


def resolve_weights(run_dir, name):
    """Path of the weights called `name` in a run folder.

    `"final"` is the weights of `model.keras` (`None` is returned: load the
    model as saved), `"averaged"` is `averaged.weights.h5`, `"best"` the
    best validation BLEU's weights, `"last"` the newest checkpoint,
    `"ckpt-<update>"` that checkpoint; anything else is taken as a path to a
    `.weights.h5` file.
    """
    run = RunFolder(run_dir)
    checkpoints = run.checkpoints()
    if name == "final":
        if not run.model_file.is_file():
            raise FileNotFoundError(f"{run.model_file} not found: the run has not "
                                    "finished; use last, ckpt-<update> or best")
        return None
    if name == "averaged":
        path = run / AVERAGED_FILE
    elif name == "best":
        path = run / BEST_FILE
    elif name == "last":
        if not checkpoints:
            raise FileNotFoundError(f"no {CHECKPOINT_DIR}/ckpt-*.weights.h5 in {run_dir}")
        path = checkpoints[-1][1]
    elif name.startswith("ckpt-") and not name.endswith(".h5"):
        path = run.checkpoint_path(name[len("ckpt-"):])
    else:
        path = pathlib.Path(name)
    if not path.exists():
        available = ", ".join(f"ckpt-{step}" for step, _ in checkpoints) or "none"
        raise FileNotFoundError(
            f"weights {name!r} not found ({path}); use final, averaged, best, last, "
            f"ckpt-<update> (checkpoints in {run_dir}: {available}) or a .weights.h5 path")
    return path


def load_run(run_dir, weights=None):
    """Model and tokenizer of a run folder, for inference.

    Args:
        run_dir: a training run's folder.
        weights: `None` (or `"final"`) for the final model (`model.keras`; an
            unfinished run: its config with the newest checkpoint), a name
            that `resolve_weights` understands, or a `.weights.h5` path.

    Returns:
        `(model, tokenizer)`; the model is not compiled.
    """
    from keras_transformer.model.transformer import build_model

    spm, keras_file, config_file = check_run(run_dir)
    run = RunFolder(run_dir)
    tokenizer = run_vocabulary.load(run)
    if weights is not None:
        weights = resolve_weights(run_dir, str(weights))
    if keras_file.is_file() and (weights is None or not config_file.is_file()):
        model = load_keras_file(keras_file)
    else:
        model = build_model(run.read_config())
        if weights is None:
            saved = pathlib.Path(run_dir) / "model.weights.h5"
            weights = saved if saved.is_file() else resolve_weights(run_dir, "last")
    if weights is not None:
        weights = pathlib.Path(weights)
        if not weights.is_file():
            raise FileNotFoundError(f"weights file not found: {weights}")
        load_model_weights(model, weights)
    return model, tokenizer


def load_keras_file(path):
    """`keras.saving.load_model(path, compile=False)`; a damaged file is a `RunError`."""
    import importlib
    import zipfile

    import keras

    # Registers the classes the file names.
    importlib.import_module("keras_transformer.model.transformer")

    path = pathlib.Path(path)
    try:
        with zipfile.ZipFile(path) as archive:
            bad = archive.testzip()  # reads every member, checking its CRC
        if bad is not None:
            raise ValueError(f"member {bad} fails its CRC check")
        return keras.saving.load_model(path, compile=False)
    except (zipfile.BadZipFile, OSError, ValueError, KeyError, TypeError, EOFError) as error:
        message = str(error).splitlines()[0] if str(error) else type(error).__name__
        raise RunError(
            f"{path} is damaged ({message}); translate or export other weights of the "
            "run (--weights last, averaged, best or ckpt-<update>), or move it aside and "
            f"re-run `keras-transformer train --output-dir {path.parent}` to write it "
            "again from the run's checkpoints") from None


def load_model_weights(model, path):
    """Loads only the model's weights from a `.weights.h5` file (optimizer state ignored).

    Works for files written by a compiled model (which also hold the
    optimizer's variables) into a model that is not compiled, or whose
    optimizer must start fresh (`--init-from`).
    """
    from keras_transformer.model.transformer import build_model

    path = str(path)
    check_state_file(path)
    source = build_model(model.config)
    try:
        source.load_weights(path, skip_mismatch=False)
    except ValueError as error:
        raise RunError(f"{path} does not fit this model: {str(error).splitlines()[0]}") \
            from None
    model.set_weights(source.get_weights())
    return model


def load_state(model, path, update):
    """Loads a state file (weights + optimizer) into a compiled model; returns its update.

    Keras loads the optimizer's variables by position and silently skips them
    when their number differs, which happens when `grad_accum_steps` changed
    between the run that saved the state and this one (accumulation adds one
    gradient accumulator per weight). Then Adam's moments and velocities (the
    last variables) are copied by role, the micro-batch counter (the first)
    is set to `update` times this run's accumulation steps, and the
    accumulators start at zero, as they do at every update.

    Args:
        model: the compiled model.
        path: a state file of `update` (a backup or checkpoint).
        update: the optimizer update the file holds (from its name).

    Raises:
        RunError: the file's optimizer state does not fit this optimizer.
    """
    import warnings

    import h5py

    optimizer = model.optimizer
    optimizer.build(model.trainable_variables)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        model.load_weights(str(path))
    skipped = any("Skipping variable loading for optimizer" in str(w.message) for w in caught)
    if skipped:
        with h5py.File(path, "r") as handle:
            group = handle["optimizer/vars"] if "optimizer/vars" in handle else {}
            saved = [group[str(i)][()] for i in range(len(group))]
        current = optimizer.variables
        moments = 2 * len(model.trainable_variables)
        fits = (len(saved) > moments and len(current) > moments
                and current[0].path.endswith("iteration")
                and all(tuple(v.shape) == a.shape
                        for v, a in zip(current[-moments:], saved[-moments:])))
        if not fits:
            raise RunError(f"{path}: its optimizer state ({len(saved)} variables) does not "
                           f"fit this run's optimizer ({len(current)} variables)")
        current[0].assign(update * (optimizer.gradient_accumulation_steps or 1))
        for variable, value in zip(current[-moments:], saved[-moments:]):
            variable.assign(value)
        for variable in current[1:-moments]:
            variable.assign(np.zeros(variable.shape, variable.dtype))
    return int(np.asarray(optimizer.iterations))
