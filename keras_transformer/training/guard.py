"""What a training run does between its updates, owned by one callback.

`model.fit` runs the remaining updates of a run as one epoch. `RunGuard`
is the one callback the job gives it: it owns the optimizer update count
(`start_update + batches // accumulation_steps`, so nothing touches the
model at every step: on JAX every access syncs all variables), the signal
handlers, halting, and how `fit` stopped. After each update it calls, in
this order, plain objects that get what they need as arguments and return
what they found:

1. `validation.Validator.validate` (every `validate_every` updates):
   validation loss and greedy BLEU on a fixed sample; keeps
   `best.weights.h5`. Returns the values.
2. `log.TrainingLog.write_row` (every `log_every` updates, at each
   validation and at the last update): a CSV row, TensorBoard scalars and a
   log line (loss, tokens/s, ETA), from Keras' loss and accuracy over the
   row's batches (it resets the model's metrics after each row) and the
   validation values handed to it. Returns the row.
3. `divergence.DivergenceRule.check_row`: the row's loss against the rule
   (see its docstring); a non-finite batch loss is checked at every batch.
4. `checkpoints.StateSaver.after_update`: checkpoints every
   `checkpoint_every` updates (the last K are kept for averaging) and
   backups (weights + optimizer) at each checkpoint and every
   `backup_minutes`.
5. A signal received (SIGTERM, SIGINT) since the last update: back this
   update up and stop.

A diverged update is not saved, and once `fit` is stopped nothing more is
written. At the end of a finished `fit`, the last update is checkpointed
and backed up. `RunGuard.outcome` says how `fit` stopped
(`stops.Outcome`: finished, signal or diverged); the job turns it into
`stops.Stopped`, and `keras-transformer train` into its exit status.

Only the chief worker writes files under `MultiWorkerMirroredStrategy`. A
write that fails raises `files.WriteError` (no partial file is left).
"""

import logging
import os
import signal
import threading

import keras

from keras_transformer import files
from keras_transformer.training.checkpoints import StateSaver, WeightWriter
from keras_transformer.training.divergence import DivergenceRule
from keras_transformer.training.log import TrainingLog
from keras_transformer.training.stops import Outcome
from keras_transformer.training.validation import Validator

logger = logging.getLogger("keras_transformer")


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

    @classmethod
    def for_settings(cls, settings, run, model, *, start_update, tokens_per_update,
                     valid_ds=None, translator=None, bleu_sample=((), ())):
        """The guard of the job's `fit`, its parts set from the run's `Settings`.

        Args:
            settings: the resolved `Settings` (checkpoints, backups, the log,
                validation, the divergence check).
            run: the `runs.RunFolder`.
            model: the training model (its vocabulary sets the divergence limit).
            start_update: the update `fit` starts from.
            tokens_per_update: mean non-pad target tokens of one update.
            valid_ds: the validation dataset (for the loss), or None.
            translator: a `Translator` over `model` for the validation BLEU,
                or None; unused when `settings.validation_bleu_sentences` is 0.
            bleu_sample: `(sources, references)` the BLEU is measured on.
        """
        s = settings
        writer = WeightWriter()
        sources, references = bleu_sample
        return cls(
            start_update=start_update, accumulation_steps=s.grad_accum_steps, writer=writer,
            saver=StateSaver(run, writer, checkpoint_every=s.checkpoint_every,
                             keep=s.average_last, backup_minutes=s.backup_minutes),
            log=TrainingLog(run, every=s.log_every, total_updates=s.train_steps,
                            target_tokens_per_update=tokens_per_update),
            divergence=DivergenceRule(model.config.vocab_size, enabled=s.divergence_check),
            validator=Validator(
                run, writer, every=s.validate_every, dataset=valid_ds,
                translator=translator if s.validation_bleu_sentences else None,
                sources=sources, references=references))

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
