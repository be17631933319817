"""What a training run does between its updates, owned by one callback.

`model.fit` runs the remaining updates of a run as one epoch. `RunGuard`
is the one callback the job gives it: it owns the optimizer update count
(`start_update + batches // accumulation_steps`, so nothing touches the
model at every step: on JAX every access syncs all variables), the signal
handlers, halting, the weights file being written, and how `fit` stopped.
After each update it calls, in this order, plain objects that get what they
need as arguments and return what they found:

1. `Validator.validate` (every `validate_every` updates): validation loss
   and greedy BLEU on a fixed sample; keeps `best.weights.h5`. Returns the
   values.
2. `TrainingLog.write_row` (every `log_every` updates, at each validation
   and at the last update): a CSV row, TensorBoard scalars and a log line
   (loss, tokens/s, ETA), from the batch losses and the validation values
   handed to it. Returns the row.
3. `DivergenceRule.check_row`: the row's loss against the rule (see its
   docstring); a non-finite batch loss is checked at every batch.
4. `StateSaver.after_update`: checkpoints every `checkpoint_every` updates
   (the last K are kept for averaging) and backups (weights + optimizer)
   at each checkpoint and every `backup_minutes`.
5. A signal received (SIGTERM, SIGINT) since the last update: back this
   update up and stop.

A diverged update is not saved, and once `fit` is stopped nothing more is
written. At the end of a finished `fit`, the last update is checkpointed
and backed up. `RunGuard.outcome` says how `fit` stopped (`Outcome`:
finished, signal or diverged); the job returns it and `keras-transformer
train` turns it into its exit status.

Only the chief worker writes files under `MultiWorkerMirroredStrategy`. A
write that fails raises `files.WriteError` (no partial file is left).
"""

import csv
import dataclasses
import json
import logging
import math
import os
import pathlib
import signal
import threading
import time

import keras

from keras_transformer import files, runs

logger = logging.getLogger("keras_transformer")


def is_chief():
    """False on the non-chief workers of a multi-worker TensorFlow run."""
    config = json.loads(os.environ.get("TF_CONFIG", "{}") or "{}")
    task = config.get("task", {})
    if not task:
        return True
    cluster = config.get("cluster", {})
    if "chief" in cluster:
        return task.get("type") == "chief"
    return task.get("type") == "worker" and int(task.get("index", 0)) == 0


@dataclasses.dataclass(frozen=True)
class Outcome:
    """How `fit` stopped.

    Attributes:
        kind: "finished", "signal" or "diverged".
        update: the last update trained (for "diverged": the update whose loss
            stopped the run).
        signal_number: for "signal", the signal received.
        backup: for "signal", the backup of `update`.
        loss, reason: for "diverged", the loss and the rule it broke.
        last_good: for "diverged", the newest logged update whose loss passed
            the rule (or the update `fit` started from).
    """

    kind: str
    update: int
    signal_number: int | None = None
    backup: pathlib.Path | None = None
    loss: float | None = None
    reason: str | None = None
    last_good: int | None = None

    @property
    def exit_status(self):
        """The command's exit status: 0, 128 + the signal's number, or 1 (diverged)."""
        if self.kind == "signal":
            return 128 + self.signal_number
        return 1 if self.kind == "diverged" else 0


class WeightWriter:
    """Writes a model's weights atomically (`files.save_weights`), knowing which file it writes.

    The one writer of a run's weight files during `fit`: a second signal
    removes the partial file of `writing`.
    """

    def __init__(self):
        self.writing = None  # the file being written, while it is

    def save(self, model, path, what, *, optimizer=True):
        self.writing = path
        try:
            return files.save_weights(model, path, optimizer=optimizer, what=what)
        finally:
            self.writing = None


class StateSaver:
    """Checkpoints for averaging and backups for resuming, in a `RunFolder`.

    Args:
        run: the `runs.RunFolder`.
        writer: the `WeightWriter`.
        checkpoint_every: updates between `checkpoints/ckpt-<update>.weights.h5`.
        keep: checkpoints kept (the last `keep` are averaged).
        backup_minutes: wall-clock minutes between backups; 0 for none
            between checkpoints.
        keep_backups: backups kept; the older one is the fallback when the
            newest is damaged.
    """

    def __init__(self, run, writer, *, checkpoint_every, keep, backup_minutes=10.0,
                 keep_backups=2):
        self.run, self.writer = run, writer
        self.checkpoint_every, self.keep = checkpoint_every, keep
        self.backup_seconds = backup_minutes * 60
        self.keep_backups = keep_backups
        self.chief = is_chief()
        self._last_backup_time = time.monotonic()
        self._last_backup_update = None

    def begin(self, update):
        """`fit` starts at `update` (restored from its backup, or 0)."""
        self._last_backup_time, self._last_backup_update = time.monotonic(), update

    def backup(self, model, update):
        """Backs up `update` once (the chief writes it); returns the backup's path."""
        path = self.run.backup_path(update)
        if update != self._last_backup_update and self._write(
                model, path, runs.BACKUP_DIR, "backup", update, kept=self.run.backups,
                keep=self.keep_backups):
            self._last_backup_time, self._last_backup_update = time.monotonic(), update
            logger.info(f"Backup at update {update}: {path}")
        return path

    def checkpoint(self, model, update):
        return self._write(model, self.run.checkpoint_path(update), runs.CHECKPOINT_DIR,
                           "checkpoint", update, kept=self.run.checkpoints, keep=self.keep)

    def _write(self, model, path, folder, kind, update, *, kept, keep):
        """Writes `path` (chief only) and removes all but the newest `keep` of `kept()`.

        Returns:
            `path`, or None where nothing was written (not the chief).
        """
        if not self.chief:
            return None
        self.writer.save(model, path, f"writing the {kind} of update {update} "
                                      f"({folder}/{path.name})")
        for _, old in kept()[:-keep]:
            os.remove(old)
        return path

    def after_update(self, model, update):
        if update % self.checkpoint_every == 0:
            self.checkpoint(model, update)
            self.backup(model, update)
        elif self.backup_seconds and \
                time.monotonic() - self._last_backup_time >= self.backup_seconds:
            self.backup(model, update)

    def finish(self, model, update):
        """`fit` finished at `update`: its checkpoint (if not on the grid) and backup."""
        if update != self._last_backup_update:
            if not any(step == update for step, _ in self.run.checkpoints()):
                self.checkpoint(model, update)
            self.backup(model, update)


class Validator:
    """Validation loss and greedy BLEU every `every` updates; keeps the best weights.

    Args:
        run: the `runs.RunFolder` (`best.weights.h5`, `best.json`).
        writer: the `WeightWriter`.
        every: updates between validations.
        dataset: the validation `tf.data.Dataset` (for the loss), or None.
        translator: a `Translator` over the training model, or None.
        sources, references: the fixed validation sample for BLEU.
    """

    def __init__(self, run, writer, *, every, dataset=None, translator=None, sources=(),
                 references=()):
        self.run, self.writer, self.every = run, writer, every
        self.dataset, self.translator = dataset, translator
        self.sources, self.references = list(sources), list(references)
        best = run.read_best() or {}
        self.best_bleu = best.get("bleu")
        self.chief = is_chief()

    def due(self, update):
        return bool(self.every) and update % self.every == 0

    def validate(self, model, update):
        """Returns `val_loss`, `val_<metric>`, `val_bleu` (as measured) and `val_seconds`.

        Resets the model's metrics after the loss: `evaluate` accumulates into
        the metrics that `fit` reports as training means (`TrainingLog`
        starts its means afresh when `val_loss` is among the values).
        """
        from keras_transformer.inference.evaluation import score_translations

        start = time.perf_counter()
        values = {}
        if self.dataset is not None:
            metrics = model.evaluate(self.dataset, verbose=0, return_dict=True)
            model.reset_metrics()
            values["val_loss"] = float(metrics["loss"])
            for name, value in metrics.items():
                if name != "loss":
                    values[f"val_{name}"] = float(value)
        if self.translator is not None and self.sources and self.chief:
            hypotheses = self.translator.translate(self.sources, beam_size=1)
            bleu = float(score_translations(hypotheses, self.references).bleu)
            values["val_bleu"] = bleu
            if self.best_bleu is None or bleu > self.best_bleu:
                self.best_bleu = bleu
                # The model's weights only: nothing resumes from them.
                self.writer.save(model, self.run / runs.BEST_FILE, optimizer=False,
                                 what=f"writing the best weights ({runs.BEST_FILE})")
                self.run.write_json(runs.BEST_INFO_FILE, dict(update=update, bleu=bleu))
        values["val_seconds"] = time.perf_counter() - start
        return values


class TrainingLog:
    """CSV rows, TensorBoard scalars and log lines of a run, keyed by update.

    Each row holds the mean training loss and accuracy of the batches since
    the last row, the learning rate of the next update (Keras'
    `optimizer.learning_rate`), target tokens/s of the training since the
    last row (validation time left out) and the validation values handed to
    it.

    Args:
        run: the `runs.RunFolder`.
        every: updates between rows.
        total_updates: the planned last update (for the ETA; it gets a row).
        target_tokens_per_update: mean non-pad target tokens of one update.
    """

    COLUMNS = ("step", "loss", "accuracy", "learning_rate", "tokens_per_second",
               "elapsed_seconds", "val_loss", "val_accuracy", "val_bleu")

    def __init__(self, run, *, every, total_updates, target_tokens_per_update):
        self.run, self.every = run, every
        self.total_updates = total_updates
        self.target_tokens_per_update = target_tokens_per_update
        self.chief = is_chief()
        self._writer = None

    def due(self, update, validated=False):
        return update % self.every == 0 or validated or update == self.total_updates

    def begin(self, update):
        """`fit` starts at `update`: opens TensorBoard's event file."""
        self._start = self._last_time = time.monotonic()
        self._last_update = update
        self._last_sums = (0.0, 0.0, 0)  # loss sum, accuracy sum, batches
        self._batches = 0
        self._loss_mean = self._accuracy_mean = math.nan
        self._elapsed_before = self._previous_elapsed()
        if self.chief:
            from tensorboard.compat.proto import event_pb2
            from tensorboard.summary.writer.event_file_writer import EventFileWriter

            self._writer = EventFileWriter(str(self.run / runs.TENSORBOARD_DIR))
            # A restart after this update: TensorBoard drops the points of
            # steps >= the START event's (an abandoned trajectory's), so the
            # curve stays one line; rows up to this update are kept.
            self._writer.add_event(event_pb2.Event(
                wall_time=time.time(), step=update + 1,
                session_log=event_pb2.SessionLog(status=event_pb2.SessionLog.START)))

    def _previous_elapsed(self):
        if not self.run.log_file.is_file():
            return 0.0
        with open(self.run.log_file, newline="") as handle:
            rows = list(csv.DictReader(handle))
        try:
            return float(rows[-1].get("elapsed_seconds") or 0.0) if rows else 0.0
        except ValueError:
            return 0.0

    def observe(self, logs):
        """A training batch's Keras logs: means since the metrics were last reset."""
        self._batches += 1
        self._loss_mean = float(logs.get("loss", math.nan))
        self._accuracy_mean = float(logs.get("accuracy", math.nan))

    def write_row(self, model, update, validation=None):
        """Writes the row of `update` with the `Validator`'s values; returns it."""
        now = time.monotonic()
        validation = dict(validation or {})
        validation_seconds = validation.pop("val_seconds", 0.0)
        loss, accuracy = self._training_means(reset="val_loss" in validation)
        updates = update - self._last_update
        seconds = now - self._last_time - validation_seconds  # training time only
        tokens_per_second = (updates * self.target_tokens_per_update / seconds
                             if seconds > 0 else 0.0)
        rate = updates / seconds if seconds > 0 and updates else 0.0
        remaining = self.total_updates - update
        eta = remaining / rate if rate else math.nan
        self._last_time, self._last_update = now, update
        learning_rate = float(keras.ops.convert_to_numpy(model.optimizer.learning_rate))
        row = dict(step=update, loss=loss, accuracy=accuracy, learning_rate=learning_rate,
                   tokens_per_second=tokens_per_second,
                   elapsed_seconds=self._elapsed_before + now - self._start)
        row.update({k: v for k, v in validation.items() if k in self.COLUMNS})
        message = (f"update {update}/{self.total_updates}  loss {loss:.4f}  "
                   f"lr {learning_rate:.3g}  {tokens_per_second:,.0f} tok/s")
        if "val_loss" in row:
            message += f"  val_loss {row['val_loss']:.4f}"
        if "val_bleu" in row:
            message += f"  val_bleu {row['val_bleu']:.2f}"
        if remaining > 0 and math.isfinite(eta):
            message += f"  ETA {_duration(eta)}"
        logger.info(message)
        if self.chief:
            self._append_row(row)
            try:
                self._write_scalars(update, row)
            except (OSError, RuntimeError) as error:
                raise files.WriteError(self.run / runs.TENSORBOARD_DIR, error,
                                      f"writing TensorBoard events ({runs.TENSORBOARD_DIR}/)"
                                      ) from error
        return row

    def _training_means(self, reset):
        """Mean loss and accuracy of the batches since the last row.

        Keras' batch logs are means since the metrics were last reset (the
        start of `fit`, or a validation: `reset`); the rows difference them.
        """
        loss_sum, accuracy_sum, batches = self._last_sums
        n = self._batches - batches
        loss = (self._loss_mean * self._batches - loss_sum) / n if n else math.nan
        accuracy = (self._accuracy_mean * self._batches - accuracy_sum) / n if n else math.nan
        self._last_sums = (self._loss_mean * self._batches,
                           self._accuracy_mean * self._batches, self._batches)
        if reset:
            self._batches, self._last_sums = 0, (0.0, 0.0, 0)
        return loss, accuracy

    def _append_row(self, row):
        """Appends a CSV row; a failed write is cut off again (no half row is left)."""
        path = self.run.log_file
        size = path.stat().st_size if path.is_file() else None
        try:
            with open(path, "a", newline="") as handle:
                writer = csv.DictWriter(handle, fieldnames=self.COLUMNS)
                if size is None:
                    writer.writeheader()
                writer.writerow({k: ("" if v is None or (isinstance(v, float) and
                                                         math.isnan(v)) else v)
                                 for k, v in row.items()})
        except OSError as error:
            try:
                if size is None:
                    os.remove(path)
                else:
                    os.truncate(path, size)
            except OSError:
                pass
            raise files.WriteError(path, error, f"writing the training log ({path.name})") \
                from error

    def _write_scalars(self, update, row):
        from tensorboard.compat.proto import event_pb2, summary_pb2

        values = [summary_pb2.Summary.Value(tag=name, simple_value=float(value))
                  for name, value in row.items()
                  if name not in ("step", "elapsed_seconds") and isinstance(value, float)
                  and math.isfinite(value)]
        self._writer.add_event(event_pb2.Event(
            wall_time=time.time(), step=update, summary=summary_pb2.Summary(value=values)))
        self._writer.flush()

    def close(self):
        if self._writer is not None:
            self._writer.close()
            self._writer = None


class DivergenceRule:
    """When a run's training loss has diverged.

    The rule: the loss of a batch is not finite; or the loss of `patience`
    consecutive log rows (one every `log_every` updates) is above
    `factor` x ln(vocabulary size). A model that predicts the uniform
    distribution has loss ln V (label smoothing does not change that), and a
    freshly initialised one about ln V + 0.5, so training that works never
    stays above 2 ln V; a learning rate far too large takes it there within a
    few hundred updates (the tiny preset with `--learning-rate-factor 1e6`:
    1e6, then 1.5e7 ...). With `enabled=False` only a non-finite loss stops
    the run (training on NaN weights cannot recover).

    Args:
        vocab_size: V.
        factor: the multiple of ln V above which a row counts.
        patience: consecutive rows above it that stop the run.
        enabled: apply the ln V rule (the non-finite check always applies).

    Attributes:
        last_good: the newest row's update whose loss passed the rule (set
            by `begin` to the update `fit` starts from).
    """

    FACTOR = 2.0
    PATIENCE = 3

    def __init__(self, vocab_size, *, factor=FACTOR, patience=PATIENCE, enabled=True):
        self.vocab_size = vocab_size
        self.limit = factor * math.log(max(vocab_size, 2))
        self.factor, self.patience, self.enabled = factor, patience, enabled
        self.last_good = None
        self._streak = 0

    def begin(self, update):
        self.last_good, self._streak = update, 0

    @staticmethod
    def check_loss(loss):
        """The reason a batch's loss stops the run, or None.

        Keras' batch loss is a running mean: one non-finite batch shows.
        """
        if loss is not None and not math.isfinite(float(loss)):
            return "the loss is not finite"
        return None

    def check_row(self, row):
        """The reason a log row stops the run (a streak of `patience` rows), or None."""
        loss = row.get("loss")
        if loss is None or math.isnan(loss):
            return None  # no training batch since the last row (a validation row)
        if self.enabled and loss > self.limit:
            self._streak += 1
            if self._streak >= self.patience:
                return (f"above {self.limit:.1f} ({self.factor:g} x ln {self.vocab_size}) "
                        f"for {self._streak} logged updates in a row")
            return None
        self._streak = 0
        self.last_good = row["step"]
        return None


class RunGuard(keras.callbacks.Callback):
    """The one callback of a training run's `fit`: see the module docstring.

    Signals: a cloud VM's or a batch scheduler's preemption notice (SIGTERM)
    or Ctrl-C (SIGINT) lets the update in progress finish (all its
    micro-batches); then that update is backed up (atomically, as always),
    nothing else is written and `fit` stops. A second signal before that
    backup is complete exits at once with status 128 + its number, removing
    the backup's partial file: the states written before stay as they were.
    The handlers are installed for the duration of `fit` (main thread only)
    and put back at its end, or by `close`.

    Args:
        start_update: the optimizer's update count when `fit` starts.
        accumulation_steps: micro-batches per update.
        writer: the `WeightWriter` the saver and the validator write through
            (a second signal removes the partial file of what it is writing).
        saver: the `StateSaver`.
        log: the `TrainingLog`.
        divergence: the `DivergenceRule`.
        validator: the `Validator`, or None.

    Attributes:
        update: the updates completed.
        outcome: how `fit` stopped (`Outcome`), once it has.
    """

    SIGNALS = (signal.SIGTERM, signal.SIGINT)

    def __init__(self, *, start_update, accumulation_steps, writer, saver, log, divergence,
                 validator=None):
        super().__init__()
        self.writer = writer
        self.update = self.start_update = start_update
        self.accumulation_steps = accumulation_steps
        self.saver, self.log, self.divergence = saver, log, divergence
        self.validator = validator
        self.signal_number = None
        self.outcome = None
        self._micro = 0
        self._previous_handlers = {}

    # --- fit's hooks -----------------------------------------------------------------

    def on_train_begin(self, logs=None):
        self.saver.begin(self.update)
        self.log.begin(self.update)
        self.divergence.begin(self.update)
        self.install_signal_handlers()

    def on_train_batch_end(self, batch, logs=None):
        logs = logs or {}
        if self.outcome is not None:
            return
        self.log.observe(logs)
        reason = self.divergence.check_loss(logs.get("loss"))
        if reason is not None:
            return self._diverge(self.update, float(logs["loss"]), reason)
        self._micro += 1
        if self._micro % self.accumulation_steps:
            return
        self.update += 1
        self._after_update(self.update)

    def on_train_end(self, logs=None):
        if self.outcome is None:
            self.saver.finish(self.model, self.update)
            self.outcome = Outcome("finished", self.update)
        self.close()

    def install_signal_handlers(self):
        """SIGTERM and SIGINT stop `fit` after the update in progress (main thread only)."""
        if threading.current_thread() is threading.main_thread():
            for number in self.SIGNALS:
                self._previous_handlers[number] = signal.signal(number, self._on_signal)

    def close(self):
        """Puts the signal handlers back and closes the log's event file (idempotent)."""
        for number, handler in self._previous_handlers.items():
            signal.signal(number, handler)
        self._previous_handlers = {}
        self.log.close()

    # --- after each update ---------------------------------------------------------

    def _after_update(self, update):
        validating = self.validator is not None and self.validator.due(update)
        validation = self.validator.validate(self.model, update) if validating else {}
        if self.log.due(update, validated=validating):
            row = self.log.write_row(self.model, update, validation)
            reason = self.divergence.check_row(row)
            if reason is not None:
                return self._diverge(update, row["loss"], reason)
        self.saver.after_update(self.model, update)
        if self.signal_number is not None:
            self._stop_on_signal(update)

    def _diverge(self, update, loss, reason):
        self.outcome = Outcome("diverged", update, loss=loss, reason=reason,
                               last_good=self.divergence.last_good)
        self.model.stop_training = True

    def _stop_on_signal(self, update):
        path = self.saver.backup(self.model, update)
        self.outcome = Outcome("signal", update, signal_number=self.signal_number, backup=path)
        self.model.stop_training = True
        name = signal.Signals(self.signal_number).name
        logger.warning(f"{name} received: stopped after update {update} "
                       f"(backup at update {update}: {path})")

    def _on_signal(self, number, frame):
        if self.signal_number is not None:  # the second one: leave now
            writing = self.writer.writing
            if writing is not None:
                try:
                    os.remove(files.partial_path(writing))
                except OSError:
                    pass
            os.write(2, (f"{signal.Signals(number).name} again: exiting at once; the "
                         "states written before are intact\n").encode())
            os._exit(128 + number)
        self.signal_number = number


def _duration(seconds):
    seconds = int(seconds)
    if seconds >= 3600:
        return f"{seconds // 3600}h{seconds % 3600 // 60:02d}m"
    if seconds >= 60:
        return f"{seconds // 60}m{seconds % 60:02d}s"
    return f"{seconds}s"
