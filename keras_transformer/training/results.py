"""results.json: what a finished run records, and whether a run already is finished.

The job's last step (`keras_transformer.training.job.train`) writes it with
`record`: the test scores, how much of the run this invocation trained and
how fast, the final weights, the machine and the settings. A re-run of a
run already finished at its budget reads it back (`completed`) and trains
nothing.
"""

import dataclasses
import logging

import keras

from keras_transformer import files, runs
from keras_transformer.training.measurement import peak_memory_mib
from keras_transformer.training.stops import write_failure

logger = logging.getLogger("keras_transformer")


def completed(run, settings, start):
    """The results of a run already finished at update `start` of its budget, or None.

    A run whose results.json was written at `start`, with `start` at (or
    past) `settings.train_steps`, has nothing to train or finish: its
    results are recorded again with `steps_this_run` 0 and returned.
    """
    s = settings
    previous = run.read_json(runs.RESULTS_FILE)
    if not (start >= s.train_steps and previous and previous.get("final_step") == start):
        return None
    more = ("its learning rate reached zero at this budget (--lr-decay linear)"
            if s.lr_decay == "linear" else "raise --train-steps to continue it")
    logger.info(f"The run in {run.root} is complete: update {start} of "
                f"{s.train_steps}, results in {run.results_file}. Nothing to train; "
                f"{more}.")
    previous["steps_this_run"] = 0
    run.write_json(runs.RESULTS_FILE, previous)
    return previous


def record(run, settings, result, *, report, start, tokens_per_update, final_weights,
           model, precision, machine, plan, export_path):
    """Writes results.json of a finished run and logs its test scores; returns the results.

    Args:
        run: the `runs.RunFolder`.
        settings: the resolved `Settings`.
        result: the test's `BleuResult`.
        report: the `job.FitReport` of this invocation's training, or None
            (training was complete at `start`).
        start: the update this invocation started from.
        tokens_per_update: mean non-pad target tokens of one update, or None.
        final_weights: the description of the final weights.
        model: the training model.
        precision: the run's `precision.Precision`.
        machine: the machine's description.
        plan: the `strategy.BatchPlan`.
        export_path: the SavedModel's folder, or None.

    Raises:
        runs.RunError: results.json could not be written (`stops.write_failure`).
    """
    s = settings
    summary = {
        "eval_split": s.eval_split,
        "bleu": result.bleu, "chrf": result.chrf, "bleu_signature": result.bleu_signature,
        "bleu_lowercase": result.bleu_lowercase,
        "bleu_lowercase_signature": result.bleu_lowercase_signature,
        "final_step": report.final_update if report else start,
        "steps_this_run": report.steps if report else 0,
        "train_seconds": report.seconds if report else 0.0,
        "step_seconds": report.step_seconds if report else 0.0,
        "target_tokens_per_update": tokens_per_update,
        "train_target_tokens_per_second": report.tokens_per_second if report else None,
        "train_peak_memory_mib": report.peak_memory_mib if report else None,
        "peak_memory_mib": peak_memory_mib(), "final_weights": final_weights,
        "parameters": model.count_params(), "backend": keras.backend.backend(),
        "precision": precision.policy, "precision_reason": precision.reason,
        "machine": machine,  # the last part's, for a continued run
        "batch_plan": dataclasses.asdict(plan),
        "saved_model": str(export_path) if export_path else None,
        "settings": s.to_dict(),
    }
    try:
        run.write_json(runs.RESULTS_FILE, summary)
    except files.WriteError as error:
        raise write_failure(error, run, "write") from None
    logger.info(f"{'Test' if s.eval_split == 'test' else 'Validation'} BLEU "
                f"{result.bleu:.2f}, chrF {result.chrf:.2f}, lowercased BLEU "
                f"{result.bleu_lowercase:.2f}; results in "
                f"{run.results_file}")
    return summary
