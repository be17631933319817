"""The end-to-end job that `examples/wmt_ende.py` runs, as importable functions.

data -> shared tokenizer -> tf.data pipelines -> model under the distribution
strategy -> compile the paper's way -> `model.fit` (resumable) -> average the
last checkpoints -> beam search the test set -> sacreBLEU -> plots and
samples. TensorFlow is used for tf.data and tf.distribute; the model itself
trains on any Keras backend.
"""

import contextlib
import dataclasses
import json
import math
import os
import pathlib
import time

import keras

from keras_transformer.config import TransformerConfig

SPLITS = ("train", "valid", "test")
# The shared SentencePiece model in a run's output folder.
TOKENIZER_FILE = "spm.model"
# Training batches whose mean token count gives the reported tokens/s.
TOKEN_SAMPLE_BATCHES = 200

# Settings used when a flag is not given. The paper's presets reproduce the
# paper (WMT14, 100k steps of 25,000 tokens for base, 300k for big); the CPU
# presets are sized for the offline demo and for Multi30k on 2 cores.
PRESET_DEFAULTS = {
    "base": dict(train_steps=100_000, tokens_per_batch=25_000, vocab_size=37_000,
                 max_length=256, checkpoint_every=1000, average_last=5),
    "big": dict(train_steps=300_000, tokens_per_batch=25_000, vocab_size=37_000,
                max_length=256, checkpoint_every=1000, average_last=20),
    # small: about 55 minutes of training on 2 CPU cores (Multi30k).
    "small": dict(train_steps=2_400, tokens_per_batch=4096, vocab_size=8000,
                  max_length=128, checkpoint_every=200, average_last=5),
    "tiny": dict(train_steps=500, tokens_per_batch=3072, vocab_size=4000,
                 max_length=96, checkpoint_every=100, average_last=3),
}


@dataclasses.dataclass
class JobSettings:
    """Everything `run` needs; `examples/wmt_ende.py` fills it from flags."""

    data: str = "wmt14"
    preset: str = "base"
    output_dir: str = "runs/wmt_ende"
    train_steps: int = None
    tokens_per_batch: int = None
    vocab_size: int = None
    max_length: int = None
    checkpoint_every: int = None
    average_last: int = None
    grad_accum_steps: int = 1
    mixed_precision: str = "none"
    distribute: str = "auto"
    seed: int = 0
    beam_size: int = 4
    alpha: float = 0.6
    eval_sentences: int = None
    jit_compile: str = "auto"
    export_dir: str = "saved_models"
    model_name: str = "transformer"
    verbose: int = 1

    def __post_init__(self):
        if self.preset not in PRESET_DEFAULTS:
            raise ValueError(
                f"Unknown preset {self.preset!r}; choose from {sorted(PRESET_DEFAULTS)}"
            )
        for name, value in PRESET_DEFAULTS[self.preset].items():
            if getattr(self, name) is None:
                setattr(self, name, value)
        if self.mixed_precision not in ("none", "mixed_float16", "mixed_bfloat16"):
            raise ValueError(
                "mixed_precision must be none, mixed_float16 or mixed_bfloat16, "
                f"received {self.mixed_precision!r}"
            )
        if self.distribute not in ("auto", "none", "mirrored", "multiworker"):
            raise ValueError(
                "distribute must be auto, none, mirrored or multiworker, "
                f"received {self.distribute!r}"
            )
        for name in ("train_steps", "tokens_per_batch", "vocab_size", "checkpoint_every",
                     "average_last", "grad_accum_steps"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be >= 1, received {getattr(self, name)}")


# --- data --------------------------------------------------------------------


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


def load_or_train_tokenizer(paths, vocab_size, model_file, *, verbose=True):
    """Reuses `model_file` when it exists, else trains it on train.en + train.de."""
    from keras_transformer import data as kt_data

    model_file = pathlib.Path(model_file)
    if model_file.exists():
        tokenizer = kt_data.Tokenizer.load(model_file)
        if verbose:
            print(f"Reusing tokenizer {model_file} "
                  f"(vocabulary {tokenizer.vocabulary_size()})")
        return tokenizer
    model_file.parent.mkdir(parents=True, exist_ok=True)
    start = time.time()
    tokenizer = kt_data.train_tokenizer(list(paths["train"]), vocab_size, model_file)
    if verbose:
        print(f"Trained shared tokenizer {model_file} (vocabulary "
              f"{tokenizer.vocabulary_size()}) in {time.time() - start:.1f} s")
    return tokenizer


# --- distribution ------------------------------------------------------------


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
                raise ValueError(
                    "--distribute multiworker needs the TF_CONFIG environment variable "
                    "(cluster and task of this worker)"
                )
            return tf.distribute.MultiWorkerMirroredStrategy()
    elif backend == "jax":
        import jax

        if kind == "multiworker":
            raise ValueError(
                "multi-worker training is supported on the TensorFlow backend "
                "(MultiWorkerMirroredStrategy); on JAX call jax.distributed.initialize() "
                "and use keras.distribution yourself"
            )
        devices = jax.devices()
        if len(devices) > 1:
            keras.distribution.set_distribution(
                keras.distribution.DataParallel(devices=devices))
        elif kind == "mirrored":
            print("Only one JAX device is visible: training on it.")
        return None
    elif kind in ("mirrored", "multiworker"):
        raise ValueError(
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


# --- the job -----------------------------------------------------------------


def _jit_compile(setting):
    if setting == "auto":
        return "auto"
    return setting in ("true", "1", True)


def read_backup_step(backup_dir):
    """The epoch recorded by `BackupAndRestore` in `backup_dir`, or 0."""
    metadata = pathlib.Path(backup_dir) / "training_metadata.json"
    if not metadata.exists():
        return 0
    try:
        return int(json.loads(metadata.read_text()).get("epoch", 0))
    except (ValueError, OSError):
        return 0


def build_callbacks(settings, output_dir, *, validation=True):
    """Progress bar, resumable backups, checkpoints, logs, NaN guard."""
    from keras_transformer.training import LearningRateLogger, StepCheckpoint, StopAtUpdate

    output_dir = pathlib.Path(output_dir)
    return [
        LearningRateLogger(),
        keras.callbacks.BackupAndRestore(str(output_dir / "backup"), save_freq="epoch",
                                         double_checkpoint=True),
        StepCheckpoint(output_dir / "checkpoints", every_n_steps=settings.checkpoint_every,
                       keep=settings.average_last),
        keras.callbacks.CSVLogger(str(output_dir / "training_log.csv"), append=True),
        keras.callbacks.TerminateOnNaN(),
        StopAtUpdate(settings.train_steps),
    ] + ([keras.callbacks.TensorBoard(str(output_dir / "tensorboard"))]
         if keras.backend.backend() == "tensorflow" else [])


def run(settings):
    """Runs the whole job; returns a dict of results and written paths."""
    from keras_transformer import data as kt_data
    from keras_transformer.model import build_model
    from keras_transformer.training import (
        TrainingTimer,
        average_checkpoints,
        compile_model,
        list_checkpoints,
        optimizer_updates,
        peak_memory_mib,
        plot_training,
    )
    from keras_transformer.translate import Translator, evaluate_bleu

    import tensorflow as tf

    s = settings
    output_dir = pathlib.Path(s.output_dir)
    output_dir.mkdir(parents=True, exist_ok=True)
    keras.utils.set_random_seed(s.seed)
    say = print if s.verbose else (lambda *a, **k: None)
    say(f"Keras {keras.__version__}, backend {keras.backend.backend()}; "
        f"output in {output_dir}")

    # Data and the shared vocabulary.
    paths = prepare_corpus(s.data, output_dir / "data", seed=s.seed)
    tokenizer = load_or_train_tokenizer(paths, s.vocab_size, output_dir / TOKENIZER_FILE,
                                        verbose=s.verbose)
    config = TransformerConfig.preset(s.preset, vocab_size=tokenizer.vocabulary_size(),
                                      max_length=s.max_length)
    train_pairs = kt_data.load_parallel_text(*paths["train"])
    valid_pairs = kt_data.load_parallel_text(*paths["valid"])
    counts = kt_data.count_length_policy(train_pairs, tokenizer, s.max_length)
    say(f"Training pairs: {len(train_pairs)} ({train_pairs.num_dropped} empty lines "
        f"dropped); {counts}")

    # Model under the strategy's scope.
    if s.mixed_precision != "none":
        keras.mixed_precision.set_global_policy(s.mixed_precision)
    strategy = get_strategy(s.distribute)
    replicas = num_replicas(strategy)
    scope = strategy.scope() if strategy is not None else contextlib.nullcontext()
    train_ds = kt_data.make_dataset(train_pairs, tokenizer,
                                    tokens_per_batch=s.tokens_per_batch,
                                    max_length=s.max_length, training=True, repeat=True,
                                    num_replicas=replicas, seed=s.seed)
    valid_ds = kt_data.make_dataset(valid_pairs, tokenizer,
                                    tokens_per_batch=s.tokens_per_batch,
                                    max_length=s.max_length, training=False,
                                    num_replicas=replicas)
    # Mean non-pad target tokens (labels) per batch, from the first
    # TOKEN_SAMPLE_BATCHES shuffled batches (all of them on small corpora);
    # with the timed steps it gives training tokens/s. A separate dataset:
    # iterating train_ds here would advance its reshuffling and change the
    # order fit sees.
    sample = kt_data.batch_statistics(kt_data.make_dataset(
        train_pairs, tokenizer, tokens_per_batch=s.tokens_per_batch,
        max_length=s.max_length, training=True, repeat=False,
        num_replicas=replicas, seed=s.seed).take(TOKEN_SAMPLE_BATCHES))
    target_tokens_per_update = (sample.target_tokens / sample.num_batches
                                * s.grad_accum_steps)
    say(f"Training batches: {target_tokens_per_update:.0f} target tokens per update "
        f"on average (mean of {sample.num_batches} batches)")
    # A known number of validation batches: without it Keras warns that the
    # input "ran out of data" at the end of the first validation pass.
    valid_ds = valid_ds.apply(tf.data.experimental.assert_cardinality(
        sum(1 for _ in valid_ds)))
    with scope:
        model = build_model(config)
        compile_model(model, gradient_accumulation_steps=s.grad_accum_steps,
                      jit_compile=_jit_compile(s.jit_compile))
    say(f"Model: preset {s.preset}, {model.count_params():,} parameters, "
        f"{replicas} replica(s)")

    # Train: an "epoch" is `checkpoint_every` batches, so the resumable
    # backup (at epoch ends) and the step checkpoints line up.
    steps_per_epoch = s.checkpoint_every * s.grad_accum_steps
    epochs = math.ceil(s.train_steps / s.checkpoint_every)
    resumed_epoch = read_backup_step(output_dir / "backup")
    if resumed_epoch:
        say(f"Resuming from the backup at epoch {resumed_epoch} "
            f"(update {resumed_epoch * s.checkpoint_every})")
    else:
        say(f"Starting training at step 0: {s.train_steps} updates")
    timer = TrainingTimer()
    history = model.fit(
        train_ds, epochs=epochs, steps_per_epoch=steps_per_epoch,
        shuffle=False,  # make_dataset shuffles; fit cannot shuffle a tf.data.Dataset
        validation_data=valid_ds, callbacks=build_callbacks(s, output_dir) + [timer],
        verbose=s.verbose if s.verbose in (0, 1, 2) else 1,
    )
    train_seconds = timer.elapsed
    final_step = optimizer_updates(model.optimizer)
    # Micro-steps under gradient accumulation: tokens per micro-step.
    tokens_per_second = timer.tokens_per_second(
        target_tokens_per_update / s.grad_accum_steps)
    train_peak_mib = peak_memory_mib()
    say(f"Training finished at update {final_step} in {train_seconds:.0f} s "
        f"({timer.steps} steps this run, {tokens_per_second:.0f} target tokens/s "
        f"in training steps, peak memory {train_peak_mib:.0f} MiB)")

    # Average the last checkpoints (section 6.1).
    checkpoints = [p for _, p in list_checkpoints(output_dir / "checkpoints")]
    checkpoints = checkpoints[-s.average_last:]
    averaged = output_dir / "averaged.weights.h5"
    if checkpoints:
        average_checkpoints(checkpoints, averaged)
        model.load_weights(averaged)
        say(f"Averaged {len(checkpoints)} checkpoints -> {averaged}")
    model_path = output_dir / "model.keras"
    model.save(model_path)

    # Beam search the test set, score with sacreBLEU.
    translator = Translator(model, tokenizer)
    hypotheses_path = output_dir / "test.hyp.de"
    result = evaluate_bleu(translator, paths["test"][0], paths["test"][1],
                           beam_size=s.beam_size, alpha=s.alpha,
                           max_sentences=s.eval_sentences, output_file=hypotheses_path,
                           progress=bool(s.verbose), verbose=bool(s.verbose))

    plot_path = output_dir / "training.png"
    plot_training(output_dir / "training_log.csv", plot_path)

    # The TF Serving export (string in, translation out); from the JAX and
    # PyTorch backends it runs in a TensorFlow subprocess.
    export_path = None
    if s.export_dir:
        from keras_transformer.export import export_saved_model

        export_path = export_saved_model(translator, s.export_dir, model_name=s.model_name,
                                         beam_size=s.beam_size, alpha=s.alpha)
        say(f"Exported the SavedModel for TF Serving -> {export_path}")

    samples = kt_data.load_parallel_text(*paths["test"])
    say("\nSample translations (test split):")
    for i in range(min(3, len(result.hypotheses))):
        say(f"  EN:  {samples[i][0]}\n  REF: {samples[i][1]}\n  HYP: {result.hypotheses[i]}")
    say("\nWritten:")
    written = {
        "tokenizer": output_dir / TOKENIZER_FILE,
        "model": model_path,
        "averaged_weights": averaged if checkpoints else None,
        "checkpoints": output_dir / "checkpoints",
        "training_log": output_dir / "training_log.csv",
        "plot": plot_path,
        "hypotheses": hypotheses_path,
        "saved_model": export_path,
    }
    for name, path in written.items():
        if path is not None:
            say(f"  {name:17s} {path}")
    summary = {
        "bleu": result.bleu, "chrf": result.chrf, "bleu_signature": result.bleu_signature,
        "final_step": final_step, "train_seconds": train_seconds,
        "steps_this_run": timer.steps, "step_seconds": timer.seconds,
        "target_tokens_per_update": target_tokens_per_update,
        "train_target_tokens_per_second": tokens_per_second,
        "train_peak_memory_mib": train_peak_mib, "peak_memory_mib": peak_memory_mib(),
        "parameters": model.count_params(), "backend": keras.backend.backend(),
        "settings": dataclasses.asdict(s),
    }
    (output_dir / "results.json").write_text(json.dumps(summary, indent=2))
    return {"result": result, "model": model, "tokenizer": tokenizer,
            "history": history.history, "paths": written, "summary": summary}



# --- scoring a finished run --------------------------------------------------


def check_run(run_dir):
    """The tokenizer, model.keras and config.json paths of a training output folder."""
    run_dir = pathlib.Path(run_dir)
    if not run_dir.is_dir():
        raise FileNotFoundError(
            f"training output folder not found: {run_dir} (expected the output_dir of "
            f"a training run, with model.keras and {TOKENIZER_FILE})")
    spm = run_dir / TOKENIZER_FILE
    if not spm.is_file():
        raise FileNotFoundError(f"{run_dir} has no {TOKENIZER_FILE} (the SentencePiece "
                                "model a training run writes)")
    keras_file, config_file = run_dir / "model.keras", run_dir / "config.json"
    if not keras_file.is_file() and not config_file.is_file():
        raise FileNotFoundError(
            f"{run_dir} has neither model.keras nor config.json (+ model.weights.h5); "
            "expected the output_dir of a training run")
    return spm, keras_file, config_file


def load_run(run_dir, weights=None):
    """Model and tokenizer of a training output folder (`run`'s `output_dir`).

    Args:
        run_dir: holds `spm.model` and `model.keras` (or `config.json` +
            `model.weights.h5`).
        weights: a `.weights.h5` file to load instead of the saved weights
            (e.g. `averaged.weights.h5` or a checkpoint).

    Returns:
        `(model, tokenizer)`.
    """
    from keras_transformer.data.tokenizer import Tokenizer
    from keras_transformer.model import build_model

    spm, keras_file, config_file = check_run(run_dir)
    if keras_file.is_file():
        model = keras.saving.load_model(keras_file, compile=False)
    else:
        model = build_model(TransformerConfig.from_dict(json.loads(config_file.read_text())))
        if weights is None:
            weights = pathlib.Path(run_dir) / "model.weights.h5"
    if weights is not None:
        weights = pathlib.Path(weights)
        if not weights.is_file():
            raise FileNotFoundError(f"weights file not found: {weights}")
        model.load_weights(weights)
    return model, Tokenizer.load(spm)


def resolve_weights(run_dir, name):
    """Path of the weights called `name` in a run folder.

    `"averaged"` is `averaged.weights.h5`, `"last"` the newest
    `checkpoints/ckpt-<update>.weights.h5`, `"ckpt-<update>"` that checkpoint;
    anything else is taken as a path to a `.weights.h5` file.
    """
    from keras_transformer.training import list_checkpoints

    run_dir = pathlib.Path(run_dir)
    checkpoints = list_checkpoints(run_dir / "checkpoints") \
        if (run_dir / "checkpoints").is_dir() else []
    if name == "averaged":
        path = run_dir / "averaged.weights.h5"
    elif name == "last":
        if not checkpoints:
            raise FileNotFoundError(f"no checkpoints/ckpt-*.weights.h5 in {run_dir}")
        path = pathlib.Path(checkpoints[-1][1])
    elif name.startswith("ckpt-") and not name.endswith(".h5"):
        path = run_dir / "checkpoints" / f"{name}.weights.h5"
    else:
        path = pathlib.Path(name)
    if not path.exists():
        available = ", ".join(f"ckpt-{step}" for step, _ in checkpoints) or "none"
        raise FileNotFoundError(
            f"weights {name!r} not found ({path}); use averaged, last, ckpt-<update> "
            f"(checkpoints in {run_dir}: {available}) or a .weights.h5 path"
        )
    return path


def evaluate_run(run_dir, corpus_dir, *, splits=("test",), weights=("averaged",),
                 beam_sizes=(4,), alpha=0.6, max_sentences=None, verbose=True):
    """Scores a finished run's weights on test splits with sacreBLEU.

    Loads the model and tokenizer of `run_dir` (`load_run`),
    then for every weights file, beam size and split translates
    `<corpus_dir>/<split>.en` and scores it against `<split>.de`.

    Args:
        run_dir: a training output folder, e.g. `runs/multi30k_small`.
        corpus_dir: folder with `<split>.en` / `<split>.de` files.
        splits: file stems, e.g. `("test", "test_2017_flickr")`.
        weights: names understood by `resolve_weights` (`"averaged"`,
            `"last"`, `"ckpt-2000"`, or paths).
        beam_sizes: 1 is greedy decoding.
        alpha: length penalty of beam search.
        max_sentences: score only the first lines of each split.
        verbose: print each row as it is measured.

    Returns:
        A list of dicts with `weights`, `beam_size`, `split`, `bleu`, `chrf`,
        `num_sentences` and `seconds`.
    """
    from keras_transformer.translate import Translator, evaluate_bleu

    run_dir, corpus_dir = pathlib.Path(run_dir), pathlib.Path(corpus_dir)
    check_run(run_dir)
    files = {}
    for split in splits:
        source, reference = corpus_dir / f"{split}.en", corpus_dir / f"{split}.de"
        if not (source.exists() and reference.exists()):
            raise FileNotFoundError(f"split {split!r} needs {source} and {reference}")
        files[split] = (source, reference)
    weight_paths = {name: resolve_weights(run_dir, name) for name in weights}
    model, tokenizer = load_run(run_dir)
    translator = Translator(model, tokenizer)
    rows = []
    for name, path in weight_paths.items():
        model.load_weights(path)
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
                    print(f"{name:>10s}  beam {beam_size}  {split:18s} BLEU {row['bleu']:6.2f}"
                          f"  chrF {row['chrf']:6.2f}  ({row['num_sentences']} sentences, "
                          f"{row['seconds']:.0f} s)", flush=True)
    return rows
