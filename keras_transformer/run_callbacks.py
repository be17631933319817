"""The callbacks through which a training run writes its folder.

`model.fit` runs the remaining updates of a run as one epoch; these
callbacks act on the optimizer update count, which they derive from the
number of batches seen (`start_update + batches // grad_accum_steps`), so
that they do not touch the model at every step (on JAX every access syncs
all variables) and act at the same updates whatever the resume point:

- `UpdateClock`: the update count, shared by the others.
- `Validator`: validation loss and greedy BLEU on a fixed sample every
  `validate_every` updates; keeps `best.weights.h5`.
- `TrainingLog`: a CSV row, TensorBoard scalars and a timestamped log line
  (loss, tokens/s, ETA) every `log_every` updates and at each validation.
- `StateSaver`: checkpoints every `checkpoint_every` updates (the last K are
  kept for averaging), and backups (weights + optimizer) at each checkpoint,
  every `backup_minutes` and at the end.
- `DivergenceCheck`: stops a run whose loss is non-finite, or far above what
  a model can reach for several logged updates (see its docstring).
- `SignalStop`: on SIGTERM or SIGINT, finishes the update in progress, backs
  it up and stops `fit` (a preemption notice, Ctrl-C).

Only the chief worker writes files under `MultiWorkerMirroredStrategy`. A
write that fails raises `files.WriteError` (no partial file is left).
"""

import csv
import logging
import math
import os
import signal
import threading
import time

import keras

from keras_transformer import files, runs

logger = logging.getLogger("keras_transformer")


def is_chief():
    """False on the non-chief workers of a multi-worker TensorFlow run."""
    import json

    config = json.loads(os.environ.get("TF_CONFIG", "{}") or "{}")
    task = config.get("task", {})
    if not task:
        return True
    cluster = config.get("cluster", {})
    if "chief" in cluster:
        return task.get("type") == "chief"
    return task.get("type") == "worker" and int(task.get("index", 0)) == 0


class UpdateClock(keras.callbacks.Callback):
    """Counts optimizer updates from the training batches `fit` runs.

    Args:
        start_update: the optimizer's update count when `fit` starts.
        accumulation_steps: micro-batches per update.
    """

    def __init__(self, start_update=0, accumulation_steps=1):
        super().__init__()
        self.update = start_update
        self.start_update = start_update
        self.accumulation_steps = accumulation_steps
        self._micro = 0
        self.stepped = False  # an update completed at the last batch

    def on_train_batch_end(self, batch, logs=None):
        self._micro += 1
        self.stepped = self._micro % self.accumulation_steps == 0
        if self.stepped:
            self.update += 1


class StateSaver(keras.callbacks.Callback):
    """Checkpoints for averaging and backups for resuming, in a `RunFolder`.

    Args:
        run: the `runs.RunFolder`.
        clock: the `UpdateClock`.
        checkpoint_every: updates between `checkpoints/ckpt-<update>.weights.h5`.
        keep: checkpoints kept (the last `keep` are averaged).
        backup_minutes: wall-clock minutes between backups; 0 for none
            between checkpoints.
        keep_backups: backups kept; the older one is the fallback when the
            newest is damaged.
    """

    def __init__(self, run, clock, *, checkpoint_every, keep, backup_minutes=10.0,
                 keep_backups=2):
        super().__init__()
        self.run, self.clock = run, clock
        self.checkpoint_every, self.keep = checkpoint_every, keep
        self.backup_seconds = backup_minutes * 60
        self.keep_backups = keep_backups
        self.chief = is_chief()
        self._last_backup_time = None
        self._last_backup_update = None
        self.halted = False  # set by `halt`: nothing more is written
        self.writing = None  # the file being written, while it is

    def on_train_begin(self, logs=None):
        self._last_backup_time = time.monotonic()
        self._last_backup_update = self.clock.update

    def halt(self):
        """Writes nothing more in this `fit` (a diverged run, or one already backed up)."""
        self.halted = True

    def _save(self, path, what):
        self.writing = path
        try:
            return files.save_weights(self.model, path, what=what)
        finally:
            self.writing = None

    def backup(self):
        """Backs up the current update (once); returns its path, or None if not written now."""
        update = self.clock.update
        if not self.chief or update == self._last_backup_update:
            return None
        path = self._save(self.run.backup_path(update), f"writing the backup of update "
                          f"{update} ({runs.BACKUP_DIR}/{self.run.backup_path(update).name})")
        for _, old in self.run.backups()[:-self.keep_backups]:
            os.remove(old)
        self._last_backup_time, self._last_backup_update = time.monotonic(), update
        logger.info(f"Backup at update {update}: {path}")
        return path

    def checkpoint(self):
        update = self.clock.update
        if not self.chief:
            return None
        path = self._save(self.run.checkpoint_path(update), f"writing the checkpoint of "
                          f"update {update} ({runs.CHECKPOINT_DIR}/"
                          f"{self.run.checkpoint_path(update).name})")
        for _, old in self.run.checkpoints()[:-self.keep]:
            os.remove(old)
        return path

    def on_train_batch_end(self, batch, logs=None):
        if not self.clock.stepped or self.halted:
            return
        update = self.clock.update
        if update % self.checkpoint_every == 0:
            self.checkpoint()
            self.backup()
        elif self.backup_seconds and \
                time.monotonic() - self._last_backup_time >= self.backup_seconds:
            self.backup()

    def on_train_end(self, logs=None):
        update = self.clock.update
        if update != self._last_backup_update and not self.halted:
            if not any(step == update for step, _ in self.run.checkpoints()):
                self.checkpoint()
            self.backup()


class Validator(keras.callbacks.Callback):
    """Validation loss and greedy BLEU every `every` updates; keeps the best weights.

    Args:
        run: the `runs.RunFolder` (`best.weights.h5`, `best.json`).
        clock: the `UpdateClock`.
        every: updates between validations.
        dataset: the validation `tf.data.Dataset` (for the loss), or None.
        translator: a `Translator` over the training model, or None.
        sources, references: the fixed validation sample for BLEU.
        record: a dict the `TrainingLog` reads (`val_loss`, `val_bleu`, ...).
    """

    def __init__(self, run, clock, *, every, dataset=None, translator=None, sources=(),
                 references=(), record=None):
        super().__init__()
        self.run, self.clock, self.every = run, clock, every
        self.dataset, self.translator = dataset, translator
        self.sources, self.references = list(sources), list(references)
        self.record = record if record is not None else {}
        best = run.read_best() or {}
        self.best_bleu = best.get("bleu")
        self.chief = is_chief()

    def validate(self):
        from keras_transformer.evaluation import score_translations

        update = self.clock.update
        start = time.perf_counter()
        values = {}
        if self.dataset is not None:
            metrics = self.model.evaluate(self.dataset, verbose=0, return_dict=True)
            # evaluate() accumulated into the metrics that fit reports as
            # training means: start those afresh (`TrainingLog` knows).
            self.model.reset_metrics()
            values["val_loss"] = float(metrics["loss"])
            for name, value in metrics.items():
                if name != "loss":
                    values[f"val_{name}"] = float(value)
        if self.translator is not None and self.sources and self.chief:
            hypotheses = self.translator.translate(self.sources, beam_size=1)
            bleu = score_translations(hypotheses, self.references).bleu
            values["val_bleu"] = float(bleu)
            if self.best_bleu is None or bleu > self.best_bleu:
                self.best_bleu = float(bleu)
                # The model's weights only: nothing resumes from them.
                files.save_weights(self.model, self.run / runs.BEST_FILE, optimizer=False,
                                   what=f"writing the best weights ({runs.BEST_FILE})")
                self.run.write_json(runs.BEST_INFO_FILE, dict(update=update, bleu=float(bleu)))
        values["val_seconds"] = time.perf_counter() - start
        self.record.update(values)
        return values

    def on_train_batch_end(self, batch, logs=None):
        if self.clock.stepped and self.clock.update % self.every == 0:
            self.validate()


class TrainingLog(keras.callbacks.Callback):
    """CSV rows, TensorBoard scalars and log lines of a run, keyed by update.

    Every `every` updates (and at each validation) it writes the mean
    training loss and accuracy of the updates since the last row, the
    learning rate of the next update (Keras' `optimizer.learning_rate`),
    target tokens/s of the training steps since the last row and the
    validation values of `record`.

    Args:
        run: the `runs.RunFolder`.
        clock: the `UpdateClock`.
        every: updates between rows.
        total_updates: the planned last update (for the ETA).
        target_tokens_per_update: mean non-pad target tokens of one update.
        record: the `Validator`'s dict.
        validate_every: updates between validations (rows are written then too).
    """

    COLUMNS = ("step", "loss", "accuracy", "learning_rate", "tokens_per_second",
               "elapsed_seconds", "val_loss", "val_accuracy", "val_bleu")

    def __init__(self, run, clock, *, every, total_updates, target_tokens_per_update,
                 record=None, validate_every=None):
        super().__init__()
        self.run, self.clock, self.every = run, clock, every
        self.total_updates = total_updates
        self.target_tokens_per_update = target_tokens_per_update
        self.record = record if record is not None else {}
        self.validate_every = validate_every
        self.chief = is_chief()
        self._writer = None
        self.last_row = None  # the newest row written, for `DivergenceCheck`

    def on_train_begin(self, logs=None):
        self._start = self._last_time = time.monotonic()
        self._last_update = self.clock.update
        self._last_sums = (0.0, 0.0, 0)  # loss sum, accuracy sum, batches
        self._batches = 0
        self._elapsed_before = self._previous_elapsed()
        if self.chief:
            from tensorboard.compat.proto import event_pb2
            from tensorboard.summary.writer.event_file_writer import EventFileWriter

            self._writer = EventFileWriter(str(self.run / runs.TENSORBOARD_DIR))
            # A restart after this update: TensorBoard drops the points of
            # steps >= the START event's (an abandoned trajectory's), so the
            # curve stays one line; rows up to this update are kept.
            self._writer.add_event(event_pb2.Event(
                wall_time=time.time(), step=self.clock.update + 1,
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

    def on_train_batch_end(self, batch, logs=None):
        logs = logs or {}
        self._batches += 1
        # Keras' batch logs are means since the metrics were last reset: the
        # start of fit, or the last validation. Rows difference them.
        self._loss_mean = float(logs.get("loss", math.nan))
        self._accuracy_mean = float(logs.get("accuracy", math.nan))
        if not self.clock.stepped:
            return
        update = self.clock.update
        validated = self.validate_every and update % self.validate_every == 0
        if update % self.every == 0 or validated or update == self.total_updates:
            self.write_row()

    def write_row(self):
        update, now = self.clock.update, time.monotonic()
        validation = dict(self.record)
        self.record.clear()
        validation_seconds = validation.pop("val_seconds", 0.0)
        loss_sum, accuracy_sum, batches = self._last_sums
        n = self._batches - batches
        loss = (self._loss_mean * self._batches - loss_sum) / n if n else math.nan
        accuracy = (self._accuracy_mean * self._batches - accuracy_sum) / n if n else math.nan
        self._last_sums = (self._loss_mean * self._batches,
                           self._accuracy_mean * self._batches, self._batches)
        if "val_loss" in validation:  # the Validator reset Keras' running means
            self._batches, self._last_sums = 0, (0.0, 0.0, 0)
        updates = update - self._last_update
        seconds = now - self._last_time - validation_seconds  # training time only
        tokens_per_second = (updates * self.target_tokens_per_update / seconds
                             if seconds > 0 else 0.0)
        rate = updates / seconds if seconds > 0 and updates else 0.0
        remaining = self.total_updates - update
        eta = remaining / rate if rate else math.nan
        self._last_time, self._last_update = now, update
        learning_rate = float(keras.ops.convert_to_numpy(self.model.optimizer.learning_rate))
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
        self.last_row = row
        if not self.chief:
            return
        self._append_row(row)
        try:
            self._write_scalars(update, row)
        except (OSError, RuntimeError) as error:
            raise files.WriteError(self.run / runs.TENSORBOARD_DIR, error,
                                  f"writing TensorBoard events ({runs.TENSORBOARD_DIR}/)") \
                from error

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

    def on_train_end(self, logs=None):
        if self._writer is not None:
            self._writer.close()
            self._writer = None


class DivergenceCheck(keras.callbacks.Callback):
    """Stops a run whose training loss diverged, before it writes more states.

    The rule: the loss of a batch is not finite; or the loss of `patience`
    consecutive log rows (`TrainingLog`, one every `log_every` updates) is
    above `factor` x ln(vocabulary size). A model that predicts the uniform
    distribution has loss ln V (label smoothing does not change that), and a
    freshly initialised one about ln V + 0.5, so training that works never
    stays above 2 ln V; a learning rate far too large takes it there within a
    few hundred updates (the tiny preset with `--learning-rate-factor 1e6`:
    1e6, then 1.5e7 ...). With `enabled=False` only a non-finite loss stops
    the run (training on NaN weights cannot recover).

    When it fires, `diverged` holds `(update, loss, reason)` and `last_good`
    the newest logged update whose loss passed the rule (or the update `fit`
    started from), `fit` stops, and the `StateSaver` writes nothing more.

    Args:
        clock: the `UpdateClock`.
        log: the `TrainingLog` (its rows are what the rule reads).
        saver: the `StateSaver`, halted when the loss diverges.
        vocab_size: V.
        factor: the multiple of ln V above which a row counts.
        patience: consecutive rows above it that stop the run.
        enabled: apply the ln V rule (the non-finite check always applies).
    """

    FACTOR = 2.0
    PATIENCE = 3

    def __init__(self, clock, log, saver, *, vocab_size, factor=FACTOR, patience=PATIENCE,
                 enabled=True):
        super().__init__()
        self.clock, self.log, self.saver = clock, log, saver
        self.vocab_size = vocab_size
        self.limit = factor * math.log(max(vocab_size, 2))
        self.factor, self.patience, self.enabled = factor, patience, enabled
        self.diverged = None
        self.last_good = None
        self._streak = 0
        self._seen = None

    def on_train_begin(self, logs=None):
        self.last_good = self.clock.update

    def on_train_batch_end(self, batch, logs=None):
        if self.diverged is not None:
            return
        loss = (logs or {}).get("loss")
        if loss is not None and not math.isfinite(float(loss)):
            # Keras' batch loss is a running mean: one non-finite batch shows.
            self._stop(self.clock.update, float(loss), "the loss is not finite")
            return
        row = self.log.last_row
        if row is None or row is self._seen:
            return
        self._seen = row
        row_loss = row.get("loss")
        if row_loss is None or math.isnan(row_loss):
            return  # no training batch since the last row (a validation row)
        if self.enabled and row_loss > self.limit:
            self._streak += 1
            if self._streak >= self.patience:
                self._stop(row["step"], row_loss,
                           f"above {self.limit:.1f} ({self.factor:g} x ln {self.vocab_size}) "
                           f"for {self._streak} logged updates in a row")
        else:
            self._streak = 0
            self.last_good = row["step"]

    def _stop(self, update, loss, reason):
        self.diverged = (update, loss, reason)
        self.saver.halt()
        self.model.stop_training = True

    def error(self, run):
        """The `RunError` of a diverged run, after setting aside the states written since."""
        update, loss, reason = self.diverged
        run.roll_back_to(self.last_good)  # moves later states and log rows aside, deletes nothing
        state = run.newest_good_state()
        if state is not None:
            newest = (f"the newest state before it is {state[1].relative_to(run.root)} "
                      f"(update {state[0]})")
            again = "continue from that state"
        else:
            newest = "no state was written before it"
            again = "start again from update 0"
        return runs.RunError(
            f"training diverged at update {update}: loss {loss:.4g}, {reason}; {newest}, and "
            f"what was written after update {self.last_good} is set aside in "
            f"{runs.ROLLED_BACK_DIR}/. Nothing was exported. Lower --learning-rate-factor and run "
            f"again to {again}, or turn this check off with --no-divergence-check")


class TrainingStopped(runs.RunError):
    """`fit` stopped on a signal (`SignalStop`), its last update backed up.

    Attributes:
        exit_status: 128 + the signal's number (143 for SIGTERM, 130 for SIGINT).
    """

    def __init__(self, signal_number, backup):
        self.exit_status = 128 + signal_number
        name = signal.Signals(signal_number).name
        if backup is None:
            message = f"stopped by {name}; nothing was written on the way out"
        else:
            update, path = backup
            message = (f"stopped by {name} after update {update}, backed up in {path}; run "
                       "the same command to continue from it")
        super().__init__(message)


class SignalStop(keras.callbacks.Callback):
    """Stops `fit` cleanly on SIGTERM or SIGINT, with a backup of the last update.

    A cloud VM's or a batch scheduler's preemption notice (SIGTERM) or Ctrl-C
    (SIGINT) during `fit` lets the update in progress finish (all its
    micro-batches); then the `StateSaver` writes a backup of that update
    (atomically, as always), nothing else is written, `fit` stops, and
    `signal_number` holds the signal: the job then exits with status
    128 + its number (143, 130). A second signal before that backup is
    complete exits at once with the same status, removing the backup's
    partial file: the states written before stay as they were.

    The handlers are installed for the duration of `fit` (main thread only)
    and the previous ones put back at its end, or by `restore_handlers`.

    Args:
        saver: the `StateSaver`.
        clock: the `UpdateClock`.
    """

    SIGNALS = (signal.SIGTERM, signal.SIGINT)

    def __init__(self, saver, clock):
        super().__init__()
        self.saver, self.clock = saver, clock
        self.signal_number = None
        self.backup = None  # (update, path) of the backup written on the signal
        self._previous = {}

    def on_train_begin(self, logs=None):
        if threading.current_thread() is not threading.main_thread():
            return
        for number in self.SIGNALS:
            self._previous[number] = signal.signal(number, self._handle)

    def _handle(self, number, frame):
        if self.signal_number is not None:  # the second one: leave now
            writing = self.saver.writing
            if writing is not None:
                try:
                    os.remove(files.partial_path(writing))
                except OSError:
                    pass
            os.write(2, (f"{signal.Signals(number).name} again: exiting at once; the "
                         "states written before are intact\n").encode())
            os._exit(128 + number)
        self.signal_number = number

    def on_train_batch_end(self, batch, logs=None):
        if self.signal_number is None or not self.clock.stepped or \
                self.model.stop_training:
            return
        update = self.clock.update
        path = None
        if not self.saver.halted:
            path = self.saver.backup() or self.saver.run.backup_path(update)
            self.backup = (update, path)
        self.saver.halt()
        self.model.stop_training = True
        name = signal.Signals(self.signal_number).name
        where = f"backup at update {update}: {path}" if path else "nothing written"
        logger.warning(f"{name} received: stopped after update {update} ({where})")

    def on_train_end(self, logs=None):
        self.restore_handlers()

    def restore_handlers(self):
        for number, handler in self._previous.items():
            signal.signal(number, handler)
        self._previous = {}


def _duration(seconds):
    seconds = int(seconds)
    if seconds >= 3600:
        return f"{seconds // 3600}h{seconds % 3600 // 60:02d}m"
    if seconds >= 60:
        return f"{seconds // 60}m{seconds % 60:02d}s"
    return f"{seconds}s"
