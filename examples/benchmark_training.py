r"""Training throughput of keras_transformer against native `torch.nn.Transformer`.

Measures target tokens per second of full training steps (forward, backward,
Adam update) of a preset on one fixed synthetic token batch, under the Keras
backend chosen by `KERAS_BACKEND`, and, in the same run, of the same model
written directly in PyTorch (`torch.nn.Transformer` with the same sizes, a
shared embedding tied to the output projection, sinusoidal positions, the same
label-smoothed loss and Adam). It prints both throughputs and their ratio, the
achieved FLOP/s as a fraction of the machine's float32 matmul throughput, and
the peak resident memory of each side.

On an accelerator the same run reports target tokens/s per device, the
achieved FLOP/s as a fraction of the device's dense peak (bf16 or fp16 under
`--mixed-precision`, TF32 for float32 runs; from `DEVICE_PEAKS_TFLOPS`, a small
table of datasheet figures without sparsity keyed by device name: an unknown
device gets "unknown peak" and its achieved TFLOP/s only) and the peak bytes
in use on the device (TensorFlow `get_memory_info`, JAX `memory_stats`, torch
`max_memory_allocated`) instead of the host's RSS. On a GPU host the torch
reference runs on CUDA when its PyTorch has it (`--no-reference` skips it).

`--distribute mirrored` (TensorFlow backend) times `tf.distribute.MirroredStrategy`
over one device and over all visible GPUs, the global batch being the
per-device batch times the replicas, and prints the speedup and the scaling
efficiency (N-device tokens/s over N times the 1-device tokens/s). Both runs go
through the same strategy code (a distributed dataset iterator and the
model's train function). Without GPUs the worker splits the CPU into
`--cpu-devices` logical devices before TensorFlow starts, which exercises the
code path but measures no scaling (the logical devices share the same cores).
XLA under MirroredStrategy needs GPUs, so on CPU devices `--jit-compile true`
is turned off with a printed note; on GPUs it is tried, and if the first step
fails the run continues without XLA, with a note (Keras' `"auto"` leaves XLA
off under a strategy).

Each side runs in its own worker process (`multiprocessing` "spawn"), so that
each peak RSS is that framework's alone and neither framework's thread pools
or allocator live in the other's process. The parent process imports neither
Keras nor PyTorch: it alternates timed rounds between the workers
(`--repeats` rounds of `--steps` steps each, `auto`: about one second's worth;
the order flips every round) and reports the median round (and the best).
Warm-up steps, tracing and XLA compilation are excluded from the timings and
reported separately.

On a shared machine, each round also records how many cores other processes
kept busy meanwhile (from /proc/stat); the summary flags busy runs. PyTorch's
OpenMP threads degrade far more than TensorFlow's or XLA's thread pools when
the cores are oversubscribed (a training step can take 5x longer), so ratios
measured on a busy machine overstate Keras' lead. `--wait-for-quiet SECONDS`
waits, before each timed run, for the other processes to leave the CPUs.

Usage:

    KERAS_BACKEND=jax python examples/benchmark_training.py --preset small
    KERAS_BACKEND=tensorflow python examples/benchmark_training.py --jit-compile true
    python examples/benchmark_training.py --all-backends   # summary table
    python examples/benchmark_training.py --all-backends --wait-for-quiet 20

On a GPU host (a few minutes with `base`, by estimate; XLA with `--jit-compile true`):

    python examples/benchmark_training.py --preset base --mixed-precision mixed_bfloat16 \
        --jit-compile true
    python examples/benchmark_training.py --preset base --mixed-precision mixed_bfloat16 \
        --distribute mirrored --no-reference   # 1 vs N GPUs
    python examples/benchmark_training.py --preset big --mixed-precision mixed_bfloat16 \
        --jit-compile true --tokens-per-batch 16384 --seq-len 64   # fuller GPU

The same code paths on a CPU (tens of seconds each):

    python examples/benchmark_training.py --preset tiny --steps 1 --repeats 2 \
        --mixed-precision mixed_bfloat16 --no-reference
    python examples/benchmark_training.py --preset tiny --steps 1 --repeats 2 \
        --distribute mirrored --no-reference

The machine's float32 matmul throughput is the best GFLOP/s of square
`--matmul-size` products in numpy, in the Keras backend (`keras.ops.matmul`)
and in PyTorch, each timed in its own process before and after the rounds;
it is the peak of CPU runs only.

FLOPs of one training step are counted analytically (see `training_flops`):
2 FLOPs per multiply-add of every matmul of the forward pass, times 3 for
forward + backward (the backward pass costs two matmuls per forward matmul:
gradients of the inputs and of the weights). Attention matrices are counted
in full (neither implementation skips masked entries); element-wise work
(softmax, LayerNorm, dropout, the optimizer) is not counted.

Parameter counts: `torch.nn.Transformer` always adds a final LayerNorm to its
encoder and decoder stacks (redundant after post-norm layers, but part of the
native module), so the reference has exactly `4 * d_model` more parameters
than the Keras model; see `expected_parameter_difference`.
"""

import argparse
import contextlib
import json
import math
import multiprocessing
import os
import re
import resource
import statistics
import subprocess
import sys
import tempfile
import time

import numpy as np

# Run from a checkout without installing the package.
REPO_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if REPO_ROOT not in sys.path:
    sys.path.insert(0, REPO_ROOT)

BACKEND_RUNS = (  # (label, KERAS_BACKEND, --jit-compile) of --all-backends
    ("tensorflow", "tensorflow", "false"),
    ("tensorflow+xla", "tensorflow", "true"),
    ("jax", "jax", "auto"),
    ("torch", "torch", "auto"),
)

# Dense peaks (no structured sparsity) of NVIDIA's datasheets, TFLOP/s per GPU,
# by matmul precision; the first pattern found in the device name wins (so
# "H100 NVL" before "H100", and word boundaries keep "A10" off "A100" and "L4"
# off "L40S"). H200 and GH200 are the H100 SXM's chip at its clocks.
DEVICE_PEAKS_TFLOPS = (
    (r"\bH[12]00 NVL\b", {"bf16": 835, "fp16": 835, "tf32": 418, "fp32": 60}),
    (r"\bH100 PCIe\b", {"bf16": 756, "fp16": 756, "tf32": 378, "fp32": 51}),
    (r"\bG?H[12]00\b", {"bf16": 989, "fp16": 989, "tf32": 495, "fp32": 67}),
    (r"\bA100\b", {"bf16": 312, "fp16": 312, "tf32": 156, "fp32": 19.5}),
    (r"\bL40S\b", {"bf16": 362, "fp16": 362, "tf32": 183, "fp32": 91.6}),
    (r"\bA10\b", {"bf16": 125, "fp16": 125, "tf32": 62.5, "fp32": 31.2}),
    (r"\bL4\b", {"bf16": 121, "fp16": 121, "tf32": 60, "fp32": 30.3}),
    (r"\bV100\b.*PCIe", {"fp16": 112, "fp32": 14}),  # no bf16, no TF32
    (r"\bV100\b", {"fp16": 125, "fp32": 15.7}),
    (r"\bT4\b", {"fp16": 65, "fp32": 8.1}),
)

# Printed beside the results; figures of others, not measured by this script.
PUBLISHED_FIGURES = (
    "published figures, not measured here -- Transformer big, target subwords/s per GPU:",
    "  NVIDIA DeepLearningExamples, PyTorch Transformer, A100 with AMP: 82k",
    "  MLPerf Training v0.7, Transformer, A100: about 100k",
)

# Keras dtype policy -> (torch autocast dtype name, peak-table precision).
MIXED_PRECISION = {
    None: (None, None),  # float32: the table's tf32 or fp32, per framework
    "mixed_float16": ("float16", "fp16"),
    "mixed_bfloat16": ("bfloat16", "bf16"),
}
# The suffix of a side's name per policy: "keras", "keras_bf16", "torch_bf16".
SIDE_SUFFIX = {None: "", "mixed_float16": "_fp16", "mixed_bfloat16": "_bf16"}


def matmul_dtype(mixed_precision):
    """The dtype a policy multiplies in: float32, bfloat16 or float16."""
    return MIXED_PRECISION[mixed_precision][0] or "float32"


# --- Analytic counts -----------------------------------------------------------


def training_flops(config, batch_size, source_length, target_length):
    """FLOPs of one training step (forward + backward) of the Transformer.

    With B sentences, S source and T target positions, N layers, width d,
    h heads of sizes d_k (queries, keys) and d_v (values), inner size d_ff and
    vocabulary V, the forward pass does these multiply-adds (MACs):

        encoder, per layer:  B*S * (2*d*h*d_k + 2*d*h*d_v + 2*d*d_ff)  Q,K,V,O + FFN
                           + B*h*S*S * (d_k + d_v)                      QK^T, AV
        decoder, per layer:  B*T * (2*d*h*d_k + 2*d*h*d_v + 2*d*d_ff)  self-attn + FFN
                           + B*T * (d*h*d_k + h*d_v*d)                 cross Q, O
                           + B*S * (d*h*d_k + d*h*d_v)                 cross K, V
                           + B*h*(T*T + T*S) * (d_k + d_v)             attention
        output projection:   B*T * d * V

    forward FLOPs = 2 * MACs; training FLOPs = 3 * forward FLOPs.

    Args:
        config: a `TransformerConfig` or its dict form.
        batch_size, source_length, target_length: B, S, T.

    Returns:
        FLOPs of one training step, an int.
    """
    c = config if isinstance(config, dict) else config.to_dict()
    d, d_ff, n, vocab = c["d_model"], c["d_ff"], c["num_layers"], c["vocab_size"]
    h = c["num_heads"]
    d_k = c["key_dim"] or d // h
    d_v = c["value_dim"] or d_k
    B, S, T = batch_size, source_length, target_length
    attention_projections = 2 * d * h * d_k + 2 * d * h * d_v
    encoder = B * S * (attention_projections + 2 * d * d_ff) + B * h * S * S * (d_k + d_v)
    decoder = (
        B * T * (attention_projections + 2 * d * d_ff)
        + B * T * (d * h * d_k + h * d_v * d)
        + B * S * (d * h * d_k + d * h * d_v)
        + B * h * (T * T + T * S) * (d_k + d_v)
    )
    output = B * T * d * vocab
    return 3 * 2 * (n * (encoder + decoder) + output)


def expected_parameter_difference(config):
    """Parameters of the torch reference minus those of the Keras model.

    `torch.nn.Transformer` has one more LayerNorm (weight and bias, `d_model`
    each) after its encoder stack and one after its decoder stack; everything
    else (tied embedding, four biased attention projections, FFN, the layers'
    LayerNorms) matches one to one.
    """
    c = config if isinstance(config, dict) else config.to_dict()
    return 2 * 2 * c["d_model"]


def matmul_peak_gflops(library="numpy", size=2048, repeats=5, dtype="float32"):
    """Best GFLOP/s of a `(size, size) x (size, size)` matmul in `dtype`.

    Each library has its own kernels (numpy: its BLAS, often OpenBLAS;
    `"keras"`: `keras.ops.matmul` on the current backend, jitted under JAX;
    `"torch"`: `torch.mm`), so the machine's peak is the best of them.

    Args:
        library: `"numpy"`, `"keras"` or `"torch"`.
        size: matrix size.
        repeats: timed products; the fastest counts.
        dtype: `"float32"`, or `"bfloat16"` / `"float16"` (Keras and torch:
            what a mixed-precision policy multiplies in).
    """
    if library == "numpy" and dtype != "float32":
        raise ValueError(f"numpy has no {dtype} matmul")
    rng = np.random.default_rng(0)
    a = rng.random((size, size), dtype=np.float32)
    b = rng.random((size, size), dtype=np.float32)
    if library == "numpy":
        product = lambda: a @ b  # noqa: E731
    elif library == "torch":
        import torch

        a, b = (torch.from_numpy(x).to(getattr(torch, dtype)) for x in (a, b))
        product = lambda: torch.mm(a, b)  # noqa: E731
    elif library == "keras":
        import keras

        a, b = (keras.ops.convert_to_tensor(x, dtype) for x in (a, b))
        if keras.backend.backend() == "jax":
            import jax

            matmul = jax.jit(keras.ops.matmul)
            product = lambda: matmul(a, b).block_until_ready()  # noqa: E731
        else:
            product = lambda: keras.ops.matmul(a, b)  # noqa: E731
    else:
        raise ValueError(f"library must be numpy, keras or torch, received {library!r}")
    product()  # warm-up: thread pools, page faults, compilation
    best = math.inf
    for _ in range(repeats):
        start = time.perf_counter()
        product()
        best = min(best, time.perf_counter() - start)
    return 2 * size**3 / best / 1e9


def peak_rss_mb():
    """Peak resident memory of this process, in MiB (Linux reports KiB)."""
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


# --- Accelerator peaks, scaling ------------------------------------------------


def device_peak_flops(device_name, precision):
    """Dense peak FLOP/s of one accelerator, from `DEVICE_PEAKS_TFLOPS`.

    Args:
        device_name: as the framework reports it, e.g. `"NVIDIA H200"`,
            `"NVIDIA A100-SXM4-80GB"`, `"Tesla V100-SXM2-16GB"`.
        precision: `"bf16"`, `"fp16"`, `"tf32"` or `"fp32"`; `"tf32"` falls
            back to `"fp32"` on devices without TF32 (V100, T4).

    Returns:
        FLOP/s (not TFLOP/s), or `None` for a device not in the table or a
        precision it has no tensor cores for (bf16 on a V100).
    """
    for pattern, peaks in DEVICE_PEAKS_TFLOPS:
        if re.search(pattern, device_name or "", re.IGNORECASE):
            tflops = peaks.get(precision)
            if tflops is None and precision == "tf32":
                tflops = peaks.get("fp32")
            return None if tflops is None else tflops * 1e12
    return None


def fraction_of_peak(flops_per_step, step_seconds, peak_flops, devices=1):
    """Achieved FLOP/s per device over the peak of one device.

    `flops_per_step` is the work of the whole (global) batch, done by
    `devices` devices in `step_seconds`; `None` where the peak is unknown.
    """
    if not peak_flops:
        return None
    return flops_per_step / step_seconds / devices / peak_flops


def scaling_efficiency(one_device_tokens_per_second, tokens_per_second, devices):
    """N-device throughput over N times the 1-device throughput (1.0 = linear)."""
    return tokens_per_second / (devices * one_device_tokens_per_second)


def cpu_name():
    """The processor's model name (Linux /proc/cpuinfo), else `"CPU"`."""
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip() or "CPU"
    except OSError:
        pass
    return "CPU"


# --- Other work on a shared machine ----------------------------------------------


def machine_busy_seconds():
    """CPU-seconds that all processes of this machine have been busy (Linux).

    From the first line of /proc/stat: everything but idle and iowait. `None`
    where /proc/stat is unavailable.
    """
    try:
        with open("/proc/stat") as f:
            values = [int(v) for v in f.readline().split()[1:9]]
    except (OSError, ValueError):
        return None
    idle = values[3] + values[4]  # idle, iowait
    return (sum(values) - idle) / os.sysconf("SC_CLK_TCK")


def wait_for_quiet(max_seconds, threshold=0.25, sample_seconds=1.0):
    """Waits (up to `max_seconds`) until other processes use < `threshold` cores.

    Call it while the benchmark itself is idle: every busy core it sees is
    someone else's. Returns the cores busy in the last sample (`None` if
    /proc/stat is unavailable).
    """
    deadline = time.perf_counter() + max_seconds
    while True:
        before = machine_busy_seconds()
        if before is None:
            return None
        time.sleep(sample_seconds)
        busy = (machine_busy_seconds() - before) / sample_seconds
        if busy < threshold or time.perf_counter() >= deadline:
            return busy


# --- The synthetic batch -------------------------------------------------------


def synthetic_batch(config, batch_size, seq_len, pad_fraction=0.0, seed=0):
    """A fixed batch of random token ids, `source_ids`, `target_ids`, `labels`.

    All arrays are int32 `(batch_size, seq_len)`. Tokens are drawn from the
    non-special ids. With `pad_fraction > 0`, each sentence is cut to a random
    length so that about that fraction of the positions is padding (id 0).
    `target_ids` is `labels` shifted right behind BOS, as in training.
    """
    c = config if isinstance(config, dict) else config.to_dict()
    rng = np.random.default_rng(seed)
    first_id = max(c["pad_id"], c["bos_id"], c["eos_id"], c["unk_id"]) + 1

    def sentences():
        ids = rng.integers(first_id, c["vocab_size"], (batch_size, seq_len))
        if pad_fraction > 0:
            cut = rng.integers(0, round(2 * pad_fraction * seq_len) + 1, batch_size)
            lengths = np.maximum(seq_len - cut, 1)
            ids[np.arange(seq_len)[None, :] >= lengths[:, None]] = c["pad_id"]
        return ids.astype("int32")

    source_ids = sentences()
    labels = sentences()
    target_ids = np.concatenate(
        [np.full((batch_size, 1), c["bos_id"], "int32"), labels[:, :-1]], axis=1
    )
    target_ids[labels == c["pad_id"]] = c["pad_id"]
    return {"source_ids": source_ids, "target_ids": target_ids, "labels": labels}


# --- Devices -------------------------------------------------------------------


def keras_backend():
    import keras

    return keras.backend.backend()


def setup_tensorflow_devices(distribute=None, replicas=None, cpu_devices=2):
    """Configures TensorFlow's devices, before TensorFlow starts; mirror targets.

    GPUs grow their memory on demand (by default TensorFlow takes nearly all
    of it, leaving none for the torch reference); with `replicas`, only the
    first `replicas` GPUs are visible. Under `distribute="mirrored"` without
    GPUs the CPU is split into `cpu_devices` logical devices, so that
    `MirroredStrategy` has replicas (sharing the same cores).

    Returns:
        The names of the devices to mirror over (the first `replicas`, or
        all), or `None` without `distribute`.
    """
    import tensorflow as tf

    gpus = tf.config.list_physical_devices("GPU")
    try:
        if gpus and replicas:
            gpus = gpus[:replicas]
            tf.config.set_visible_devices(gpus, "GPU")
        for gpu in gpus:
            tf.config.experimental.set_memory_growth(gpu, True)
        if distribute and not gpus:
            cpu = tf.config.list_physical_devices("CPU")[0]
            tf.config.set_logical_device_configuration(
                cpu, [tf.config.LogicalDeviceConfiguration()] * cpu_devices)
    except RuntimeError as error:  # TensorFlow has started (an in-process run)
        if distribute:
            raise RuntimeError("--distribute mirrored configures devices before "
                               "TensorFlow starts: it needs a fresh worker process") from error
    if not distribute:
        return None
    devices = tf.config.list_logical_devices("GPU") or tf.config.list_logical_devices("CPU")
    return [d.name for d in devices[:replicas or len(devices)]]


def describe_device(kind):
    """`(platform, name)` of the device a `kind` trainer computes on.

    `platform` is `"gpu"`, `"tpu"` or `"cpu"`; `name` as the framework reports
    it (`"NVIDIA H200"`), the processor's model name on a CPU.
    """
    backend = "torch" if kind == "torch" else keras_backend()
    if backend == "torch":
        import torch

        if torch.cuda.is_available():
            return "gpu", torch.cuda.get_device_name(0)
    elif backend == "tensorflow":
        import tensorflow as tf

        gpus = tf.config.get_visible_devices("GPU")
        if gpus:
            details = tf.config.experimental.get_device_details(gpus[0])
            return "gpu", details.get("device_name", "GPU")
    elif backend == "jax":
        import jax

        device = jax.devices()[0]
        if device.platform != "cpu":
            return device.platform, device.device_kind
    return "cpu", cpu_name()


def float32_peak_precision(kind):
    """The peak-table precision of float32 matmuls: `"tf32"` or `"fp32"`.

    TensorFlow and XLA (JAX) use TF32 tensor cores for float32 matmuls by
    default on Ampere and newer; PyTorch only with
    `torch.set_float32_matmul_precision("high")` (the torch reference sets it
    on CUDA, to match).
    """
    backend = "torch" if kind == "torch" else keras_backend()
    if backend == "torch":
        import torch

        return "fp32" if torch.get_float32_matmul_precision() == "highest" else "tf32"
    if backend == "tensorflow":
        import tensorflow as tf

        return "tf32" if tf.config.experimental.tensor_float_32_execution_enabled() else "fp32"
    import jax

    precision = jax.config.jax_default_matmul_precision
    return "fp32" if precision in ("highest", "float32") else "tf32"


def device_memory_peak_bytes(kind, devices=1):
    """Peak bytes in use on the accelerator (the most of the first `devices`).

    TensorFlow `get_memory_info(...)["peak"]`, JAX
    `memory_stats()["peak_bytes_in_use"]`, torch `max_memory_allocated`:
    allocations, not the memory a framework's allocator has reserved.
    `None` on a CPU.
    """
    backend = "torch" if kind == "torch" else keras_backend()
    if backend == "torch":
        import torch

        if not torch.cuda.is_available():
            return None
        count = min(devices, torch.cuda.device_count())
        return max(torch.cuda.max_memory_allocated(i) for i in range(count))
    if backend == "tensorflow":
        import tensorflow as tf

        count = min(devices, len(tf.config.list_logical_devices("GPU")))
        if not count:
            return None
        return max(tf.config.experimental.get_memory_info(f"GPU:{i}")["peak"]
                   for i in range(count))
    import jax

    device = jax.devices()[0]
    if device.platform == "cpu":
        return None
    return (device.memory_stats() or {}).get("peak_bytes_in_use")


# --- The two trainers ----------------------------------------------------------


class KerasTrainer:
    """`keras_transformer` training steps on a fixed batch, on the current backend.

    Builds the model, compiles it with `keras_transformer.compile_model` (the
    paper's Adam and schedule, the label-smoothed loss, the masked accuracy
    metric) and runs `model.train_on_batch`, the train function `fit` uses.
    With `devices`, the model lives in a `tf.distribute.MirroredStrategy` over
    them, the batch is repeated once per replica (the global batch) and each
    step feeds the model's train function from a distributed dataset iterator,
    as `fit` does.

    Args:
        config: a `TransformerConfig` dict.
        batch: the dict of `synthetic_batch` (per device).
        jit_compile: `"auto"`, `True` or `False`; the JAX backend always jits.
        seed: weight initialisation seed.
        mixed_precision: a Keras dtype policy name (`"mixed_bfloat16"`,
            `"mixed_float16"`) or `None` for float32; the global policy is
            restored once the model is built and compiled.
        devices: device names for `MirroredStrategy` (TensorFlow only), or
            `None`.
    """

    def __init__(self, config, batch, jit_compile="auto", seed=0, mixed_precision=None,
                 devices=None):
        import keras

        import keras_transformer

        self.backend = keras.backend.backend()
        self.notes = []
        if self.backend == "jax":
            jit_compile = True
        self.strategy = None
        if devices is not None:
            import tensorflow as tf

            self.strategy = tf.distribute.MirroredStrategy(devices)
            if jit_compile is True and not all("GPU" in d.upper() for d in devices):
                # Keras' optimizer calls merge_call inside the XLA function, which
                # MirroredStrategy allows only when every replica is a GPU.
                jit_compile = False
                self.notes.append("jit_compile forced off: XLA under MirroredStrategy "
                                  "needs GPUs (on CPU devices it fails)")
        self.replicas = self.strategy.num_replicas_in_sync if self.strategy else 1
        keras.utils.set_random_seed(seed)
        config = keras_transformer.TransformerConfig.from_dict(config)
        previous_policy = keras.mixed_precision.global_policy()
        keras.mixed_precision.set_global_policy(mixed_precision or "float32")
        try:
            with self.strategy.scope() if self.strategy else contextlib.nullcontext():
                self.model = keras_transformer.build_model(config)
                keras_transformer.compile_model(self.model, jit_compile=jit_compile)
                if self.strategy:  # fit builds it before its first step, too
                    self.model.optimizer.build(self.model.trainable_variables)
        finally:
            keras.mixed_precision.set_global_policy(previous_policy)
        self.precision = self.model.dtype_policy.name
        self.jit_compile = bool(self.model.jit_compile)
        self.num_parameters = int(self.model.count_params())
        # (batch * replicas, T): every replica gets its own copy of the batch.
        batch = {k: np.concatenate([v] * self.replicas) for k, v in batch.items()}
        self.x = {"source_ids": batch["source_ids"], "target_ids": batch["target_ids"]}
        self.y = batch["labels"]
        if self.strategy:
            import tensorflow as tf

            dataset = tf.data.Dataset.from_tensors((self.x, self.y)).repeat()
            self.iterator = iter(self.strategy.experimental_distribute_dataset(dataset))
            self.model.make_train_function()
        self.name = f"keras/{self.backend}" + ("+xla" if self.backend == "tensorflow"
                                               and self.jit_compile else "")
        if self.strategy:
            self.name += f" mirrored x{self.replicas}"

    def step(self):
        """One training step; returns the loss as a Python float.

        The float conversion finishes the step (also under JAX's asynchronous
        dispatch and on a GPU) before the clock is read.
        """
        if self.strategy:
            logs = self.model.train_function(self.iterator)
        else:
            logs = self.model.train_on_batch(self.x, self.y, return_dict=True)
        return float(logs["loss"])


def build_torch_reference(config):
    """The same Transformer written directly in PyTorch, a `torch.nn.Module`.

    `torch.nn.Transformer` (post-norm, batch first, ReLU, the config's dropout
    and LayerNorm epsilon) with one `nn.Embedding` shared by source, target and
    the pre-softmax projection (`F.linear` with the embedding matrix, no bias),
    embeddings scaled by sqrt(d_model) plus the paper's interleaved sinusoid,
    and dropout on the sums. `forward(source_ids, target_ids)` returns logits
    `(batch, T, vocab_size)`.
    """
    import torch
    from torch import nn
    from torch.nn import functional as F

    c = config

    class TorchTransformer(nn.Module):
        def __init__(self):
            super().__init__()
            d = c["d_model"]
            self.embedding = nn.Embedding(c["vocab_size"], d)
            nn.init.normal_(self.embedding.weight, std=d**-0.5)
            self.transformer = nn.Transformer(
                d_model=d, nhead=c["num_heads"], num_encoder_layers=c["num_layers"],
                num_decoder_layers=c["num_layers"], dim_feedforward=c["d_ff"],
                dropout=c["dropout"], layer_norm_eps=c["layer_norm_epsilon"],
                batch_first=True, norm_first=False,
            )
            self.dropout = nn.Dropout(c["dropout"])
            self.scale = math.sqrt(d)
            # (max_length, d): [sin0, cos0, sin1, cos1, ...]; a buffer, not a weight.
            positions = torch.arange(c["max_length"], dtype=torch.float32)[:, None]
            inverse_frequency = 10000.0 ** (-torch.arange(0, d, 2, dtype=torch.float32) / d)
            angles = positions * inverse_frequency
            encoding = torch.stack([angles.sin(), angles.cos()], dim=-1).flatten(1)[:, :d]
            self.register_buffer("positional_encoding", encoding, persistent=False)

        def embed(self, ids):
            x = self.embedding(ids) * self.scale + self.positional_encoding[: ids.shape[1]]
            return self.dropout(x)

        def forward(self, source_ids, target_ids):
            target_length = target_ids.shape[1]
            # torch masks use True for "masked out".
            causal = torch.ones(target_length, target_length, dtype=torch.bool,
                                device=target_ids.device).triu(1)
            source_padding = source_ids == c["pad_id"]
            target_padding = target_ids == c["pad_id"]
            x = self.transformer(
                self.embed(source_ids), self.embed(target_ids),
                tgt_mask=causal, tgt_is_causal=True,
                src_key_padding_mask=source_padding,
                tgt_key_padding_mask=target_padding,
                memory_key_padding_mask=source_padding,
            )
            return F.linear(x, self.embedding.weight)

    return TorchTransformer()


class TorchTrainer:
    """Training steps of `build_torch_reference(config)` on a fixed batch.

    `F.cross_entropy(label_smoothing=eps, ignore_index=pad)` (eps/V over all
    classes, mean over non-pad tokens: the Keras loss), `torch.optim.Adam`
    with betas (0.9, 0.98) and eps 1e-9, the paper's learning-rate schedule,
    train mode (dropout on), PyTorch's default threads. On CUDA, float32
    matmuls may use TF32 (`set_float32_matmul_precision("high")`), as
    TensorFlow and JAX do by default. Under mixed precision the forward pass
    and the loss run in `torch.autocast` with the policy's dtype (weights stay
    float32, as in Keras' mixed policies); float16 adds a `GradScaler`, Keras'
    `LossScaleOptimizer`.

    Args:
        config, batch, seed: as `KerasTrainer`.
        num_threads: `torch.set_num_threads` first, if given.
        mixed_precision: a Keras policy name (see `MIXED_PRECISION`) or `None`.
        device: `"cuda"`, `"cpu"`; `None`: CUDA when PyTorch has it.
    """

    def __init__(self, config, batch, seed=0, num_threads=None, mixed_precision=None,
                 device=None):
        import torch
        from torch.nn import functional as F

        if num_threads:
            torch.set_num_threads(num_threads)
        torch.manual_seed(seed)
        self.torch, self.F = torch, F
        self.config = config
        self.device = torch.device(device or ("cuda" if torch.cuda.is_available() else "cpu"))
        if self.device.type == "cuda":
            torch.set_float32_matmul_precision("high")
        autocast_dtype = MIXED_PRECISION[mixed_precision][0]
        self.autocast_dtype = autocast_dtype and getattr(torch, autocast_dtype)
        self.precision = f"autocast {autocast_dtype}" if autocast_dtype else "float32"
        self.scaler = torch.amp.GradScaler(self.device.type,
                                           enabled=self.autocast_dtype == torch.float16)
        self.model = build_torch_reference(config).to(self.device)
        self.model.train()
        self.num_parameters = sum(p.numel() for p in self.model.parameters())
        self.optimizer = torch.optim.Adam(self.model.parameters(), lr=1.0,
                                          betas=(0.9, 0.98), eps=1e-9)
        d, warmup = config["d_model"], config["warmup_steps"]
        self.scheduler = torch.optim.lr_scheduler.LambdaLR(
            self.optimizer,
            lambda step: d**-0.5 * min((step + 1) ** -0.5, (step + 1) * warmup**-1.5),
        )
        self.source_ids, self.target_ids, self.labels = (
            torch.from_numpy(batch[key]).long().to(self.device)
            for key in ("source_ids", "target_ids", "labels"))
        self.name = "torch.nn.Transformer " + (
            "(cuda)" if self.device.type == "cuda" else f"({torch.get_num_threads()} threads)")

    def step(self):
        self.optimizer.zero_grad(set_to_none=True)
        with self.torch.autocast(self.device.type, dtype=self.autocast_dtype,
                                 enabled=self.autocast_dtype is not None):
            logits = self.model(self.source_ids, self.target_ids)
            loss = self.F.cross_entropy(  # autocast computes it in float32
                logits.reshape(-1, logits.shape[-1]), self.labels.reshape(-1),
                label_smoothing=self.config["label_smoothing"],
                ignore_index=self.config["pad_id"],
            )
        self.scaler.scale(loss).backward()
        self.scaler.step(self.optimizer)
        self.scaler.update()
        self.scheduler.step()
        return loss.item()


def time_steps(trainer, steps):
    """Runs `trainer.step()` `steps` times.

    Returns:
        A dict: `seconds` (wall clock), `cpu_seconds` (CPU time of all this
        process's threads), `other_cores` (the cores that other processes of
        the machine kept busy meanwhile, on average; `None` without
        /proc/stat), `steps` and the last `loss`.
    """
    busy_start = machine_busy_seconds()
    start, cpu_start = time.perf_counter(), time.process_time()
    for _ in range(steps):
        loss = trainer.step()
    seconds = time.perf_counter() - start
    cpu_seconds = time.process_time() - cpu_start
    other_cores = None
    if busy_start is not None:
        other_cores = max(machine_busy_seconds() - busy_start - cpu_seconds, 0.0) / seconds
    return {"seconds": seconds, "cpu_seconds": cpu_seconds, "other_cores": other_cores,
            "steps": steps, "loss": loss}


def resolve_config(preset, **overrides):
    """The `TransformerConfig` dict of a preset, without importing Keras.

    `keras_transformer/model/config.py` imports no framework, but importing it
    through the package would (its `__init__` imports Keras), so the module
    is loaded from its file: the parent process stays framework-free.
    """
    import importlib.util

    name = "_benchmark_transformer_config"
    module = sys.modules.get(name)
    if module is None:
        path = os.path.join(REPO_ROOT, "keras_transformer", "model", "config.py")
        spec = importlib.util.spec_from_file_location(name, path)
        module = importlib.util.module_from_spec(spec)
        sys.modules[name] = module
        spec.loader.exec_module(module)
    return module.TransformerConfig.preset(preset, **overrides).to_dict()


def make_trainer(kind, config, batch, options, devices=None):
    """A `KerasTrainer` (`kind="keras"`) or a `TorchTrainer` (`"torch"`).

    `options` holds `jit_compile` (Keras), `torch_threads` (torch) and
    `mixed_precision` (both); `devices` are the Keras side's mirror targets.
    """
    if kind == "keras":
        return KerasTrainer(config, batch, jit_compile=options.get("jit_compile", "auto"),
                            mixed_precision=options.get("mixed_precision"), devices=devices)
    if kind == "torch":
        return TorchTrainer(config, batch, num_threads=options.get("torch_threads"),
                            mixed_precision=options.get("mixed_precision"))
    raise ValueError(f"kind must be 'keras' or 'torch', received {kind!r}")


def start_trainer(kind, config, batch, options, warmup_steps):
    """Sets up the devices, builds a trainer and runs its untimed warm-up steps.

    `options` may also hold `distribute` (`"mirrored"` or `None`), `replicas`
    (mirror over the first that many devices; `None`: all) and `cpu_devices`
    (logical CPU devices to mirror over where there are no GPUs), see
    `setup_tensorflow_devices`.

    Returns:
        `(trainer, info)`, `info` a dict with `name`, `num_parameters`,
        `jit_compile`, `precision` (the Keras policy, or torch's autocast),
        `platform` and `device_name` (see `describe_device`), `replicas`,
        `batch_size` and `target_tokens` (of the global batch), `peak_precision`
        (the peak table's key), `first_step_seconds` (tracing and compilation),
        `warm_step_seconds` (a step after it), `build_seconds`,
        `matmul_peak_gflops` (of this framework's matmul in the side's compute
        dtype, `matmul_dtype`, measured first; `None` off the CPU) and `notes`
        (strings to print).
    """
    devices = None
    if kind == "keras" and keras_backend() == "tensorflow":
        devices = setup_tensorflow_devices(options.get("distribute"), options.get("replicas"),
                                           options.get("cpu_devices", 2))
    platform, device_name = describe_device(kind)
    dtype = matmul_dtype(options.get("mixed_precision"))
    matmul_peak = None
    if platform == "cpu":
        matmul_peak = matmul_peak_gflops(kind, options.get("matmul_size", 2048), dtype=dtype)
    start = time.perf_counter()
    trainer = make_trainer(kind, config, batch, options, devices)
    built = time.perf_counter()
    try:
        first = warm = time_steps(trainer, 1)["seconds"]
    except Exception as error:  # XLA under MirroredStrategy, where GPUs still refuse it
        if not (getattr(trainer, "strategy", None) and trainer.jit_compile):
            raise
        trainer = make_trainer(kind, config, batch, dict(options, jit_compile=False), devices)
        trainer.notes.append(f"jit_compile=True failed under MirroredStrategy "
                             f"({type(error).__name__}): timed without XLA")
        first = warm = time_steps(trainer, 1)["seconds"]
    if warmup_steps > 1:
        warm = time_steps(trainer, warmup_steps - 1)["seconds"] / (warmup_steps - 1)
    replicas = getattr(trainer, "replicas", 1)
    mixed_precision = options.get("mixed_precision")
    return trainer, {
        "name": trainer.name,
        "num_parameters": trainer.num_parameters,
        "jit_compile": getattr(trainer, "jit_compile", False),
        "precision": trainer.precision,
        "platform": platform,
        "device_name": device_name,
        "replicas": replicas,
        "batch_size": replicas * len(batch["labels"]),
        "target_tokens": replicas * int(np.count_nonzero(batch["labels"])),
        "peak_precision": MIXED_PRECISION[mixed_precision][1] or float32_peak_precision(kind),
        "build_seconds": built - start,
        "first_step_seconds": first,
        "warm_step_seconds": warm,
        "matmul_peak_gflops": matmul_peak,
        "matmul_dtype": dtype,
        "notes": list(getattr(trainer, "notes", [])),
    }


def steps_per_round(step_seconds, round_seconds=1.0, max_steps=50):
    """Steps of `step_seconds` that fill about `round_seconds`, 1 to `max_steps`.

    What `steps="auto"` times per round: one step where a step takes half a
    second or more (CPUs), enough steps for a steady figure on accelerators.
    """
    return max(1, min(max_steps, round(round_seconds / max(step_seconds, 1e-9))))


# --- Worker processes ----------------------------------------------------------


def _closing(kind, options, info):
    """Peak RSS and device memory after the rounds; on a CPU, the matmul peak again."""
    closing = {
        "peak_rss_mb": peak_rss_mb(),
        "device_memory_bytes": device_memory_peak_bytes(kind, info["replicas"]),
        "matmul_peak_gflops": None,
    }
    if info["platform"] == "cpu":
        closing["matmul_peak_gflops"] = matmul_peak_gflops(
            kind, options.get("matmul_size", 2048), dtype=info["matmul_dtype"])
    return closing


def _worker(connection, kind, config, batch, options, warmup_steps):
    """Worker loop: build and warm up, then time `steps` on request."""
    try:
        trainer, info = start_trainer(kind, config, batch, options, warmup_steps)
        connection.send(info)
        while True:
            steps = connection.recv()
            if steps is None:
                break
            connection.send(time_steps(trainer, steps))
        connection.send(_closing(kind, options, info))
    except BaseException as error:  # report, then let the parent raise
        connection.send({"error": f"{kind} worker failed: {error!r}"})
        raise


class _InProcess:
    """The worker interface, for a trainer living in this process."""

    def __init__(self, kind, config, batch, options, warmup_steps):
        self.kind, self.options = kind, options
        self.trainer, self.info = start_trainer(kind, config, batch, options,
                                                warmup_steps)

    def run(self, steps):
        return time_steps(self.trainer, steps)

    def close(self):
        return _closing(self.kind, self.options, self.info)


class _Subprocess:
    """A trainer in its own spawned process, driven over a pipe."""

    def __init__(self, kind, config, batch, options, warmup_steps):
        context = multiprocessing.get_context("spawn")
        self.connection, child = context.Pipe()
        self.process = context.Process(
            target=_worker, args=(child, kind, config, batch, options, warmup_steps),
            daemon=True,
        )
        self.process.start()
        self.info = self._receive()

    def _receive(self):
        message = self.connection.recv()
        if isinstance(message, dict) and "error" in message:
            self.process.join(5)
            raise RuntimeError(message["error"])
        return message

    def run(self, steps):
        self.connection.send(steps)
        return self._receive()

    def close(self):
        self.connection.send(None)
        result = self._receive()
        self.process.join(30)
        return result


# --- The benchmark -------------------------------------------------------------


def run_benchmark(config, *, tokens_per_batch=4096, seq_len=32, steps=1,
                  warmup_steps=2, repeats=7, jit_compile="auto", torch_threads=None,
                  pad_fraction=0.0, isolate=True, matmul_size=2048, wait_for_quiet_s=0.0,
                  mixed_precision=None, reference=True, distribute=None, cpu_devices=2,
                  log=print):
    """Times Keras and native PyTorch training steps, alternating rounds.

    Args:
        config: a `TransformerConfig` dict (see `resolve_config`).
        tokens_per_batch: target positions per batch (per device); the batch
            holds `tokens_per_batch // seq_len` sentence pairs.
        seq_len: source and target length (fixed shapes).
        steps: timed steps per round, or `"auto"`: per side, about a second's
            worth (see `steps_per_round`).
        warmup_steps: untimed steps first (the first one compiles).
        repeats: rounds; each times every side once, in alternating order.
            The median round is reported (and the best, less sensitive to
            other work on a shared machine).
        jit_compile: passed to `compile_model` (`"auto"`, `True`, `False`).
        torch_threads: threads of the torch reference; `None` keeps
            PyTorch's default (one per physical core).
        pad_fraction: about this fraction of the positions is padding.
        isolate: run each side in its own spawned process (separate peak
            RSS); `False` runs them in this process (for tests).
        matmul_size: size of the square matmuls timed for the CPU peak (numpy
            in this process, and each framework on a CPU in its worker, before
            and after the rounds); the best of all is the machine's peak.
        wait_for_quiet_s: before each timed run, wait up to this long for
            other processes to leave the CPUs (see `wait_for_quiet`). Each
            run records `other_cores`, the cores others used meanwhile.
        mixed_precision: `None` (or `"none"`) for float32, `"mixed_float16"`
            or `"mixed_bfloat16"`: the Keras dtype policy, and torch's autocast.
            A list of two times one Keras side (and one torch side) per
            policy, side by side in the same alternating rounds: `"keras"`
            for the first, `"keras_bf16"` for `"mixed_bfloat16"` after a
            float32 first, and so on (`SIDE_SUFFIX`).
        reference: also time the torch reference.
        distribute: `None`, or `"mirrored"` (TensorFlow backend, needs
            `isolate`): side `"keras"` runs `MirroredStrategy` over one device,
            side `"keras_mirrored"` over all GPUs (or `cpu_devices` logical
            CPU devices), on the per-device batch repeated per replica.
        cpu_devices: logical CPU devices for `distribute` without GPUs.
        log: a print-like function for progress, or `None`.

    Returns:
        A dict. Per side (`"keras"`, `"keras_mirrored"` with `distribute`,
        `"torch"` with `reference`; `sides` lists them): `tokens_per_second`
        (median round; of the global batch), `tokens_per_second_per_device`,
        `best_tokens_per_second`, `step_seconds`, `cpu_seconds` (per step),
        `gflops` (all devices), `fraction_of_peak` (per device: the dense
        peak of `DEVICE_PEAKS_TFLOPS` on an accelerator, `None` if unknown;
        the float32 matmul peak on a CPU) with `peak_flops` and
        `peak_source`, `device_memory_bytes` (`None` on a CPU) and
        `device_memory` (text, `"n/a (CPU)"`), `peak_rss_mb`, `precision`,
        `platform`, `device_name`, `replicas`, `batch_size`, `target_tokens`,
        `num_parameters`, `first_step_seconds`, `other_cores` (median over
        rounds), `rounds`. And `ratio` (Keras over torch, median rounds),
        `best_ratio`, `parameter_difference` (torch minus Keras; these three
        `None` without `reference`), `scaling` (with `distribute`: `replicas`,
        `one_device_tokens_per_second`, `tokens_per_second`, `speedup`,
        `efficiency`; else `None`), `matmul_peak_gflops` (the best float32
        product; per side in `matmul_peaks`), `compute_matmul_peaks` (per
        compute dtype, the best of the sides multiplying in it),
        `flops_per_step`, `mixed_precision` (the first policy), `precisions`
        (all of them) and `precision_ratios` (with two policies: for
        `"keras"` and `"torch"`, the second policy's tokens/s over the
        first's, median rounds; else `{}`).
    """
    log = log or (lambda *args, **kwargs: None)
    precisions = (list(mixed_precision) if isinstance(mixed_precision, (list, tuple))
                  else [mixed_precision])
    precisions = [None if p in (None, "none") else p for p in precisions]
    for policy in precisions:
        if policy not in MIXED_PRECISION:
            raise ValueError("mixed_precision must be none, mixed_float16 or "
                             f"mixed_bfloat16, received {policy!r}")
    if len(set(precisions)) != len(precisions) or len(precisions) > 2:
        raise ValueError(f"one or two different policies, received {mixed_precision!r}")
    if distribute and len(precisions) > 1:
        raise ValueError("distribute='mirrored' times one policy at a time")
    mixed_precision = precisions[0]
    if distribute not in (None, "mirrored"):
        raise ValueError(f"distribute must be None or 'mirrored', received {distribute!r}")
    if distribute and not isolate:
        raise ValueError("distribute='mirrored' configures TensorFlow's devices before it "
                         "starts, in a fresh worker: it needs isolate=True")
    batch_size = max(tokens_per_batch // seq_len, 1)
    batch = synthetic_batch(config, batch_size, seq_len, pad_fraction)
    target_tokens = int(np.count_nonzero(batch["labels"]))
    flops = training_flops(config, batch_size, seq_len, seq_len)
    peaks = {"numpy": matmul_peak_gflops("numpy", matmul_size)}
    log(f"batch: {batch_size} x {seq_len} source and target positions, "
        f"{target_tokens} non-pad target tokens; {flops / 1e9:.1f} GFLOP per step"
        + (" (per device)" if distribute else ""))

    options = {"jit_compile": jit_compile, "torch_threads": torch_threads,
               "matmul_size": matmul_size, "mixed_precision": mixed_precision,
               "distribute": distribute, "cpu_devices": cpu_devices}
    plan = [("keras", "keras", {"replicas": 1} if distribute else {})]  # (side, kind, options)
    if distribute:
        plan.append(("keras_mirrored", "keras", {"replicas": None}))
    if reference:
        plan.append(("torch", "torch", {}))
    for policy in precisions[1:]:
        suffix = SIDE_SUFFIX[policy] or "_float32"
        plan += [(kind + suffix, kind, {"mixed_precision": policy})
                 for kind in ("keras", "torch") if kind == "keras" or reference]
    runner = _Subprocess if isolate else _InProcess
    sides, side_steps = {}, {}
    rounds = {name: [] for name, _, _ in plan}
    try:
        for name, kind, extra in plan:
            sides[name] = runner(kind, config, batch, dict(options, **extra), warmup_steps)
            info = sides[name].info
            side_steps[name] = (steps_per_round(info["warm_step_seconds"]) if steps == "auto"
                                else steps)
            matmul = info["matmul_peak_gflops"]
            log(f"{info['name']}: {info['num_parameters']:,} parameters, "
                f"{info['precision']}, {_where(info)}; built in {info['build_seconds']:.1f} s, "
                f"first step (compilation) {info['first_step_seconds']:.1f} s"
                + ("" if matmul is None
                   else f"; {info['matmul_dtype']} matmul {matmul:.0f} GFLOP/s")
                + f"; steps per round: {side_steps[name]}")
            for note in info["notes"]:
                log(f"  note: {note}")
        names = list(sides)
        for round_index in range(repeats):
            order = names if round_index % 2 == 0 else names[::-1]
            for name in order:
                if wait_for_quiet_s:
                    wait_for_quiet(wait_for_quiet_s)
                timing = sides[name].run(side_steps[name])
                rounds[name].append(timing)
                others = timing["other_cores"]
                tokens = timing["steps"] * sides[name].info["target_tokens"]
                log(f"  round {round_index + 1}/{repeats} {name:14s}: "
                    f"{tokens / timing['seconds']:8.0f} tokens/s, "
                    f"{timing['cpu_seconds'] / timing['seconds']:.2f} cores busy"
                    + ("" if others is None else f", other processes {others:.2f} cores")
                    + f", loss {timing['loss']:.3f}")
        closing = {name: side.close() for name, side in sides.items()}
    finally:
        for side in sides.values():
            if isinstance(side, _Subprocess) and side.process.is_alive():
                side.process.terminate()
    peaks["numpy"] = max(peaks["numpy"], matmul_peak_gflops("numpy", matmul_size))
    dtypes = {"numpy": "float32"}
    for name in names:
        measured = [v for v in (sides[name].info["matmul_peak_gflops"],
                                closing[name]["matmul_peak_gflops"]) if v is not None]
        if measured:
            peaks[name] = max(measured)
            dtypes[name] = sides[name].info["matmul_dtype"]
    compute_peaks = {}
    for name, value in peaks.items():
        compute_peaks[dtypes[name]] = max(compute_peaks.get(dtypes[name], 0.0), value)
    peak = compute_peaks["float32"]
    for dtype in compute_peaks:
        log(f"{dtype} matmul peak (CPU), best of: " + ", ".join(
            f"{name} {value:.0f}" for name, value in peaks.items() if dtypes[name] == dtype)
            + " GFLOP/s")

    result = {
        "config": config, "batch_size": batch_size, "seq_len": seq_len,
        "target_tokens": target_tokens, "steps": steps, "repeats": repeats,
        "flops_per_step": flops, "matmul_peak_gflops": peak, "matmul_peaks": peaks,
        "compute_matmul_peaks": compute_peaks,
        "isolated": isolate, "mixed_precision": mixed_precision or "none",
        "precisions": [p or "none" for p in precisions],
        "distribute": distribute, "sides": names,
    }
    for name in names:
        info = sides[name].info
        result[name] = _side_result(
            info, rounds[name], closing[name], peaks.get(name),
            compute_peaks.get(info["matmul_dtype"], peak),
            training_flops(config, info["batch_size"], seq_len, seq_len))
    result["precision_ratios"] = {}
    if len(precisions) > 1:
        suffix = SIDE_SUFFIX[precisions[1]] or "_float32"
        result["precision_ratios"] = {
            kind: result[kind + suffix]["tokens_per_second"] / result[kind]["tokens_per_second"]
            for kind in ("keras", "torch") if kind in result}
    keras_result = result["keras"]
    result["backend"] = keras_result["name"].split("/", 1)[1].split()[0]
    result["ratio"] = result["best_ratio"] = result["parameter_difference"] = None
    if reference:
        torch_result = result["torch"]
        result["ratio"] = (keras_result["tokens_per_second"]
                           / torch_result["tokens_per_second"])
        result["best_ratio"] = (keras_result["best_tokens_per_second"]
                                / torch_result["best_tokens_per_second"])
        result["parameter_difference"] = (torch_result["num_parameters"]
                                          - keras_result["num_parameters"])
    result["scaling"] = None
    if distribute:
        one, many = result["keras"]["tokens_per_second"], result["keras_mirrored"]
        devices = many["replicas"]
        result["scaling"] = {
            "replicas": devices, "platform": many["platform"],
            "one_device_tokens_per_second": one,
            "tokens_per_second": many["tokens_per_second"],
            "tokens_per_second_per_device": many["tokens_per_second_per_device"],
            "speedup": many["tokens_per_second"] / one,
            "efficiency": scaling_efficiency(one, many["tokens_per_second"], devices),
        }
    return result


def _side_result(info, rounds, closing, matmul_peak, cpu_peak_gflops, flops):
    """One side's figures from its worker's `info`, its rounds and closing.

    `cpu_peak_gflops` is the machine's matmul peak in the side's compute
    dtype (`info["matmul_dtype"]`, float32 where absent).
    """
    seconds = [r["seconds"] / r["steps"] for r in rounds]
    median = statistics.median(seconds)
    tokens, replicas = info["target_tokens"], info["replicas"]
    if info["platform"] == "cpu":
        # Logical CPU devices share the cores: the whole CPU is one device here.
        peak_flops, devices = cpu_peak_gflops * 1e9, 1
        peak_source = (f"{info.get('matmul_dtype', 'float32')} matmul peak "
                       f"{cpu_peak_gflops:.0f} GFLOP/s (measured here)")
    else:
        precision, device_name = info["peak_precision"], info["device_name"]
        peak_flops, devices = device_peak_flops(device_name, precision), replicas
        peak_source = (f"unknown peak for {device_name!r} ({precision})" if not peak_flops
                       else f"{precision} dense peak of the {device_name}, "
                            f"{peak_flops / 1e12:.0f} TFLOP/s (datasheet, no sparsity)")
    memory = closing["device_memory_bytes"]
    if info["platform"] == "cpu":
        memory_text = "n/a (CPU)"
    elif memory is None:
        memory_text = "unknown"
    else:
        memory_text = f"{memory / 2**30:.2f} GiB" + (
            f" (the most of {replicas} devices)" if replicas > 1 else "")
    return dict(
        info,
        matmul_peak_gflops=matmul_peak,
        steps=rounds[0]["steps"],
        flops_per_step=flops,
        step_seconds=median,
        cpu_seconds=statistics.median(r["cpu_seconds"] / r["steps"] for r in rounds),
        tokens_per_second=tokens / median,
        tokens_per_second_per_device=tokens / median / replicas,
        best_tokens_per_second=tokens / min(seconds),
        gflops=flops / median / 1e9,
        peak_flops=peak_flops,
        peak_source=peak_source,
        fraction_of_peak=fraction_of_peak(flops, median, peak_flops, devices),
        peak_rss_mb=closing["peak_rss_mb"],
        device_memory_bytes=memory,
        device_memory=memory_text,
        other_cores=_median_or_none(r["other_cores"] for r in rounds),
        rounds=rounds,
    )


def _where(info):
    """`"NVIDIA H200"`, `"2 x NVIDIA H200"`, `"2 x <cpu> (logical devices)"`."""
    where = info["device_name"]
    if info["replicas"] > 1:
        where = f"{info['replicas']} x {where}"
        if info["platform"] == "cpu":
            where += " (logical devices)"
    return where


def _median_or_none(values):
    values = [v for v in values if v is not None]
    return statistics.median(values) if values else None


def _cores(value):
    return "  n/a" if value is None else f"{value:5.2f}"


def _percent(fraction, width=4):
    return f"{'n/a':>{width + 1}s}" if fraction is None else f"{100 * fraction:{width}.1f}%"


def format_result(result):
    """The lines summarising one `run_benchmark` result."""
    lines = []
    for name in result["sides"]:
        r = result[name]
        if r["platform"] == "cpu":
            achieved = f"{r['gflops']:.1f} GFLOP/s"
        else:
            achieved = f"{r['gflops'] / 1e3 / r['replicas']:.1f} TFLOP/s per device"
        if r["fraction_of_peak"] is None:
            achieved += f"; {r['peak_source']}"
        else:
            achieved += f" = {_percent(r['fraction_of_peak']).strip()} of the {r['peak_source']}"
        lines += [
            f"{r['name']} [{r['precision']}] on {_where(r)}:",
            f"    {r['tokens_per_second']:.0f} target tokens/s (best "
            f"{r['best_tokens_per_second']:.0f}), {r['tokens_per_second_per_device']:.0f} "
            f"per device; {r['step_seconds']:.3f} s/step ({r['cpu_seconds']:.2f} CPU s), "
            f"batch {r['batch_size']} x {result['seq_len']}, steps per round: {r['steps']}",
            f"    {achieved}",
            f"    device memory peak {r['device_memory']}; host peak RSS "
            f"{r['peak_rss_mb']:.0f} MiB; {r['num_parameters']:,} parameters",
        ]
        lines += [f"    note: {note}" for note in r["notes"]]
    if result["ratio"] is None:
        lines.append("torch reference skipped (--no-reference)")
    else:
        lines.append(
            f"ratio keras/torch: {result['ratio']:.2f}x median, {result['best_ratio']:.2f}x "
            f"best round   (parameters {result['parameter_difference']:+,}: torch's final "
            f"encoder and decoder LayerNorms"
            + ("" if result["isolated"] else "; one process, shared RSS") + ")"
        )
    for kind, ratio in result.get("precision_ratios", {}).items():
        lines.append(f"{result['precisions'][1]} over {result['precisions'][0]} ({kind}): "
                     f"{ratio:.2f}x target tokens/s, median rounds")
    scaling = result["scaling"]
    if scaling:
        lines.append(
            f"MirroredStrategy: 1 device {scaling['one_device_tokens_per_second']:.0f} "
            f"tokens/s, {scaling['replicas']} devices {scaling['tokens_per_second']:.0f} "
            f"tokens/s ({scaling['tokens_per_second_per_device']:.0f} per device): speedup "
            f"{scaling['speedup']:.2f}x, scaling efficiency {100 * scaling['efficiency']:.0f}%")
        if scaling["platform"] == "cpu":
            lines.append("    (logical CPU devices share the same cores: this runs the "
                         "code path, it measures no scaling)")
        elif scaling["replicas"] == 1:
            lines.append("    (one GPU visible: scaling needs two or more)")
    others = {name: result[name]["other_cores"] for name in result["sides"]}
    if None not in others.values():
        lines.append(
            "other processes on this machine used " + ", ".join(
                f"{value:.2f} ({name} rounds)" for name, value in others.items())
            + " cores, median"
            + ("  -- a busy machine: timings are unreliable"
               + (", torch's OpenMP threads suffer most" if "torch" in others else "")
               if max(others.values()) > 0.25 else "")
        )
    lines += PUBLISHED_FIGURES
    return "\n".join(lines)


def format_table(rows):
    """The `--all-backends` summary: one row per `(label, result or None)`."""
    header = (f"{'backend':15s} {'keras tok/s':>11s} {'torch tok/s':>11s} "
              f"{'ratio':>6s} {'best':>6s} {'keras %pk':>9s} {'torch %pk':>9s} "
              f"{'keras RSS':>9s} {'torch RSS':>9s} {'compile':>7s} {'others':>6s}")
    second = next((r["precisions"][1] for _, r in rows
                   if r is not None and len(r.get("precisions", ())) > 1), None)
    if second:
        header += f" {second[-8:] + ' tok/s':>15s} {'ratio':>6s}"
    lines = [header, "-" * len(header)]
    for label, r in rows:
        if r is None:
            lines.append(f"{label:15s} failed")
            continue
        k, t = r["keras"], r.get("torch")
        others = [v for v in (k["other_cores"], t and t["other_cores"]) if v is not None]
        if t is None:
            torch_columns = f"{'-':>11s} {'-':>6s} {'-':>6s}"
            torch_peak, torch_rss = f"{'-':>9s}", f"{'-':>9s}"
        else:
            torch_columns = (f"{t['tokens_per_second']:11.0f} {r['ratio']:5.2f}x "
                             f"{r['best_ratio']:5.2f}x")
            torch_peak = _percent(t["fraction_of_peak"], 8)
            torch_rss = f"{t['peak_rss_mb']:5.0f} MiB"
        lines.append(
            f"{label:15s} {k['tokens_per_second']:11.0f} {torch_columns} "
            f"{_percent(k['fraction_of_peak'], 8)} {torch_peak} "
            f"{k['peak_rss_mb']:5.0f} MiB {torch_rss} "
            f"{k['first_step_seconds']:6.1f}s {_cores(max(others) if others else None)}"
            + ("" if not second else
               f" {r['keras' + SIDE_SUFFIX[second]]['tokens_per_second']:15.0f} "
               f"{r['precision_ratios']['keras']:5.2f}x")
        )
    lines.append(
        "ratio: Keras over torch tokens/s, median rounds; best: best rounds; %pk: "
        "achieved FLOP/s over the best float32 matmul (CPU) or the device's dense peak; "
        "RSS: peak resident memory of each side's process; compile: Keras' first step; "
        "others: cores used by other processes during the rounds (median, worse side)"
        + (f"; {second} tok/s: Keras under that policy, and its ratio over the first "
           "policy's tokens/s, median rounds in the same run" if second else ""))
    return "\n".join(lines)


# --- Command line --------------------------------------------------------------


def parse_args(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--preset", default="small")
    parser.add_argument("--vocab-size", type=int, default=None)
    parser.add_argument("--tokens-per-batch", type=int, default=4096,
                        help="target positions per batch (default 4096)")
    parser.add_argument("--seq-len", type=int, default=32,
                        help="source and target length (default 32: batch 128)")
    parser.add_argument("--pad-fraction", type=float, default=0.0)
    parser.add_argument("--steps", type=_steps, default="auto",
                        help="timed steps per round, or auto (default): about one "
                             "second's worth per side, 1 on most CPUs")
    parser.add_argument("--warmup-steps", type=int, default=2,
                        help="untimed steps first, compilation included")
    parser.add_argument("--repeats", type=int, default=7,
                        help="alternating rounds; the median is reported")
    parser.add_argument("--jit-compile", choices=("auto", "true", "false"),
                        default="auto",
                        help="XLA for TensorFlow (auto: off on CPU); JAX always jits")
    parser.add_argument("--mixed-precision", default=["none"], nargs="+",
                        choices=("none", "mixed_float16", "mixed_bfloat16"),
                        help="Keras dtype policy; the torch reference uses torch.autocast "
                             "with the same dtype. Two policies (none mixed_bfloat16) time "
                             "both side by side, each in its own process, alternating")
    parser.add_argument("--no-reference", action="store_true",
                        help="skip the torch.nn.Transformer reference")
    parser.add_argument("--distribute", default="none", choices=("none", "mirrored"),
                        help="mirrored: time tf.distribute.MirroredStrategy over 1 and over "
                             "all GPUs (TensorFlow backend); global batch = "
                             "--tokens-per-batch x replicas")
    parser.add_argument("--cpu-devices", type=int, default=2,
                        help="logical CPU devices that --distribute mirrored splits the CPU "
                             "into where there is no GPU (default 2)")
    parser.add_argument("--wait-for-quiet", type=float, default=0.0, metavar="SECONDS",
                        help="before each timed run wait up to SECONDS for other "
                             "processes to leave the CPUs (shared machines)")
    parser.add_argument("--torch-threads", type=int, default=None,
                        help="threads of the torch reference (default: PyTorch's)")
    parser.add_argument("--matmul-size", type=int, default=2048,
                        help="size of the square matmuls timed for the peak")
    parser.add_argument("--in-process", action="store_true",
                        help="run Keras and torch in this process (one shared RSS)")
    parser.add_argument("--all-backends", action="store_true",
                        help="rerun for tensorflow, tensorflow+xla, jax, torch; "
                             "print a summary table")
    parser.add_argument("--json", default=None, help="also write the result here")
    return parser.parse_args(argv)


def _steps(value):
    """`--steps`: a positive int or `"auto"`."""
    if value == "auto":
        return value
    if not value.isdigit() or int(value) < 1:
        raise argparse.ArgumentTypeError(f"expected a positive integer or auto, got {value!r}")
    return int(value)


def _all_backends(args, argv):
    """Reruns this script once per `BACKEND_RUNS` entry; prints the table."""
    rows = []
    passthrough = [a for a in argv if a != "--all-backends"]
    with tempfile.TemporaryDirectory() as directory:
        for label, backend, jit in BACKEND_RUNS:
            print(f"\n=== {label} ===", flush=True)
            path = os.path.join(directory, f"{label}.json")
            command = [sys.executable, os.path.abspath(__file__), *passthrough,
                       "--jit-compile", jit, "--json", path]
            completed = subprocess.run(command, env=dict(os.environ, KERAS_BACKEND=backend))
            result = None
            if completed.returncode == 0:
                with open(path) as f:
                    result = json.load(f)
            rows.append((label, result))
    print(f"\n=== {args.preset} preset, {args.tokens_per_batch} target tokens per "
          f"batch (seq len {args.seq_len}), {args.repeats} rounds of {args.steps} "
          f"steps per backend ===")
    print(format_table(rows))
    return rows


def main(argv=None):
    argv = sys.argv[1:] if argv is None else argv
    args = parse_args(argv)
    backend = os.environ.get("KERAS_BACKEND", "tensorflow")
    distribute = None if args.distribute == "none" else args.distribute
    if distribute and (args.all_backends or backend != "tensorflow" or args.in_process):
        raise SystemExit("--distribute mirrored needs the TensorFlow backend "
                         f"(KERAS_BACKEND={backend}) and worker processes: not with "
                         "--all-backends or --in-process")
    if args.all_backends:
        return _all_backends(args, argv)
    overrides = {} if args.vocab_size is None else {"vocab_size": args.vocab_size}
    print(f"KERAS_BACKEND={backend}, preset {args.preset}, jit_compile={args.jit_compile}, "
          f"mixed precision {' and '.join(args.mixed_precision)}, distribute "
          f"{args.distribute}, torch "
          f"reference {'off' if args.no_reference else 'on'}", flush=True)
    result = run_benchmark(
        resolve_config(args.preset, **overrides),
        tokens_per_batch=args.tokens_per_batch, seq_len=args.seq_len,
        steps=args.steps, warmup_steps=args.warmup_steps, repeats=args.repeats,
        jit_compile={"auto": "auto", "true": True, "false": False}[args.jit_compile],
        torch_threads=args.torch_threads, pad_fraction=args.pad_fraction,
        wait_for_quiet_s=args.wait_for_quiet, matmul_size=args.matmul_size,
        mixed_precision=args.mixed_precision if len(args.mixed_precision) > 1
        else args.mixed_precision[0], reference=not args.no_reference,
        distribute=distribute, cpu_devices=args.cpu_devices,
        isolate=not args.in_process, log=lambda *a: print(*a, flush=True),
    )
    print(format_result(result))
    if args.json:
        with open(args.json, "w") as f:
            json.dump(result, f)
    return result


if __name__ == "__main__":
    main()
