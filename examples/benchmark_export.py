"""The exported SavedModel of two checkouts side by side: size, export cost, load, speed.

For each run folder (`--run LABEL RUN_DIR SENTENCES`) and each checkout
(`--system NAME PATH`, e.g. `before /tmp/before` and `after .`), in rounds
(round 1: A, B; round 2: B, A; ...), each measurement runs in a fresh
process of its own, one at a time:

- `export`: `keras-transformer export --run RUN_DIR` of that checkout
  (`PYTHONPATH` and the working folder set to it, TensorFlow backend), in a
  process whose wall time and peak RSS (`ru_maxrss` of the command) are the
  export's figures;
- `serve`: a process that imports TensorFlow and TensorFlow Text (not timed)
  and then, as a model server does, loads the export (`tf.saved_model.load`,
  timed) and answers a first request (one sentence, `serving_default`,
  timed): "load + first" is the wait of a fresh server. Then, after a
  warm-up pass, the p50 latency of `--calls` one-sentence requests and the
  sentences/s of `--large-calls` requests of `--large-batch` sentences; the
  sentences are the lines of SENTENCES, in order. It also reads the
  `saved_model.pb`: its bytes, the functions of its library and their nodes.

Per run and checkout the table gives the median over rounds, and the run's
training peak from its `results.json` (`train_peak_memory_mib`), which the
export's peak is compared with. The processes share the machine with
whatever else runs; each line of the log says how many cores other
processes kept busy meanwhile.

Usage (the figures of docs/results.md):

    git worktree add /tmp/before <commit before the change>
    python examples/benchmark_export.py --system before /tmp/before --system after . \\
        --run demo_tiny runs/demo_tiny runs/prepared/demo-seed0/test.en \\
        --run m30k_small_200 runs/m30k_short ../shared/data/multi30k/test.en --rounds 2
"""

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time

EXAMPLES = os.path.dirname(os.path.abspath(__file__))
if EXAMPLES not in sys.path:
    sys.path.insert(0, EXAMPLES)

from benchmark_decoding import (  # noqa: E402
    busiest_round,
    child_environment,
    child_main,
    peak_rss_mib,
    percentile,
    rotated,
    run_child,
)

SCRIPT = os.path.abspath(__file__)
# (key, column title, format) of the table, in order.
COLUMNS = (
    ("pb_mb", "pb MB", "{:.2f}"),
    ("functions", "functions", "{:.0f}"),
    ("nodes", "nodes", "{:.0f}"),
    ("export_seconds", "export s", "{:.1f}"),
    ("export_peak_mib", "export MiB", "{:.0f}"),
    ("load_seconds", "load s", "{:.1f}"),
    ("first_seconds", "1st req s", "{:.1f}"),
    ("load_and_first_seconds", "load+1st s", "{:.1f}"),
    ("p50_ms", "p50 ms b1", "{:.0f}"),
    ("sentences_per_second", "sent/s b32", "{:.1f}"),
)


def parse_args(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--system", nargs=2, action="append", metavar=("NAME", "CHECKOUT"),
                        help="a checkout of keras-transformer to export with (repeat)")
    parser.add_argument("--run", nargs=3, action="append",
                        metavar=("LABEL", "RUN_DIR", "SENTENCES"),
                        help="a training run folder and a file of source sentences (repeat)")
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--calls", type=int, default=8, help="timed one-sentence requests")
    parser.add_argument("--large-batch", type=int, default=32)
    parser.add_argument("--large-calls", type=int, default=2,
                        help="timed requests of --large-batch sentences")
    parser.add_argument("--timeout", type=float, default=1800)
    parser.add_argument("--work-dir", help="keep the exports here (default: a temp folder)")
    parser.add_argument("--json", metavar="PATH", help="write every figure to this JSON file")
    parser.add_argument("--worker", choices=("export", "serve"), help=argparse.SUPPRESS)
    parser.add_argument("--spec", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if not args.worker:
        if not args.system or not args.run:
            parser.error("give at least one --system and one --run")
        for name in ("rounds", "calls", "large_batch", "large_calls"):
            if getattr(args, name) < 1:
                parser.error(f"--{name.replace('_', '-')} must be at least 1")
    return args


def graph_stats(saved_model_dir):
    """`saved_model.pb` bytes, functions in its library and nodes (graph + functions)."""
    from tensorflow.core.protobuf import saved_model_pb2

    path = os.path.join(saved_model_dir, "saved_model.pb")
    proto = saved_model_pb2.SavedModel()
    with open(path, "rb") as f:
        data = f.read()
    proto.ParseFromString(data)
    functions = nodes = 0
    for meta_graph in proto.meta_graphs:
        graph = meta_graph.graph_def
        functions += len(graph.library.function)
        nodes += len(graph.node) + sum(len(f.node_def) for f in graph.library.function)
    return {"pb_mb": len(data) / 1e6, "functions": functions, "nodes": nodes}


# --- the workers ------------------------------------------------------------------------------


def export_worker(spec):
    """Runs the checkout's `keras-transformer export`; its wall time and peak RSS."""
    import resource

    checkout = os.path.abspath(spec["checkout"])
    env = dict(os.environ, KERAS_BACKEND="tensorflow", PYTHONPATH=checkout,
               CUDA_VISIBLE_DEVICES="", TF_CPP_MIN_LOG_LEVEL="3")
    command = [sys.executable, "-m", "keras_transformer", "export",
               "--run", os.path.abspath(spec["run_dir"]),
               "--export-dir", os.path.abspath(spec["export_dir"]), "--model-name", "model",
               "--version", "1", "--overwrite", "--quiet"]
    start = time.perf_counter()
    completed = subprocess.run(command, cwd=checkout, env=env, capture_output=True, text=True)
    seconds = time.perf_counter() - start
    if completed.returncode != 0:
        raise RuntimeError(f"export failed ({completed.returncode}): "
                           f"{completed.stderr.strip().splitlines()[-1:]}")
    peak = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss / 1024
    return {"export_seconds": seconds, "export_peak_mib": peak,
            "path": completed.stdout.strip().splitlines()[-1]}


def serve_worker(spec):
    """Load + first request in this fresh process, then latency and throughput."""
    import tensorflow as tf
    import tensorflow_text  # noqa: F401  (registers the SentencePiece ops)

    with open(spec["sentences"], encoding="utf-8") as f:
        sentences = [line.strip() for line in f if line.strip()]
    start = time.perf_counter()
    loaded = tf.saved_model.load(spec["path"])
    signature = loaded.signatures["serving_default"]
    loaded_at = time.perf_counter()
    signature(text=tf.constant(sentences[:1]))
    first_at = time.perf_counter()

    def call(texts):
        begin = time.perf_counter()
        outputs = signature(text=tf.constant(texts))["translation"]
        if outputs.shape != (len(texts),):
            raise RuntimeError(f"{len(texts)} sentences in, {outputs.shape} out")
        return time.perf_counter() - begin

    singles = [sentences[i % len(sentences):][:1] for i in range(spec["calls"])]
    for texts in singles:  # warm-up pass
        call(texts)
    latencies = [call(texts) for texts in singles]
    large = spec["large_batch"]
    batches = [(sentences * (1 + large * (spec["large_calls"] + 1) // len(sentences)))
               [i * large:(i + 1) * large] for i in range(spec["large_calls"] + 1)]
    call(batches[0])  # warm-up
    seconds = sum(call(texts) for texts in batches[1:])
    result = {"load_seconds": loaded_at - start, "first_seconds": first_at - loaded_at,
              "load_and_first_seconds": first_at - start,
              "p50_ms": 1000 * percentile(latencies, 50),
              "sentences_per_second": large * spec["large_calls"] / seconds,
              "serve_peak_mib": peak_rss_mib()}
    result.update(graph_stats(spec["path"]))
    return result


# --- the parent -----------------------------------------------------------------------------


def training_peaks(run_dir):
    """`train_peak_memory_mib` and `peak_memory_mib` of a run's results.json (or None)."""
    path = os.path.join(run_dir, "results.json")
    try:
        with open(path, encoding="utf-8") as f:
            results = json.load(f)
    except (OSError, ValueError):
        return {}
    return {k: results.get(k) for k in ("train_peak_memory_mib", "peak_memory_mib")}


def summarize(rounds):
    """The median of each figure over a (run, system)'s successful rounds."""
    summary = {}
    for key, _, _ in COLUMNS:
        values = [r[key] for r in rounds if r.get(key) is not None]
        if values:
            summary[key] = statistics.median(values)
    summary["rounds"] = len(rounds)
    return summary


def format_table(figures):
    """A row per run and system: the medians of `COLUMNS`, then the training peak."""
    label_width = max([len(f"{r} {s}") for r in figures["runs"] for s in figures["systems"]]
                      + [10])
    header = f"{'run system':<{label_width}} " + " ".join(
        f"{title:>{max(len(title), 8)}}" for _, title, _ in COLUMNS) + f" {'train MiB':>9}"
    lines = [header, "-" * len(header)]
    for run, entry in figures["runs"].items():
        for system in figures["systems"]:
            row = entry["summary"].get(system, {})
            cells = []
            for key, title, fmt in COLUMNS:
                value = row.get(key)
                text = fmt.format(value) if value is not None else "-"
                cells.append(text.rjust(max(len(title), 8)))
            train = entry["training"].get("train_peak_memory_mib")
            train = f"{train:.0f}" if train is not None else "-"
            lines.append(f"{run + ' ' + system:<{label_width}} " + " ".join(cells)
                         + f" {train:>9}")
            if entry["errors"].get(system):
                lines.append(f"  {system} failed: {entry['errors'][system]}")
    return "\n".join(lines)


def run_benchmark(args, work_dir, log=print):
    systems = dict(args.system)
    runs = {label: {"run_dir": run_dir, "sentences": sentences}
            for label, run_dir, sentences in args.run}
    figures = {"systems": list(systems), "settings": {
        "rounds": args.rounds, "calls": args.calls, "large_batch": args.large_batch,
        "large_calls": args.large_calls, "checkouts": systems}, "runs": {}}
    for label, run in runs.items():
        figures["runs"][label] = {**run, "training": training_peaks(run["run_dir"]),
                                  "rounds": {s: [] for s in systems}, "errors": {},
                                  "summary": {}}
    env = child_environment()
    for round_index in range(args.rounds):
        for label, run in runs.items():
            entry = figures["runs"][label]
            for system in rotated(list(systems), round_index):
                if entry["errors"].get(system):
                    continue
                export_dir = os.path.join(work_dir, label, system)
                spec = {"checkout": systems[system], "run_dir": run["run_dir"],
                        "export_dir": export_dir}
                exported = run_child(["--worker", "export", "--spec", json.dumps(spec)],
                                     env, args.timeout, script=SCRIPT)
                if "error" not in exported:
                    spec = {"path": exported["path"], "sentences": run["sentences"],
                            "calls": args.calls, "large_batch": args.large_batch,
                            "large_calls": args.large_calls}
                    served = run_child(["--worker", "serve", "--spec", json.dumps(spec)],
                                       env, args.timeout, script=SCRIPT)
                else:
                    served = {}
                error = exported.get("error") or served.get("error")
                if error:
                    entry["errors"][system] = error
                    log(f"round {round_index + 1} {label} {system}: failed: {error}")
                    continue
                result = {**exported, **served,
                          "other_cores": max(exported.get("other_cores") or 0,
                                             served.get("other_cores") or 0)}
                entry["rounds"][system].append(result)
                log(f"round {round_index + 1} {label} {system}: pb {result['pb_mb']:.2f} MB, "
                    f"export {result['export_seconds']:.0f} s / "
                    f"{result['export_peak_mib']:.0f} MiB, load+first "
                    f"{result['load_and_first_seconds']:.1f} s, p50 {result['p50_ms']:.0f} ms, "
                    f"{result['sentences_per_second']:.1f} sent/s; other processes "
                    f"{result['other_cores']:.2f} cores")
    for entry in figures["runs"].values():
        entry["summary"] = {s: summarize(rounds) for s, rounds in entry["rounds"].items()}
    return figures


def main(argv=None):
    args = parse_args(argv)
    if args.worker:
        spec = json.loads(args.spec)
        worker = export_worker if args.worker == "export" else serve_worker
        return child_main(f"{args.worker} worker", worker, spec)
    start = time.perf_counter()
    print(f"{args.rounds} round(s) of {', '.join(s for s, _ in args.system)} on "
          f"{', '.join(r for r, _, _ in args.run)}; each export and each serving process "
          f"on its own", flush=True)
    with tempfile.TemporaryDirectory(prefix="kt_bench_export_") as temp:
        work_dir = args.work_dir or temp
        figures = run_benchmark(args, work_dir, log=lambda *a: print(*a, flush=True))
    print()
    print(format_table(figures))
    print(f"\nmedians over rounds; load+1st: tf.saved_model.load and a one-sentence "
          f"serving_default request in a fresh process that imported tensorflow and "
          f"tensorflow_text first; p50 of {args.calls} one-sentence requests, sent/s of "
          f"{args.large_calls} requests of {args.large_batch}; train MiB: the run's "
          f"train_peak_memory_mib; total {time.perf_counter() - start:.0f} s")
    busy = busiest_round({f"{r} {s}": {"rounds": rounds} for r, e in figures["runs"].items()
                          for s, rounds in e["rounds"].items()})
    if busy:
        print(f"note: other processes kept {busy[0]:.2f} cores busy during {busy[1]}: "
              f"figures of a shared machine")
    if args.json:
        with open(args.json, "w", encoding="utf-8") as f:
            json.dump(figures, f, indent=1)
        print(f"figures written to {args.json}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
