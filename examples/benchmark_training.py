"""Training throughput of keras_transformer against native `torch.nn.Transformer`.

Measures target tokens per second of full training steps (forward, backward,
Adam update) of a preset on one fixed synthetic token batch, under the Keras
backend chosen by `KERAS_BACKEND`, and, in the same run, of the same model
written directly in PyTorch (`torch.nn.Transformer` with the same sizes, a
shared embedding tied to the output projection, sinusoidal positions, the same
label-smoothed loss and Adam). It prints both throughputs and their ratio, the
achieved FLOP/s as a fraction of the machine's float32 matmul throughput, and
the peak resident memory of each side.

Each side runs in its own worker process (`multiprocessing` "spawn"), so that
each peak RSS is that framework's alone and neither framework's thread pools
or allocator live in the other's process. The parent process imports neither
Keras nor PyTorch: it alternates timed rounds between the two workers
(`--repeats` rounds of `--steps` steps each; the order flips every round) and
reports the median round (and the best). Warm-up steps, tracing and XLA
compilation are excluded from the timings and reported separately.

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

The machine's float32 matmul throughput is the best GFLOP/s of square
`--matmul-size` products in numpy, in the Keras backend (`keras.ops.matmul`)
and in PyTorch, each timed in its own process before and after the rounds.

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
import json
import math
import multiprocessing
import os
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


def matmul_peak_gflops(library="numpy", size=2048, repeats=5):
    """Best float32 GFLOP/s of a `(size, size) x (size, size)` matmul.

    Each library has its own kernels (numpy: its BLAS, often OpenBLAS;
    `"keras"`: `keras.ops.matmul` on the current backend, jitted under JAX;
    `"torch"`: `torch.mm`), so the machine's peak is the best of them.

    Args:
        library: `"numpy"`, `"keras"` or `"torch"`.
        size: matrix size.
        repeats: timed products; the fastest counts.
    """
    rng = np.random.default_rng(0)
    a = rng.random((size, size), dtype=np.float32)
    b = rng.random((size, size), dtype=np.float32)
    if library == "numpy":
        product = lambda: a @ b  # noqa: E731
    elif library == "torch":
        import torch

        a, b = torch.from_numpy(a), torch.from_numpy(b)
        product = lambda: torch.mm(a, b)  # noqa: E731
    elif library == "keras":
        import keras

        a, b = keras.ops.convert_to_tensor(a), keras.ops.convert_to_tensor(b)
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


# --- The two trainers ----------------------------------------------------------


class KerasTrainer:
    """`keras_transformer` training steps on a fixed batch, on the current backend.

    Builds the model, compiles it with `keras_transformer.compile_model` (the
    paper's Adam and schedule, the label-smoothed loss, the masked accuracy
    metric) and runs `model.train_on_batch`, the train function `fit` uses.

    Args:
        config: a `TransformerConfig` dict.
        batch: the dict of `synthetic_batch`.
        jit_compile: `"auto"`, `True` or `False`; the JAX backend always jits.
        seed: weight initialisation seed.
    """

    def __init__(self, config, batch, jit_compile="auto", seed=0):
        import keras

        import keras_transformer

        self.backend = keras.backend.backend()
        if self.backend == "jax":
            jit_compile = True
        keras.utils.set_random_seed(seed)
        config = keras_transformer.TransformerConfig.from_dict(config)
        self.model = keras_transformer.build_model(config)
        keras_transformer.compile_model(self.model, jit_compile=jit_compile)
        self.jit_compile = bool(self.model.jit_compile)
        self.num_parameters = int(self.model.count_params())
        self.x = {"source_ids": batch["source_ids"], "target_ids": batch["target_ids"]}
        self.y = batch["labels"]
        self.name = f"keras/{self.backend}" + ("+xla" if self.backend == "tensorflow"
                                               and self.jit_compile else "")

    def step(self):
        """One training step; returns the loss as a Python float.

        The float conversion finishes the step (also under JAX's asynchronous
        dispatch) before the clock is read.
        """
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
            causal = torch.ones(target_length, target_length, dtype=torch.bool).triu(1)
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
    train mode (dropout on), PyTorch's default threads.

    Args:
        config, batch, seed: as `KerasTrainer`.
        num_threads: `torch.set_num_threads` first, if given.
    """

    def __init__(self, config, batch, seed=0, num_threads=None):
        import torch
        from torch.nn import functional as F

        if num_threads:
            torch.set_num_threads(num_threads)
        torch.manual_seed(seed)
        self.torch, self.F = torch, F
        self.config = config
        self.model = build_torch_reference(config)
        self.model.train()
        self.num_parameters = sum(p.numel() for p in self.model.parameters())
        self.optimizer = torch.optim.Adam(self.model.parameters(), lr=1.0,
                                          betas=(0.9, 0.98), eps=1e-9)
        d, warmup = config["d_model"], config["warmup_steps"]
        self.scheduler = torch.optim.lr_scheduler.LambdaLR(
            self.optimizer,
            lambda step: d**-0.5 * min((step + 1) ** -0.5, (step + 1) * warmup**-1.5),
        )
        self.source_ids = torch.from_numpy(batch["source_ids"]).long()
        self.target_ids = torch.from_numpy(batch["target_ids"]).long()
        self.labels = torch.from_numpy(batch["labels"]).long()
        self.name = f"torch.nn.Transformer ({torch.get_num_threads()} threads)"

    def step(self):
        self.optimizer.zero_grad(set_to_none=True)
        logits = self.model(self.source_ids, self.target_ids)
        loss = self.F.cross_entropy(
            logits.reshape(-1, logits.shape[-1]), self.labels.reshape(-1),
            label_smoothing=self.config["label_smoothing"],
            ignore_index=self.config["pad_id"],
        )
        loss.backward()
        self.optimizer.step()
        self.scheduler.step()
        return loss.item()



def time_steps(trainer, steps):
    """Runs `trainer.step()` `steps` times.

    Returns:
        A dict: `seconds` (wall clock), `cpu_seconds` (CPU time of all this
        process's threads), `other_cores` (the cores that other processes of
        the machine kept busy meanwhile, on average; `None` without
        /proc/stat) and the last `loss`.
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
            "loss": loss}


def resolve_config(preset, **overrides):
    """The `TransformerConfig` dict of a preset, without importing Keras.

    `keras_transformer/config.py` imports no framework, but importing it
    through the package would (its `__init__` imports Keras), so the module
    is loaded from its file: the parent process stays framework-free.
    """
    import importlib.util

    name = "_benchmark_transformer_config"
    module = sys.modules.get(name)
    if module is None:
        path = os.path.join(REPO_ROOT, "keras_transformer", "config.py")
        spec = importlib.util.spec_from_file_location(name, path)
        module = importlib.util.module_from_spec(spec)
        sys.modules[name] = module
        spec.loader.exec_module(module)
    return module.TransformerConfig.preset(preset, **overrides).to_dict()


def make_trainer(kind, config, batch, options):
    """A `KerasTrainer` (`kind="keras"`) or a `TorchTrainer` (`"torch"`).

    `options` holds `jit_compile` (Keras) and `torch_threads` (torch).
    """
    if kind == "keras":
        return KerasTrainer(config, batch, jit_compile=options.get("jit_compile", "auto"))
    if kind == "torch":
        return TorchTrainer(config, batch, num_threads=options.get("torch_threads"))
    raise ValueError(f"kind must be 'keras' or 'torch', received {kind!r}")


def start_trainer(kind, config, batch, options, warmup_steps):
    """Builds a trainer and runs its untimed warm-up steps (compilation included).

    Returns:
        `(trainer, info)`, `info` a dict with `name`, `num_parameters`,
        `jit_compile`, `first_step_seconds` (tracing and compilation),
        `build_seconds` and `matmul_peak_gflops` (of this framework's matmul,
        measured first).
    """
    matmul_peak = matmul_peak_gflops(kind, options.get("matmul_size", 2048))
    start = time.perf_counter()
    trainer = make_trainer(kind, config, batch, options)
    built = time.perf_counter()
    first = time_steps(trainer, 1)["seconds"]
    if warmup_steps > 1:
        time_steps(trainer, warmup_steps - 1)
    return trainer, {
        "name": trainer.name,
        "num_parameters": trainer.num_parameters,
        "jit_compile": getattr(trainer, "jit_compile", False),
        "build_seconds": built - start,
        "first_step_seconds": first,
        "matmul_peak_gflops": matmul_peak,
    }


# --- Worker processes ----------------------------------------------------------


def _closing(kind, options):
    """Peak RSS after the timed rounds, and the framework's matmul peak again."""
    return {
        "peak_rss_mb": peak_rss_mb(),
        "matmul_peak_gflops": matmul_peak_gflops(kind, options.get("matmul_size", 2048)),
    }


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
        connection.send(_closing(kind, options))
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
        return _closing(self.kind, self.options)


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
                  log=print):
    """Times Keras and native PyTorch training steps, alternating rounds.

    Args:
        config: a `TransformerConfig` dict (see `resolve_config`).
        tokens_per_batch: target positions per batch; the batch holds
            `tokens_per_batch // seq_len` sentence pairs.
        seq_len: source and target length (fixed shapes).
        steps: timed steps per round.
        warmup_steps: untimed steps first (the first one compiles).
        repeats: rounds; each times `steps` Keras steps and `steps` torch
            steps, in alternating order. The median round is reported (and
            the best, less sensitive to other work on a shared machine).
        jit_compile: passed to `compile_model` (`"auto"`, `True`, `False`).
        torch_threads: threads of the torch reference; `None` keeps
            PyTorch's default (one per physical core).
        pad_fraction: about this fraction of the positions is padding.
        isolate: run each framework in its own spawned process (separate peak
            RSS); `False` runs both in this process (for tests).
        matmul_size: size of the square matmuls timed for the peak (numpy in
            this process, and each framework in its worker, before and after
            the rounds); the best of all is the machine's peak.
        wait_for_quiet_s: before each timed run, wait up to this long for
            other processes to leave the CPUs (see `wait_for_quiet`). Each
            run records `other_cores`, the cores others used meanwhile.
        log: a print-like function for progress, or `None`.

    Returns:
        A dict: for `"keras"` and `"torch"`, `tokens_per_second` (median
        round), `best_tokens_per_second`, `step_seconds`, `cpu_seconds` (per
        step), `gflops`, `fraction_of_peak`, `peak_rss_mb`, `num_parameters`,
        `first_step_seconds`, `other_cores` (median over rounds), `rounds`; and `ratio` (Keras over torch, median
        rounds), `best_ratio`, `matmul_peak_gflops` (and per library
        `matmul_peaks`), `flops_per_step`,
        `parameter_difference` (torch minus Keras).
    """
    log = log or (lambda *args, **kwargs: None)
    batch_size = max(tokens_per_batch // seq_len, 1)
    batch = synthetic_batch(config, batch_size, seq_len, pad_fraction)
    target_tokens = int(np.count_nonzero(batch["labels"]))
    flops = training_flops(config, batch_size, seq_len, seq_len)
    peaks = {"numpy": matmul_peak_gflops("numpy", matmul_size)}
    log(f"batch: {batch_size} x {seq_len} source and target positions, "
        f"{target_tokens} non-pad target tokens; {flops / 1e9:.1f} GFLOP per step")

    options = {"jit_compile": jit_compile, "torch_threads": torch_threads,
               "matmul_size": matmul_size}
    runner = _Subprocess if isolate else _InProcess
    sides = {}
    rounds = {"keras": [], "torch": []}
    try:
        for kind in ("keras", "torch"):
            sides[kind] = runner(kind, config, batch, options, warmup_steps)
            info = sides[kind].info
            log(f"{info['name']}: {info['num_parameters']:,} parameters; built in "
                f"{info['build_seconds']:.1f} s, first step (compilation) "
                f"{info['first_step_seconds']:.1f} s; float32 matmul "
                f"{info['matmul_peak_gflops']:.0f} GFLOP/s")
        for round_index in range(repeats):
            order = ("keras", "torch") if round_index % 2 == 0 else ("torch", "keras")
            for kind in order:
                if wait_for_quiet_s:
                    wait_for_quiet(wait_for_quiet_s)
                timing = sides[kind].run(steps)
                rounds[kind].append(timing)
                others = timing["other_cores"]
                log(f"  round {round_index + 1}/{repeats} {kind:5s}: "
                    f"{steps * target_tokens / timing['seconds']:8.0f} tokens/s, "
                    f"{timing['cpu_seconds'] / timing['seconds']:.2f} cores busy"
                    + ("" if others is None else f", other processes {others:.2f} cores")
                    + f", loss {timing['loss']:.3f}")
        closing = {kind: side.close() for kind, side in sides.items()}
    finally:
        for side in sides.values():
            if isinstance(side, _Subprocess) and side.process.is_alive():
                side.process.terminate()
    peaks["numpy"] = max(peaks["numpy"], matmul_peak_gflops("numpy", matmul_size))
    for kind in ("keras", "torch"):
        peaks[kind] = max(sides[kind].info["matmul_peak_gflops"],
                          closing[kind]["matmul_peak_gflops"])
    peak = max(peaks.values())
    log("float32 matmul peak, best of: " + ", ".join(
        f"{name} {value:.0f}" for name, value in peaks.items()) + " GFLOP/s")

    result = {
        "config": config, "batch_size": batch_size, "seq_len": seq_len,
        "target_tokens": target_tokens, "steps": steps, "repeats": repeats,
        "flops_per_step": flops, "matmul_peak_gflops": peak, "matmul_peaks": peaks,
        "isolated": isolate,
    }
    for kind in ("keras", "torch"):
        seconds = [r["seconds"] / steps for r in rounds[kind]]
        median = statistics.median(seconds)
        result[kind] = dict(
            sides[kind].info,
            matmul_peak_gflops=peaks[kind],
            step_seconds=median,
            cpu_seconds=statistics.median(r["cpu_seconds"] / steps for r in rounds[kind]),
            tokens_per_second=target_tokens / median,
            best_tokens_per_second=target_tokens / min(seconds),
            gflops=flops / median / 1e9,
            fraction_of_peak=flops / median / 1e9 / peak,
            peak_rss_mb=closing[kind]["peak_rss_mb"],
            other_cores=_median_or_none(r["other_cores"] for r in rounds[kind]),
            rounds=rounds[kind],
        )
    keras_result, torch_result = result["keras"], result["torch"]
    result["backend"] = keras_result["name"].split("/", 1)[1]
    result["ratio"] = keras_result["tokens_per_second"] / torch_result["tokens_per_second"]
    result["best_ratio"] = (keras_result["best_tokens_per_second"]
                            / torch_result["best_tokens_per_second"])
    result["parameter_difference"] = (torch_result["num_parameters"]
                                      - keras_result["num_parameters"])
    return result


def _median_or_none(values):
    values = [v for v in values if v is not None]
    return statistics.median(values) if values else None


def _cores(value):
    return "  n/a" if value is None else f"{value:5.2f}"


def format_result(result):
    """A few lines summarising one `run_benchmark` result."""
    lines = []
    for kind in ("keras", "torch"):
        r = result[kind]
        lines.append(
            f"{r['name']:32s} {r['tokens_per_second']:7.0f} tokens/s (best "
            f"{r['best_tokens_per_second']:.0f})  {r['step_seconds']:.3f} s/step "
            f"({r['cpu_seconds']:.2f} CPU s)  {r['gflops']:5.1f} GFLOP/s = "
            f"{100 * r['fraction_of_peak']:4.1f}% of matmul peak  "
            f"peak RSS {r['peak_rss_mb']:5.0f} MiB  {r['num_parameters']:,} params"
        )
    lines.append(
        f"ratio keras/torch: {result['ratio']:.2f}x median, {result['best_ratio']:.2f}x "
        f"best round   (matmul peak {result['matmul_peak_gflops']:.1f} GFLOP/s; "
        f"parameters {result['parameter_difference']:+,}: torch's final encoder and "
        f"decoder LayerNorms"
        + ("" if result["isolated"] else "; one process, shared RSS") + ")"
    )
    others = [result[kind]["other_cores"] for kind in ("keras", "torch")]
    if None not in others:
        lines.append(
            f"other processes on this machine used {others[0]:.2f} (keras rounds) and "
            f"{others[1]:.2f} (torch rounds) cores, median"
            + ("  -- a busy machine: timings are unreliable, torch's OpenMP threads "
               "suffer most" if max(others) > 0.25 else "")
        )
    return "\n".join(lines)


def format_table(rows):
    """The `--all-backends` summary: one row per `(label, result or None)`."""
    header = (f"{'backend':15s} {'keras tok/s':>11s} {'torch tok/s':>11s} "
              f"{'ratio':>6s} {'best':>6s} {'keras %pk':>9s} {'torch %pk':>9s} "
              f"{'keras RSS':>9s} {'torch RSS':>9s} {'compile':>7s} {'others':>6s}")
    lines = [header, "-" * len(header)]
    for label, r in rows:
        if r is None:
            lines.append(f"{label:15s} failed")
            continue
        k, t = r["keras"], r["torch"]
        others = [v for v in (k["other_cores"], t["other_cores"]) if v is not None]
        lines.append(
            f"{label:15s} {k['tokens_per_second']:11.0f} {t['tokens_per_second']:11.0f} "
            f"{r['ratio']:5.2f}x {r['best_ratio']:5.2f}x "
            f"{100 * k['fraction_of_peak']:8.1f}% {100 * t['fraction_of_peak']:8.1f}% "
            f"{k['peak_rss_mb']:5.0f} MiB {t['peak_rss_mb']:5.0f} MiB "
            f"{k['first_step_seconds']:6.1f}s {_cores(max(others) if others else None)}"
        )
    lines.append(
        "ratio: Keras over torch tokens/s, median rounds; best: best rounds; %pk: "
        "achieved FLOP/s over the best float32 matmul; RSS: peak resident memory of "
        "each side's process; compile: Keras' first step; others: cores used by other "
        "processes during the rounds (median, worse side)")
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
    parser.add_argument("--steps", type=int, default=1, help="timed steps per round")
    parser.add_argument("--warmup-steps", type=int, default=2,
                        help="untimed steps first, compilation included")
    parser.add_argument("--repeats", type=int, default=7,
                        help="alternating rounds; the median is reported")
    parser.add_argument("--jit-compile", choices=("auto", "true", "false"),
                        default="auto",
                        help="XLA for TensorFlow (auto: off on CPU); JAX always jits")
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
    if args.all_backends:
        return _all_backends(args, argv)
    overrides = {} if args.vocab_size is None else {"vocab_size": args.vocab_size}
    print(f"KERAS_BACKEND={os.environ.get('KERAS_BACKEND', 'tensorflow')}, preset "
          f"{args.preset}, jit_compile={args.jit_compile}", flush=True)
    result = run_benchmark(
        resolve_config(args.preset, **overrides),
        tokens_per_batch=args.tokens_per_batch, seq_len=args.seq_len,
        steps=args.steps, warmup_steps=args.warmup_steps, repeats=args.repeats,
        jit_compile={"auto": "auto", "true": True, "false": False}[args.jit_compile],
        torch_threads=args.torch_threads, pad_fraction=args.pad_fraction,
        wait_for_quiet_s=args.wait_for_quiet, matmul_size=args.matmul_size,
        isolate=not args.in_process, log=lambda *a: print(*a, flush=True),
    )
    print(format_result(result))
    if args.json:
        with open(args.json, "w") as f:
            json.dump(result, f)
    return result


if __name__ == "__main__":
    main()
