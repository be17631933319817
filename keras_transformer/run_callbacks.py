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

Only the chief worker writes files under `MultiWorkerMirroredStrategy`.
"""

import csv
import logging
import math
import os
import time

import keras

from keras_transformer import runs

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

    def on_train_begin(self, logs=None):
        self._last_backup_time = time.monotonic()
        self._last_backup_update = self.clock.update

    def _save(self, path):
        return runs.write_atomically(path, self.model.save_weights)

    def backup(self):
        update = self.clock.update
        if not self.chief or update == self._last_backup_update:
            return None
        path = self._save(self.run.backup_path(update))
        for _, old in self.run.backups()[:-self.keep_backups]:
            os.remove(old)
        self._last_backup_time, self._last_backup_update = time.monotonic(), update
        logger.info(f"Backup at update {update}: {path}")
        return path

    def checkpoint(self):
        update = self.clock.update
        if not self.chief:
            return None
        path = self._save(self.run.checkpoint_path(update))
        for _, old in self.run.checkpoints()[:-self.keep]:
            os.remove(old)
        return path

    def on_train_batch_end(self, batch, logs=None):
        if not self.clock.stepped:
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
        if update != self._last_backup_update:
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
        best = run.read_json(runs.BEST_INFO_FILE) or {}
        self.best_bleu = best.get("bleu")
        self.chief = is_chief()

    def validate(self):
        from keras_transformer.translate import score_translations

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
                runs.write_atomically(self.run / runs.BEST_FILE, self.model.save_weights)
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
        if not self.chief:
            return
        new_file = not self.run.log_file.is_file()
        with open(self.run.log_file, "a", newline="") as handle:
            writer = csv.DictWriter(handle, fieldnames=self.COLUMNS)
            if new_file:
                writer.writeheader()
            writer.writerow({k: ("" if v is None or (isinstance(v, float) and math.isnan(v))
                                 else v) for k, v in row.items()})
        self._write_scalars(update, row)

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


def _duration(seconds):
    seconds = int(seconds)
    if seconds >= 3600:
        return f"{seconds // 3600}h{seconds % 3600 // 60:02d}m"
    if seconds >= 60:
        return f"{seconds // 60}m{seconds % 60:02d}s"
    return f"{seconds}s"
