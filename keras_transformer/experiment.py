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
import logging
import os
import pathlib
import shutil
import time

import keras

from keras_transformer import runs
from keras_transformer.run_callbacks import is_chief
from keras_transformer.settings import Settings, SettingsError, resolve
from keras_transformer.training import peak_memory_mib, plot_training

logger = logging.getLogger("keras_transformer")

SPLITS = ("train", "valid", "test")
# Training batches whose mean token count gives the tokens per update.
TOKEN_SAMPLE_BATCHES = 200


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
    saved = runs.RunFolder(output_dir).read_json(runs.SETTINGS_FILE)
    return resolve(given, given_model, config_file, saved=saved)


# --- data --------------------------------------------------------------------------


def split_paths(directory):
    """`{split: (en_path, de_path)}` of a corpus folder, checked to exist."""
    directory = pathlib.Path(directory)
    paths = {s: (directory / f"{s}.en", directory / f"{s}.de") for s in SPLITS}
    missing = [str(p) for pair in paths.values() for p in pair if not p.exists()]
    if missing:
        raise FileNotFoundError(
            f"corpus folder {directory} must hold train/valid/test .en/.de files "
            f"(the layout of shared/data/multi30k); missing: {', '.join(missing)}"
        )
    return paths


def prepare_corpus(data, work_dir, *, seed=0):
    """Returns `{split: (en_path, de_path)}` for `--data`.

    Args:
        data: `"demo"` (generated offline, see `keras_transformer.data.demo`),
            `"wmt14"` (tensorflow-datasets; needs internet the first time), or
            a folder with `{train,valid,test}.{en,de}`.
        work_dir: where generated or exported text goes.
        seed: demo corpus seed.
    """
    from keras_transformer import data as kt_data

    work_dir = pathlib.Path(work_dir)
    if data == "demo":
        directory = work_dir / "demo"
        if not (directory / "test.de").exists():
            kt_data.write_demo_corpus(directory, seed=seed)
        return split_paths(directory)
    if data == "wmt14":
        directory = work_dir / "wmt14"
        if not (directory / "test.de").exists():
            directory.mkdir(parents=True, exist_ok=True)
            # tfds names: train (4.5M pairs), validation (newstest2013),
            # test (newstest2014).
            for split, tfds_split in (("train", "train"), ("valid", "validation"),
                                      ("test", "test")):
                dataset = kt_data.load_wmt14(tfds_split)
                pairs = ((s.decode("utf-8"), t.decode("utf-8"))
                         for s, t in dataset.as_numpy_iterator())
                kt_data.write_parallel_text(pairs, directory / f"{split}.en",
                                            directory / f"{split}.de")
        return split_paths(directory)
    return split_paths(data)


def prepare_data(settings, run):
    """Stage 1: the corpus files of `settings.data`."""
    return prepare_corpus(settings.data, run / "data", seed=settings.seed)


def prepare_tokenizer(settings, run, paths):
    """Stage 2: the shared vocabulary: the run's, `--init-from`'s, or a new one.

    A fine-tuned run uses the vocabulary of the weights it starts from: it is
    copied when the run has none yet, and a run whose own vocabulary differs
    is refused before anything is trained.
    """
    from keras_transformer import data as kt_data

    source_run = None
    if settings.init_from:
        source_run = runs.find_run_dir(settings.init_from)
        if source_run is None and not pathlib.Path(settings.init_from).exists():
            raise runs.RunError(f"--init-from {settings.init_from} does not exist (a run "
                                "folder or a .weights.h5 file)")
    if source_run is not None:
        source_spm = source_run / runs.TOKENIZER_FILE
        if run.tokenizer_file.is_file():
            if runs.file_sha256(source_spm) != run.tokenizer_hash():
                raise runs.RunError(
                    f"--init-from {settings.init_from}: its vocabulary {source_spm} differs "
                    f"from this run's {run.tokenizer_file}; fine-tune in a new --output-dir "
                    "(it takes the vocabulary of the weights it starts from)")
        else:
            run.root.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(source_spm, run.tokenizer_file)
            logger.info(f"Tokenizer copied from {source_spm} (--init-from)")
    if run.tokenizer_file.is_file():
        tokenizer = kt_data.Tokenizer.load(run.tokenizer_file)
        logger.info(f"Tokenizer {run.tokenizer_file} (vocabulary "
                    f"{tokenizer.vocabulary_size()})")
        return tokenizer
    start = time.time()
    run.root.mkdir(parents=True, exist_ok=True)
    try:
        tokenizer = kt_data.train_tokenizer(list(paths["train"]), settings.vocab_size,
                                            run.tokenizer_file)
    except ValueError as error:  # e.g. a vocabulary too large or small for the data
        raise SettingsError(f"--vocab-size {settings.vocab_size}: {error}") from None
    logger.info(f"Trained the shared tokenizer {run.tokenizer_file} (vocabulary "
                f"{tokenizer.vocabulary_size()}) in {time.time() - start:.1f} s")
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


def make_datasets(settings, tokenizer, paths, plan, *, start_update=0):
    """Stage 3: training and validation `tf.data` pipelines and their statistics.

    The training order is seeded with `seed + start_update`, so a resumed run
    does not replay the batches its first part began with.

    Returns:
        `(train_ds, valid_ds, target_tokens_per_update, valid_pairs)`.
    """
    import tensorflow as tf

    from keras_transformer import data as kt_data

    train_pairs = kt_data.load_parallel_text(*paths["train"])
    valid_pairs = kt_data.load_parallel_text(*paths["valid"])
    counts = kt_data.count_length_policy(train_pairs, tokenizer, settings.max_length)
    logger.info(f"Training pairs: {len(train_pairs)} ({train_pairs.num_dropped} empty lines "
                f"dropped); {counts}")
    common = dict(tokens_per_batch=plan.micro_batch_tokens, max_length=settings.max_length,
                  num_replicas=plan.replicas)
    seed = settings.seed + start_update
    train_ds = kt_data.make_dataset(train_pairs, tokenizer, training=True, repeat=True,
                                    seed=seed, **common)
    valid_ds = kt_data.make_dataset(valid_pairs, tokenizer, training=False, **common)
    # Mean non-pad target tokens per micro-batch, from a separate dataset:
    # iterating train_ds would advance its reshuffling.
    sample = kt_data.batch_statistics(kt_data.make_dataset(
        train_pairs, tokenizer, training=True, repeat=False, seed=seed,
        **common).take(TOKEN_SAMPLE_BATCHES))
    target_tokens_per_update = sample.target_tokens / sample.num_batches \
        * plan.grad_accum_steps
    logger.info(f"Batches: {plan}; {target_tokens_per_update:.0f} non-pad target tokens "
                f"per update on average")
    # A known number of validation batches: without it Keras warns that the
    # input "ran out of data".
    valid_ds = valid_ds.apply(tf.data.experimental.assert_cardinality(
        sum(1 for _ in valid_ds)))
    return train_ds, valid_ds, target_tokens_per_update, valid_pairs


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
    from keras_transformer.run_callbacks import StateSaver, TrainingLog, UpdateClock, Validator
    from keras_transformer.training import TrainingTimer

    s = settings
    remaining = s.train_steps - start_update
    clock = UpdateClock(start_update, s.grad_accum_steps)
    record = {}
    sources, references = bleu_sample
    callbacks = [
        clock,
        Validator(run, clock, every=s.validate_every, dataset=valid_ds,
                  translator=translator if s.validation_bleu_sentences else None,
                  sources=sources, references=references, record=record),
        TrainingLog(run, clock, every=s.log_every, total_updates=s.train_steps,
                    target_tokens_per_update=tokens_per_update, record=record,
                    validate_every=s.validate_every),
        StateSaver(run, clock, checkpoint_every=s.checkpoint_every, keep=s.average_last,
                   backup_minutes=s.backup_minutes),
        keras.callbacks.TerminateOnNaN(),
    ]
    timer = TrainingTimer()
    logger.info(f"Training updates {start_update + 1}-{s.train_steps} ({remaining} updates)")
    model.fit(train_ds, epochs=1, steps_per_epoch=remaining * s.grad_accum_steps,
              shuffle=False, callbacks=callbacks + [timer], verbose=0)
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
        best = run.read_json(runs.BEST_INFO_FILE)
        if best is not None and (run / runs.BEST_FILE).is_file():
            runs.load_model_weights(model, run / runs.BEST_FILE)
            used = f"the best validation BLEU's ({best['bleu']:.2f} at update {best['update']})"
        else:
            logger.warning("No best.weights.h5 (no validation BLEU measured): using the "
                           "last weights")
    runs.write_atomically(run.model_file, model.save)
    logger.info(f"Final weights: {used} -> {run.model_file}")
    return used


def evaluate_test(translator, run, settings, paths):
    """Stage 8: beam search of the test split, scored with sacreBLEU."""
    from keras_transformer.translate import evaluate_bleu

    return evaluate_bleu(translator, paths["test"][0], paths["test"][1],
                         beam_size=settings.beam_size, alpha=settings.alpha,
                         max_sentences=settings.eval_sentences,
                         output_file=run / runs.HYPOTHESES_FILE,
                         progress=bool(settings.verbose), verbose=bool(settings.verbose))


def export_run(translator, run, settings):
    """Stage 9: the TF Serving SavedModel, named after the run folder."""
    if not settings.export_dir:
        return None
    from keras_transformer.export import export_saved_model

    name = settings.model_name or run.root.resolve().name
    path = export_saved_model(translator, settings.export_dir, model_name=name,
                              beam_size=max(2, settings.beam_size), alpha=settings.alpha,
                              max_extra_length=settings.max_extra_length)
    logger.info(f"Exported the SavedModel for TF Serving -> {path}")
    return path


# --- the job -----------------------------------------------------------------------


def _check_config(run, config):
    """Writes config.json for a new run; for a continued one, says what changed."""
    saved = run.read_config()
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

    paths = prepare_data(s, run)  # checked before the run folder is created
    with run.lock() if is_chief() else contextlib.nullcontext():
        return _train_in(run, s, paths)


def _train_in(run, settings, paths):
    """`train` once the corpus is known and the run folder is locked."""
    from keras_transformer.translate import Translator
    from keras_transformer.translate import _read_lines as read_lines

    s = settings
    tokenizer = prepare_tokenizer(s, run, paths)
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
        train_ds, valid_ds, tokens_per_update, valid_pairs = make_datasets(
            s, tokenizer, paths, plan, start_update=start)
        sample = [valid_pairs[i] for i in range(min(s.validation_bleu_sentences,
                                                    len(valid_pairs)))]
        bleu_sample = ([source for source, _ in sample], [target for _, target in sample])
        translator = Translator(model, tokenizer, max_extra_length=s.max_extra_length)
        report = fit(model, run, s, train_ds, valid_ds, start_update=start,
                     tokens_per_update=tokens_per_update, translator=translator,
                     bleu_sample=bleu_sample)
    else:
        logger.info(f"Training is complete at update {start}; finishing the run "
                    "(final weights, test, export)")
        tokens_per_update = None

    final_weights = finalize_weights(model, run, s)
    plot_training(run.log_file, run / runs.PLOT_FILE)
    translator = translator or Translator(model, tokenizer, max_extra_length=s.max_extra_length)
    result = evaluate_test(translator, run, s, paths)
    export_path = export_run(translator, run, s)

    # The lines evaluate_bleu translated (blank ones included), so samples align.
    sources = read_lines(paths["test"][0])
    references = read_lines(paths["test"][1])
    lines = ["Sample translations (test split):"]
    for i in range(min(3, len(result.hypotheses))):
        lines.append(f"  EN:  {sources[i]}\n  REF: {references[i]}\n  HYP: "
                     f"{result.hypotheses[i]}")
    logger.info("\n".join(lines))
    summary = {
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
    run.write_json(runs.RESULTS_FILE, summary)
    logger.info(f"Test BLEU {result.bleu:.2f}, chrF {result.chrf:.2f}; results in "
                f"{run.results_file}")
    return summary


# --- scoring a finished run --------------------------------------------------------


def evaluate_run(run_dir, corpus_dir, *, splits=("test",), weights=("final",),
                 beam_sizes=(4,), alpha=0.6, max_sentences=None, verbose=True):
    """Scores a run's weights on test splits with sacreBLEU.

    Loads the model and tokenizer of `run_dir` (`runs.load_run`), then for
    every weights name, beam size and split translates
    `<corpus_dir>/<split>.en` and scores it against `<split>.de`.

    Args:
        run_dir: a training run folder, e.g. `runs/multi30k_small`.
        corpus_dir: folder with `<split>.en` / `<split>.de` files.
        splits: file stems, e.g. `("test", "test_2017_flickr")`.
        weights: names understood by `runs.resolve_weights` (`"final"`,
            `"averaged"`, `"best"`, `"last"`, `"ckpt-2000"`, or paths).
        beam_sizes: 1 is greedy decoding.
        alpha: length penalty of beam search.
        max_sentences: score only the first lines of each split.
        verbose: log each row as it is measured.

    Returns:
        A list of dicts with `weights`, `beam_size`, `split`, `bleu`, `chrf`,
        `num_sentences`, `seconds` and `bleu_signature`.
    """
    from keras_transformer.translate import Translator, evaluate_bleu

    run_dir, corpus_dir = pathlib.Path(run_dir), pathlib.Path(corpus_dir)
    runs.check_run(run_dir)
    files = {}
    for split in splits:
        source, reference = corpus_dir / f"{split}.en", corpus_dir / f"{split}.de"
        if not (source.exists() and reference.exists()):
            raise FileNotFoundError(f"split {split!r} needs {source} and {reference}")
        files[split] = (source, reference)
    weight_paths = {name: runs.resolve_weights(run_dir, name) for name in weights}
    model, tokenizer = runs.load_run(run_dir)
    final = [w.numpy() if hasattr(w, "numpy") else w for w in model.get_weights()]
    translator = Translator(model, tokenizer)
    rows = []
    for name, path in weight_paths.items():
        if path is None:
            model.set_weights(final)
        else:
            runs.load_model_weights(model, path)
        for beam_size in beam_sizes:
            for split, (source, reference) in files.items():
                start = time.time()
                result = evaluate_bleu(translator, source, reference, beam_size=beam_size,
                                       alpha=alpha, max_sentences=max_sentences,
                                       verbose=False)
                row = dict(weights=name, beam_size=beam_size, split=split,
                           bleu=result.bleu, chrf=result.chrf,
                           num_sentences=result.num_sentences,
                           seconds=time.time() - start,
                           bleu_signature=result.bleu_signature)
                rows.append(row)
                if verbose:
                    logger.info(f"{name:>10s}  beam {beam_size}  {split:18s} BLEU "
                                f"{row['bleu']:6.2f}  chrF {row['chrf']:6.2f}  "
                                f"({row['num_sentences']} sentences, {row['seconds']:.0f} s)")
    return rows


__all__ = ["BatchPlan", "FitReport", "build_model_for_run", "evaluate_run", "evaluate_test",
           "export_run", "finalize_weights", "fit", "get_strategy", "load_settings",
           "make_datasets", "num_replicas", "plan_batches", "prepare_corpus", "prepare_data",
           "prepare_tokenizer", "restore", "split_paths", "train"]
