"""Training the paper's way: optimizer, compile helper, devices, batches, averaging.

Backend-agnostic except `get_strategy`, which returns a `tf.distribute`
strategy (TensorFlow backend) or sets a `keras.distribution` (JAX backend).
What a run does between updates (checkpoints, backups, the log,
validation, signals, divergence) is `keras_transformer.training.guard`; the job
that uses all of this is `keras_transformer.training.job`.
"""

import contextlib
import dataclasses
import io
import logging
import os
import pathlib
import resource
import time

import keras
import numpy as np

from keras_transformer.model.config import TransformerConfig
from keras_transformer.model.losses import LabelSmoothedCrossEntropy, MaskedAccuracy
from keras_transformer.files import write_bytes
from keras_transformer.model.schedules import TransformerSchedule
from keras_transformer.training.settings import SettingsError

logger = logging.getLogger("keras_transformer")


def paper_optimizer(config, *, learning_rate=None, **kwargs):
    """Adam(beta_1=0.9, beta_2=0.98, epsilon=1e-9) with `TransformerSchedule`.

    Args:
        config: the model's `TransformerConfig` (d_model, warmup_steps).
        learning_rate: a float or schedule replacing the paper's schedule.
        **kwargs: passed to `keras.optimizers.Adam` (e.g. `clipnorm`,
            `gradient_accumulation_steps`).
    """
    if learning_rate is None:
        learning_rate = TransformerSchedule(
            config.d_model, config.warmup_steps,
            accumulation_steps=kwargs.get("gradient_accumulation_steps") or 1)
    return keras.optimizers.Adam(
        learning_rate=learning_rate, beta_1=0.9, beta_2=0.98, epsilon=1e-9, **kwargs
    )


def compile_model(model, config=None, *, learning_rate=None,
                  gradient_accumulation_steps=None, **compile_kwargs):
    """Compiles `model` with the paper's optimizer, loss and a token-accuracy metric.

    Args:
        model: a model built by `build_model`.
        config: its `TransformerConfig`; defaults to `model.config`.
        learning_rate: replaces the paper's schedule (a float or schedule).
        gradient_accumulation_steps: accumulate this many micro-batches per
            update; the paper's schedule is told, so it counts updates, not
            micro-batches.
        **compile_kwargs: passed to `model.compile` (e.g. `jit_compile`,
            `steps_per_execution`).

    Returns:
        The model, compiled.

    Example:

    >>> model = compile_model(build_model(preset="tiny"))
    >>> model.fit(dataset, epochs=1)
    """
    config = config or getattr(model, "config", None)
    if not isinstance(config, TransformerConfig):
        raise ValueError("compile_model needs the model's TransformerConfig")
    optimizer_kwargs = {}
    if gradient_accumulation_steps and gradient_accumulation_steps > 1:
        optimizer_kwargs["gradient_accumulation_steps"] = gradient_accumulation_steps
    model.compile(
        optimizer=paper_optimizer(config, learning_rate=learning_rate, **optimizer_kwargs),
        loss=LabelSmoothedCrossEntropy(config.label_smoothing, pad_id=config.pad_id),
        metrics=[MaskedAccuracy(pad_id=config.pad_id)],
        **compile_kwargs,
    )
    return model


# --- devices and batches ----------------------------------------------------


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


def build_training_model(config, *, strategy=None, learning_rate_factor=1.0,
                         grad_accum_steps=1, jit_compile="auto", decay_steps=None):
    """`build_model(config)` under the strategy's scope, compiled the paper's way.

    Args:
        config: the `TransformerConfig`.
        strategy: a `tf.distribute.Strategy` (`get_strategy`), or `None`.
        learning_rate_factor: multiplies the paper's schedule (equation 3).
        grad_accum_steps: micro-batches per update (the schedule counts updates).
        jit_compile: `model.compile`'s `jit_compile` (`"auto"`, `True`,
            `False`, or the setting's strings `"true"` / `"false"`).
        decay_steps: the schedule decays linearly to zero at this update
            (`TransformerSchedule`); `None`: the paper's decay.

    Returns:
        The compiled model.
    """
    from keras_transformer.model.transformer import build_model

    if jit_compile != "auto":
        jit_compile = jit_compile in ("true", "1", True)
    scope = strategy.scope() if strategy is not None else contextlib.nullcontext()
    with scope:
        model = build_model(config)
        schedule = TransformerSchedule(config.d_model, config.warmup_steps,
                                       scale=learning_rate_factor,
                                       accumulation_steps=grad_accum_steps,
                                       decay_steps=decay_steps)
        compile_model(model, learning_rate=schedule,
                      gradient_accumulation_steps=grad_accum_steps, jit_compile=jit_compile)
    return model


# --- checkpoints -------------------------------------------------------------

def optimizer_updates(optimizer):
    """Number of parameter updates an optimizer has applied.

    Under `gradient_accumulation_steps=k` Keras' public `optimizer.iterations`
    already counts updates (k micro-batches each); learning-rate schedules,
    however, are called with the micro-batch count (see
    `TransformerSchedule(accumulation_steps=...)`).
    """
    return int(keras.ops.convert_to_numpy(optimizer.iterations))


def average_checkpoints(paths, output_path):
    """Averages the model weights of several `.weights.h5` checkpoints.

    Every floating-point weight outside the optimizer is replaced by its
    arithmetic mean over `paths`; everything else (optimizer state, integer
    variables) is copied from the last checkpoint. The result loads with
    `model.load_weights(output_path)` into the model that wrote the inputs
    (section 6.1: the base models average the last 5 checkpoints).

    Args:
        paths: checkpoint files written by `model.save_weights`.
        output_path: where to write the averaged weights (`*.weights.h5`).

    Returns:
        `output_path`.
    """
    import h5py

    paths = [str(p) for p in paths]
    if not paths:
        raise ValueError("average_checkpoints needs at least one checkpoint path")
    for path in paths:
        if not os.path.exists(path):
            raise FileNotFoundError(f"checkpoint not found: {path}")
    if not str(output_path).endswith(".weights.h5"):
        raise ValueError(f"output_path must end with .weights.h5, received {output_path}")

    def datasets(handle):
        names = []
        handle.visititems(lambda name, obj: names.append(name)
                          if isinstance(obj, h5py.Dataset) else None)
        return names

    sources = [h5py.File(p, "r") for p in paths]
    try:
        reference = sources[-1]
        names = datasets(reference)
        for path, source in zip(paths, sources):
            if sorted(datasets(source)) != sorted(names):
                raise ValueError(
                    f"checkpoint {path} does not hold the same variables as {paths[-1]}"
                )
        # Built in memory, then written with plain file I/O (see
        # `files.weights_bytes`: HDF5 meeting a full disk crashes the process).
        buffer = io.BytesIO(pathlib.Path(paths[-1]).read_bytes())
        with h5py.File(buffer, "r+") as out:
            for name in names:
                data = reference[name]
                if name.split("/")[0] == "optimizer" or not np.issubdtype(data.dtype,
                                                                            np.floating):
                    continue
                stacked = np.stack([np.asarray(s[name], dtype="float64") for s in sources])
                out[name][...] = stacked.mean(axis=0).astype(data.dtype)
        write_bytes(output_path, buffer.getvalue(), what=f"writing the averaged weights "
                    f"{output_path}")
    finally:
        for source in sources:
            source.close()
    return output_path


class TrainingTimer(keras.callbacks.Callback):
    """Times the training batches of `fit`, without validation and callbacks.

    `seconds` sums the time from each `on_train_batch_begin` to its
    `on_train_batch_end` (the training step itself: with the default
    `steps_per_execution=1` a step's results are fetched before its end hook
    runs), and `steps` counts them. Keras calls the callbacks' hooks in list
    order: put the timer first, or it times the end hooks of the callbacks
    before it (a validation, a checkpoint). `tokens_per_second(tokens_per_step)`
    turns that into throughput. `elapsed` is the wall-clock time of the whole
    `fit` call, validation included.
    """

    def __init__(self):
        super().__init__()
        self.seconds = 0.0
        self.steps = 0
        self.elapsed = 0.0
        self._batch_start = None
        self._fit_start = None

    def on_train_begin(self, logs=None):
        self._fit_start = time.perf_counter()

    def on_train_batch_begin(self, batch, logs=None):
        self._batch_start = time.perf_counter()

    def on_train_batch_end(self, batch, logs=None):
        if self._batch_start is not None:
            self.seconds += time.perf_counter() - self._batch_start
            self.steps += 1
            self._batch_start = None

    def on_train_end(self, logs=None):
        if self._fit_start is not None:
            self.elapsed += time.perf_counter() - self._fit_start

    def tokens_per_second(self, tokens_per_step):
        """Throughput given the mean number of tokens in one training step."""
        return tokens_per_step * self.steps / self.seconds if self.seconds else 0.0


def peak_memory_mib():
    """Peak resident memory of this process (Linux/macOS `ru_maxrss`) in MiB."""
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    # Linux reports KiB, macOS bytes.
    return peak / (1024 * 1024) if os.uname().sysname == "Darwin" else peak / 1024


def plot_training(log_csv, output_png):
    """Writes a PNG of the loss, the validation BLEU and the learning rate against updates.

    Args:
        log_csv: a run's `training_log.csv` (`keras_transformer.training.guard
            .TrainingLog`: `step`, `loss`, `learning_rate` on every row;
            `val_loss`, `val_bleu` on the rows where validation ran). Logs
            of `keras.callbacks.CSVLogger` with `step` and `learning_rate`
            columns work too.
        output_png: the figure's path.

    Returns:
        `output_png`, or `None` when the log has no rows.
    """
    import csv
    import math

    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    with open(log_csv, newline="") as handle:
        rows = list(csv.DictReader(handle))
    if not rows:
        return None

    steps = [float(r["step"]) if r.get("step") else float(i + 1) for i, r in enumerate(rows)]

    def series(name):
        """(steps, values) of the rows that have a value in column `name`."""
        points = [(x, float(r[name])) for x, r in zip(steps, rows)
                  if r.get(name) not in (None, "") and math.isfinite(float(r[name]))]
        return [x for x, _ in points], [y for _, y in points]

    has_bleu = bool(series("val_bleu")[0])
    figure, axes = plt.subplots(1, 3 if has_bleu else 2, figsize=(16 if has_bleu else 11, 4))
    loss_axis, lr_axis = axes[0], axes[-1]
    loss_axis.plot(*series("loss"), label="training loss")
    if series("val_loss")[0]:
        loss_axis.plot(*series("val_loss"), marker="o", label="validation loss")
    loss_axis.set_xlabel("update")
    loss_axis.set_ylabel("label-smoothed cross-entropy per token")
    loss_axis.grid(alpha=0.3)
    loss_axis.legend()
    if has_bleu:
        axes[1].plot(*series("val_bleu"), marker="o", color="tab:red")
        axes[1].set_xlabel("update")
        axes[1].set_ylabel("validation BLEU (greedy, sample)")
        axes[1].grid(alpha=0.3)
    if series("learning_rate")[0]:
        lr_axis.plot(*series("learning_rate"), color="tab:green")
    lr_axis.set_xlabel("update")
    lr_axis.set_ylabel("learning rate")
    lr_axis.grid(alpha=0.3)
    figure.tight_layout()
    figure.savefig(output_png, dpi=100)
    plt.close(figure)
    return output_png
