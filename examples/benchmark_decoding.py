"""Decoding speed of this package's searches against HF MarianMT and CTranslate2, fairly.

Every system decodes the same batch (default: the `small` preset's sizes,
random weights, 16 sentences of 20 source ids, exactly 64 generated tokens
each, greedy and cached beam 4 with alpha 0.6) **in its own process**: a
worker mode of this script (`--worker SYSTEM`, which prints one JSON line)
started afresh for every round, so no two frameworks' thread pools ever share
the cores. The parent process imports no framework; it runs the workers one
at a time, in rounds (round 1: A, B, C; round 2: B, C, A; ...), and reports
per system the median over rounds and the spread (min-max), with the speed
ratio to HF MarianMT. Within a round a worker builds its model, runs each
search once untimed (tracing and XLA compilation: the "first call" column,
reported separately) and then `--repeats` timed runs, whose median is the
round's figure.

Systems (`--systems`; default all but the quantized Keras ones):

- `tensorflow`: `keras_transformer.greedy_decode` / `beam_search` under the
  TensorFlow backend, traced once into a `tf.function` without XLA (graph
  mode, as the exported SavedModel runs it);
- `tensorflow+xla`: the same, compiled with XLA (`jit_compile=True`, the
  package's default under TensorFlow);
- `jax`: compiled with `jax.jit`;
- `torch`: eager PyTorch under `torch.no_grad()`, one Keras layer call at a
  time;
- `<keras system>-int8` (`--quantize int8` adds one per Keras system):
  `model.quantize("int8")` before decoding; reported as "not supported" when
  it raises or quantizes nothing;
- `<keras system>-bf16` (`--bf16` adds one per Keras system): the model in
  bf16 weights and arithmetic (`keras_transformer.model.transformer.with_dtype`);
- `hf-marian`: `transformers.MarianMTModel.generate` (PyTorch, its own
  key/value cache) with the same sizes and random weights (`hf_marian_config`
  gives the mapping);
- `ct2-marian`, `ct2-marian-int8`: that same HF model converted once, before
  the rounds and in its own process, with
  `ctranslate2.converters.TransformersConverter` (float32 weights), run by
  `ctranslate2.Translator(compute_type="float32"/"int8")`;
- `ct2-ours`, `ct2-ours-int8`: our model (the weights of `tensorflow`)
  exported once by `keras_transformer.export.ctranslate2`, run the same way.

Forced lengths: EOS is forbidden until the last position, so every system
generates exactly `--lengths` tokens per sentence (ours: `min_length` = the
limit; HF: `min_new_tokens = max_new_tokens`; CTranslate2:
`min_decoding_length = max_decoding_length`), and every worker checks each
output row's length. "tokens/s" counts the final tokens (batch x length),
not the beam hypotheses.

Length penalties differ: ours is GNMT's `((5 + |Y|) / 6) ** alpha`, HF's
and CTranslate2's `|Y| ** length_penalty` (the CTranslate2 docs:
"hypothesis_score /= (hypothesis_length ** length_penalty)"), and both get
`alpha`. At a forced length every hypothesis has the same length, so the
penalty divides all scores by the same number: it changes neither the
ranking nor the work, and the comparison is not affected. In unforced
decoding the two penalties do rank hypotheses differently.

Threads: `--threads` (default: the cores this process may use) goes to
`torch.set_num_threads` (PyTorch backend and HF) and to CTranslate2's
`intra_threads` (with `inter_threads=1`; `--ct2-threads` sets CTranslate2's
apart: on 2 cores CTranslate2 decoded slower with 2 intra-threads than with 1,
while PyTorch and HF were faster with 2, docs/results.md);
TensorFlow's intra-/inter-op pools
and XLA's CPU pool keep their defaults (one thread per core), and
TensorFlow's intra-op pool is set to `--threads` only when it differs from
the cores. Each worker reports what it used. GPUs are hidden from the
workers (`CUDA_VISIBLE_DEVICES=""`): this is a CPU benchmark.

`--uncached` adds our searches with `use_cache=False` (the whole prefix
re-decoded at every step: slow), and several `--lengths` show how the time
per token grows with the prefix; the targets of the cached search are
checked when those figures are there.

Adding a system: a `System` in `SYSTEMS` names its runner (`RUNNERS`: how
the worker builds and runs it) and, if it needs a model made once before the
rounds, an `artifact` made by `PREPARERS[artifact](settings, directory)` in
its own process (with the system's `KERAS_BACKEND`). `ct2-ours` is such a
system: `prepare_ct2_ours` builds and exports the model, and `ct2_runner`
(shared with `ct2-marian`) reads the vocabulary that the conversion wrote
and feeds the source ids as its tokens, so any CTranslate2 model whose token
`i` is id `i` plugs in with a preparer and two `System` lines.

`transformers` and `ctranslate2` are benchmark-only dependencies; a system
whose package is missing is reported as one failed line.

Usage:

    python examples/benchmark_decoding.py                  # all systems, 3 rounds
    python examples/benchmark_decoding.py --quantize int8 --json decoding.json
    python examples/benchmark_decoding.py --systems jax hf-marian --rounds 5
    python examples/benchmark_decoding.py --preset tiny --vocab-size 64 --rounds 1  # smoke
"""

import argparse
import dataclasses
import importlib.util
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
import traceback
from typing import Optional

# Run from a checkout without installing the package.
REPO_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if REPO_ROOT not in sys.path:
    sys.path.insert(0, REPO_ROOT)

SCRIPT = os.path.abspath(__file__)
# A worker's stdout may carry other libraries' prints; its result is the line
# that starts with this.
RESULT_PREFIX = "BENCHMARK_RESULT "
QUANTIZE_MODES = ("int8",)
# Variant suffix -> dtype of `with_dtype` (`jax-bf16`).
DTYPE_VARIANTS = {"bf16": "bfloat16"}
REFERENCE = "hf-marian"  # the ratios' denominator


class NotSupported(Exception):
    """A system cannot run this benchmark (reported as "not supported", not "failed")."""


@dataclasses.dataclass(frozen=True)
class System:
    """One decoding system, timed in worker processes of its own.

    Attributes:
        name: the `--systems` name.
        kind: its runner in `RUNNERS`: `"keras"`, `"hf"` or `"ct2"`.
        description: one line for the legend.
        backend: `KERAS_BACKEND` of its worker and preparer processes
            (`None`: Keras is not used).
        jit_compile: Keras systems: passed to the decoding functions;
            `False` under TensorFlow traces the search into a `tf.function`
            without XLA.
        quantize: Keras systems: `model.quantize(mode)` before decoding.
        dtype: Keras systems: `with_dtype(model, dtype)` before decoding.
        compute_type: CTranslate2 systems: `Translator(compute_type=...)`.
        artifact: a model made once before the rounds by
            `PREPARERS[artifact]`, in `<workdir>/<artifact>`.
        requires: top-level modules its worker imports; a missing one fails
            the system before the rounds.
    """

    name: str
    kind: str
    description: str
    backend: Optional[str] = None
    jit_compile: Optional[bool] = None
    quantize: Optional[str] = None
    dtype: Optional[str] = None
    compute_type: Optional[str] = None
    artifact: Optional[str] = None
    requires: tuple = ()


SYSTEMS = {system.name: system for system in (
    System("tensorflow", "keras", "ours, TensorFlow, tf.function graph without XLA",
           backend="tensorflow", jit_compile=False, requires=("tensorflow", "keras")),
    System("tensorflow+xla", "keras", "ours, TensorFlow, XLA-compiled",
           backend="tensorflow", jit_compile=True, requires=("tensorflow", "keras")),
    System("jax", "keras", "ours, JAX, jax.jit-compiled", backend="jax",
           requires=("jax", "keras")),
    System("torch", "keras", "ours, PyTorch, eager", backend="torch",
           requires=("torch", "keras")),
    System(REFERENCE, "hf", "HF transformers MarianMTModel.generate, PyTorch",
           requires=("torch", "transformers")),
    System("ct2-marian", "ct2", "the HF Marian model in CTranslate2, float32",
           artifact="ct2-marian", compute_type="float32",
           requires=("ctranslate2", "torch", "transformers")),
    System("ct2-marian-int8", "ct2", "the HF Marian model in CTranslate2, int8",
           artifact="ct2-marian", compute_type="int8",
           requires=("ctranslate2", "torch", "transformers")),
    # Our model (the tensorflow system's weights) exported by export_ctranslate2.
    System("ct2-ours", "ct2", "ours exported to CTranslate2, float32", backend="tensorflow",
           artifact="ct2-ours", compute_type="float32",
           requires=("ctranslate2", "sentencepiece", "keras_transformer.export.ctranslate2")),
    System("ct2-ours-int8", "ct2", "ours exported to CTranslate2, int8", backend="tensorflow",
           artifact="ct2-ours", compute_type="int8",
           requires=("ctranslate2", "sentencepiece", "keras_transformer.export.ctranslate2")),
)}
DEFAULT_SYSTEMS = tuple(SYSTEMS)


def get_system(name):
    """The `System` called `name`, quantized (`jax-int8`) and bf16 (`jax-bf16`) Keras variants included.

    Raises:
        KeyError: for an unknown name.
    """
    if name in SYSTEMS:
        return SYSTEMS[name]
    base, _, mode = name.rpartition("-")
    if mode in QUANTIZE_MODES and base in SYSTEMS and SYSTEMS[base].kind == "keras":
        system = SYSTEMS[base]
        return dataclasses.replace(system, name=name, quantize=mode,
                                   description=f"{system.description}, {mode} weights")
    if mode in DTYPE_VARIANTS and base in SYSTEMS and SYSTEMS[base].kind == "keras":
        system = SYSTEMS[base]
        return dataclasses.replace(system, name=name, dtype=DTYPE_VARIANTS[mode],
                                   description=f"{system.description}, bf16 weights and "
                                               "arithmetic")
    raise KeyError(name)


def known_system_names():
    keras_names = [n for n, s in SYSTEMS.items() if s.kind == "keras"]
    return list(SYSTEMS) + [f"{n}-{mode}" for mode in (*QUANTIZE_MODES, *DTYPE_VARIANTS)
                            for n in keras_names]


# --- settings --------------------------------------------------------------------------


def parse_args(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    variants = [n for n in known_system_names() if n not in SYSTEMS]
    parser.add_argument("--systems", nargs="+", metavar="SYSTEM",
                        help=f"systems to time, in this order (default: "
                             f"{' '.join(DEFAULT_SYSTEMS)}; also {', '.join(variants)})")
    parser.add_argument("--backend", choices=["tensorflow", "jax", "torch"],
                        help="keep only this backend's Keras systems of the default set "
                             "(tensorflow: with and without XLA)")
    parser.add_argument("--skip-hf", action="store_true",
                        help="leave out the systems built on HF transformers "
                             "(hf-marian, ct2-marian*)")
    parser.add_argument("--skip-uncached", action="store_true",
                        help="no uncached runs (the default; kept for old command lines)")
    parser.add_argument("--uncached", action="store_true",
                        help="also time our searches without the key/value cache (slow)")
    parser.add_argument("--quantize", choices=QUANTIZE_MODES,
                        help="add a quantized variant of every selected Keras system")
    parser.add_argument("--bf16", action="store_true",
                        help="add a bf16 variant (weights and arithmetic) of every selected "
                             "Keras system")
    parser.add_argument("--rounds", type=int, default=3,
                        help="rounds; each starts every system's worker once")
    parser.add_argument("--repeats", type=int, default=3,
                        help="timed runs per search in each worker (their median is the round's)")
    parser.add_argument("--uncached-repeats", type=int, default=1,
                        help="timed runs of the (slow) uncached searches")
    parser.add_argument("--preset", default="small")
    parser.add_argument("--vocab-size", type=int, default=None)
    parser.add_argument("--num-layers", type=int, default=None)
    parser.add_argument("--d-model", type=int, default=None)
    parser.add_argument("--num-heads", type=int, default=None)
    parser.add_argument("--d-ff", type=int, default=None)
    parser.add_argument("--batch-size", type=int, default=16)
    parser.add_argument("--source-length", type=int, default=20,
                        help="source ids per sentence, EOS included")
    parser.add_argument("--lengths", type=int, nargs="+", default=[64],
                        help="forced output lengths (at least --source-length)")
    # Decoding defaults: DecodingOptions' (resolve_settings; the workers do
    # not import keras_transformer to parse their arguments).
    parser.add_argument("--beam-size", type=int, help="default: DecodingOptions().beam_size")
    parser.add_argument("--alpha", type=float,
                        help="length-penalty strength (default: DecodingOptions().alpha)")
    parser.add_argument("--threads", type=int, default=None,
                        help="threads of PyTorch and CTranslate2 (default: the usable cores)")
    parser.add_argument("--ct2-threads", type=int, default=None,
                        help="CTranslate2's intra_threads (default: --threads); on 2 cores "
                             "shared with nothing, 1 was measured several times faster "
                             "than 2")
    parser.add_argument("--timeout", type=float, default=3600,
                        help="seconds a worker may run before it is stopped")
    parser.add_argument("--wait-for-quiet", type=float, default=0.0, metavar="SECONDS",
                        help="before each worker, wait up to this long for other processes "
                             "to leave the cores")
    parser.add_argument("--workdir", help="keep the prepared models here (default: a temp folder)")
    parser.add_argument("--json", metavar="PATH", help="write every figure to this JSON file")
    parser.add_argument("--worker", metavar="SYSTEM", help=argparse.SUPPRESS)
    parser.add_argument("--prepare", metavar="ARTIFACT", help=argparse.SUPPRESS)
    parser.add_argument("--settings", help=argparse.SUPPRESS)
    return parser.parse_args(argv)


def usable_cores():
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not Linux
        return os.cpu_count() or 1


def resolve_settings(args):
    """The workers' settings from the command line; `SystemExit` with one line if invalid."""
    from keras_transformer.model.config import DecodingOptions, TransformerConfig

    if args.beam_size is None:
        args.beam_size = DecodingOptions.beam_size
    if args.alpha is None:
        args.alpha = DecodingOptions.alpha
    for name in ("rounds", "repeats", "uncached_repeats", "batch_size", "beam_size"):
        if getattr(args, name) < 1:
            raise SystemExit(f"--{name.replace('_', '-')} must be at least 1, "
                             f"received {getattr(args, name)}")
    if args.beam_size < 2:
        raise SystemExit(f"--beam-size must be at least 2 (greedy is timed anyway), "
                         f"received {args.beam_size}")
    if args.source_length < 2:
        raise SystemExit(f"--source-length must be at least 2, received {args.source_length}")
    if min(args.lengths) < args.source_length:
        raise SystemExit("--lengths must be at least --source-length (our output limit is "
                         f"source length + max_extra_length), received {args.lengths} with "
                         f"--source-length {args.source_length}")
    for flag, value in (("--threads", args.threads), ("--ct2-threads", args.ct2_threads)):
        if value is not None and value < 1:
            raise SystemExit(f"{flag} must be at least 1, received {value}")
    overrides = {"dropout": 0.0}
    for name in ("vocab_size", "num_layers", "d_model", "num_heads", "d_ff"):
        if getattr(args, name) is not None:
            overrides[name] = getattr(args, name)
    try:
        config = TransformerConfig.preset(args.preset, **overrides)
        config = config.replace(max_length=max(config.max_length, 512, max(args.lengths) + 1))
    except (ValueError, TypeError) as error:
        raise SystemExit(f"invalid model settings: {error}") from None
    if config.vocab_size < 8:
        raise SystemExit(f"--vocab-size must be at least 8, received {config.vocab_size}")
    return {
        "config": dataclasses.asdict(config), "preset": args.preset,
        "batch_size": args.batch_size, "source_length": args.source_length,
        "lengths": sorted(set(args.lengths)), "beam_size": args.beam_size,
        "alpha": args.alpha, "repeats": args.repeats, "uncached": args.uncached,
        "uncached_repeats": args.uncached_repeats, "threads": args.threads or usable_cores(),
        "ct2_threads": args.ct2_threads or args.threads or usable_cores(),
    }


def select_systems(args):
    """The `System`s to time, in order; `SystemExit` with one line for a bad choice."""
    if args.systems:
        if args.backend or args.skip_hf:
            raise SystemExit("--systems names the systems: leave out --backend and --skip-hf")
        names = list(dict.fromkeys(args.systems))
        unknown = [n for n in names if n not in known_system_names()]
        if unknown:
            raise SystemExit(f"unknown system {unknown[0]!r}; choose from "
                             + ", ".join(known_system_names()))
        systems = [get_system(n) for n in names]
    else:
        systems = [SYSTEMS[n] for n in DEFAULT_SYSTEMS]
        if args.backend:
            systems = [s for s in systems if s.kind != "keras" or s.backend == args.backend]
        if args.skip_hf:
            systems = [s for s in systems if "transformers" not in s.requires]
    modes = ([args.quantize] if args.quantize else []) + (["bf16"] if args.bf16 else [])
    chosen = {s.name for s in systems}
    with_variants = []
    for system in systems:
        with_variants.append(system)
        for mode in modes:
            variant = f"{system.name}-{mode}"
            if (system.kind == "keras" and not system.quantize and not system.dtype
                    and variant not in chosen):
                with_variants.append(get_system(variant))
    return with_variants


def searches(settings):
    """`(name, beam_size)` of the timed searches: greedy, then beam search."""
    return [("greedy", 1), (f"beam-{settings['beam_size']}", settings["beam_size"])]


# --- the systems, inside their workers -------------------------------------------------


def source_ids(settings):
    """The benchmark batch: `(batch, source_length)` int32 ids, EOS last, no pad.

    Ids are drawn from `[4, vocab_size - 1)`: neither our special ids nor
    the last id, which is the HF Marian model's pad.
    """
    import numpy as np

    config = settings["config"]
    rng = np.random.default_rng(0)
    ids = rng.integers(4, config["vocab_size"] - 1,
                       (settings["batch_size"], settings["source_length"]))
    ids = ids.astype("int32")
    ids[:, -1] = config["eos_id"]
    return ids


def quantize_model(model, mode):
    """`model.quantize(mode)`; returns what it quantized, raises `NotSupported` if nothing."""
    import warnings

    try:
        with warnings.catch_warnings():  # one "no quantize method" warning per layer kind
            warnings.simplefilter("ignore")
            model.quantize(mode)
    except Exception as error:  # noqa: BLE001 - any failure means "not supported"
        raise NotSupported(f"model.quantize({mode!r}) raised {one_line(error)}") from error
    quantized = [v for v in model.variables if "int" in str(v.dtype)]
    floats = [v for v in model.variables if "float" in str(v.dtype) and len(v.shape) == 2]
    if not quantized:
        raise NotSupported(f"model.quantize({mode!r}) quantized no weight")

    def size(variable):
        count = 1
        for dim in variable.shape:
            count *= int(dim)
        return count

    return {
        "mode": mode, "quantized_tensors": len(quantized),
        "quantized_parameters": sum(size(v) for v in quantized),
        "float_matrix_parameters": sum(size(v) for v in floats),
        "float_matrices": sorted(v.path for v in floats),
    }


def keras_runner(system, settings, workdir):
    """Our model under `system.backend`; see `RUNNERS` for the contract."""
    backend = os.environ.get("KERAS_BACKEND")
    if backend != system.backend:
        raise RuntimeError(f"worker started with KERAS_BACKEND={backend!r}, "
                           f"{system.name} needs {system.backend!r}")
    threads = settings["threads"]
    if backend == "tensorflow":
        import tensorflow as tf

        if threads != usable_cores():
            tf.config.threading.set_intra_op_parallelism_threads(threads)
        intra = tf.config.threading.get_intra_op_parallelism_threads()
        inter = tf.config.threading.get_inter_op_parallelism_threads()
        thread_note = (f"TensorFlow intra-op {intra or 'default'}, inter-op "
                       f"{inter or 'default'} ({usable_cores()} cores)")
    elif backend == "torch":
        import torch

        torch.set_num_threads(threads)
        thread_note = f"torch {torch.get_num_threads()} threads"
    else:
        thread_note = f"XLA CPU default ({usable_cores()} cores)"
    import keras

    from keras_transformer.model.config import TransformerConfig
    from keras_transformer.inference.decoding import beam_search, greedy_decode
    from keras_transformer.model.transformer import build_model

    config = TransformerConfig(**settings["config"])
    keras.utils.set_random_seed(0)
    model = build_model(config)
    info = {"threads": thread_note, "parameters": int(model.count_params()),
            "versions": {"keras": keras.__version__, backend: _version(backend)}}
    if system.quantize:
        info["quantization"] = quantize_model(model, system.quantize)
    if system.dtype:
        from keras_transformer.model.transformer import with_dtype

        model = with_dtype(model, system.dtype)
        info["dtype"] = system.dtype
    source = keras.ops.convert_to_tensor(source_ids(settings))
    source_length = int(source.shape[1])

    def make_run(beam_size, length, use_cache):
        options = dict(max_extra_length=length - source_length, min_length=length,
                       use_cache=use_cache, jit_compile=system.jit_compile)

        def decode(source):
            if beam_size == 1:
                return greedy_decode(model, source, **options)
            return beam_search(model, source, beam_size=beam_size, alpha=settings["alpha"],
                               **options)[0]

        if backend == "tensorflow" and system.jit_compile is False:
            import tensorflow as tf

            decode = tf.function(decode, autograph=False)  # one trace per search and length

        def run():
            return keras.ops.convert_to_numpy(decode(source))  # waits for the result

        def rows(tokens):  # (batch, L) ids, 0 after EOS
            return [[int(t) for t in row[: _first(row, config.pad_id)]] for row in tokens]

        return run, rows

    return make_run, info


def _first(row, value):
    """Index of the first `value` in `row`, or its length."""
    for i, item in enumerate(row):
        if item == value:
            return i
    return len(row)


def _version(module):
    try:
        return importlib.import_module(module).__version__
    except (ImportError, AttributeError):
        return "unknown"


def hf_marian_config(config, max_positions):
    """A `transformers.MarianConfig` of our config's sizes.

    Marian's conventions are kept where they matter to the CTranslate2
    conversion: the pad id is the last id and starts the decoder (its
    embedding row is zero). EOS, BOS and the sizes are ours; dropout is off.

    Args:
        config: a `TransformerConfig` dict.
        max_positions: `max_position_embeddings`, more than the longest output.
    """
    from transformers import MarianConfig

    pad = config["vocab_size"] - 1
    return MarianConfig(
        vocab_size=config["vocab_size"], d_model=config["d_model"],
        encoder_layers=config["num_layers"], decoder_layers=config["num_layers"],
        encoder_attention_heads=config["num_heads"], decoder_attention_heads=config["num_heads"],
        encoder_ffn_dim=config["d_ff"], decoder_ffn_dim=config["d_ff"],
        max_position_embeddings=max_positions, activation_function="relu",
        scale_embedding=True, share_encoder_decoder_embeddings=True,
        dropout=0.0, attention_dropout=0.0, activation_dropout=0.0,
        pad_token_id=pad, bos_token_id=config["bos_id"], eos_token_id=config["eos_id"],
        decoder_start_token_id=pad, forced_eos_token_id=None)


def build_hf_marian(settings):
    """The random-weight `MarianMTModel` (seed 0) shared by hf-marian and ct2-marian."""
    import torch
    from transformers import MarianMTModel

    torch.manual_seed(0)
    config = hf_marian_config(settings["config"], max(512, max(settings["lengths"]) + 2))
    return MarianMTModel(config).eval()


def _set_torch_threads(threads):
    import torch

    torch.set_num_threads(threads)
    return f"torch {torch.get_num_threads()} threads"


def hf_runner(system, settings, workdir):
    """HF `MarianMTModel.generate`; see `RUNNERS` for the contract."""
    thread_note = _set_torch_threads(settings["threads"])
    import torch
    import transformers

    transformers.logging.set_verbosity_error()
    model = build_hf_marian(settings)
    input_ids = torch.as_tensor(source_ids(settings), dtype=torch.long)
    attention_mask = torch.ones_like(input_ids)
    info = {"threads": thread_note, "parameters": sum(p.numel() for p in model.parameters()),
            "versions": {"transformers": transformers.__version__, "torch": torch.__version__}}

    def make_run(beam_size, length, use_cache):
        options = dict(num_beams=beam_size, do_sample=False, max_new_tokens=length,
                       min_new_tokens=length, use_cache=use_cache)
        if beam_size > 1:
            options["length_penalty"] = settings["alpha"]

        def run():
            with torch.no_grad():
                return model.generate(input_ids=input_ids, attention_mask=attention_mask,
                                      **options)

        def rows(output):  # (batch, 1 + L): the decoder start token first
            return output[:, 1:].tolist()

        return run, rows

    return make_run, info


class _MarianVocabulary:
    """The tokenizer interface `TransformersConverter` needs, without files.

    Token `i` is `"t<i>"`, except `<s>`, `</s>` and `<unk>` at our special
    ids and `<pad>` last, which the Marian conversion drops (CTranslate2
    starts its decoder from a zero embedding instead).
    """

    def __init__(self, config):
        self.tokens = [f"t{i}" for i in range(config["vocab_size"])]
        for name, token in (("bos_id", "<s>"), ("eos_id", "</s>"), ("unk_id", "<unk>")):
            self.tokens[config[name]] = token
        self.tokens[-1] = "<pad>"
        self.bos_token, self.eos_token, self.unk_token = "<s>", "</s>", "<unk>"

    def get_vocab(self):
        return {token: i for i, token in enumerate(self.tokens)}

    def convert_ids_to_tokens(self, ids):
        return self.tokens[ids] if isinstance(ids, int) else [self.tokens[i] for i in ids]


def prepare_ct2_marian(settings, directory):
    """Saves the HF Marian model and converts it to CTranslate2 in `directory`."""
    _set_torch_threads(settings["threads"])
    import ctranslate2
    import transformers
    from ctranslate2.converters import TransformersConverter

    transformers.logging.set_verbosity_error()
    vocabulary = _MarianVocabulary(settings["config"])

    class Converter(TransformersConverter):
        def load_tokenizer(self, tokenizer_class, model_name_or_path, **kwargs):
            return vocabulary

    with tempfile.TemporaryDirectory(prefix="kt_hf_marian_") as hf_dir:
        build_hf_marian(settings).save_pretrained(hf_dir)
        Converter(hf_dir).convert(directory, force=True)  # float32 weights
    return {"path": directory, "ctranslate2": ctranslate2.__version__,
            "vocabulary_size": len(read_ct2_vocabulary(directory))}


def prepare_ct2_ours(settings, directory):
    """Builds our model (seed 0) and exports it with `export_ctranslate2` to `directory`.

    The export names its vocabulary after a SentencePiece model's pieces
    (ids past them become `<unused_i>`): any tokenizer serves for random
    ids, so a small one is trained on random words.
    """
    import random

    import keras

    from keras_transformer.model.config import TransformerConfig
    from keras_transformer.data import train_tokenizer
    from keras_transformer.export.ctranslate2 import export_ctranslate2
    from keras_transformer.model.transformer import build_model

    config = TransformerConfig(**settings["config"])
    rng = random.Random(0)
    words = [" ".join("".join(rng.choice("abcdefgh") for _ in range(rng.randint(2, 6)))
                      for _ in range(8)) for _ in range(2000)]
    with tempfile.TemporaryDirectory(prefix="kt_ct2_ours_") as temp:
        tokenizer = train_tokenizer([], min(config.vocab_size, 256),
                                    os.path.join(temp, "spm.model"), sentences=words,
                                    byte_fallback=False, hard_vocab_limit=False)
    keras.utils.set_random_seed(0)
    model = build_model(config)
    export_ctranslate2(model, tokenizer, directory, overwrite=True)
    return {"path": directory, "vocabulary_size": len(read_ct2_vocabulary(directory)),
            "parameters": int(model.count_params())}


def read_ct2_vocabulary(path):
    """The target (or shared) vocabulary of a CTranslate2 model folder, as a list."""
    for name in ("shared_vocabulary", "target_vocabulary"):
        for extension in ("json", "txt"):
            file = os.path.join(path, f"{name}.{extension}")
            if os.path.exists(file):
                with open(file, encoding="utf-8") as f:
                    if extension == "json":
                        return json.load(f)
                    return f.read().splitlines()
    raise FileNotFoundError(f"no vocabulary file in {path}")


def ct2_runner(system, settings, workdir):
    """A CTranslate2 model from `<workdir>/<artifact>`; see `RUNNERS` for the contract."""
    import ctranslate2

    path = os.path.join(workdir, system.artifact)
    threads = settings["ct2_threads"]
    translator = ctranslate2.Translator(path, device="cpu", compute_type=system.compute_type,
                                        intra_threads=threads, inter_threads=1)
    vocabulary = read_ct2_vocabulary(path)
    index = {token: i for i, token in enumerate(vocabulary)}
    rows = source_ids(settings).tolist()
    with open(os.path.join(path, "config.json"), encoding="utf-8") as f:
        if json.load(f).get("add_source_eos"):  # CTranslate2 appends EOS itself
            rows = [row[:-1] for row in rows]
    source = [[vocabulary[i] for i in row] for row in rows]
    info = {"threads": f"CTranslate2 intra_threads={threads}, inter_threads=1",
            "compute_type": getattr(translator, "compute_type", system.compute_type),
            "vocabulary_size": len(vocabulary),
            "versions": {"ctranslate2": ctranslate2.__version__}}

    def make_run(beam_size, length, use_cache):
        if not use_cache:
            raise NotSupported("CTranslate2 always decodes with its cache")

        def run():
            return translator.translate_batch(
                source, beam_size=beam_size, length_penalty=settings["alpha"],
                min_decoding_length=length, max_decoding_length=length,
                return_end_token=True)

        def rows(results):
            return [[index[token] for token in r.hypotheses[0]] for r in results]

        return run, rows

    return make_run, info


# A runner builds a system in its worker: `runner(system, settings, workdir)`
# returns `(make_run, info)`, where `make_run(beam_size, length, use_cache)`
# returns `(run, rows)`: `run()` decodes the benchmark batch (what is timed)
# and `rows(run())` turns its output into one list of generated ids per
# sentence (EOS included, no start token), which the worker checks.
RUNNERS = {"keras": keras_runner, "hf": hf_runner, "ct2": ct2_runner}
# `preparer(settings, directory) -> dict`, run once before the rounds in a
# process of its own (with the `KERAS_BACKEND` of the first system that needs it).
PREPARERS = {"ct2-marian": prepare_ct2_marian, "ct2-ours": prepare_ct2_ours}


def percentile(values, q):
    """The nearest-rank `q`-th percentile of `values`."""
    values = sorted(values)
    index = min(len(values) - 1, max(0, round(q / 100 * (len(values) - 1))))
    return values[index]


def peak_rss_mib():
    import resource

    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # Linux: KiB


def run_worker(name, settings, workdir):
    """Builds one system and times every search; returns the worker's result dict."""
    system = get_system(name)
    start = time.perf_counter()
    make_run, info = RUNNERS[system.kind](system, settings, workdir)
    info["setup_seconds"] = time.perf_counter() - start
    batch = settings["batch_size"]
    modes = [True] + ([False] if settings["uncached"] and system.kind == "keras" else [])
    measurements = []
    for search, beam_size in searches(settings):
        for length in settings["lengths"]:
            for use_cache in modes:
                run, rows = make_run(beam_size, length, use_cache)
                start = time.perf_counter()
                output = run()
                first = time.perf_counter() - start
                generated = rows(output)
                lengths = sorted({len(row) for row in generated})
                if len(generated) != batch or lengths != [length]:
                    raise RuntimeError(
                        f"{search} was not forced to {length} tokens: {len(generated)} rows "
                        f"of lengths {lengths}")
                seconds = []
                repeats = settings["repeats"] if use_cache else settings["uncached_repeats"]
                for _ in range(repeats):
                    start = time.perf_counter()
                    run()
                    seconds.append(time.perf_counter() - start)
                measurements.append({
                    "search": search, "beam_size": beam_size, "length": length,
                    "cached": use_cache, "first_call_seconds": first, "seconds": seconds,
                    "median_seconds": statistics.median(seconds),
                    "output_length": lengths[0], "sample": generated[0][:8],
                })
    info["peak_rss_mib"] = peak_rss_mib()
    return {"system": name, "info": info, "measurements": measurements}


def run_preparer(artifact, settings, directory):
    """Makes `directory` and runs `PREPARERS[artifact]` in it."""
    os.makedirs(directory, exist_ok=True)
    return PREPARERS[artifact](settings, directory)


def one_line(error):
    """`Type: first line of the message` of an exception."""
    text = str(error).strip().splitlines()
    return type(error).__name__ + (f": {text[0]}" if text else "")


def child_main(task, function, *arguments):
    """Runs a worker or preparer, prints its JSON result line; the exit status."""
    try:
        result = function(*arguments)
    except NotSupported as error:
        result = {"error": str(error), "not_supported": True}
    except Exception as error:  # noqa: BLE001 - reported to the parent as one line
        traceback.print_exc()
        result = {"error": f"{task}: {one_line(error)}"}
    print(RESULT_PREFIX + json.dumps(result), flush=True)
    return 1 if "error" in result and not result.get("not_supported") else 0


# --- the parent: rounds of workers -----------------------------------------------------


def child_environment(backend=None):
    """The environment of a worker: its Keras backend, GPUs hidden, HF offline."""
    env = dict(os.environ)
    env.pop("KERAS_BACKEND", None)
    if backend:
        env["KERAS_BACKEND"] = backend
    env.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    env.update(CUDA_VISIBLE_DEVICES="", HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1",
               HF_HUB_DISABLE_PROGRESS_BARS="1", TRANSFORMERS_VERBOSITY="error",
               PYTHONPATH=os.pathsep.join(p for p in (REPO_ROOT, env.get("PYTHONPATH")) if p))
    return env


def parse_result(stdout):
    """The last result line of a worker's stdout, or `None`."""
    for line in reversed(stdout.splitlines()):
        if line.startswith(RESULT_PREFIX):
            try:
                return json.loads(line[len(RESULT_PREFIX):])
            except ValueError:
                return None
    return None


def run_child(arguments, env, timeout, script=SCRIPT):
    """Runs `script` (default this one) with `arguments` in a new process; its result dict.

    A worker that crashes, hangs or prints no result line gets
    `{"error": one line}`; its stderr's end is kept under `stderr_tail`.
    The result also gets `wall_seconds` and `other_cores`: the cores that
    other processes kept busy meanwhile (machine CPU time less the worker's,
    over its wall time; `None` without /proc/stat), which a quiet machine
    keeps near 0.
    """
    start, busy, own = time.perf_counter(), machine_busy_seconds(), _children_cpu_seconds()
    try:
        completed = subprocess.run([sys.executable, script, *arguments], env=env,
                                   capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired:
        return {"error": f"stopped after the --timeout of {timeout:g} s",
                "wall_seconds": time.perf_counter() - start, "other_cores": None}
    wall = time.perf_counter() - start
    result = parse_result(completed.stdout)
    if result is None:
        lines = [line for line in completed.stderr.splitlines() if line.strip()]
        result = {"error": f"worker exited with status {completed.returncode} and no result"
                           + (f"; last stderr line: {lines[-1].strip()}" if lines else "")}
    if "error" in result:
        result["stderr_tail"] = completed.stderr[-3000:]
    result["wall_seconds"] = wall
    result["other_cores"] = None
    if busy is not None:
        others = (machine_busy_seconds() - busy) - (_children_cpu_seconds() - own)
        result["other_cores"] = max(others, 0.0) / wall
    return result


def _children_cpu_seconds():
    import resource

    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def machine_busy_seconds():
    """CPU-seconds all processes of this machine have been busy (Linux /proc/stat), or `None`."""
    try:
        with open("/proc/stat") as f:
            values = [int(v) for v in f.readline().split()[1:9]]
    except (OSError, ValueError):
        return None
    return (sum(values) - values[3] - values[4]) / os.sysconf("SC_CLK_TCK")  # less idle, iowait


def wait_for_quiet(max_seconds, threshold=0.25, sample_seconds=1.0):
    """Waits up to `max_seconds` until other processes use fewer than `threshold` cores.

    Called between workers, while this process is idle, so every busy core
    is someone else's. Returns the cores busy in the last sample (`None`
    without /proc/stat).
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


def rotated(items, round_index):
    """Round `r`'s order: the list started at its `r`-th item (A B C, B C A, ...)."""
    shift = round_index % len(items) if items else 0
    return items[shift:] + items[:shift]


def summarize(rounds, settings):
    """Per-measurement figures over a system's successful rounds.

    Args:
        rounds: the worker results of one system (some may be errors).
        settings: the workers' settings.

    Returns:
        A list of dicts, one per (search, length, cached): `median_seconds`,
        `min_seconds`, `max_seconds` over rounds (each round's value is the
        median of its repeats), `round_seconds`, `first_call_seconds` (median
        over rounds), `sentences_per_second`, `tokens_per_second` and
        `ms_per_token` at the median, `output_length`, `sample`.
    """
    groups = {}
    for result in rounds:
        for m in result.get("measurements", []):
            groups.setdefault((m["search"], m["length"], m["cached"]), []).append(m)
    summary = []
    for (search, length, cached), items in groups.items():
        values = [m["median_seconds"] for m in items]
        median = statistics.median(values)
        tokens = settings["batch_size"] * length
        summary.append({
            "search": search, "beam_size": items[0]["beam_size"], "length": length,
            "cached": cached, "rounds": len(values), "round_seconds": values,
            "median_seconds": median, "min_seconds": min(values), "max_seconds": max(values),
            "first_call_seconds": statistics.median(m["first_call_seconds"] for m in items),
            "sentences_per_second": settings["batch_size"] / median,
            "tokens_per_second": tokens / median, "ms_per_token": 1000 * median / tokens,
            "output_length": items[0]["output_length"], "sample": items[0]["sample"],
        })
    return summary


def add_ratios(figures, reference=REFERENCE):
    """Sets `vs_reference` (reference median seconds / this median) on every cached row."""
    ref = figures["systems"].get(reference)
    ref_rows = {(r["search"], r["length"]): r for r in (ref or {}).get("summary", [])
                if r["cached"]}
    for entry in figures["systems"].values():
        for row in entry["summary"]:
            base = ref_rows.get((row["search"], row["length"])) if row["cached"] else None
            row["vs_reference"] = (base["median_seconds"] / row["median_seconds"]
                                   if base else None)


def format_tables(figures):
    """The printed tables: one per search and length, a row per system."""
    settings = figures["settings"]
    lines = []
    keys = []
    for search, _ in searches(settings):
        keys += [(search, length) for length in settings["lengths"]]
    width = max([len(n) for n in figures["systems"]] + [6]) + len(" (uncached)")
    for search, length in keys:
        lines.append(f"\n{search}, {length} tokens (batch {settings['batch_size']} x source "
                     f"{settings['source_length']}), median of {settings['rounds']} round(s)")
        header = (f"{'system':<{width}} {'median s':>9} {'min-max s':>15} {'sent/s':>8} "
                  f"{'tokens/s':>9} {'ms/token':>8} {'first call s':>12} "
                  f"{'vs ' + REFERENCE:>13}")
        lines += [header, "-" * len(header)]
        for name, entry in figures["systems"].items():
            rows = [r for r in entry["summary"] if (r["search"], r["length"]) == (search, length)]
            if not rows:
                lines.append(f"{name:<{width}} {entry_status(entry)}")
                continue
            for row in sorted(rows, key=lambda r: not r["cached"]):
                label = name if row["cached"] else f"{name} (uncached)"
                ratio = row.get("vs_reference")
                spread = f"{row['min_seconds']:.3f}-{row['max_seconds']:.3f}"
                lines.append(
                    f"{label:<{width}} {row['median_seconds']:>9.3f} {spread:>15} "
                    f"{row['sentences_per_second']:>8.2f} {row['tokens_per_second']:>9.1f} "
                    f"{row['ms_per_token']:>8.3f} {row['first_call_seconds']:>12.2f} "
                    + (f"{ratio:>12.2f}x" if ratio else f"{'':>13}"))
    return "\n".join(lines)


def entry_status(entry):
    """`failed: ...` or `not supported: ...` for a system without figures."""
    if entry.get("error"):
        return ("not supported: " if entry.get("not_supported") else "failed: ") + entry["error"]
    return "no figures"


def _summary_rows(entry):
    """A system's summary rows by (search, length, cached)."""
    return {(r["search"], r["length"], r["cached"]): r for r in entry["summary"]}


def format_targets(figures):
    """The cached search's targets, where the figures needed are there."""
    settings = figures["settings"]
    short, long = min(settings["lengths"]), max(settings["lengths"])
    lines, best = [], []

    def check(label, value, target=None, higher=True):
        if target is None:
            lines.append(f"{label:<64} {value:6.2f}x")
            return
        met = value >= target if higher else value <= target
        lines.append(f"{label:<64} {value:6.2f}x  (target {'>=' if higher else '<='} "
                     f"{target}x: {'met' if met else 'NOT met'})")

    for name, entry in figures["systems"].items():
        system = get_system(name)
        if system.kind != "keras":  # the targets are our searches'
            continue
        rows = _summary_rows(entry)
        # A quantized or bf16 variant (`jax-int8`) is also measured against its float32 system.
        variant = system.quantize or system.dtype
        plain = figures["systems"].get(name.rpartition("-")[0]) if variant else None
        plain_rows = _summary_rows(plain) if plain and not plain.get("error") else {}
        for search, _ in searches(settings):
            cached, uncached = rows.get((search, long, True)), rows.get((search, long, False))
            if cached and uncached:
                check(f"{name} {search}: cached speed-up over uncached at {long}",
                      uncached["median_seconds"] / cached["median_seconds"], 5.0)
            first = rows.get((search, short, True))
            if cached and first and long != short:
                check(f"{name} {search}: time per token at {long} vs {short}",
                      (cached["median_seconds"] / long) / (first["median_seconds"] / short),
                      1.5, higher=False)
            if cached and cached.get("vs_reference") and search != "greedy":
                # Issue 12: no backend below HF (float32 or int8).
                check(f"{name} {search}: speed-up over {REFERENCE} at {long}",
                      cached["vs_reference"], 1.0)
                best.append((cached["vs_reference"], name, search))
            reference = plain_rows.get((search, long, True))
            if cached and reference:  # int8's target; bf16 is reported
                check(f"{name} {search}: speed-up over float32 at {long}",
                      reference["median_seconds"] / cached["median_seconds"],
                      1.5 if system.quantize else None)
    for search in sorted({s for _, _, s in best}):
        value, name = max((v, n) for v, n, s in best if s == search)
        check(f"best ({name}) {search}: speed-up over {REFERENCE} at {long}", value, 2.2)
    return "\n".join(lines)


def busiest_round(entries, threshold=0.25):
    """`(cores, name)` of the round during which others used the most cores, if >= threshold."""
    rounds = [(r.get("other_cores") or 0.0, name) for name, entry in entries.items()
              for r in entry["rounds"]]
    busiest = max(rounds, default=(0.0, None))
    return busiest if busiest[0] >= threshold else None


def describe(name, result):
    """One line about a system's worker: versions, size, threads, setup."""
    info = result["info"]
    versions = ", ".join(f"{k} {v}" for k, v in info.get("versions", {}).items())
    extra = ""
    if "quantization" in info:
        q = info["quantization"]
        extra = (f"; {q['mode']}: {q['quantized_tensors']} tensors, "
                 f"{q['quantized_parameters']:,} parameters quantized, "
                 f"{q['float_matrix_parameters']:,} in float matrices")
    if "dtype" in info:
        extra += f"; {info['dtype']} weights and arithmetic"
    size = f"{info['parameters']:,} parameters" if "parameters" in info else (
        f"vocabulary {info.get('vocabulary_size')}, {info.get('compute_type')}")
    return (f"  {name}: {versions}; {size}; threads: {info['threads']}; "
            f"setup {info['setup_seconds']:.1f} s, peak RSS {info['peak_rss_mib']:.0f} MiB"
            + extra)


def run_benchmark(systems, settings, *, rounds, workdir, timeout=3600, wait_for_quiet_s=0.0,
                  log=print):
    """Prepares what the systems need, then times them in alternating rounds.

    Args:
        systems: `System`s, in the order of round 1.
        settings: from `resolve_settings`.
        rounds: how many times each system's worker runs.
        workdir: folder for the prepared models.
        timeout: seconds per worker or preparer.
        wait_for_quiet_s: before each worker, wait up to this long for other
            processes to leave the cores (see `wait_for_quiet`).
        log: a print-like function.

    Returns:
        The figures dict: `settings` (with `rounds`), `order` (the systems
        of each round), `prepared` (per artifact), and `systems`: per name
        `description`, `rounds` (worker results), `info` (of its first
        successful round), `error` and `not_supported` (when it never
        succeeded), `summary` (see `summarize`; cached rows also get
        `vs_reference`, the speed ratio to `REFERENCE`).
    """
    settings = dict(settings, rounds=rounds)
    entries = {s.name: {"description": s.description, "kind": s.kind, "rounds": [],
                        "info": None, "error": None, "not_supported": False, "summary": []}
               for s in systems}
    figures = {"settings": settings, "order": [], "prepared": {}, "systems": entries,
               "reference": REFERENCE}
    encoded = json.dumps(settings)
    for system in systems:
        missing = [m for m in system.requires if importlib.util.find_spec(m) is None]
        if missing:
            entries[system.name]["error"] = (f"{missing[0]} is not installed "
                                             f"(pip install {missing[0]})")
    for system in systems:
        artifact = system.artifact
        if not artifact or entries[system.name]["error"] or artifact in figures["prepared"]:
            continue
        log(f"preparing {artifact} ...")
        directory = os.path.join(workdir, artifact)
        result = run_child(["--prepare", artifact, "--settings", encoded, "--workdir", directory],
                           child_environment(system.backend), timeout)
        figures["prepared"][artifact] = result
        if "error" in result:
            log(f"  preparing {artifact} failed: {result['error']}")
        else:
            log(f"  {artifact} ready in {result['wall_seconds']:.1f} s")
    for system in systems:
        prepared = figures["prepared"].get(system.artifact)
        if prepared and "error" in prepared and not entries[system.name]["error"]:
            error = prepared["error"]
            if not error.startswith(f"preparing {system.artifact}"):
                error = f"preparing {system.artifact}: {error}"
            entries[system.name]["error"] = error

    names = [s.name for s in systems]
    by_name = {s.name: s for s in systems}
    for round_index in range(rounds):
        order = [n for n in rotated(names, round_index) if not entries[n]["error"]]
        figures["order"].append(order)
        for name in order:
            if wait_for_quiet_s:
                wait_for_quiet(wait_for_quiet_s)
            result = run_child(["--worker", name, "--settings", encoded, "--workdir", workdir],
                               child_environment(by_name[name].backend), timeout)
            entry = entries[name]
            entry["rounds"].append(result)
            if "error" in result:  # errors repeat: no further rounds for this system
                entry["error"], entry["not_supported"] = (result["error"],
                                                          bool(result.get("not_supported")))
                log(f"round {round_index + 1}/{rounds} {name}: "
                    + entry_status(entry))
                continue
            if entry["info"] is None:
                entry["info"] = result["info"]
                log(describe(name, result))
            times = ", ".join(f"{m['search']}{'' if m['cached'] else ' uncached'}@{m['length']} "
                              f"{m['median_seconds']:.3f} s (first {m['first_call_seconds']:.1f})"
                              for m in result["measurements"])
            others = result["other_cores"]
            log(f"round {round_index + 1}/{rounds} {name}: {times}; "
                f"worker {result['wall_seconds']:.0f} s"
                + ("" if others is None else f", other processes {others:.2f} cores"))
    for entry in entries.values():
        good = [r for r in entry["rounds"] if "error" not in r]
        entry["summary"] = summarize(good, settings)
        if good:  # figures from earlier rounds stand; the error is kept as a note
            entry["not_supported"] = False
    add_ratios(figures)
    return figures


def main(argv=None):
    args = parse_args(argv)
    if args.worker or args.prepare:
        if not args.settings or not args.workdir:
            raise SystemExit("--worker and --prepare need --settings and --workdir")
        settings = json.loads(args.settings)
        if args.worker:
            if args.worker not in known_system_names():
                raise SystemExit(f"unknown system {args.worker!r}")
            return child_main(f"{args.worker} worker", run_worker, args.worker, settings,
                              args.workdir)
        if args.prepare not in PREPARERS:
            raise SystemExit(f"nothing prepares {args.prepare!r}")
        return child_main(f"preparing {args.prepare}", run_preparer, args.prepare, settings,
                          args.workdir)

    settings = resolve_settings(args)
    systems = select_systems(args)
    if not systems:
        raise SystemExit("no system left to time (see --systems, --backend, --skip-hf)")
    config = settings["config"]
    print(f"preset {args.preset} (d_model {config['d_model']}, {config['num_layers']}+"
          f"{config['num_layers']} layers, {config['num_heads']} heads, d_ff {config['d_ff']}, "
          f"vocabulary {config['vocab_size']}), random weights; batch {settings['batch_size']}, "
          f"source {settings['source_length']} ids, exactly {settings['lengths']} new tokens; "
          f"greedy and beam {settings['beam_size']} (alpha {settings['alpha']}); "
          f"{args.rounds} round(s) of {', '.join(s.name for s in systems)}, each in its own "
          f"process, {settings['repeats']} timed run(s) per search; threads "
          f"{settings['threads']} of {usable_cores()} usable cores (CTranslate2 "
          f"{settings['ct2_threads']})", flush=True)
    with tempfile.TemporaryDirectory(prefix="kt_bench_decoding_") as temp:
        workdir = args.workdir or temp
        os.makedirs(workdir, exist_ok=True)
        figures = run_benchmark(systems, settings, rounds=args.rounds, workdir=workdir,
                                timeout=args.timeout, wait_for_quiet_s=args.wait_for_quiet,
                                log=lambda *a: print(*a, flush=True))
    print(format_tables(figures))
    print("\n" + "\n".join(f"{name}: {entry['description']}"
                           for name, entry in figures["systems"].items()))
    busy = busiest_round(figures["systems"])
    if busy:
        print(f"\nnote: other processes kept {busy[0]:.2f} cores busy during a round of "
              f"{busy[1]} (see the round lines): figures of a shared machine")
    targets = format_targets(figures)
    if targets:
        print("\n" + targets)
    print(f"\nRatios: {REFERENCE} median time / the system's (above 1: faster than HF). "
          "Length penalties: ours ((5+|Y|)/6)^alpha (GNMT), HF and CTranslate2 |Y|^alpha; "
          "at a forced length every hypothesis has the same length, so they rank alike.")
    if args.json:
        with open(args.json, "w", encoding="utf-8") as f:
            json.dump(figures, f, indent=1)
        print(f"figures written to {args.json}")
    return figures


if __name__ == "__main__":
    status = main()
    sys.exit(status if isinstance(status, int) else 0)
