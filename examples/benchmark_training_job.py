r"""The training job's updates beside its bare training step's, on the job's own batches.

`benchmark_training.py` times one training step on a synthetic batch of one
shape without padding; a job's tokens/s (its log lines, `results.json`)
count the non-pad target tokens of bucketed, padded batches of many shapes,
fed by the streaming tf.data pipeline, with the job's callbacks after each
update. This script separates those parts for one config (`--config`, a
`train` config file), in one process, in alternating rounds (the order flips
every round), and prints the median of each:

- `bare step`: `model.train_on_batch` on the job's first `--updates`
  batches held in memory: no input pipeline, no callbacks;
- `job`: `job.fit`, the job's training stage itself: its streaming
  pipeline (built again with the job's seed each round, so the same batches)
  and its callbacks (update clock, log rows, checkpoints and backups into a
  temporary run folder, divergence check, signal handler); validation off
  (its cost is in a job's `results.json`: `train_seconds` includes it,
  `step_seconds` does not);
- `job, bucket multiple M` for each `--bucket-multiple` M other than the
  config's: the same with other length buckets (other batches: the same
  token slots per update, more or fewer of them padding);
- `bare step, P` and `job, P` with `--mixed-precision P` (e.g.
  `mixed_bfloat16`): the same on a second model built under that dtype
  policy (the config's own `mixed_precision` is ignored: the first model
  is float32), on the same batches.

Per variant: seconds per update (the first update of a round is left out:
the shuffle buffer fills then), non-pad target tokens per update (counted in
the batches) and their ratio, target tokens/s. The machine's float32
matmul GFLOP/s (`benchmark_training.matmul_peak_gflops`) is printed first.
All variants train the same model in turn, so the figures share the
machine's state; a busy machine still moves them, so compare within a run.

Usage (the figures of docs/results.md: round 1's recipe, buckets in steps of 8, against 2;
the recipe's updates in float32 and in bf16):

    python examples/benchmark_training_job.py --config configs/multi30k_search/small.toml \
        --bucket-multiple 2 --updates 50 --rounds 3
    python examples/benchmark_training_job.py --config configs/multi30k.toml \
        --mixed-precision mixed_bfloat16 --updates 50 --rounds 3
"""

import argparse
import dataclasses
import os
import pathlib
import statistics
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))


def parse_args(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--config", required=True, help="a `train` config file")
    parser.add_argument("--bucket-multiple", type=int, nargs="*", default=[],
                        help="other length-bucket multiples to time the job with")
    parser.add_argument("--mixed-precision", choices=("mixed_bfloat16", "mixed_float16"),
                        help="also time the bare step and the job under this dtype policy")
    parser.add_argument("--updates", type=int, default=50, help="timed updates per round")
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args(argv)
    if args.updates < 2 or args.rounds < 1:
        parser.error("--updates must be >= 2 and --rounds >= 1")
    if any(m < 1 for m in args.bucket_multiple):
        parser.error("--bucket-multiple values must be positive integers")
    if not pathlib.Path(args.config).is_file():
        parser.error(f"no config file {args.config}")
    return args


def main(argv=None):
    args = parse_args(argv)
    import keras
    import numpy as np
    from benchmark_training import matmul_peak_gflops

    from keras_transformer import runs
    from keras_transformer.data import corpora
    from keras_transformer.model.precision import policy_scope
    from keras_transformer.training import job
    from keras_transformer.training.optimization import build_training_model
    from keras_transformer.training.settings import load_settings
    from keras_transformer.training.strategy import plan_batches

    print(f"fp32 matmul: {matmul_peak_gflops():.0f} GFLOP/s (numpy, 2048 x 2048)", flush=True)
    scratch = pathlib.Path(tempfile.mkdtemp(prefix="benchmark_job_"))
    settings = load_settings(given={"output_dir": str(scratch / "settings")},
                             config_file=args.config)
    # The timed rounds: no validation, no log lines, no time-based backups.
    settings = dataclasses.replace(settings, train_steps=args.updates + 1,
                                   validate_every=10**9, log_every=10**9, backup_minutes=0.0)
    corpus = corpora.prepare_corpus(settings.data, vocab_size=settings.vocab_size,
                                    max_length=settings.max_length,
                                    prepared_dir=settings.prepared_dir)
    keras.utils.set_random_seed(settings.seed)
    config = settings.model_config(vocab_size=corpus.vocab_size)
    plan = plan_batches(settings.tokens_per_batch, max_length=settings.max_length)
    policies = [None] + ([args.mixed_precision] if args.mixed_precision else [])
    models = {}
    for policy in policies:
        with policy_scope(policy or "float32"):
            models[policy] = build_training_model(
                config, learning_rate_factor=settings.learning_rate_factor,
                jit_compile=settings.jit_compile)
    model = models[None]
    print(f"{args.config}: {model.count_params():,} parameters, {plan}", flush=True)

    multiples = [settings.bucket_multiple] + [
        m for m in args.bucket_multiple if m != settings.bucket_multiple]

    def datasets(multiple):
        return corpora.training_datasets(
            corpus, tokens_per_batch=plan.micro_batch_tokens, max_length=settings.max_length,
            seed=settings.seed, bucket_multiple=multiple)

    # What each variant trains on: updates 2..N+1 of a fresh pipeline.
    tokens = {}
    for multiple in multiples:
        batches = list(datasets(multiple)[0].take(args.updates + 1))
        labels = [np.asarray(y) for _, y in batches[1:]]
        tokens[multiple] = sum(int((y != 0).sum()) for y in labels) / args.updates
        slots = sum(y.size for y in labels) / args.updates
        shapes = len({y.shape for y in labels})
        print(f"bucket multiple {multiple}: {tokens[multiple]:,.0f} non-pad target tokens "
              f"per update ({tokens[multiple] / slots:.1%} of {slots:,.0f} slots), "
              f"{shapes} batch shapes", flush=True)
        if multiple == settings.bucket_multiple:
            in_memory = batches[1:]
        for x, y in batches:  # warm-up: traces (or compiles) every shape once
            for each in models.values():
                each.train_on_batch(x, y)

    class UpdateTimes(keras.callbacks.Callback):
        def __init__(self):
            super().__init__()
            self.times = []

        def on_train_batch_end(self, batch, logs=None):
            self.times.append(time.perf_counter())

    def bare_step(model):
        def timed():
            start = time.perf_counter()
            for x, y in in_memory:
                model.train_on_batch(x, y)
            return (time.perf_counter() - start) / args.updates
        return timed

    def job_run(multiple, model):
        def timed():
            train_ds, valid_ds, per_update = datasets(multiple)
            run = runs.RunFolder(tempfile.mkdtemp(dir=scratch))
            times = UpdateTimes()
            job.fit(model, run, dataclasses.replace(settings, bucket_multiple=multiple),
                    train_ds, valid_ds, start_update=0, tokens_per_update=per_update,
                    callbacks=[times])
            return (times.times[-1] - times.times[0]) / args.updates
        return timed

    variants = {"bare step": (bare_step(model), settings.bucket_multiple)}
    for multiple in multiples:
        name = "job" if multiple == settings.bucket_multiple else \
            f"job, bucket multiple {multiple}"
        variants[name] = (job_run(multiple, model), multiple)
    if args.mixed_precision:
        mixed = models[args.mixed_precision]
        variants[f"bare step, {args.mixed_precision}"] = (bare_step(mixed),
                                                          settings.bucket_multiple)
        variants[f"job, {args.mixed_precision}"] = (job_run(settings.bucket_multiple, mixed),
                                                    settings.bucket_multiple)
    seconds = {name: [] for name in variants}
    order = list(variants)
    for round_index in range(args.rounds):
        for name in (order if round_index % 2 == 0 else order[::-1]):
            function, multiple = variants[name]
            seconds[name].append(function())
            print(f"round {round_index + 1} {name}: {seconds[name][-1]:.3f} s/update, "
                  f"{tokens[multiple] / seconds[name][-1]:,.0f} target tokens/s", flush=True)

    print(f"\nmedians of {args.rounds} rounds of {args.updates} updates "
          f"(config bucket multiple {settings.bucket_multiple}):")
    print("| variant | s/update | non-pad target tokens/update | target tokens/s |")
    print("|---|---|---|---|")
    for name, (_, multiple) in variants.items():
        median = statistics.median(seconds[name])
        print(f"| {name} | {median:.3f} | {tokens[multiple]:,.0f} | "
              f"{tokens[multiple] / median:,.0f} |")
    if args.mixed_precision:
        for name in ("bare step", "job"):
            ratio = (statistics.median(seconds[name])
                     / statistics.median(seconds[f"{name}, {args.mixed_precision}"]))
            print(f"{name}: {args.mixed_precision} over float32 {ratio:.2f}x updates per "
                  "second (medians)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
