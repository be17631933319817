"""The training log: CSV rows, TensorBoard scalars and log lines, keyed by update.

`RunGuard` (`keras_transformer.training.guard`) hands `TrainingLog` each
batch's Keras logs and, every `log_every` updates (and at each validation
and the last update), asks it for a row. Rows are appended to
`training_log.csv` through `keras_transformer.files` (a failed write leaves
no half row); TensorBoard's event file is appended by TensorBoard's own
writer. `plotting.plot_training` draws the CSV.
"""

import csv
import io
import logging
import math
import time

import keras

from keras_transformer import files, runs
from keras_transformer.training.strategy import is_chief

logger = logging.getLogger("keras_transformer")


class TrainingLog:
    """CSV rows, TensorBoard scalars and log lines of a run, keyed by update.

    Each row holds Keras' own training loss and accuracy of the batches
    since the last row, the learning rate of the next update (Keras'
    `optimizer.learning_rate`), target tokens/s of the training since the
    last row (validation time left out) and the validation values handed to
    it. `write_row` resets the model's metrics (`model.reset_metrics()`)
    once it has read them, so the last batch's logs hold the metrics over
    exactly the row's batches (`fit` resets them at its start, a validation
    after its `evaluate`): the accuracy is `MaskedAccuracy`'s correct over
    non-pad target tokens of those batches (in [0, 1]); the loss is Keras'
    loss tracker, the mean of the batches' losses (each a mean over its
    non-pad tokens) weighted by their sentences. (Under `tf.distribute`,
    Keras' batch logs are the mean of the replicas' own values.) A row with
    no training batch since the last one has NaN (an empty cell).

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
        self._batches = 0  # training batches since the last row
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
        """A training batch's Keras logs: the metrics since they were last reset.

        That is since the last row (`write_row` resets them), the start of
        `fit` or a validation (which comes with a row).
        """
        self._batches += 1
        self._loss_mean = float(logs.get("loss", math.nan))
        self._accuracy_mean = float(logs.get("accuracy", math.nan))

    def write_row(self, model, update, validation=None):
        """Writes the row of `update` with the `Validator`'s values; returns it.

        The model's metrics are reset once read: the next row's start here.
        """
        now = time.monotonic()
        validation = dict(validation or {})
        validation_seconds = validation.pop("val_seconds", 0.0)
        loss, accuracy = self._training_means(model)
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

    def _training_means(self, model):
        """Loss and accuracy of the batches since the last row; resets the model's metrics.

        Keras' metrics accumulate from their last reset, so the last batch's
        logs hold them over the row's batches; resetting them here starts
        the next row's. (Differencing running means instead is wrong: Keras
        weights the loss by sentences and the accuracy by tokens, not by
        batches.) Under JAX, `model` must come from `Callback.model`, which
        puts the training state into the variables; `fit` reads it back at
        its next step.
        """
        if not self._batches:
            return math.nan, math.nan
        means = self._loss_mean, self._accuracy_mean
        model.reset_metrics()
        self._batches = 0
        return means

    def _append_row(self, row):
        """Appends a CSV row (`files.append_bytes`: a failed write leaves no half row).

        A new file gets the header first.
        """
        path = self.run.log_file
        text = io.StringIO(newline="")
        writer = csv.DictWriter(text, fieldnames=self.COLUMNS)
        if not path.is_file():
            writer.writeheader()
        writer.writerow({k: ("" if v is None or (isinstance(v, float) and math.isnan(v)) else v)
                         for k, v in row.items()})
        files.append_bytes(path, text.getvalue().encode(),
                           what=f"writing the training log ({path.name})")

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


def _duration(seconds):
    seconds = int(seconds)
    if seconds >= 3600:
        return f"{seconds // 3600}h{seconds % 3600 // 60:02d}m"
    if seconds >= 60:
        return f"{seconds // 60}m{seconds % 60:02d}s"
    return f"{seconds}s"
