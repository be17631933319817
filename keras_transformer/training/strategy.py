"""Devices and batches: the distribution strategy, its replicas, the chief, the batch plan.

`get_strategy` returns a `tf.distribute` strategy (TensorFlow backend) or
sets a `keras.distribution` (JAX backend); `plan_batches` splits the tokens
of one update over gradient-accumulation micro-batches and replicas;
`is_chief` says whether this worker writes the run's files.
"""

import dataclasses
import json
import logging
import os

import keras

from keras_transformer.training.settings import SettingsError

logger = logging.getLogger("keras_transformer")


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
    """The replicas of `strategy`, or of the JAX distribution `get_strategy` set (else 1)."""
    if strategy is not None:
        return strategy.num_replicas_in_sync
    distribution = keras.distribution.distribution()
    if distribution is not None:
        return len(distribution.device_mesh.devices.flatten())
    return 1


def is_chief():
    """False on the non-chief workers of a multi-worker TensorFlow run."""
    config = json.loads(os.environ.get("TF_CONFIG", "{}") or "{}")
    task = config.get("task", {})
    if not task:
        return True
    cluster = config.get("cluster", {})
    if "chief" in cluster:
        return task.get("type") == "chief"
    return task.get("type") == "worker" and int(task.get("index", 0)) == 0


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
