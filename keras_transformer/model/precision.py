"""Which dtype policy a run trains in: float32, or bfloat16 where the hardware pays.

`choose_precision(setting)` turns the `mixed_precision` setting into a
Keras dtype policy and the reason for it, which the job logs among its first
lines. `"auto"` chooses Keras' `mixed_bfloat16` policy (float32 variables
and optimizer state, bf16 matrix products) where the arithmetic has bf16
units that the backend uses, and float32 elsewhere:

- a GPU with bf16 (NVIDIA compute capability 8.0 or newer): bf16;
- a CPU with `avx512_bf16` or `amx_bf16` (read from /proc/cpuinfo by
  `cpu_flags`, the one function a test fakes): bf16 under TensorFlow and
  PyTorch, whose oneDNN kernels multiply bf16 on those units; float32 under
  JAX, whose XLA:CPU trains no faster in bf16. The speeds of both are in
  docs/bf16.md (`examples/benchmark_training.py --mixed-precision none
  mixed_bfloat16` measures them);
- a CPU without them: float32. bf16 arithmetic is emulated there and runs
  slower than float32 (tensorflow/tensorflow#45441, pytorch/pytorch#86550).

Under `mixed_bfloat16` the model computes in bf16 except where float32 is
needed for accuracy, each said where it is done: the attention logits and
softmax (`MultiHeadAttention`), LayerNorm's statistics (Keras'
`layer_normalization` upcasts bf16 inputs), the logits before the softmax
over the vocabulary and the loss (`Transformer`'s float32 `logits` layer,
`LabelSmoothedCrossEntropy`). The tied output projection multiplies bf16
operands (`SharedEmbedding`); its logits are rounded to bf16 and cast to
float32.
"""

import contextlib
import dataclasses
import os
import pathlib

import keras

# `--mixed-precision` values: "none" is float32.
SETTINGS = ("auto", "none", "mixed_bfloat16", "mixed_float16")
BF16_CPU_FLAGS = ("avx512_bf16", "amx_bf16")
# Backends whose CPU kernels run bf16 products on those units (oneDNN).
BF16_CPU_BACKENDS = ("tensorflow", "torch")


@dataclasses.dataclass(frozen=True)
class Precision:
    """A resolved precision: the Keras dtype policy name and why it was chosen."""

    policy: str  # "float32", "mixed_bfloat16" or "mixed_float16"
    reason: str

    @property
    def mixed(self):
        return self.policy != "float32"

    def __str__(self):
        return f"{self.policy} ({self.reason})"


def cpu_flags(path="/proc/cpuinfo"):
    """The CPU's feature flags (`flags` line of /proc/cpuinfo); empty where unreadable."""
    try:
        text = pathlib.Path(path).read_text()
    except OSError:
        return frozenset()
    for line in text.splitlines():
        if line.startswith("flags"):
            return frozenset(line.split(":", 1)[1].split())
    return frozenset()


def cpu_name(path="/proc/cpuinfo"):
    """The processor's model name (`model name` line of /proc/cpuinfo), else `"CPU"`."""
    try:
        text = pathlib.Path(path).read_text()
    except OSError:
        return "CPU"
    for line in text.splitlines():
        if line.startswith("model name"):
            return line.split(":", 1)[1].strip() or "CPU"
    return "CPU"


def machine(backend=None):
    """The hardware a run is timed on, in words: what its minutes and tokens/s mean.

    The backend's first GPU where it has one, else the processor's model name
    and the cores this process may use, e.g. `"AMD EPYC 9R14, 2 cores"`.
    """
    gpu = gpu_bf16(backend)
    if gpu is not None:
        return f"GPU {gpu[0]}"
    cores = (len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity")
             else os.cpu_count())
    return f"{cpu_name()}, {cores} core{'s' if cores != 1 else ''}"


def gpu_bf16(backend=None):
    """`(name, supports_bf16)` of the backend's first GPU, or `None` without one."""
    backend = backend or keras.backend.backend()
    if backend == "tensorflow":
        import tensorflow as tf

        gpus = tf.config.list_physical_devices("GPU")
        if not gpus:
            return None
        details = tf.config.experimental.get_device_details(gpus[0])
        capability = details.get("compute_capability") or (0, 0)
        return details.get("device_name", gpus[0].name), tuple(capability) >= (8, 0)
    if backend == "jax":
        import jax

        device = jax.devices()[0]
        if device.platform != "gpu":
            return None
        capability = getattr(device, "compute_capability", "0.0")
        return device.device_kind, tuple(int(p) for p in str(capability).split(".")) >= (8, 0)
    if backend == "torch":
        import torch

        if not torch.cuda.is_available():
            return None
        return torch.cuda.get_device_name(0), bool(torch.cuda.is_bf16_supported())
    return None


def choose_precision(setting="auto", backend=None):
    """The `Precision` of a `mixed_precision` setting on this machine and backend.

    Args:
        setting: `"auto"`, `"none"` (float32), `"mixed_bfloat16"` or
            `"mixed_float16"`.
        backend: the Keras backend (default the current one).

    Raises:
        ValueError: an unknown setting.
    """
    if setting not in SETTINGS:
        raise ValueError(f"mixed_precision must be one of {', '.join(SETTINGS)}, "
                         f"received {setting!r}")
    if setting == "none":
        return Precision("float32", "--mixed-precision none")
    if setting != "auto":
        return Precision(setting, f"--mixed-precision {setting}")
    backend = backend or keras.backend.backend()
    gpu = gpu_bf16(backend)
    if gpu is not None:
        name, bf16 = gpu
        if bf16:
            return Precision("mixed_bfloat16", f"auto: the GPU {name} has bf16 units")
        return Precision("float32", f"auto: the GPU {name} has no bf16 units")
    units = [flag for flag in BF16_CPU_FLAGS if flag in cpu_flags()]
    if not units:
        return Precision("float32", "auto: this CPU has no bf16 instructions "
                         f"({' or '.join(BF16_CPU_FLAGS)}), where bf16 is slower than float32")
    if backend not in BF16_CPU_BACKENDS:
        return Precision("float32", f"auto: this CPU has {units[0]}, but the {backend} "
                         "backend's XLA:CPU runs bf16 training no faster than float32")
    return Precision("mixed_bfloat16", f"auto: this CPU has {units[0]}, which the {backend} "
                     "backend's oneDNN kernels use for bf16 products")


@contextlib.contextmanager
def policy_scope(policy):
    """Sets Keras' global dtype policy for the models built inside; restores it after."""
    previous = keras.config.dtype_policy()
    keras.config.set_dtype_policy(policy)
    try:
        yield
    finally:
        keras.config.set_dtype_policy(previous)
