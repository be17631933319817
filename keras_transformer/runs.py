"""The run folder: its layout, what it holds, and how a run is resumed from it.

One module owns the folder a training run writes, so that training,
evaluation, translation and export agree on its names (fairseq's
`checkpoint_utils`, OpenNMT-tf's `model_dir`):

    <run>/
      settings.json          the resolved settings (`keras_transformer.training.settings`)
      config.json            the model's `TransformerConfig`
      spm.model              the shared SentencePiece vocabulary
      vocabulary.json        its sha256 and the prepared corpus it was copied from
      backup/                state-<update>.weights.h5: weights + optimizer, for resuming
      checkpoints/           ckpt-<update>.weights.h5: the last K, for averaging
      */rolled_back/         files of an abandoned trajectory (never averaged or resumed)
      */damaged/             unreadable state files, set aside when the run fell back
      damaged/spm.model      a damaged vocabulary, set aside when it was restored
      best.weights.h5        model weights only, of the best validation BLEU (+ best.json)
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

Every file is written through `keras_transformer.files` (atomic, made in
memory, a `WriteError` naming what failed), and whatever a rollback or a
fallback moves aside goes to `rolled_back/` or `damaged/` under a name not
yet taken (`files.set_aside`): nothing is deleted or overwritten. The files
a command reads (`config.json`, `settings.json`, `best.json`) are checked as
they are read: a damaged one is a `RunError` naming it. The run's
vocabulary is looked after by `keras_transformer.run_vocabulary`, and a run
is loaded for inference by `keras_transformer.inference.loading`.
"""

import csv
import dataclasses
import io
import json
import logging
import pathlib
import re

from keras_transformer import names
from keras_transformer.files import append_bytes, file_lock, file_sha256, set_aside, write_bytes

SETTINGS_FILE = "settings.json"
CONFIG_FILE = names.CONFIG_FILE
TOKENIZER_FILE = names.TOKENIZER_FILE
MODEL_FILE = "model.keras"
AVERAGED_FILE = "averaged.weights.h5"
BEST_FILE = "best.weights.h5"
BEST_INFO_FILE = "best.json"
VOCABULARY_INFO_FILE = "vocabulary.json"
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

# The `[decoding]` settings a run records in settings.json: what the run is
# decoded with by default (`keras_transformer.inference.loading.run_decoding`).
DECODING_SETTINGS = ("beam_size", "alpha", "max_extra_length")

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

    def lock(self):
        """Holds `<run>/.lock` while a process trains in the folder (see `file_lock`).

        A second `train` on the same folder would interleave its backups,
        checkpoints and log rows with the first one's; it is refused instead.
        """
        return file_lock(self.root / LOCK_FILE, error=RunError, busy=lambda owner: (
            f"{self.root} is in use: {owner} is training in it. Wait for it to finish or "
            "stop it, or use another --output-dir"))

    def tokenizer_hash(self):
        return file_sha256(self.tokenizer_file) if self.tokenizer_file.is_file() else None

    # --- settings and config -------------------------------------------------

    def read_json(self, name):
        """The dict a JSON file of the run holds, `None` without the file.

        Raises:
            RunError: the file is not a JSON object (truncated, overwritten).
        """
        path = self.root / name
        if not path.is_file():
            return None
        try:
            values = json.loads(path.read_text(encoding="utf-8"))
        except (ValueError, UnicodeDecodeError) as error:
            raise RunError(f"{path} is damaged: not valid JSON ({error}); restore it or "
                           "start a new --output-dir") from None
        if not isinstance(values, dict):
            raise RunError(f"{path} is damaged: it holds a {type(values).__name__}, not a "
                           "JSON object; restore it or start a new --output-dir")
        return values

    def write_json(self, name, values):
        text = json.dumps(values, indent=2, sort_keys=False) + "\n"
        return write_bytes(self.root / name, text.encode("utf-8"))

    def read_config(self):
        """The run's `TransformerConfig` (`config.json`), `None` without the file."""
        from keras_transformer.model.config import TransformerConfig

        values = self.read_json(CONFIG_FILE)
        if values is None:
            return None
        try:
            return TransformerConfig.from_dict(values)
        except (TypeError, ValueError, KeyError) as error:
            message = str(error).splitlines()[0] if str(error) else type(error).__name__
            raise RunError(f"{self.config_file} is damaged: not a model configuration "
                           f"({message}); restore it or start a new --output-dir") from None

    def recorded_decoding(self):
        """The decoding settings the run recorded: `{name: value}`, maybe empty.

        The `DECODING_SETTINGS` that `settings.json` holds, read as JSON keys
        (their values unchecked; `null` counts as not recorded). An older
        run, or a folder written by hand, may record none, or have no
        `settings.json` at all.
        """
        values = self.read_json(SETTINGS_FILE) or {}
        return {name: values[name] for name in DECODING_SETTINGS
                if values.get(name) is not None}

    def read_best(self):
        """`best.json` (`{"update": int, "bleu": float}`), `None` without the file."""
        best = self.read_json(BEST_INFO_FILE)
        if best is None:
            return None
        if not (isinstance(best.get("update"), int) and not isinstance(best["update"], bool)
                and isinstance(best.get("bleu"), (int, float))):
            raise RunError(f"{self.root / BEST_INFO_FILE} is damaged: expected "
                           f'{{"update": <int>, "bleu": <number>}}, found {best!r}; delete it '
                           f"and {BEST_FILE} to measure the best weights afresh")
        return best

    # --- what is intact ----------------------------------------------------------

    def newest_good_state(self):
        """`(update, path)` of the newest readable state, or `None` when there is none.

        For error messages: unlike `latest_state` it does not raise when
        nothing is readable (damaged files found are still reported and set
        aside, as `latest_state` does).
        """
        try:
            update, path = self.latest_state()
        except RunError:
            return None
        return None if path is None else (update, path)

    def newest_state_text(self):
        """A phrase naming the newest readable backup or checkpoint, for error messages."""
        state = self.newest_good_state()
        if state is None:
            if not self.state_files():
                return f"{self.root} holds no backup or checkpoint yet"
            return f"no readable backup or checkpoint in {self.root}"
        update, path = state
        return f"the newest good state is {path.relative_to(self.root)} (update {update})"

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
                target = set_aside(bad, bad.parent / DAMAGED_DIR)
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
                moved.append(str(set_aside(path, path.parent / ROLLED_BACK_DIR)))
        best = self.read_best()
        if best is not None and best.get("update", 0) > update:
            for name in (BEST_FILE, BEST_INFO_FILE):
                if (self.root / name).exists():
                    moved.append(str(set_aside(self.root / name,
                                               self.checkpoint_dir / ROLLED_BACK_DIR)))
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
    append_bytes(rolled_back_file, _csv_bytes(fields, drop, header=not rolled_back_file.is_file()),
                 what=f"writing the rolled-back log rows ({rolled_back_file.name})")
    write_bytes(log_file, _csv_bytes(fields, keep),
                what=f"writing the training log ({log_file.name})")
    return len(drop)


def _csv_bytes(fields, rows, header=True):
    """`rows` (dicts) as CSV bytes with `fields` as columns, the header line first."""
    text = io.StringIO(newline="")
    writer = csv.DictWriter(text, fieldnames=fields)
    if header:
        writer.writeheader()
    writer.writerows(rows)
    return text.getvalue().encode("utf-8")

