"""How the job stops before its end, and the one line that tells the user so.

`fit` stops on a signal or a diverged loss: `RunGuard` records how
(`Outcome`), and `stopped` turns it into the `Stopped` that `train` raises
(a diverged run rolled back first). A write that fails (a full disk) turns
into the `runs.RunError` of `write_failure`. Each message says what is
intact and what the same command will do; `keras-transformer train` prints
it and exits with `Outcome.exit_status`.
"""

import dataclasses
import pathlib
import signal

from keras_transformer import files, runs


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


class Stopped(Exception):
    """`train` stopped before the end of its updates: a signal, or a diverged loss.

    Attributes:
        outcome: the `Outcome` (`exit_status` is the command's).
    """

    def __init__(self, outcome, message):
        super().__init__(message)
        self.outcome = outcome


def stopped(outcome, run):
    """The `Stopped` of a `fit` that did not finish; a diverged run's later states set aside.

    Training that diverged is rolled back to `outcome.last_good`: the states
    and log rows written after it move to `rolled_back/` (nothing is
    deleted), so the same command continues from before the divergence.
    """
    if outcome.kind == "signal":
        name = signal.Signals(outcome.signal_number).name
        return Stopped(outcome, f"stopped by {name} after update {outcome.update}, backed up "
                                f"in {outcome.backup}; run the same command to continue from "
                                "it")
    run.roll_back_to(outcome.last_good)
    state = run.newest_good_state()
    if state is not None:
        newest = (f"the newest state before it is {state[1].relative_to(run.root)} "
                  f"(update {state[0]})")
        again = "continue from that state"
    else:
        newest = "no state was written before it"
        again = "start again from update 0"
    return Stopped(outcome, (
        f"training diverged at update {outcome.update}: loss {outcome.loss:.4g}, "
        f"{outcome.reason}; {newest}, and what was written after update {outcome.last_good} "
        f"is set aside in {runs.ROLLED_BACK_DIR}/. Nothing was exported. Lower "
        f"--learning-rate-factor and run again to {again}, or turn this check off with "
        "--no-divergence-check"))


def write_failure(error, run, then, *, update=None):
    """The user's line for a write that failed: what, why, what is intact, what to do.

    Args:
        error: a `files.WriteError`, or another `OSError` (a TensorFlow or
            library write that failed outside `files`).
        run: the `RunFolder`.
        then: what the same command will do once there is space: "continue"
            (training), "finish" (final weights, test, export) or "write"
            (only `results.json` is missing).
        update: for "finish", the update training completed.

    Returns:
        The `runs.RunError` to raise.
    """
    if not isinstance(error, files.WriteError):  # its reason, said as WriteError says it
        where = getattr(error, "filename", None)
        error = files.WriteError(where or "", error, f"writing {where}" if where else "writing")
    what = str(error)
    if then == "write":
        return runs.RunError(f"{what}; the run is otherwise complete: run the same command "
                             "to write it")
    if then == "finish":
        state = (f"training is complete at update {update} and {run.newest_state_text()}. "
                 "Free space (or fix the folder) and run the same command to finish the "
                 "run (final weights, test, export)")
    else:
        state = (f"{run.newest_state_text()}. Free space (or fix the folder) and run the "
                 "same command to continue")
    return runs.RunError(f"{what}; {state}")
