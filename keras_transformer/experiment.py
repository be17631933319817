"""The training job as named stages, each a function a user can call.

    settings = load_settings(given={"data": "demo", "preset": "tiny"})
    results = train(settings)

`train` runs: `prepare_data` -> `prepare_tokenizer` -> `make_datasets` ->
`build_model_for_run` -> `restore` (backup, or `--init-from` weights) ->
`fit` -> `finalize_weights` (average / best / last) -> `evaluate_test` ->
`export_run`. The run folder (`keras_transformer.runs`) makes it
resumable: re-running the same command continues from the newest backup, a
larger `train_steps` continues a finished run, and a finished run re-run
unchanged trains nothing. TensorFlow is used for tf.data and tf.distribute;
the model trains on any Keras backend.
"""

import contextlib
import dataclasses
import itertools
import logging
import os
import pathlib
import time

import keras

from keras_transformer import runs
from keras_transformer.run_callbacks import is_chief
from keras_transformer.settings import Settings, SettingsError, resolve
from keras_transformer.training import peak_memory_mib, plot_training

logger = logging.getLogger("keras_transformer")

SPLITS = ("train", "valid", "test")


# --- settings ----------------------------------------------------------------------


def load_settings(given=None, given_model=None, config_file=None):
    """The settings of a `train` invocation, continuing the run folder's saved ones.

    The run folder is `output_dir` as given (flag or config file), else
    `runs/<data>_<preset>`; when it holds `settings.json`, those values
    are the defaults that the config file and the flags override.
    """
    from keras_transformer.settings import default_output_dir, read_config_file

    given = dict(given or {})
    file_job = read_config_file(config_file)[0] if config_file else {}
    merged = {**file_job, **given}
    output_dir = merged.get("output_dir")
    if output_dir is None:
        defaults = Settings.__dataclass_fields__
        output_dir = default_output_dir(merged.get("data", defaults["data"].default),
                                        merged.get("preset", defaults["preset"].default))
        given["output_dir"] = output_dir
    run = runs.RunFolder(output_dir)
    saved = run.read_json(runs.SETTINGS_FILE)
    if saved is not None:
        try:
            resolve(saved=saved)
        except (SettingsError, TypeError, ValueError) as error:
            raise runs.RunError(f"{run.settings_file} is damaged: {error}; restore it, or "
                                "start a new --output-dir") from None
    data = merged.get("data") or (saved or {}).get("data")
    if data and "vocab_size" not in merged:
        from keras_transformer.data import prepared

        if prepared.is_prepared(data):  # a prepared corpus brings its vocabulary
            given["vocab_size"] = prepared.PreparedCorpus(data).vocab_size
    return resolve(given, given_model, config_file, saved=saved)


# --- data --------------------------------------------------------------------------


def corpus_inputs(data, work_dir, *, seed=0):
    """The `CorpusInputs` that `--data` names (demo text is generated into `work_dir`).

    Args:
        data: `"demo"` (generated offline, see `keras_transformer.data.demo`),
            `"wmt14"` (tensorflow-datasets; needs internet the first time), or
            a folder with `{train,valid,test}.{en,de}`.
        work_dir: where the demo corpus's text goes.
        seed: demo corpus seed.
    """
    from keras_transformer.data import prepared

    if data == "demo":
        from keras_transformer import data as kt_data

        directory = pathlib.Path(work_dir) / f"demo-seed{seed}"
        if not (directory / "test.de").exists():
            kt_data.write_demo_corpus(directory, seed=seed)
        inputs = prepared.text_inputs(directory, name=f"demo-seed{seed}")
    elif data == "wmt14":
        from keras_transformer.data.readers import WMT14_NAME, load_wmt14

        # tfds names: train (4.5M pairs), validation (newstest2013), test
        # (newstest2014). Loaded only when a preparation is needed.
        inputs = prepared.CorpusInputs(
            "wmt14", train=lambda: load_wmt14("train"),
            valid=lambda: load_wmt14("validation"), test=lambda: load_wmt14("test"),
            key={"tfds": WMT14_NAME, "splits": ["train", "validation", "test"]})
    else:
        inputs = prepared.text_inputs(data)
    missing = [split for split in ("valid", "test") if getattr(inputs, split) is None]
    if missing:
        raise FileNotFoundError(
            f"corpus folder {data} must hold train/valid/test .en/.de files (the layout "
            f"of shared/data/multi30k); missing: {', '.join(missing)}")
    return inputs


def default_prepared_dir(settings, inputs, tokenizer_file=None):
    """`<runs folder>/prepared/<corpus>_v<vocab>` (or `_spm-<hash>` for a given vocabulary)."""
    from keras_transformer.data import prepared

    return prepared.default_directory(pathlib.Path(settings.output_dir).parent / "prepared",
                                      inputs, settings.vocab_size, tokenizer_file)


def _given_tokenizer(settings, run):
    """The vocabulary a run must keep: its own, or `--init-from`'s; `None` for a new one."""
    source_spm = None
    if settings.init_from:
        source_run = runs.find_run_dir(settings.init_from)
        if source_run is None and not pathlib.Path(settings.init_from).exists():
            raise runs.RunError(f"--init-from {settings.init_from} does not exist (a run "
                                "folder or a .weights.h5 file)")
        if source_run is not None:
            source_spm = source_run / runs.TOKENIZER_FILE
    if run.tokenizer_file.is_file() or (run / runs.VOCABULARY_INFO_FILE).is_file():
        run.restore_tokenizer()  # a damaged copy is restored from its source, or named
        if source_spm is not None and (runs.file_sha256(source_spm)
                                       != run.tokenizer_hash()):
            raise runs.RunError(
                f"--init-from {settings.init_from}: its vocabulary {source_spm} differs "
                f"from this run's {run.tokenizer_file}; fine-tune in a new --output-dir "
                "(it takes the vocabulary of the weights it starts from)")
        return run.tokenizer_file
    return source_spm


def prepare_data(settings, run):
    """Stage 1: the prepared corpus of `settings.data` (prepared now only when needed).

    `--data` may name a prepared folder (`keras-transformer prepare`), or
    demo / wmt14 / a text folder, which is prepared into `--prepared-dir`
    (default `default_prepared_dir`) the first time and reused afterwards;
    a changed input file or vocabulary size prepares it again. A run keeps
    its vocabulary: continuing it, or fine-tuning from `--init-from`, encodes
    the corpus with that vocabulary.
    """
    from keras_transformer.data import prepared

    if prepared.is_prepared(settings.data):
        corpus = prepared.PreparedCorpus(settings.data)
        corpus.check()
        if corpus.vocab_size != settings.vocab_size:
            raise SettingsError(
                f"--vocab-size {settings.vocab_size}: the prepared corpus {settings.data} "
                f"has vocabulary size {corpus.vocab_size}; prepare it again with "
                f"--vocab-size {settings.vocab_size}, or leave the flag out")
        logger.info(f"Prepared corpus {settings.data}: {corpus.summary()}")
    else:
        inputs = corpus_inputs(settings.data, run.root.parent / "prepared",
                               seed=settings.seed)
        tokenizer_file = _given_tokenizer(settings, run)
        own = tokenizer_file is not None and tokenizer_file == run.tokenizer_file
        directory = settings.prepared_dir or default_prepared_dir(
            settings, inputs, None if own or tokenizer_file is None else tokenizer_file)
        if own and prepared.stale_reason(directory, inputs,
                                         vocab_size=settings.vocab_size) is None:
            tokenizer_file = None  # the usual case: the run's vocabulary came from there
        # The preparation belongs to the corpus, not to the run: the seed of
        # its tokenizer sample and shard order is `prepare`'s default, so that
        # runs with any --seed share it and `prepare` ahead of time is the same.
        corpus = prepared.ensure_prepared(inputs, directory, vocab_size=settings.vocab_size,
                                          tokenizer_file=tokenizer_file,
                                          max_length=settings.max_length)
    if not corpus.has_split("valid") or corpus.text_paths("test") is None:
        raise runs.RunError(f"the prepared corpus {corpus.directory} has no valid and test "
                            "splits; training needs both")
    return corpus


def prepare_tokenizer(settings, run, corpus):
    """Stage 2: the run's copy of the corpus's vocabulary (checked when it has one).

    A run keeps the vocabulary it was trained with: a continued run whose
    prepared corpus now has another one (prepared again since) is refused,
    and so is fine-tuning from `--init-from` weights whose vocabulary is not
    the corpus's.
    """
    from keras_transformer import data as kt_data

    if run.tokenizer_file.is_file() or (run / runs.VOCABULARY_INFO_FILE).is_file():
        # A damaged copy is restored from the corpus it came from, or named.
        run.restore_tokenizer(candidates=[corpus.tokenizer_file])
        if run.tokenizer_hash() != corpus.tokenizer_sha256:
            raise runs.RunError(
                f"{run.tokenizer_file} differs from the vocabulary of the prepared corpus "
                f"{corpus.tokenizer_file} (prepared again since this run began?); "
                "continue with the run's own vocabulary: pass --prepared-dir for a new "
                "preparation (it will use the run's vocabulary), or train in a new "
                "--output-dir")
    else:
        if settings.init_from:
            source_run = runs.find_run_dir(settings.init_from)
            if source_run is not None and runs.file_sha256(
                    source_run / runs.TOKENIZER_FILE) != corpus.tokenizer_sha256:
                raise runs.RunError(
                    f"--init-from {settings.init_from}: its vocabulary differs from the "
                    f"prepared corpus {corpus.directory}'s; let the job prepare --data "
                    "with it (name the text folder, not a prepared one)")
        runs.write_bytes(run.tokenizer_file, corpus.tokenizer_file.read_bytes())
    if not (run / runs.VOCABULARY_INFO_FILE).is_file():
        run.record_tokenizer(corpus.tokenizer_file)
    tokenizer = kt_data.Tokenizer.load(run.tokenizer_file)
    logger.info(f"Tokenizer {run.tokenizer_file} (vocabulary {tokenizer.vocabulary_size()})")
    return tokenizer


@dataclasses.dataclass(frozen=True)
class BatchPlan:
    """How `tokens_per_batch` tokens per update are split.

    `tokens_per_update` = `micro_batch_tokens` x `grad_accum_steps`, and a
    micro-batch is split evenly over `replicas` (`replica_tokens` each).
    """

    tokens_per_update: int
    grad_accum_steps: int
    replicas: int
    micro_batch_tokens: int
    replica_tokens: int

    def __str__(self):
        return (f"{self.tokens_per_update} tokens per update = {self.grad_accum_steps} "
                f"micro-batch(es) of {self.micro_batch_tokens} tokens over "
                f"{self.replicas} replica(s) ({self.replica_tokens} each)")


def plan_batches(tokens_per_batch, *, grad_accum_steps=1, replicas=1, max_length=None):
    """The `BatchPlan` for a token budget per update; raises if a replica's share is too small."""
    micro = tokens_per_batch // grad_accum_steps
    replica = micro // replicas
    if max_length is not None and replica < max_length:
        raise SettingsError(
            f"--tokens-per-batch {tokens_per_batch} split over {grad_accum_steps} "
            f"micro-batch(es) and {replicas} replica(s) leaves {replica} tokens per "
            f"replica, fewer than one sequence of --max-length {max_length}; raise "
            "--tokens-per-batch or lower --grad-accum-steps")
    return BatchPlan(tokens_per_update=micro * grad_accum_steps,
                     grad_accum_steps=grad_accum_steps, replicas=replicas,
                     micro_batch_tokens=replica * replicas, replica_tokens=replica)


def make_datasets(settings, corpus, plan, *, start_update=0):
    """Stage 3: training and validation `tf.data` pipelines streamed from the shards.

    The training order is seeded with `seed + start_update`, so a resumed run
    does not replay the batches its first part began with. Token counts come
    from the manifest: nothing is read before the first update.

    Returns:
        `(train_ds, valid_ds, target_tokens_per_update)`.
    """
    import tensorflow as tf

    common = dict(tokens_per_batch=plan.micro_batch_tokens, max_length=settings.max_length,
                  num_replicas=plan.replicas)
    counts = corpus.length_policy("train", settings.max_length)
    logger.info(f"Training pairs: {counts.num_pairs:,}; the length policy (max "
                f"{settings.max_length} tokens) drops {counts.num_over_long:,}")
    train_ds = corpus.dataset("train", training=True, repeat=True,
                              seed=settings.seed + start_update, **common)
    valid_ds = corpus.dataset("valid", training=False, **common)
    batches, target_tokens = corpus.batch_plan("train", training=True, **common)
    target_tokens_per_update = target_tokens / max(batches, 1) * plan.grad_accum_steps
    logger.info(f"Batches: {plan}; {target_tokens_per_update:.0f} non-pad target tokens "
                f"per update on average")
    # A known number of validation batches: without it Keras warns that the
    # input "ran out of data".
    valid_batches, _ = corpus.batch_plan("valid", training=False, **common)
    valid_ds = valid_ds.apply(tf.data.experimental.assert_cardinality(valid_batches))
    return train_ds, valid_ds, target_tokens_per_update


def validation_sample(corpus, count):
    """The first `count` validation pairs with two non-empty sides, as (sources, references)."""
    from keras_transformer.data.readers import iter_parallel_lines

    if not count:
        return (), ()
    pairs = ((s, t) for _, s, t in iter_parallel_lines(*corpus.text_paths("valid"))
             if s.strip() and t.strip())
    sample = list(itertools.islice(pairs, count))
    return [s for s, _ in sample], [t for _, t in sample]


# --- distribution ------------------------------------------------------------------


def get_strategy(kind="auto"):
    """Chooses how to spread training over devices.

    TensorFlow backend: `"auto"` gives `tf.distribute.MirroredStrategy` when
    several GPUs are visible, else none; `"mirrored"` forces it (also over
    logical CPU devices); `"multiworker"` gives
    `MultiWorkerMirroredStrategy` from the `TF_CONFIG` environment variable.
    JAX backend: `"auto"`/`"mirrored"` set `keras.distribution.DataParallel`
    over all local devices when there are several. PyTorch backend: single
    device only.

    Returns:
        A `tf.distribute.Strategy` or `None` (no strategy scope needed).
    """
    backend = keras.backend.backend()
    if kind == "none":
        return None
    if backend == "tensorflow":
        import tensorflow as tf

        if kind == "auto":
            gpus = tf.config.list_logical_devices("GPU")
            return tf.distribute.MirroredStrategy() if len(gpus) > 1 else None
        if kind == "mirrored":
            return tf.distribute.MirroredStrategy()
        if kind == "multiworker":
            if "TF_CONFIG" not in os.environ:
                raise SettingsError(
                    "--distribute multiworker needs the TF_CONFIG environment variable "
                    "(cluster and task of this worker)"
                )
            return tf.distribute.MultiWorkerMirroredStrategy()
    elif backend == "jax":
        import jax

        if kind == "multiworker":
            raise SettingsError(
                "multi-worker training is supported on the TensorFlow backend "
                "(MultiWorkerMirroredStrategy); on JAX call jax.distributed.initialize() "
                "and use keras.distribution yourself"
            )
        devices = jax.devices()
        if len(devices) > 1:
            keras.distribution.set_distribution(
                keras.distribution.DataParallel(devices=devices))
        elif kind == "mirrored":
            logger.info("Only one JAX device is visible: training on it.")
        return None
    elif kind in ("mirrored", "multiworker"):
        raise SettingsError(
            f"--distribute {kind} needs the TensorFlow (or JAX) backend; the "
            f"{backend} backend trains on one device"
        )
    return None


def num_replicas(strategy):
    if strategy is not None:
        return strategy.num_replicas_in_sync
    distribution = keras.distribution.distribution()
    if distribution is not None:
        return len(distribution.device_mesh.devices.flatten())
    return 1


# --- model -------------------------------------------------------------------------


def _jit_compile(setting):
    if setting == "auto":
        return "auto"
    return setting in ("true", "1", True)


def build_model_for_run(settings, config, strategy=None):
    """Stage 4: the model under the strategy's scope, compiled the paper's way.

    The learning rate is the paper's schedule times `learning_rate_factor`.
    """
    from keras_transformer.model import build_model
    from keras_transformer.schedules import TransformerSchedule
    from keras_transformer.training import compile_model

    scope = strategy.scope() if strategy is not None else contextlib.nullcontext()
    with scope:
        model = build_model(config)
        schedule = TransformerSchedule(config.d_model, config.warmup_steps,
                                       scale=settings.learning_rate_factor,
                                       accumulation_steps=settings.grad_accum_steps)
        compile_model(model, learning_rate=schedule,
                      gradient_accumulation_steps=settings.grad_accum_steps,
                      jit_compile=_jit_compile(settings.jit_compile))
    return model


def restore(model, run, settings, strategy=None):
    """Stage 5: loads the newest backup (weights + optimizer), or `--init-from`'s weights.

    Returns:
        The optimizer update count training continues from (0 for a new run).
    """
    update, path = run.latest_state()
    if path is None:
        run.roll_back_to(0)
        if settings.init_from:
            source = pathlib.Path(settings.init_from)
            if source.is_dir():
                source_model, _ = runs.load_run(source)
                try:
                    model.set_weights(source_model.get_weights())
                except ValueError as error:
                    raise runs.RunError(f"--init-from {source}: its model does not fit "
                                        f"this one ({error})") from None
            else:
                runs.load_model_weights(model, source)
            logger.info(f"Initialised from {source}'s weights; a fresh optimizer and "
                        "learning-rate schedule (fine-tuning)")
        return 0
    scope = strategy.scope() if strategy is not None else contextlib.nullcontext()
    with scope:
        restored = runs.load_state(model, path, update)
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
    """What `fit` did: updates, time, throughput, memory."""

    start_update: int
    final_update: int
    seconds: float
    step_seconds: float
    steps: int
    tokens_per_second: float
    peak_memory_mib: float


def fit(model, run, settings, train_ds, valid_ds, *, start_update, tokens_per_update,
        translator=None, bleu_sample=((), ())):
    """Stage 6: trains from `start_update` to `settings.train_steps` in one `model.fit`.

    Callbacks (`keras_transformer.run_callbacks`) write checkpoints, backups,
    the log, TensorBoard and the best validation BLEU's weights.
    """
    from keras_transformer.run_callbacks import (DivergenceCheck, SignalStop, StateSaver,
                                                 TrainingLog, UpdateClock, Validator)
    from keras_transformer.training import TrainingTimer

    s = settings
    remaining = s.train_steps - start_update
    clock = UpdateClock(start_update, s.grad_accum_steps)
    record = {}
    sources, references = bleu_sample
    log = TrainingLog(run, clock, every=s.log_every, total_updates=s.train_steps,
                      target_tokens_per_update=tokens_per_update, record=record,
                      validate_every=s.validate_every)
    saver = StateSaver(run, clock, checkpoint_every=s.checkpoint_every, keep=s.average_last,
                       backup_minutes=s.backup_minutes)
    divergence = DivergenceCheck(clock, log, saver, vocab_size=model.config.vocab_size,
                                 enabled=s.divergence_check)
    stop = SignalStop(saver, clock)
    callbacks = [
        clock,
        Validator(run, clock, every=s.validate_every, dataset=valid_ds,
                  translator=translator if s.validation_bleu_sentences else None,
                  sources=sources, references=references, record=record),
        log,
        divergence,  # before the saver: a diverged update is not saved
        saver,
        stop,
    ]
    timer = TrainingTimer()
    logger.info(f"Training updates {start_update + 1}-{s.train_steps} ({remaining} updates)")
    try:
        model.fit(train_ds, epochs=1, steps_per_epoch=remaining * s.grad_accum_steps,
                  shuffle=False, callbacks=callbacks + [timer], verbose=0)
    except runs.WriteError as error:
        raise runs.RunError(f"{error}; {run.newest_state_text()}. Free space (or fix the "
                            "folder) and run the same command to continue") from None
    finally:
        stop.restore_handlers()
    if divergence.diverged is not None:
        raise _diverged(run, divergence)
    if stop.signal_number is not None:
        raise TrainingStopped(stop.signal_number, stop.backup)
    final_update = clock.update
    report = FitReport(
        start_update=start_update, final_update=final_update, seconds=timer.elapsed,
        step_seconds=timer.seconds, steps=final_update - start_update,
        tokens_per_second=timer.tokens_per_second(tokens_per_update / s.grad_accum_steps),
        peak_memory_mib=peak_memory_mib())
    logger.info(f"Training reached update {final_update} in {report.seconds:.0f} s "
                f"({report.steps} updates this run, {report.tokens_per_second:.0f} target "
                f"tokens/s in training steps, peak memory {report.peak_memory_mib:.0f} MiB)")
    return report


class TrainingStopped(runs.RunError):
    """`fit` stopped on a signal (`SignalStop`), its last update backed up.

    Attributes:
        exit_status: 128 + the signal's number (143 for SIGTERM, 130 for SIGINT).
    """

    def __init__(self, signal_number, backup):
        import signal

        self.exit_status = 128 + signal_number
        name = signal.Signals(signal_number).name
        if backup is None:
            message = f"stopped by {name}; nothing was written on the way out"
        else:
            update, path = backup
            message = (f"stopped by {name} after update {update}, backed up in {path}; run "
                       "the same command to continue from it")
        super().__init__(message)


def _diverged(run, divergence):
    """The `RunError` of a diverged run, after setting aside the states written since."""
    update, loss, reason = divergence.diverged
    good = divergence.last_good
    run.roll_back_to(good)  # moves later states and log rows aside, deletes nothing
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
        f"what was written after update {good} is set aside in {runs.ROLLED_BACK_DIR}/. "
        f"Nothing was exported. Lower --learning-rate-factor and run again to {again}, or "
        "turn this check off with --no-divergence-check")


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
    from keras_transformer.training import average_checkpoints

    used = "the last update's weights"
    if settings.final_weights == "averaged":
        checkpoints = [p for _, p in run.checkpoints()][-settings.average_last:]
        if checkpoints:
            averaged = run / runs.AVERAGED_FILE
            average_checkpoints(checkpoints, averaged)
            runs.load_model_weights(model, averaged)
            used = (f"the average of {len(checkpoints)} checkpoints "
                    f"({', '.join(p.name for p in checkpoints)})")
    elif settings.final_weights == "best":
        best = run.read_best()
        if best is not None and (run / runs.BEST_FILE).is_file():
            runs.load_model_weights(model, run / runs.BEST_FILE)
            used = f"the best validation BLEU's ({best['bleu']:.2f} at update {best['update']})"
        else:
            logger.warning("No best.weights.h5 (no validation BLEU measured): using the "
                           "last weights")
    runs.write_atomically(run.model_file, model.save)
    logger.info(f"Final weights: {used} -> {run.model_file}")
    return used


def evaluate_test(translator, run, settings, corpus):
    """Stage 8: beam search of the test split (or `eval_split`), scored with sacreBLEU."""
    from keras_transformer.evaluation import evaluate_bleu

    source, reference = corpus.text_paths(settings.eval_split)
    return evaluate_bleu(translator, source, reference, max_sentences=settings.eval_sentences,
                         output_file=run / runs.hypotheses_file(settings.eval_split),
                         progress=bool(settings.verbose), verbose=bool(settings.verbose))


def _what_failed(error):
    if isinstance(error, runs.WriteError):
        return str(error)
    reason = os.strerror(error.errno) if getattr(error, "errno", None) else str(error)
    where = f" {error.filename}" if getattr(error, "filename", None) else ""
    return f"writing{where} failed: {reason}"


def export_run(translator, run, settings):
    """Stage 9: the TF Serving SavedModel, named after the run folder.

    Raises:
        runs.WriteError: the export could not be written (its partial folder
            is removed; earlier versions are untouched).
    """
    if not settings.export_dir:
        return None
    from keras_transformer.export import export_saved_model

    name = settings.model_name or run.root.resolve().name
    # serving_default is a beam search; translate_greedy is there as well.
    path = export_saved_model(translator, settings.export_dir, model_name=name,
                              beam_size=max(2, settings.beam_size))
    logger.info(f"Exported the SavedModel for TF Serving -> {path}")
    return path


# --- the job -----------------------------------------------------------------------


def _check_config(run, config):
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


def train(settings):
    """Runs the whole job for resolved `Settings`; returns the results dict.

    See the module docstring for the stages and for how a run folder is
    continued.
    """
    s = settings
    run = runs.RunFolder(s.output_dir)
    keras.utils.set_random_seed(s.seed)
    logger.info(f"Keras {keras.__version__}, backend {keras.backend.backend()}; "
                f"run folder {run.root}")

    corpus = prepare_data(s, run)  # checked before the run folder is created
    with run.lock() if is_chief() else contextlib.nullcontext():
        return _train_in(run, s, corpus)


def _train_in(run, settings, corpus):
    """`train` once the corpus is known and the run folder is locked."""
    from keras_transformer.translate import Translator
    from keras_transformer.evaluation import read_lines

    s = settings
    tokenizer = prepare_tokenizer(s, run, corpus)
    run.write_json(runs.SETTINGS_FILE, s.to_dict())
    config = s.model_config(vocab_size=tokenizer.vocabulary_size())

    if s.mixed_precision != "none":
        keras.mixed_precision.set_global_policy(s.mixed_precision)
    strategy = get_strategy(s.distribute)
    plan = plan_batches(s.tokens_per_batch, grad_accum_steps=s.grad_accum_steps,
                        replicas=num_replicas(strategy), max_length=s.max_length)
    model = build_model_for_run(s, config, strategy)
    _check_config(run, config)
    logger.info(f"Model: preset {s.preset}, {model.count_params():,} parameters, "
                f"{plan.replicas} replica(s)")

    start = restore(model, run, s, strategy)
    previous = run.read_json(runs.RESULTS_FILE)
    if start >= s.train_steps and previous and previous.get("final_step") == start:
        logger.info(f"The run in {run.root} is complete: update {start} of "
                    f"{s.train_steps}, results in {run.results_file}. Nothing to train; "
                    "raise --train-steps to continue it.")
        previous["steps_this_run"] = 0
        run.write_json(runs.RESULTS_FILE, previous)
        return previous

    report = None
    translator = None
    if start < s.train_steps:
        if start:
            logger.info(f"Continuing {run.root} at update {start} (of {s.train_steps})")
        else:
            logger.info(f"Starting training at update 0: {s.train_steps} updates")
        train_ds, valid_ds, tokens_per_update = make_datasets(s, corpus, plan,
                                                              start_update=start)
        bleu_sample = validation_sample(corpus, s.validation_bleu_sentences)
        translator = Translator(model, tokenizer, s.decoding_options())
        report = _fit_checking_shards(corpus, model, run, s, train_ds, valid_ds,
                                      start_update=start,
                                      tokens_per_update=tokens_per_update,
                                      translator=translator, bleu_sample=bleu_sample)
    else:
        logger.info(f"Training is complete at update {start}; finishing the run "
                    "(final weights, test, export)")
        tokens_per_update = None

    try:
        final_weights = finalize_weights(model, run, s)
        plot_training(run.log_file, run / runs.PLOT_FILE)
        translator = translator or Translator(model, tokenizer, s.decoding_options())
        result = evaluate_test(translator, run, s, corpus)
        export_path = export_run(translator, run, s)
    except (runs.WriteError, OSError) as error:
        update = report.final_update if report else start
        raise runs.RunError(
            f"{_what_failed(error)}; training is complete at update {update} and "
            f"{run.newest_state_text()}. Free space (or fix the folder) and run the same "
            "command to finish the run (final weights, test, export)") from None

    # The lines evaluate_bleu translated (blank ones included), so samples align.
    sources, references = (read_lines(p) for p in corpus.text_paths(s.eval_split))
    lines = [f"Sample translations ({s.eval_split} split):"]
    for i in range(min(3, len(result.hypotheses))):
        lines.append(f"  EN:  {sources[i]}\n  REF: {references[i]}\n  HYP: "
                     f"{result.hypotheses[i]}")
    logger.info("\n".join(lines))
    summary = {
        "eval_split": s.eval_split,
        "bleu": result.bleu, "chrf": result.chrf, "bleu_signature": result.bleu_signature,
        "final_step": report.final_update if report else start,
        "steps_this_run": report.steps if report else 0,
        "train_seconds": report.seconds if report else 0.0,
        "step_seconds": report.step_seconds if report else 0.0,
        "target_tokens_per_update": tokens_per_update,
        "train_target_tokens_per_second": report.tokens_per_second if report else None,
        "train_peak_memory_mib": report.peak_memory_mib if report else None,
        "peak_memory_mib": peak_memory_mib(), "final_weights": final_weights,
        "parameters": model.count_params(), "backend": keras.backend.backend(),
        "batch_plan": dataclasses.asdict(plan),
        "saved_model": str(export_path) if export_path else None,
        "settings": s.to_dict(),
    }
    try:
        run.write_json(runs.RESULTS_FILE, summary)
    except runs.WriteError as error:
        raise runs.RunError(f"{error}; the run is otherwise complete: run the same command "
                            "to write it") from None
    logger.info(f"{'Test' if s.eval_split == 'test' else 'Validation'} BLEU "
                f"{result.bleu:.2f}, chrF {result.chrf:.2f}; results in "
                f"{run.results_file}")
    return summary


__all__ = ["BatchPlan", "FitReport", "build_model_for_run", "evaluate_test",
           "export_run", "finalize_weights", "fit", "get_strategy", "load_settings",
           "make_datasets", "num_replicas", "plan_batches", "prepare_data",
           "prepare_tokenizer", "restore", "corpus_inputs", "train", "validation_sample"]
