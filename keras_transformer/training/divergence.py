"""When a run's training loss has diverged: the rule `RunGuard` applies to each row.

The job stops a diverged run and rolls it back to the newest update whose
loss passed (`keras_transformer.training.stops.stopped`).
"""

import math


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
