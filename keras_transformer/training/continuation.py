"""Continuing a run: what a re-run's settings keep, say or refuse.

Re-running the same command continues a run from its newest state, and a
larger `--train-steps` continues a finished one (`keras_transformer.training
.job`; a run already finished at its budget is `results.completed`). Before
the job trains, `check_schedule` refuses a learning-rate schedule other
than the run's own; `write_config` writes config.json and says which model
settings changed.
"""

import logging

from keras_transformer import runs
from keras_transformer.training.settings import SettingsError

logger = logging.getLogger("keras_transformer")


def check_schedule(run, settings):
    """Refuses to continue a run on a learning-rate schedule other than its own.

    A linear decay reaches zero at the run's `--train-steps`, so the budget is
    part of its schedule: continuing it to another budget, or switching a run
    between decays, would give the updates to come rates that no schedule
    gives after the updates already made. (The inverse square root does not
    depend on the budget: raising `--train-steps` continues it.)

    Raises:
        SettingsError: the run has trained on another schedule.
    """
    s = settings
    previous = run.read_json(runs.SETTINGS_FILE)
    if not previous or not run.state_files():
        return
    old_decay = previous.get("lr_decay", "inverse_sqrt")
    old_steps = previous.get("train_steps")
    if "linear" not in (old_decay, s.lr_decay):
        return
    if (old_decay, old_steps) == (s.lr_decay, s.train_steps):
        return
    trained_on = (f"decays its learning rate linearly to zero at update {old_steps}"
                  if old_decay == "linear" else
                  "trained on the inverse square root schedule")
    asked = (f"--lr-decay linear to update {s.train_steps}" if s.lr_decay == "linear"
             else "--lr-decay inverse_sqrt")
    raise SettingsError(
        f"{run.root} {trained_on} ({run.settings_file.name}); {asked} would change the "
        "schedule of the updates already made. Nothing was changed: train a new "
        "--output-dir, or fine-tune this run's weights there with --init-from")


def write_config(run, config):
    """Writes config.json for a new run; for a continued one, says what changed.

    A damaged config.json is written again (it is derived from the settings).
    """
    try:
        saved = run.read_config()
    except runs.RunError as error:
        logger.warning(f"{error}: writing it again from the settings")
        saved = None
    if saved is not None and saved != config:
        changed = {k: (v, getattr(config, k)) for k, v in saved.to_dict().items()
                   if v != getattr(config, k)}
        logger.info(f"Model settings changed since the last invocation: {changed}")
    run.write_json(runs.CONFIG_FILE, config.to_dict())
