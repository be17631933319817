r"""Where a training step's time goes: a per-op profile of one update, float32 and bf16.

Runs `benchmark_training.py`'s Keras trainer (the model `fit` trains, the
paper's Adam, the label-smoothed loss) on its fixed synthetic batch under the
TensorFlow backend, once per dtype policy, each in its own process; records
`--steps` updates with TensorFlow's profiler after `--warmup-steps`, and sums
the time of every TensorFlow op by what it does:

    matmul: output projection    the tied embedding's projection to logits (and its gradients)
    matmul: attention Q/K/V/O    the four projections of every attention layer
    matmul: feed-forward         the two Dense layers of every FFN
    matmul: attention scores     the batched products Q K^T and weights x V
    loss over the vocabulary     the label-smoothed cross-entropy on (tokens, vocab) float32 logits
    attention softmax + mask     the softmax, its mask and scale
    layer norm                   statistics (float32) and scale, forward and backward
    dropout                      random numbers, masks, products
    head transposes              split and merge of heads
    bias add + ReLU              BiasAdd, its gradient, ReLU and its gradient
    embedding lookup + gradient  gathers of source and target ids, their scatter-add
    optimizer (Adam)             moments and weight updates of every variable
    casts                        float32 <-> bf16 conversions (mixed precision)
    other                        everything else (reshapes, residual sums, metrics)

The op times are summed over TensorFlow's executor threads, which run
independent ops side by side: their total exceeds the step's wall time, so
each category is printed in milliseconds of op time per update and as a share
of the total, next to the wall time per update measured without the profiler.
What the figures are: where the arithmetic and memory traffic go, not an
exact split of the wall clock.

Usage:

    python examples/profile_training_step.py                  # small, float32 and bf16
    python examples/profile_training_step.py --preset tiny --steps 1 --json profile.json
    python examples/profile_training_step.py --top 20         # also the 20 costliest ops
"""

import argparse
import collections
import glob
import json
import multiprocessing
import os
import re
import sys
import tempfile
import time

REPO_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
EXAMPLES = os.path.dirname(os.path.abspath(__file__))
for path in (REPO_ROOT, EXAMPLES):
    if path not in sys.path:
        sys.path.insert(0, path)

# (category, test on (op name, op type)), the first match wins.
CATEGORIES = (
    ("casts", lambda name, kind: kind == "Cast"),
    ("matmul: output projection",
     lambda name, kind: "MatMul" in kind and re.search(
         r"(shared|target)_embedding|output_projection", name) is not None),
    ("matmul: attention scores", lambda name, kind: "BatchMatMul" in kind),
    ("matmul: attention Q/K/V/O",
     lambda name, kind: "MatMul" in kind and re.search(
         r"/(query|key|value|attention_output)(_\d+)?/", name) is not None),
    ("matmul: feed-forward",
     lambda name, kind: "MatMul" in kind and "/ffn_" in name),
    ("loss over the vocabulary",
     lambda name, kind: re.search(r"(^|/)(compile_loss|label_smoothed_ce)", name) is not None
     or name.startswith(("AddN:", "AddN/", "AddN_1:", "AddN_1/"))),
    ("optimizer (Adam)", lambda name, kind: re.match(r"(adam|Adam)[/_]", name) is not None),
    ("dropout", lambda name, kind: "dropout" in name),
    ("layer norm", lambda name, kind: "_norm" in name),
    ("embedding lookup + gradient",
     lambda name, kind: "embedding" in name or kind in ("UnsortedSegmentSum", "GatherV2")),
    ("head transposes", lambda name, kind: "Transpose" in kind),
    ("attention softmax + mask",
     lambda name, kind: re.search(r"(self|cross)_attention(_\d+)?/", name) is not None
     and "MatMul" not in kind),
    ("bias add + ReLU", lambda name, kind: kind in ("BiasAdd", "BiasAddGrad", "Relu",
                                                    "ReluGrad", "_MklFusedMatMul")),
    ("other", lambda name, kind: True),
)
CATEGORY_NAMES = tuple(name for name, _ in CATEGORIES)


def categorize(name, kind):
    """The `CATEGORIES` entry of an op, from its name (`scope/op`) and type."""
    for category, test in CATEGORIES:
        if test(name, kind):
            return category
    raise AssertionError("'other' matches everything")


def op_times(logdir):
    """`{(op name, op type): seconds}` summed over the executor threads of a profile."""
    from tensorflow.tsl.profiler.protobuf import xplane_pb2

    paths = glob.glob(os.path.join(logdir, "**", "*.xplane.pb"), recursive=True)
    if not paths:
        raise RuntimeError(f"no profile was written under {logdir}")
    space = xplane_pb2.XSpace()
    with open(paths[0], "rb") as f:
        space.ParseFromString(f.read())
    times = collections.Counter()
    for plane in space.planes:
        if plane.name != "/host:CPU":
            continue
        for line in plane.lines:
            if not line.name.startswith("tf_Compute"):
                continue
            for event in line.events:
                metadata = plane.event_metadata[event.metadata_id]
                # Ops are "<name>:<type>"; the executor's own events have no type.
                if ":" not in metadata.name or not metadata.display_name:
                    continue
                name = metadata.name.rsplit(":", 1)[0]
                times[(name, metadata.display_name)] += event.duration_ps / 1e12
    return times


def summarize(times, steps):
    """`({category: ms per update}, [(ms per update, op name, op type), ...] costliest first)`."""
    by_category = dict.fromkeys(CATEGORY_NAMES, 0.0)
    for (name, kind), seconds in times.items():
        by_category[categorize(name, kind)] += 1e3 * seconds / steps
    ops = sorted(((1e3 * s / steps, name, kind) for (name, kind), s in times.items()),
                 reverse=True)
    return by_category, ops


def profile_policy(preset, policy, tokens_per_batch, seq_len, steps, warmup_steps,
                   timed_steps):
    """Profiles `steps` updates of `preset` under `policy` in this process.

    Returns:
        A dict: `policy`, `wall_ms` (median update time of `timed_steps`
        updates without the profiler), `categories` (ms of op time per
        update), `ops` (the costliest ops), `total_ms`.
    """
    os.environ.setdefault("KERAS_BACKEND", "tensorflow")
    import tensorflow as tf

    import benchmark_training as bench

    config = bench.resolve_config(preset)
    batch = bench.synthetic_batch(config, max(tokens_per_batch // seq_len, 1), seq_len)
    trainer = bench.KerasTrainer(config, batch,
                                 mixed_precision=None if policy == "float32" else policy)
    for _ in range(warmup_steps):
        trainer.step()
    walls = []
    for _ in range(timed_steps):
        start = time.perf_counter()
        trainer.step()
        walls.append(time.perf_counter() - start)
    with tempfile.TemporaryDirectory() as logdir:
        tf.profiler.experimental.start(logdir)
        for _ in range(steps):
            trainer.step()
        tf.profiler.experimental.stop()
        times = op_times(logdir)
    categories, ops = summarize(times, steps)
    walls.sort()
    return {"policy": trainer.precision, "wall_ms": 1e3 * walls[len(walls) // 2],
            "categories": categories, "total_ms": sum(categories.values()),
            "ops": [list(op) for op in ops[:200]]}


def _worker(connection, *args):
    try:
        connection.send(profile_policy(*args))
    except BaseException as error:
        connection.send({"error": repr(error)})
        raise


def run(preset="small", policies=("float32", "mixed_bfloat16"), tokens_per_batch=4096,
        seq_len=32, steps=2, warmup_steps=3, timed_steps=3, isolate=True):
    """`{policy: profile_policy(...)}`, each policy in its own spawned process."""
    results = {}
    for policy in policies:
        args = (preset, policy, tokens_per_batch, seq_len, steps, warmup_steps, timed_steps)
        if not isolate:
            results[policy] = profile_policy(*args)
            continue
        context = multiprocessing.get_context("spawn")
        parent, child = context.Pipe()
        process = context.Process(target=_worker, args=(child, *args), daemon=True)
        process.start()
        message = parent.recv()
        process.join(30)
        if "error" in message:
            raise RuntimeError(f"profiling {policy} failed: {message['error']}")
        results[policy] = message
    return results


def format_table(results):
    """The category table: ms of op time per update and share, one column pair per policy."""
    policies = list(results)
    header = f"{'':30s}" + "".join(f" {p[-14:]:>14s} {'share':>6s}" for p in policies)
    lines = [header, "-" * len(header)]
    for category in CATEGORY_NAMES:
        row = f"{category:30s}"
        for p in policies:
            ms, total = results[p]["categories"][category], results[p]["total_ms"]
            row += f" {ms:11.1f} ms {100 * ms / total:5.1f}%"
        lines.append(row)
    lines.append("-" * len(header))
    lines.append(f"{'op time per update':30s}" + "".join(
        f" {results[p]['total_ms']:11.1f} ms {'':6s}" for p in policies))
    lines.append(f"{'wall time per update':30s}" + "".join(
        f" {results[p]['wall_ms']:11.1f} ms {'':6s}" for p in policies))
    if len(policies) > 1:
        first = results[policies[0]]
        for p in policies[1:]:
            lines.append(f"{p} over {policies[0]}: {first['wall_ms'] / results[p]['wall_ms']:.2f}x "
                         "updates per second (wall time, one run each, not alternated: "
                         "benchmark_training.py measures that)")
    return "\n".join(lines)


def format_top(results, count):
    lines = []
    for policy, result in results.items():
        lines.append(f"\nthe {count} costliest ops under {policy} (ms of op time per update):")
        for ms, name, kind in result["ops"][:count]:
            lines.append(f"  {ms:7.1f}  {categorize(name, kind):28s} {kind:22s} {name}")
    return "\n".join(lines)


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--preset", default="small")
    parser.add_argument("--policies", nargs="+", default=["float32", "mixed_bfloat16"],
                        choices=("float32", "mixed_bfloat16", "mixed_float16"))
    parser.add_argument("--tokens-per-batch", type=int, default=4096)
    parser.add_argument("--seq-len", type=int, default=32)
    parser.add_argument("--steps", type=int, default=2, help="profiled updates")
    parser.add_argument("--warmup-steps", type=int, default=3)
    parser.add_argument("--top", type=int, default=0, help="also list the costliest ops")
    parser.add_argument("--json", default=None, help="also write the results here")
    args = parser.parse_args(argv)
    if os.environ.get("KERAS_BACKEND", "tensorflow") != "tensorflow":
        raise SystemExit("profile_training_step.py profiles TensorFlow ops: run it with "
                         "KERAS_BACKEND=tensorflow (or unset)")
    print(f"{args.preset} preset, {args.tokens_per_batch} target tokens per batch "
          f"(seq len {args.seq_len}), {args.steps} profiled updates per policy", flush=True)
    results = run(args.preset, args.policies, args.tokens_per_batch, args.seq_len,
                  args.steps, args.warmup_steps)
    print(format_table(results))
    if args.top:
        print(format_top(results, args.top))
    if args.json:
        with open(args.json, "w") as f:
            json.dump(results, f)
    return results


if __name__ == "__main__":
    main()
