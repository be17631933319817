"""The run folder: its layout, what it holds, and how a run is resumed from it.

One module owns the folder a training run writes, so that training,
evaluation, translation and export agree on its names (fairseq's
`checkpoint_utils`, OpenNMT-tf's `model_dir`):

    <run>/
      settings.json          the resolved settings (`keras_transformer.settings`)
      config.json            the model's `TransformerConfig`
      spm.model              the shared SentencePiece vocabulary
      backup/                state-<update>.weights.h5: weights + optimizer, for resuming
      checkpoints/           ckpt-<update>.weights.h5: the last K, for averaging
      */rolled_back/         files of an abandoned trajectory (never averaged or resumed)
      */damaged/             unreadable state files, set aside when the run fell back
      best.weights.h5        the weights of the best validation BLEU (+ best.json)
      averaged.weights.h5    the average of the last K checkpoints
      model.keras            the final model (the `final_weights` setting)
      training_log.csv       one row per logged update; validation columns when measured
      training_log.rolled_back.csv  rows of an abandoned trajectory
      tensorboard/           the same scalars for TensorBoard
      training.png, test.hyp.de, results.json
      .lock                  held by the process training in the folder

A state file (backup or checkpoint) is a `model.save_weights` file of the
compiled model, so it also holds the optimizer's variables (its update
count included): the learning-rate schedule and Adam's moments continue
where they stopped. Files are written under a temporary name and renamed, so
a killed process leaves no half-written file under a state name; a file
damaged afterwards is detected when read: the run falls back to the newest
readable state, naming the damaged file and moving it to `damaged/`, or,
when none is readable, stops with a message and changes nothing.
"""

import contextlib
import csv
import dataclasses
import hashlib
import json
import logging
import os
import pathlib
import re
import socket

import numpy as np

SETTINGS_FILE = "settings.json"
CONFIG_FILE = "config.json"
TOKENIZER_FILE = "spm.model"
MODEL_FILE = "model.keras"
AVERAGED_FILE = "averaged.weights.h5"
BEST_FILE = "best.weights.h5"
BEST_INFO_FILE = "best.json"
RESULTS_FILE = "results.json"
LOG_FILE = "training_log.csv"
ROLLED_BACK_LOG_FILE = "training_log.rolled_back.csv"
PLOT_FILE = "training.png"
BACKUP_DIR = "backup"
CHECKPOINT_DIR = "checkpoints"
ROLLED_BACK_DIR = "rolled_back"
DAMAGED_DIR = "damaged"
LOCK_FILE = ".lock"
TENSORBOARD_DIR = "tensorboard"

_CHECKPOINT_PATTERN = re.compile(r"^ckpt-(\d+)\.weights\.h5$")
_BACKUP_PATTERN = re.compile(r"^state-(\d+)\.weights\.h5$")

logger = logging.getLogger("keras_transformer")


class RunError(Exception):
    """A run folder that cannot be used as asked; the message says why and what to do."""


def hypotheses_file(split):
    """The run folder's translations of `split` by the job's final scoring (`test.hyp.de`)."""
    return f"{split}.hyp.de"


def _numbered(directory, pattern):
    directory = pathlib.Path(directory)
    if not directory.is_dir():
        return []
    found = []
    for path in directory.iterdir():
        match = pattern.match(path.name)
        if match and path.is_file():
            found.append((int(match.group(1)), path))
    return sorted(found)


def list_checkpoints(directory):
    """`(update, path)` pairs of `ckpt-<update>.weights.h5` files, oldest first."""
    return [(step, str(path)) for step, path in _numbered(directory, _CHECKPOINT_PATTERN)]


def write_atomically(path, write):
    """Calls `write(temporary_path)` then renames the result to `path`."""
    path = pathlib.Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    partial = path.with_name(f".partial-{path.name}")
    write(str(partial))
    os.replace(partial, path)
    return path


def file_sha256(path):
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        for block in iter(lambda: handle.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def find_run_dir(path):
    """The run folder holding `path` (itself or a parent with `spm.model`), or None."""
    path = pathlib.Path(path).resolve()
    for candidate in [path] + list(path.parents)[:3]:
        if candidate.is_dir() and (candidate / TOKENIZER_FILE).is_file():
            return candidate
    return None


def check_state_file(path):
    """Raises `RunError` naming `path` unless it is a readable Keras weights file."""
    import h5py

    try:
        with h5py.File(path, "r") as handle:
            if "layers" not in handle and "_layer_checkpoint_dependencies" not in handle:
                names = list(handle.keys())
                raise OSError(f"no model weights in it (top-level groups {names})")
            # Reading every dataset catches truncation inside the file.
            handle.visititems(lambda name, obj: obj[()] if isinstance(obj, h5py.Dataset)
                              else None)
    except (OSError, KeyError, ValueError, RuntimeError) as error:
        raise RunError(f"{path} is unreadable ({str(error).splitlines()[0]})") from None


@dataclasses.dataclass
class RunFolder:
    """Paths and bookkeeping of one run folder; creates nothing until written to.

    Args:
        root: the folder (`--output-dir`).
    """

    root: pathlib.Path

    def __post_init__(self):
        self.root = pathlib.Path(self.root)

    def __truediv__(self, name):
        return self.root / name

    # --- files ---------------------------------------------------------------

    @property
    def tokenizer_file(self):
        return self.root / TOKENIZER_FILE

    @property
    def settings_file(self):
        return self.root / SETTINGS_FILE

    @property
    def config_file(self):
        return self.root / CONFIG_FILE

    @property
    def model_file(self):
        return self.root / MODEL_FILE

    @property
    def checkpoint_dir(self):
        return self.root / CHECKPOINT_DIR

    @property
    def backup_dir(self):
        return self.root / BACKUP_DIR

    @property
    def log_file(self):
        return self.root / LOG_FILE

    @property
    def results_file(self):
        return self.root / RESULTS_FILE

    def exists(self):
        return self.root.is_dir()

    def checkpoints(self):
        """`(update, path)` of this trajectory's checkpoints, oldest first."""
        return _numbered(self.checkpoint_dir, _CHECKPOINT_PATTERN)

    def backups(self):
        """`(update, path)` of the backups, oldest first."""
        return _numbered(self.backup_dir, _BACKUP_PATTERN)

    def backup_path(self, update):
        return self.backup_dir / f"state-{update}.weights.h5"

    def checkpoint_path(self, update):
        return self.checkpoint_dir / f"ckpt-{update}.weights.h5"

    @contextlib.contextmanager
    def lock(self):
        """Holds `<run>/.lock` while a process trains in the folder.

        A second `train` on the same folder would interleave its backups,
        checkpoints and log rows with the first one's; it is refused instead.
        The lock (`fcntl.flock`) is released by the kernel when its process
        ends, `kill -9` included, so a crash never leaves a stale lock.
        """
        try:
            import fcntl
        except ImportError:  # not POSIX: no lock
            yield
            return
        self.root.mkdir(parents=True, exist_ok=True)
        path = self.root / LOCK_FILE
        handle = open(path, "a+")
        try:
            try:
                fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except OSError:
                handle.seek(0)
                owner = handle.read().strip() or "another process"
                raise RunError(f"{self.root} is in use: {owner} is training in it. Wait for "
                               "it to finish or stop it, or use another --output-dir") from None
            handle.seek(0)
            handle.truncate()
            handle.write(f"process {os.getpid()} on {socket.gethostname()}\n")
            handle.flush()
            yield
        finally:
            handle.close()  # releases the lock

    def tokenizer_hash(self):
        return file_sha256(self.tokenizer_file) if self.tokenizer_file.is_file() else None

    # --- settings and config -------------------------------------------------

    def read_json(self, name):
        path = self.root / name
        if not path.is_file():
            return None
        try:
            return json.loads(path.read_text())
        except ValueError as error:
            raise RunError(f"{path} is not valid JSON ({error}); restore it or start "
                           "a new --output-dir") from None

    def write_json(self, name, values):
        text = json.dumps(values, indent=2, sort_keys=False) + "\n"
        return write_atomically(self.root / name,
                                lambda tmp: pathlib.Path(tmp).write_text(text))

    def read_config(self):
        from keras_transformer.config import TransformerConfig

        values = self.read_json(CONFIG_FILE)
        return None if values is None else TransformerConfig.from_dict(values)

    # --- resuming ------------------------------------------------------------

    def state_files(self):
        """Every file a run can resume from, newest update first.

        Backups come before checkpoints of the same update. Returns
        `(update, path)` pairs.
        """
        files = [(step, 1, path) for step, path in self.backups()]
        files += [(step, 0, path) for step, path in self.checkpoints()]
        return [(step, path) for step, _, path in sorted(files, reverse=True)]

    def latest_state(self, say=None):
        """The newest readable state file: `(update, path)`, or `(0, None)` for none.

        Unreadable files newer than it are reported (`say`, default the log)
        and moved to a `damaged/` folder beside them, never deleted. When
        state files exist but none is readable, the run cannot continue
        without losing its training, so this raises `RunError` and moves
        nothing: the user decides.
        """
        say = say or logger.warning
        damaged = []
        for step, path in self.state_files():
            try:
                check_state_file(path)
            except RunError as error:
                damaged.append((path, str(error)))
                continue
            for bad, problem in damaged:
                target = bad.parent / DAMAGED_DIR / bad.name
                target.parent.mkdir(exist_ok=True)
                os.replace(bad, target)
                say(f"{problem}; moved it to {target}.")
            if damaged:
                say(f"Falling back to {path} (update {step}), the newest readable state.")
            return step, path
        if damaged:
            raise RunError(
                f"no readable backup or checkpoint in {self.root}: "
                f"{'; '.join(problem for _, problem in damaged)}. Nothing was changed. "
                f"Move the damaged file(s) aside to train {self.root} again from update 0, "
                "or fine-tune other weights with --init-from in a new --output-dir")
        return 0, None

    def roll_back_to(self, update, say=None):
        """Sets aside what an abandoned trajectory wrote after `update`.

        Checkpoints and backups newer than `update` move to a `rolled_back/`
        folder beside them, log rows after it to
        `training_log.rolled_back.csv`, and a best validation BLEU reached
        after it to `rolled_back/`; nothing is deleted. Called before
        training resumes from `update`, so that averaging, the log and the
        best weights only see this trajectory.
        """
        say = say or logger.info
        moved = []
        for step, path in self.checkpoints() + self.backups():
            if step > update:
                target = path.parent / ROLLED_BACK_DIR / path.name
                target.parent.mkdir(exist_ok=True)
                os.replace(path, target)
                moved.append(str(target))
        best = self.read_json(BEST_INFO_FILE)
        if best is not None and best.get("update", 0) > update:
            for name in (BEST_FILE, BEST_INFO_FILE):
                if (self.root / name).exists():
                    target = self.checkpoint_dir / ROLLED_BACK_DIR / name
                    target.parent.mkdir(parents=True, exist_ok=True)
                    os.replace(self.root / name, target)
                    moved.append(str(target))
        if moved:
            say(f"Set aside {len(moved)} file(s) of updates after {update} (another "
                f"trajectory): {', '.join(moved)}")
        dropped = roll_back_log(self.log_file, self.root / ROLLED_BACK_LOG_FILE, update)
        if dropped:
            say(f"Moved {dropped} log row(s) after update {update} to "
                f"{ROLLED_BACK_LOG_FILE}")


def roll_back_log(log_file, rolled_back_file, update):
    """Keeps the rows of `log_file` up to `update`, appends the others to `rolled_back_file`."""
    log_file = pathlib.Path(log_file)
    if not log_file.is_file():
        return 0
    with open(log_file, newline="") as handle:
        reader = csv.DictReader(handle)
        fields, rows = reader.fieldnames, list(reader)
    if not fields or "step" not in fields:
        return 0
    keep = [r for r in rows if r["step"] and int(float(r["step"])) <= update]
    drop = [r for r in rows if r not in keep]
    if not drop:
        return 0
    rolled_back_file = pathlib.Path(rolled_back_file)
    new_file = not rolled_back_file.is_file()
    with open(rolled_back_file, "a", newline="") as handle:
        writer = csv.DictWriter(handle, fieldnames=fields)
        if new_file:
            writer.writeheader()
        writer.writerows(drop)

    def write(tmp):
        with open(tmp, "w", newline="") as handle:
            writer = csv.DictWriter(handle, fieldnames=fields)
            writer.writeheader()
            writer.writerows(keep)

    write_atomically(log_file, write)
    return len(drop)


# --- loading a run for evaluation, translation and export -----------------------


def check_run(run_dir):
    """The tokenizer, model.keras and config.json paths of a run folder; raises if unusable."""
    run_dir = pathlib.Path(run_dir)
    if not run_dir.is_dir():
        raise FileNotFoundError(
            f"run folder not found: {run_dir} (expected the --output-dir of a "
            f"training run, with {TOKENIZER_FILE} and {CONFIG_FILE} or {MODEL_FILE})")
    spm = run_dir / TOKENIZER_FILE
    if not spm.is_file():
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
    import keras

    from keras_transformer.config import TransformerConfig
    from keras_transformer.data.tokenizer import Tokenizer
    from keras_transformer.model import build_model

    spm, keras_file, config_file = check_run(run_dir)
    if weights is not None:
        weights = resolve_weights(run_dir, str(weights))
    if keras_file.is_file():
        model = keras.saving.load_model(keras_file, compile=False)
    else:
        model = build_model(TransformerConfig.from_dict(json.loads(config_file.read_text())))
        if weights is None:
            saved = pathlib.Path(run_dir) / "model.weights.h5"
            weights = saved if saved.is_file() else resolve_weights(run_dir, "last")
    if weights is not None:
        weights = pathlib.Path(weights)
        if not weights.is_file():
            raise FileNotFoundError(f"weights file not found: {weights}")
        load_model_weights(model, weights)
    return model, Tokenizer.load(spm)


def load_model_weights(model, path):
    """Loads only the model's weights from a `.weights.h5` file (optimizer state ignored).

    Works for files written by a compiled model (which also hold the
    optimizer's variables) into a model that is not compiled, or whose
    optimizer must start fresh (`--init-from`).
    """
    from keras_transformer.model import build_model

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
