"""The training job as named stages, each a function a user can call.

    from keras_transformer.training.settings import load_settings
    results = train(load_settings(given={"data": "demo", "preset": "tiny"}))

`train` runs: `prepare_data` (`data.corpora`) -> the run's vocabulary
(`run_vocabulary.adopt`) -> `optimization.build_training_model` under
`strategy.get_strategy`'s strategy -> `restore_state` (backup, or
`--init-from` weights) -> `fit` on `data.corpora.training_datasets` ->
`finalize_weights` (average / best / last) -> `evaluate_test` ->
`export_run`. The run folder (`keras_transformer.runs`) makes it
resumable: re-running the same command continues from the newest backup, a
larger `train_steps` continues a finished run, and a finished run re-run
unchanged trains nothing (`continuation`, `results`). A run that stops
early raises `stops.Stopped` (a signal, a diverged loss) or the
`runs.RunError` of `stops.write_failure` (a failed write). TensorFlow is
used for tf.data and tf.distribute; the model trains on any Keras backend.
Scoring a finished run is `keras_transformer.inference.evaluation`.
"""

import contextlib
import dataclasses
import logging
import pathlib

import keras

from keras_transformer import files, run_vocabulary, runs
from keras_transformer.data import corpora, sampling
from keras_transformer.inference import loading
from keras_transformer.training import continuation, results
from keras_transformer.training.guard import RunGuard
from keras_transformer.training.measurement import TrainingTimer, peak_memory_mib
from keras_transformer.training.plotting import plot_training
from keras_transformer.training.settings import SettingsError
from keras_transformer.training.stops import Outcome, stopped, write_failure
from keras_transformer.training.strategy import is_chief

logger = logging.getLogger("keras_transformer")


def prepare_data(settings, run):
    """Stage 1: the prepared corpus of `settings.data` (`data.corpora.prepare_corpus`).

    A run keeps its vocabulary: continuing it, or fine-tuning from
    `--init-from`, encodes the corpus with that vocabulary.
    """
    tokenizer_file = run_vocabulary.kept(run, settings.init_from)
    return corpora.prepare_corpus(
        settings.data, vocab_size=settings.vocab_size, max_length=settings.max_length,
        prepared_dir=settings.prepared_dir, tokenizer_file=tokenizer_file,
        tokenizer_from_default=tokenizer_file is not None
        and tokenizer_file == run.tokenizer_file, seed=settings.seed)


def restore_state(model, run, settings, strategy=None):
    """Stage 2: loads the newest backup (weights + optimizer), or `--init-from`'s weights.

    Returns:
        The optimizer update count training continues from (0 for a new run).
    """
    update, path = run.latest_state()
    if path is None:
        run.roll_back_to(0)
        if settings.init_from:
            source = pathlib.Path(settings.init_from)
            if source.is_dir():
                source_model, _ = loading.load_run(source)
                try:
                    model.set_weights(source_model.get_weights())
                except ValueError as error:
                    raise runs.RunError(f"--init-from {source}: its model does not fit "
                                        f"this one ({error})") from None
            else:
                loading.load_model_weights(model, source)
            logger.info(f"Initialised from {source}'s weights; a fresh optimizer and "
                        "learning-rate schedule (fine-tuning)")
        return 0
    scope = strategy.scope() if strategy is not None else contextlib.nullcontext()
    with scope:
        restored = loading.load_state(model, path, update)
    if restored != update:
        raise runs.RunError(f"{path} holds the optimizer state of update {restored}, "
                            f"not {update}; the file was renamed or is not this run's")
    run.roll_back_to(update)
    if settings.init_from:
        logger.info(f"--init-from {settings.init_from} is not applied again: the run "
                    f"continues from its own state at update {update}")
    return update


# --- training ----------------------------------------------------------------------


@dataclasses.dataclass
class FitReport:
    """What `fit` did: how it stopped, updates, time, throughput, memory."""

    outcome: Outcome
    start_update: int
    final_update: int
    seconds: float
    step_seconds: float
    steps: int
    tokens_per_second: float
    peak_memory_mib: float



def fit(model, run, settings, train_ds, valid_ds, *, start_update, tokens_per_update,
        translator=None, bleu_sample=((), ()), callbacks=()):
    """Stage 6: trains from `start_update` to `settings.train_steps` in one `model.fit`.

    `guard.RunGuard` writes checkpoints, backups, the log, TensorBoard
    and the best validation BLEU's weights, and stops on a signal or a
    diverged loss; `callbacks` are added after it
    (`examples/benchmark_training_job.py` times the updates with one).

    Returns:
        A `FitReport`; its `outcome` says whether `fit` finished, stopped on
        a signal or diverged.
    """
    s = settings
    remaining = s.train_steps - start_update
    run_guard = RunGuard.for_settings(s, run, model, start_update=start_update,
                                      tokens_per_update=tokens_per_update, valid_ds=valid_ds,
                                      translator=translator, bleu_sample=bleu_sample)
    # First: its end-of-batch hook runs before the guard's (validation,
    # checkpoints), which it must not time.
    timer = TrainingTimer()
    logger.info(f"Training updates {start_update + 1}-{s.train_steps} ({remaining} updates)")
    try:
        model.fit(train_ds, epochs=1, steps_per_epoch=remaining * s.grad_accum_steps,
                  shuffle=False, callbacks=[timer, run_guard, *callbacks], verbose=0)
    except files.WriteError as error:
        raise write_failure(error, run, "continue") from None
    finally:
        run_guard.close()
    final_update = run_guard.update
    report = FitReport(
        outcome=run_guard.outcome, start_update=start_update, final_update=final_update,
        seconds=timer.elapsed, step_seconds=timer.seconds, steps=final_update - start_update,
        tokens_per_second=timer.tokens_per_second(tokens_per_update / s.grad_accum_steps),
        peak_memory_mib=peak_memory_mib())
    if report.outcome.kind == "finished":
        logger.info(f"Training reached update {final_update} in {report.seconds:.0f} s "
                    f"({report.steps} updates this run, {report.tokens_per_second:.0f} target "
                    f"tokens/s in training steps, peak memory {report.peak_memory_mib:.0f} MiB)")
    return report


def _fit_checking_shards(corpus, *args, **kwargs):
    """`fit`; a damaged record turns into an error naming its shard.

    TFRecord checks each record's CRC as it reads it and reports "corrupted
    record at <offset>" without the file; the shards' sha256 find it.
    """
    import tensorflow as tf

    try:
        return fit(*args, **kwargs)
    except tf.errors.DataLossError as error:
        corpus.check(deep=True)  # raises PreparedCorpusError naming the shard
        raise runs.RunError(f"reading the prepared corpus {corpus.directory} failed: "
                            f"{error.message.splitlines()[0]}") from None


def finalize_weights(model, run, settings):
    """Stage 7: sets the final weights (`final_weights`) and saves `model.keras`.

    `averaged`: the mean of the last `average_last` checkpoints of this
    trajectory (section 6.1); `best`: the weights of the best validation
    BLEU; `last`: the weights as training left them.

    Returns:
        A short description of the weights used.
    """
    from keras_transformer.training.averaging import average_checkpoints


    used = "the last update's weights"
    if settings.final_weights == "averaged":
        checkpoints = [p for _, p in run.checkpoints()][-settings.average_last:]
        if checkpoints:
            averaged = run / runs.AVERAGED_FILE
            average_checkpoints(checkpoints, averaged)
            loading.load_model_weights(model, averaged)
            used = (f"the average of {len(checkpoints)} checkpoints "
                    f"({', '.join(p.name for p in checkpoints)})")
    elif settings.final_weights == "best":
        best = run.read_best()
        if best is not None and (run / runs.BEST_FILE).is_file():
            loading.load_model_weights(model, run / runs.BEST_FILE)
            used = f"the best validation BLEU's ({best['bleu']:.2f} at update {best['update']})"
        else:
            logger.warning("No best.weights.h5 (no validation BLEU measured): using the "
                           "last weights")
    files.save_model(model, run.model_file, what=f"writing the final model ({runs.MODEL_FILE})")
    logger.info(f"Final weights: {used} -> {run.model_file}")
    return used


def evaluate_test(translator, run, settings, corpus):
    """Stage 8: beam search of the test split (or `eval_split`), scored with sacreBLEU."""
    from keras_transformer.inference.evaluation import evaluate_bleu

    source, reference = corpus.text_paths(settings.eval_split)
    return evaluate_bleu(translator, source, reference, max_sentences=settings.eval_sentences,
                         output_file=run / runs.hypotheses_file(settings.eval_split),
                         progress=bool(settings.verbose), verbose=bool(settings.verbose))


def export_run(translator, run, settings):
    """Stage 9: the TF Serving SavedModel, named after the run folder.

    Raises:
        files.WriteError: the export could not be written (its partial folder
            is removed; earlier versions are untouched).
    """
    if not settings.export_dir:
        return None
    from keras_transformer.export.saved_model import export_saved_model

    name = settings.model_name or run.root.resolve().name
    # serving_default is a beam search; translate_greedy is there as well.
    path = export_saved_model(translator, settings.export_dir, model_name=name,
                              beam_size=max(2, settings.beam_size))
    logger.info(f"Exported the SavedModel for TF Serving -> {path}")
    return path


# --- the job -----------------------------------------------------------------------


def train(settings):
    """Runs the whole job for resolved `Settings`; returns the results dict.

    See the module docstring for the stages and for how a run folder is
    continued.

    Raises:
        stops.Stopped: training stopped on a signal (its last update backed
            up) or diverged (`stops.stopped`); its `outcome` says which.
        runs.RunError: a user error, or a write that failed
            (`stops.write_failure`).
    """
    from keras_transformer.model import precision as precisions

    s = settings
    run = runs.RunFolder(s.output_dir)
    keras.utils.set_random_seed(s.seed)
    logger.info(f"Keras {keras.__version__}, backend {keras.backend.backend()}; "
                f"run folder {run.root}")
    precision = precisions.choose_precision(s.mixed_precision)
    logger.info(f"Precision: {precision}")
    machine = precisions.machine()
    logger.info(f"Machine: {machine}")

    warmup = s.model_config().warmup_steps
    if s.lr_decay == "linear" and s.train_steps <= warmup:
        raise SettingsError(
            f"--lr-decay linear decays to zero at --train-steps {s.train_steps}, which "
            f"must be more than the {warmup} warm-up updates")
    corpus = prepare_data(s, run)  # checked before the run folder is created
    with run.lock() if is_chief() else contextlib.nullcontext():
        return _train_in(run, s, corpus, precision, machine)


def _build(run, s, tokenizer, precision):
    """The compiled training model (in the run's precision), its strategy and batch plan."""
    from keras_transformer.model.precision import policy_scope
    from keras_transformer.training import strategy as strategies
    from keras_transformer.training.optimization import build_training_model

    config = s.model_config(vocab_size=tokenizer.vocabulary_size())
    strategy = strategies.get_strategy(s.distribute)
    plan = strategies.plan_batches(s.tokens_per_batch, grad_accum_steps=s.grad_accum_steps,
                                   replicas=strategies.num_replicas(strategy),
                                   max_length=s.max_length)
    # The policy holds for the layers built here only: what the job builds
    # later (the float32 model it scores and exports) is float32.
    with policy_scope(precision.policy):
        model = build_training_model(
            config, strategy=strategy, learning_rate_factor=s.learning_rate_factor,
            grad_accum_steps=s.grad_accum_steps, jit_compile=s.jit_compile,
            decay_steps=s.train_steps if s.lr_decay == "linear" else None)
    continuation.write_config(run, config)
    logger.info(f"Model: preset {s.preset}, {model.count_params():,} parameters, "
                f"{plan.replicas} replica(s)")
    return model, strategy, plan


def _train_stage(run, s, corpus, model, tokenizer, plan, start):
    """Trains from update `start`: `(FitReport, the validation Translator, tokens per update)`."""
    from keras_transformer.inference.translator import Translator

    if start:
        logger.info(f"Continuing {run.root} at update {start} (of {s.train_steps})")
    else:
        logger.info(f"Starting training at update 0: {s.train_steps} updates")
    sampled = sampling.ensure_sampled(corpus, alpha=s.subword_sampling,
                                      views=s.sampling_views, seed=s.seed,
                                      sides=s.sampling_sides) \
        if s.subword_sampling else None
    # A continued run reads on where the stopped one was, batch for batch.
    train_ds, valid_ds, tokens_per_update = corpora.training_datasets(
        corpus, tokens_per_batch=plan.micro_batch_tokens, max_length=s.max_length,
        num_replicas=plan.replicas, grad_accum_steps=plan.grad_accum_steps,
        seed=s.seed, bucket_multiple=s.bucket_multiple, sampled=sampled,
        start_update=start)
    logger.info(f"Batches: {plan}; {tokens_per_update:.0f} non-pad target tokens per "
                "update on average")
    bleu_sample = corpora.validation_sample(corpus, s.validation_bleu_sentences)
    translator = Translator(model, tokenizer, s.decoding_options())
    report = _fit_checking_shards(corpus, model, run, s, train_ds, valid_ds,
                                  start_update=start, tokens_per_update=tokens_per_update,
                                  translator=translator, bleu_sample=bleu_sample)
    return report, translator, tokens_per_update


def _finish(run, s, corpus, model, tokenizer, precision, translator, *, update):
    """Final weights, plot, test score and export: `(final_weights, BleuResult, export path)`.

    Raises:
        runs.RunError: a write failed; the message says the run is trained
            and that the same command finishes it.
    """
    from keras_transformer.model.transformer import with_dtype
    from keras_transformer.inference.translator import Translator

    try:
        final_weights = finalize_weights(model, run, s)
        plot_training(run.log_file, run / runs.PLOT_FILE)
        if precision.mixed:  # the test and the export decode the float32 model
            translator = Translator(with_dtype(model, "float32"), tokenizer,
                                    s.decoding_options())
        translator = translator or Translator(model, tokenizer, s.decoding_options())
        result = evaluate_test(translator, run, s, corpus)
        export_path = export_run(translator, run, s)
    except OSError as error:  # files.WriteError included
        raise write_failure(error, run, "finish", update=update) from None
    return final_weights, result, export_path


def _log_samples(result, corpus, split):
    """Logs the first three translations of the scored split beside source and reference."""
    from keras_transformer.inference.evaluation import read_lines

    # The lines evaluate_bleu translated (blank ones included), so samples align.
    sources, references = (read_lines(p) for p in corpus.text_paths(split))
    lines = [f"Sample translations ({split} split):"]
    for i in range(min(3, len(result.hypotheses))):
        lines.append(f"  EN:  {sources[i]}\n  REF: {references[i]}\n  HYP: "
                     f"{result.hypotheses[i]}")
    logger.info("\n".join(lines))

def _train_in(run, settings, corpus, precision, machine):
    """`train` once the corpus is known and the run folder is locked."""
    s = settings
    continuation.check_schedule(run, s)
    tokenizer = run_vocabulary.adopt(run, corpus, s.init_from)
    run.write_json(runs.SETTINGS_FILE, s.to_dict())
    model, strategy, plan = _build(run, s, tokenizer, precision)
    start = restore_state(model, run, s, strategy)
    previous = results.completed(run, s, start)
    if previous is not None:
        return previous

    report, translator, tokens_per_update = None, None, None
    if start < s.train_steps:
        report, translator, tokens_per_update = _train_stage(run, s, corpus, model, tokenizer,
                                                             plan, start)
        if report.outcome.kind != "finished":
            raise stopped(report.outcome, run)
    else:
        logger.info(f"Training is complete at update {start}; finishing the run "
                    "(final weights, test, export)")
    final_weights, result, export_path = _finish(
        run, s, corpus, model, tokenizer, precision, translator,
        update=report.final_update if report else start)
    _log_samples(result, corpus, s.eval_split)
    return results.record(run, s, result, report=report, start=start,
                          tokens_per_update=tokens_per_update, final_weights=final_weights,
                          model=model, precision=precision, machine=machine, plan=plan,
                          export_path=export_path)
