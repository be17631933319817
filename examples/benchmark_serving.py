"""Serving latency: the exported SavedModel's `serving_default` vs the Translator, fairly.

Builds a model of a preset (default `small`) with random weights and a
SentencePiece tokenizer trained on a sample of the demo corpus, saves the
weights and exports it with `keras_transformer.export_saved_model` (beam 4,
alpha 0.6), all in one preparing process. Then, in rounds, each path runs in
a fresh process of its own (a worker mode of this script that prints one
JSON line), one at a time, so that no two runtimes share the cores:

- `saved_model`: a process that imports only TensorFlow and TensorFlow Text
  loads the export with `tf.saved_model.load`, as a model server does, and
  calls its `serving_default` signature (tokenize, cached beam search,
  detokenize: all graph ops, no XLA, what TF Serving runs);
- `translator-<backend>`: a process with that `KERAS_BACKEND` rebuilds the
  model, loads the same weights and calls `Translator.translate` (search
  XLA-compiled under TensorFlow and JAX, eager under PyTorch; tokenization in
  Python around it).

For each of `--batch-sizes` (default 1 and 32) a worker makes `--calls`
requests of English demo sentences twice: a warm-up pass, which reports the
first request of each shape the path decodes in (tracing, XLA compilation,
the SavedModel's first run of its signature and of a new size) separately,
then the timed pass: p50 / p95 latency of one request and sentences/s. The
parent reports per path and batch size the median over rounds and the spread
(min-max).

Random weights rarely choose EOS, so every sentence decodes to its length
limit (source length + `--max-extra-length`): the figures are for the
longest outputs a sentence can have. Shapes: the SavedModel decodes a
request as it comes (one search of dynamic shape, in chunks of at most
`max(--batch-sizes)` sentences, each cut to its longest sentence), the
Translator pads the width to a multiple of 8 and the batch to a power of
two. `examples/benchmark_export.py` measures the export itself: graph size,
export time and memory, load and first request.

Threads: TensorFlow's pools keep their defaults (one thread per core);
`--threads` (default: the usable cores) goes to `torch.set_num_threads` for
a PyTorch Translator. GPUs are hidden from the workers.

Usage:

    python examples/benchmark_serving.py
    python examples/benchmark_serving.py --backends tensorflow jax --rounds 5 --json serving.json
    python examples/benchmark_serving.py --max-extra-length 20 --calls 10
    KERAS_BACKEND=jax python examples/benchmark_serving.py  # Translator under JAX
"""

import argparse
import json
import math
import os
import statistics
import sys
import tempfile
import time

# Run from a checkout without installing the package; the worker machinery is
# benchmark_decoding's (it imports no framework at module level).
EXAMPLES = os.path.dirname(os.path.abspath(__file__))
REPO_ROOT = os.path.dirname(EXAMPLES)
for _path in (REPO_ROOT, EXAMPLES):
    if _path not in sys.path:
        sys.path.insert(0, _path)

from benchmark_decoding import (  # noqa: E402
    child_environment,
    child_main,
    percentile,
    rotated,
    busiest_round,
    run_child,
    usable_cores,
    wait_for_quiet,
)

SCRIPT = os.path.abspath(__file__)
SAVED_MODEL = "saved_model"
BACKENDS = ("tensorflow", "jax", "torch")
# Python a model server does not run: the SavedModel worker must not import it.
# (TensorFlow 2.21 itself imports `keras`, and `jax` when it is installed.)
FOREIGN_MODULES = ("keras_transformer", "torch", "transformers")


def parse_args(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--preset", default="small")
    parser.add_argument("--vocab-size", type=int, default=1000,
                        help="tokenizer vocabulary, trained on the demo sample")
    parser.add_argument("--num-layers", type=int, default=None)
    parser.add_argument("--d-model", type=int, default=None)
    parser.add_argument("--d-ff", type=int, default=None)
    parser.add_argument("--max-length", type=int, default=64,
                        help="config.max_length = max_source_length of the export")
    parser.add_argument("--max-extra-length", type=int, default=30)
    # Decoding defaults: DecodingOptions' (resolve_settings; a worker parses
    # its arguments without importing keras_transformer).
    parser.add_argument("--beam-size", type=int, help="default: DecodingOptions().beam_size")
    parser.add_argument("--alpha", type=float, help="default: DecodingOptions().alpha")
    parser.add_argument("--batch-sizes", type=int, nargs="+", default=[1, 32])
    parser.add_argument("--calls", type=int, default=12,
                        help="timed requests per batch size, path and round")
    parser.add_argument("--rounds", type=int, default=3,
                        help="rounds; each starts every path's worker once")
    parser.add_argument("--backends", nargs="+", choices=BACKENDS,
                        default=[os.environ.get("KERAS_BACKEND", "tensorflow")],
                        help="Keras backends of the Translator paths (default: KERAS_BACKEND, "
                             "else tensorflow)")
    parser.add_argument("--skip-saved-model", action="store_true",
                        help="time the Translator paths only")
    parser.add_argument("--threads", type=int, default=None,
                        help="torch threads of a PyTorch Translator (default: the usable cores)")
    parser.add_argument("--timeout", type=float, default=3600,
                        help="seconds a worker may run before it is stopped")
    parser.add_argument("--wait-for-quiet", type=float, default=0.0, metavar="SECONDS",
                        help="before each worker, wait up to this long for other processes "
                             "to leave the cores")
    parser.add_argument("--output-dir",
                        help="keep the export, weights and tokenizer here (default: a temp folder)")
    parser.add_argument("--json", metavar="PATH", help="write every figure to this JSON file")
    parser.add_argument("--worker", metavar="PATH", help=argparse.SUPPRESS)
    parser.add_argument("--prepare", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--settings", help=argparse.SUPPRESS)
    parser.add_argument("--workdir", help=argparse.SUPPRESS)
    return parser.parse_args(argv)


def resolve_settings(args):
    """The workers' settings; `SystemExit` with one line for bad input."""
    from keras_transformer.model.config import DecodingOptions, TransformerConfig

    if args.beam_size is None:
        args.beam_size = DecodingOptions.beam_size
    if args.alpha is None:
        args.alpha = DecodingOptions.alpha
    for name in ("calls", "rounds", "beam_size", "vocab_size", "max_length"):
        if getattr(args, name) < 1:
            raise SystemExit(f"--{name.replace('_', '-')} must be at least 1, "
                             f"received {getattr(args, name)}")
    if args.beam_size < 2:
        raise SystemExit(f"--beam-size must be at least 2 (serving_default is beam search), "
                         f"received {args.beam_size}")
    if args.max_extra_length < 0:
        raise SystemExit(f"--max-extra-length must be at least 0, "
                         f"received {args.max_extra_length}")
    if min(args.batch_sizes) < 1:
        raise SystemExit(f"--batch-sizes must be positive, received {args.batch_sizes}")
    if args.threads is not None and args.threads < 1:
        raise SystemExit(f"--threads must be at least 1, received {args.threads}")
    overrides = {name: getattr(args, name) for name in ("num_layers", "d_model", "d_ff")
                 if getattr(args, name) is not None}
    try:
        TransformerConfig.preset(args.preset, **overrides)
    except (ValueError, TypeError) as error:
        raise SystemExit(f"invalid model settings: {error}") from None
    return {
        "preset": args.preset, "overrides": overrides, "vocab_size": args.vocab_size,
        "max_length": args.max_length, "max_extra_length": args.max_extra_length,
        "beam_size": args.beam_size, "alpha": args.alpha,
        "batch_sizes": sorted(set(args.batch_sizes)), "calls": args.calls,
        "threads": args.threads or usable_cores(),
    }


def request_batches(sentences, batch_size, calls):
    """`calls` requests of `batch_size` sentences, walking through `sentences`."""
    batches = [sentences[(i * batch_size) % len(sentences):][:batch_size] for i in range(calls)]
    return [b if len(b) == batch_size else sentences[:batch_size] for b in batches]


# --- inside the workers -----------------------------------------------------------------


def prepare(settings, directory):
    """Tokenizer, random-weight model, weights file, SavedModel and the request sentences.

    Runs under the TensorFlow backend. Writes into `directory` and returns
    what the workers need: `config`, `weights`, `tokenizer`, `export`,
    `sentences` (a JSON file of `[text, source ids with EOS]` pairs).
    """
    import dataclasses

    import keras

    from keras_transformer.model.config import TransformerConfig
    from keras_transformer.data import generate_pairs, train_tokenizer
    from keras_transformer.export.saved_model import export_saved_model
    from keras_transformer.model.transformer import build_model
    from keras_transformer.inference.translator import Translator

    start = time.perf_counter()
    pairs = generate_pairs(3000, seed=0)
    sample = os.path.join(directory, "sample.txt")
    with open(sample, "w", encoding="utf-8") as f:
        f.writelines(f"{en}\n{de}\n" for en, de in pairs)
    tokenizer_file = os.path.join(directory, "spm.model")
    tokenizer = train_tokenizer([sample], settings["vocab_size"], tokenizer_file)
    keras.utils.set_random_seed(0)
    config = TransformerConfig.preset(
        settings["preset"], **settings["overrides"], vocab_size=tokenizer.vocabulary_size(),
        max_length=settings["max_length"], dropout=0.0)
    model = build_model(config)
    weights = os.path.join(directory, "model.weights.h5")
    model.save_weights(weights)
    translator = Translator(model, tokenizer, batch_size=max(settings["batch_sizes"]),
                            max_extra_length=settings["max_extra_length"])
    export_start = time.perf_counter()
    export = export_saved_model(
        translator, os.path.join(directory, "saved_models"), beam_size=settings["beam_size"],
        alpha=settings["alpha"], batch_size=max(settings["batch_sizes"]), overwrite=True,
        version=1)
    export_seconds = time.perf_counter() - export_start
    english = [en for en, _ in generate_pairs(400, seed=1)]
    sentences = os.path.join(directory, "sentences.json")
    with open(sentences, "w", encoding="utf-8") as f:
        json.dump([[text, len(ids)] for text, ids in zip(english, translator.encode(english))],
                  f)
    return {"config": dataclasses.asdict(config), "weights": weights,
            "tokenizer": tokenizer_file, "export": str(export), "sentences": sentences,
            "parameters": int(model.count_params()), "export_seconds": export_seconds,
            "seconds": time.perf_counter() - start,
            "versions": {"keras": keras.__version__, "tensorflow": _version("tensorflow")}}


def _version(module):
    import importlib

    try:
        return importlib.import_module(module).__version__
    except (ImportError, AttributeError):
        return "unknown"


def saved_model_path(settings, prepared):
    """`(translate, shape_of, info)` of the loaded SavedModel; TensorFlow and tf-text only."""
    import tensorflow as tf
    import tensorflow_text  # noqa: F401  (registers the SentencePiece ops)

    start = time.perf_counter()
    loaded = tf.saved_model.load(prepared["export"])
    serving_default = loaded.signatures["serving_default"]
    info = {"load_seconds": time.perf_counter() - start,
            "threads": (f"TensorFlow intra-op "
                        f"{tf.config.threading.get_intra_op_parallelism_threads() or 'default'}, "
                        f"inter-op "
                        f"{tf.config.threading.get_inter_op_parallelism_threads() or 'default'} "
                        f"({usable_cores()} cores)"),
            "versions": {"tensorflow": tf.__version__,
                         "tensorflow_text": _version("tensorflow_text")}}
    def translate(batch):
        texts = [text for text, _ in batch]
        output = serving_default(text=tf.constant(texts))["translation"].numpy()
        return [t.decode("utf-8") for t in output]

    def shape_of(batch):  # the request's own (rows, width): the graph pads nothing
        return (len(batch), max(n for _, n in batch))

    return translate, shape_of, info


def translator_path(backend, settings, prepared):
    """`(translate, shape_of, info)` of a Translator rebuilt from the saved weights."""
    if os.environ.get("KERAS_BACKEND") != backend:
        raise RuntimeError(f"worker started with KERAS_BACKEND="
                           f"{os.environ.get('KERAS_BACKEND')!r}, needs {backend!r}")
    if backend == "torch":
        import torch

        torch.set_num_threads(settings["threads"])
        threads = f"torch {torch.get_num_threads()} threads"
    elif backend == "tensorflow":
        import tensorflow as tf

        threads = (f"TensorFlow intra-op "
                   f"{tf.config.threading.get_intra_op_parallelism_threads() or 'default'} "
                   f"({usable_cores()} cores)")
    else:
        threads = f"XLA CPU default ({usable_cores()} cores)"
    import keras

    from keras_transformer.model.config import TransformerConfig
    from keras_transformer.data import Tokenizer
    from keras_transformer.model.transformer import build_model
    from keras_transformer.inference.translator import Translator

    start = time.perf_counter()
    model = build_model(TransformerConfig(**prepared["config"]))
    model.load_weights(prepared["weights"])
    translator = Translator(model, Tokenizer.load(prepared["tokenizer"]),
                            batch_size=max(settings["batch_sizes"]),
                            max_extra_length=settings["max_extra_length"])
    info = {"load_seconds": time.perf_counter() - start, "threads": threads,
            "versions": {"keras": keras.__version__, backend: _version(backend)}}
    multiple = translator.length_multiple
    compiled = backend != "torch"

    def translate(batch):
        return translator.translate([text for text, _ in batch],
                                    beam_size=settings["beam_size"], alpha=settings["alpha"])

    def shape_of(batch):  # the padded (rows, width) the search compiles for
        rows = len(batch)
        if compiled:
            rows = max(rows, min(translator.batch_size, 2 ** math.ceil(math.log2(rows))))
        width = -(-max(n for _, n in batch) // multiple) * multiple
        return (rows, width)

    return translate, shape_of, info


def measure(translate, shape_of, batches):
    """A warm-up pass over `batches`, then a timed pass: one batch size's figures."""
    first_requests, warmup, sample = {}, [], None
    for batch in batches:
        start = time.perf_counter()
        output = translate(batch)
        warmup.append(time.perf_counter() - start)
        first_requests.setdefault(shape_of(batch), warmup[-1])
        if len(output) != len(batch):
            raise RuntimeError(f"{len(batch)} sentences in, {len(output)} translations out")
        sample = output[0] if sample is None else sample
    latencies = []
    for batch in batches:
        start = time.perf_counter()
        translate(batch)
        latencies.append(time.perf_counter() - start)
    return {
        "calls": len(batches), "latencies": latencies,
        "p50_seconds": percentile(latencies, 50), "p95_seconds": percentile(latencies, 95),
        "sentences_per_second": len(batches[0]) * len(latencies) / sum(latencies),
        "warmup_seconds": sum(warmup),
        "first_requests": [{"shape": list(shape), "seconds": seconds}
                           for shape, seconds in first_requests.items()],
        "sample": sample,  # the first request's first translation
    }


def run_worker(path, settings, workdir):
    """Loads one path and measures every batch size; the worker's result dict."""
    with open(os.path.join(workdir, "prepared.json"), encoding="utf-8") as f:
        prepared = json.load(f)
    if path == SAVED_MODEL:
        translate, shape_of, info = saved_model_path(settings, prepared)
    else:
        translate, shape_of, info = translator_path(path.split("-", 1)[1], settings, prepared)
    with open(prepared["sentences"], encoding="utf-8") as f:
        sentences = [tuple(item) for item in json.load(f)]
    results = {}
    for batch_size in settings["batch_sizes"]:
        batches = request_batches(sentences, batch_size, settings["calls"])
        results[str(batch_size)] = measure(translate, shape_of, batches)
    # Python of ours a model server would not have, loaded by this process
    # (none for the SavedModel).
    info["foreign_modules"] = sorted({m.split(".")[0] for m in sys.modules}
                                     & set(FOREIGN_MODULES))
    import resource

    info["peak_rss_mib"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    return {"path": path, "info": info, "batches": results}


def prepare_worker(settings, workdir):
    prepared = prepare(settings, workdir)
    with open(os.path.join(workdir, "prepared.json"), "w", encoding="utf-8") as f:
        json.dump(prepared, f)
    return prepared


# --- the parent ----------------------------------------------------------------------


def summarize(rounds, settings):
    """Per batch size, the median over a path's successful rounds and the spread.

    Returns:
        `{batch_size (str): figures}` with, for `p50_seconds`, `p95_seconds`
        and `sentences_per_second`, the median over rounds and `<name>_min` /
        `<name>_max`; `warmup_seconds` (median); `first_requests`: per shape
        the median first-request seconds; `rounds`.
    """
    summary = {}
    for batch_size in map(str, settings["batch_sizes"]):
        items = [r["batches"][batch_size] for r in rounds if batch_size in r.get("batches", {})]
        if not items:
            continue
        figures = {"rounds": len(items),
                   "warmup_seconds": statistics.median(i["warmup_seconds"] for i in items)}
        for name in ("p50_seconds", "p95_seconds", "sentences_per_second"):
            values = [i[name] for i in items]
            figures.update({name: statistics.median(values), f"{name}_min": min(values),
                            f"{name}_max": max(values)})
        shapes = {}
        for item in items:
            for request in item["first_requests"]:
                shapes.setdefault(tuple(request["shape"]), []).append(request["seconds"])
        figures["first_requests"] = [{"shape": list(shape), "seconds": statistics.median(s)}
                                     for shape, s in shapes.items()]
        summary[batch_size] = figures
    return summary


def format_table(figures):
    """The printed table: a row per path and batch size, then the first requests."""
    paths = figures["paths"]
    width = max([len(p) for p in paths] + [4])
    header = (f"{'path':<{width}} {'batch':>5} {'p50 ms':>9} {'(min-max)':>17} {'p95 ms':>9} "
              f"{'sent/s':>8} {'(min-max)':>15} {'warm-up s':>9} {'p50 vs ' + SAVED_MODEL:>19}")
    lines = [header, "-" * len(header)]
    reference = paths.get(SAVED_MODEL, {}).get("summary", {})
    for batch_size in map(str, figures["settings"]["batch_sizes"]):
        for name, entry in paths.items():
            row = entry["summary"].get(batch_size)
            if row is None:
                continue
            base = reference.get(batch_size)
            ratio = f"{base['p50_seconds'] / row['p50_seconds']:18.2f}x" if base else ""
            p50 = f"{1000 * row['p50_seconds_min']:.1f}-{1000 * row['p50_seconds_max']:.1f}"
            rate = (f"{row['sentences_per_second_min']:.1f}-"
                    f"{row['sentences_per_second_max']:.1f}")
            lines.append(
                f"{name:<{width}} {batch_size:>5} {1000 * row['p50_seconds']:>9.1f} {p50:>17} "
                f"{1000 * row['p95_seconds']:>9.1f} {row['sentences_per_second']:>8.1f} "
                f"{rate:>15} {row['warmup_seconds']:>9.1f} {ratio:>19}")
    for name, entry in paths.items():
        if not entry["summary"]:
            lines.append(f"{name:<{width}} failed: {entry['error'] or 'no figures'}")
    lines.append("\nfirst request of each shape (batch x source width; warm-up cost, "
                 "median over rounds):")
    for name, entry in paths.items():
        requests = [r for row in entry["summary"].values() for r in row["first_requests"]]
        if requests:
            lines.append(f"  {name:<{width}} " + ", ".join(
                f"{r['shape'][0]}x{r['shape'][1]}: {r['seconds']:.2f} s" for r in requests))
    return "\n".join(lines)


def run_benchmark(paths, settings, *, rounds, workdir, timeout=3600, wait_for_quiet_s=0.0,
                  log=print):
    """Prepares the model and export, then times the paths in alternating rounds.

    `wait_for_quiet_s`: before each worker, wait up to this long for other
    processes to leave the cores. Each worker result records `other_cores`
    (see `benchmark_decoding.run_child`).

    Returns:
        The figures dict: `settings` (with `rounds`), `prepared` (the
        preparing process's result), `order` (the paths of each round) and
        `paths`: per path `rounds` (worker results), `info` (first
        successful round), `error` (when it never succeeded) and `summary`
        (see `summarize`).
    """
    settings = dict(settings, rounds=rounds)
    entries = {p: {"rounds": [], "info": None, "error": None, "summary": {}} for p in paths}
    figures = {"settings": settings, "prepared": None, "order": [], "paths": entries}
    encoded = json.dumps(settings)
    log("preparing the tokenizer, the random-weight model and its SavedModel ...")
    prepared = run_child(["--prepare", "--settings", encoded, "--workdir", workdir],
                         child_environment("tensorflow"), timeout, script=SCRIPT)
    figures["prepared"] = prepared
    if "error" in prepared:
        for entry in entries.values():
            entry["error"] = prepared["error"]
        log(f"  preparing failed: {prepared['error']}")
        return figures
    log(f"  {prepared['parameters']:,} parameters, vocabulary {prepared['config']['vocab_size']}; "
        f"exported in {prepared['export_seconds']:.0f} s to {prepared['export']}")
    for round_index in range(rounds):
        order = [p for p in rotated(list(paths), round_index) if not entries[p]["error"]]
        figures["order"].append(order)
        for path in order:
            if wait_for_quiet_s:
                wait_for_quiet(wait_for_quiet_s)
            backend = None if path == SAVED_MODEL else path.split("-", 1)[1]
            result = run_child(["--worker", path, "--settings", encoded, "--workdir", workdir],
                               child_environment(backend), timeout, script=SCRIPT)
            entry = entries[path]
            entry["rounds"].append(result)
            if "error" in result:
                entry["error"] = result["error"]
                log(f"round {round_index + 1}/{rounds} {path}: failed: {result['error']}")
                continue
            if entry["info"] is None:
                entry["info"] = result["info"]
                info = result["info"]
                log(f"  {path}: " + ", ".join(f"{k} {v}" for k, v in info["versions"].items())
                    + f"; threads: {info['threads']}; loaded in {info['load_seconds']:.1f} s"
                    + (f"; WARNING: imported {', '.join(info['foreign_modules'])}"
                       if path == SAVED_MODEL and info["foreign_modules"] else ""))
            log(f"round {round_index + 1}/{rounds} {path}: " + ", ".join(
                f"batch {b} p50 {1000 * r['p50_seconds']:.0f} ms, "
                f"{r['sentences_per_second']:.1f} sent/s" for b, r in result["batches"].items())
                + f"; worker {result['wall_seconds']:.0f} s"
                + ("" if result["other_cores"] is None
                   else f", other processes {result['other_cores']:.2f} cores"))
    for entry in entries.values():
        entry["summary"] = summarize([r for r in entry["rounds"] if "error" not in r], settings)
    return figures


def main(argv=None):
    args = parse_args(argv)
    if args.worker or args.prepare:
        if not args.settings or not args.workdir:
            raise SystemExit("--worker and --prepare need --settings and --workdir")
        settings = json.loads(args.settings)
        if args.prepare:
            return child_main("preparing", prepare_worker, settings, args.workdir)
        if args.worker != SAVED_MODEL and args.worker not in [f"translator-{b}" for b in BACKENDS]:
            raise SystemExit(f"unknown path {args.worker!r}")
        return child_main(f"{args.worker} worker", run_worker, args.worker, settings,
                          args.workdir)

    settings = resolve_settings(args)
    paths = ([] if args.skip_saved_model else [SAVED_MODEL]) + [
        f"translator-{b}" for b in dict.fromkeys(args.backends)]
    print(f"preset {args.preset}, random weights, tokenizer vocabulary {args.vocab_size}; "
          f"beam {args.beam_size}, alpha {args.alpha}, outputs up to source + "
          f"{args.max_extra_length} tokens; batches {settings['batch_sizes']}, {args.calls} "
          f"timed requests each; {args.rounds} round(s) of {', '.join(paths)}, each in its "
          f"own process", flush=True)
    start = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="kt_bench_serving_") as temp:
        workdir = args.output_dir or temp
        os.makedirs(workdir, exist_ok=True)
        figures = run_benchmark(paths, settings, rounds=args.rounds, workdir=workdir,
                                timeout=args.timeout, wait_for_quiet_s=args.wait_for_quiet,
                                log=lambda *a: print(*a, flush=True))
    print()
    print(format_table(figures))
    print(f"\n{args.calls} timed requests per row and round after a warm-up pass over the same "
          f"requests; total {time.perf_counter() - start:.0f} s")
    busy = busiest_round(figures["paths"])
    if busy:
        print(f"note: other processes kept {busy[0]:.2f} cores busy during a round of "
              f"{busy[1]} (see the round lines): figures of a shared machine")
    if args.json:
        with open(args.json, "w", encoding="utf-8") as f:
            json.dump(figures, f, indent=1)
        print(f"figures written to {args.json}")
    return figures


if __name__ == "__main__":
    status = main()
    sys.exit(status if isinstance(status, int) else 0)
