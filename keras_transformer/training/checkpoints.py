"""The run's weight files during `fit`: checkpoints for averaging, backups for resuming.

`WeightWriter` is the one writer of a run's weight files while `fit` runs
(so that a second signal knows which partial file to remove);
`StateSaver` decides when a checkpoint or a backup is due and keeps the
newest ones. `RunGuard` (`keras_transformer.training.guard`) calls it after
each update; only the chief worker writes.
"""

import logging
import os
import time

from keras_transformer import files, runs
from keras_transformer.training.strategy import is_chief

logger = logging.getLogger("keras_transformer")


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
