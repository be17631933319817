"""The paper-scale data path, measured: prepare, start-up, streaming, memory.

On a WMT14-size corpus (4.5M pairs, 1.3 GB of text; made by
`examples/make_wmt_size_corpus.py` from the real data in ../shared/data
unless `--corpus` names a text folder), in one run, each step in its own
process so that each peak memory is its own:

1. **prepare**: `keras-transformer prepare --preset small` (vocabulary of
   8,000 trained on a 2M-sentence sample, every pair encoded once into
   shuffled shards): wall time, peak RSS (target <= 4 GiB), bytes on disk;
2. **the streaming pipeline alone** (`PreparedCorpus.dataset`, as training
   reads it: interleaved shards, shuffle buffer, windowed bucketing, batch
   shuffle, prefetch; one iterator of the repeated dataset, as `fit` reads
   it) for two whole epochs: non-pad target tokens/s of each epoch (target
   >= 1,000,000 on 2 cores, the first epoch as fast as the second) and the
   resident memory after 1,000 and after 10,000 batches (target: within 10%);
3. with `--subword-sampling ALPHA`, **sampled segmentations**
   (`keras_transformer.data.sampling`): the seconds and bytes of writing
   `--sampling-views` of them, then the same pipeline reading them (a view
   per epoch): pairs/s and tokens/s beside the deterministic pipeline's;
4. **start-up**: seconds from launching `keras-transformer train --data
   <prepared> --preset small` in a fresh run folder to the end of its first
   optimizer update (target <= 60 s); the process is stopped there.

The pipeline runs with the `base` preset's batches by default (25,000 tokens
per batch, `max_length` 256): what an accelerator training `base` consumes.
Prints a table of figures and targets; `--json FILE` also writes them.

Usage:

    python examples/benchmark_data.py --workdir /tmp/bench            # 4.5M pairs
    python examples/benchmark_data.py --workdir /tmp/b --pairs 200000 --epochs 1
    python examples/benchmark_data.py --corpus ../shared/data/multi30k --workdir /tmp/m \
        --tokens-per-batch 4096 --max-length 128 --epochs 4 --subword-sampling 0.1 \
        --skip-startup
"""

import argparse
import json
import os
import pathlib
import re
import resource
import shutil
import subprocess
import sys
import time

REPO_ROOT = pathlib.Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO_ROOT))
sys.path.insert(0, str(REPO_ROOT / "examples"))


def _env():
    return dict(os.environ, PYTHONPATH=os.pathsep.join(
        p for p in (str(REPO_ROOT), os.environ.get("PYTHONPATH", "")) if p),
        PYTHONUNBUFFERED="1", TF_CPP_MIN_LOG_LEVEL="2")


def current_rss_mib():
    """Resident memory now (not the peak), from /proc/self/statm."""
    with open("/proc/self/statm") as f:
        pages = int(f.read().split()[1])
    return pages * os.sysconf("SC_PAGE_SIZE") / 2**20


def folder_bytes(folder):
    return sum(p.stat().st_size for p in pathlib.Path(folder).rglob("*") if p.is_file())


def make_corpus(args):
    if args.corpus:
        return pathlib.Path(args.corpus), "given"
    import make_wmt_size_corpus

    folder = pathlib.Path(args.workdir) / f"wmt_size_{args.pairs}"
    marker = folder / ".complete"
    if not marker.exists():
        start = time.time()
        make_wmt_size_corpus.write_corpus(folder, args.pairs)
        marker.write_text("")
        print(f"Generated {folder} ({args.pairs:,} pairs) in {time.time() - start:.0f} s",
              flush=True)
    return folder, "generated"


def run_prepare(corpus, output, args):
    """`keras-transformer prepare` in a child process: seconds, peak RSS (MiB), bytes."""
    if output.exists() and not args.reuse_prepared:
        shutil.rmtree(output)
    command = [sys.executable, "-m", "keras_transformer", "prepare", "--data", str(corpus),
               "--preset", "small", "--prepared-dir", str(output)]
    start = time.time()
    result = subprocess.run(command, env=_env(), capture_output=True, text=True)
    seconds = time.time() - start
    if result.returncode:
        sys.exit(f"prepare failed:\n{result.stderr[-3000:]}")
    print(result.stdout.strip(), flush=True)
    # The largest RSS of any waited-for child so far: prepare is the first.
    peak = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss / 1024
    return {"seconds": seconds, "peak_rss_mib": peak, "bytes": folder_bytes(output)}


def pipeline_worker(prepared_dir, args):
    """Runs in its own process: the training pipeline as `fit` reads it, timed per epoch.

    One iterator of the repeated dataset, as in training. An epoch ends when
    the target tokens read reach a multiple of the tokens one pass holds (the
    manifest's count of the pairs the length policy keeps): windows straddle
    epochs, so the boundary is exact to a window.
    """
    from keras_transformer.data.prepared import PreparedCorpus

    corpus = PreparedCorpus(prepared_dir)
    sampled = None
    if args.subword_sampling:
        from keras_transformer.data.sampling import ensure_sampled

        sampled = ensure_sampled(corpus, alpha=args.subword_sampling,
                                 views=args.sampling_views)
    common = dict(tokens_per_batch=args.tokens_per_batch, max_length=args.max_length,
                  training=True, sampled=sampled)
    _, epoch_tokens = corpus.batch_plan("train", **common)
    dataset = corpus.dataset("train", seed=0, repeat=True, **common)
    batches, tokens, pairs, rss, epochs = 0, 0, 0, {}, []
    marks = {1_000, 2_000, 5_000, 10_000, 15_000, 20_000}
    start = epoch_start = time.perf_counter()
    epoch_batches = epoch_slots = 0
    for _, labels in dataset.as_numpy_iterator():
        real = int((labels != 0).sum())
        tokens += real
        pairs += int((labels[:, 0] != 0).sum())
        batches += 1
        epoch_batches += 1
        epoch_slots += labels.size
        if batches in marks:
            rss[batches] = current_rss_mib()
        if tokens >= epoch_tokens * (len(epochs) + 1):
            now = time.perf_counter()
            epochs.append({"batches": epoch_batches, "target_tokens": epoch_tokens,
                           "seconds": now - epoch_start,
                           "tokens_per_second": epoch_tokens / (now - epoch_start),
                           "padding": 1 - epoch_tokens / max(epoch_slots, 1)})
            epoch_start, epoch_batches, epoch_slots = now, 0, 0
            if len(epochs) == args.epochs:
                break
        if args.max_batches and batches >= args.max_batches:
            break
    seconds = time.perf_counter() - start
    print(json.dumps({"epochs": epochs, "rss_mib": rss, "batches": batches,
                      "target_tokens": tokens, "pairs": pairs, "seconds": seconds,
                      "tokens_per_second": tokens / seconds,
                      "pairs_per_second": pairs / seconds}))


def run_pipeline(prepared_dir, args, subword_sampling=0.0):
    command = [sys.executable, __file__, "--pipeline-worker", str(prepared_dir),
               "--tokens-per-batch", str(args.tokens_per_batch), "--max-length",
               str(args.max_length), "--epochs", str(args.epochs), "--max-batches",
               str(args.max_batches or 0), "--subword-sampling", str(subword_sampling),
               "--sampling-views", str(args.sampling_views)]
    result = subprocess.run(command, env=_env(), capture_output=True, text=True)
    if result.returncode:
        sys.exit(f"the pipeline worker failed:\n{result.stderr[-3000:]}")
    return json.loads(result.stdout.strip().splitlines()[-1])


def run_sampling(prepared_dir, args):
    """`--sampling-views` sampled segmentations written in a child process: seconds, bytes."""
    code = ("import sys; from keras_transformer.data import prepared, sampling; "
            "sampling.ensure_sampled(prepared.PreparedCorpus(sys.argv[1]), "
            "alpha=float(sys.argv[2]), views=int(sys.argv[3]))")
    from keras_transformer.data import sampling

    folder = pathlib.Path(prepared_dir) / sampling.folder_name(
        args.subword_sampling, args.sampling_views, 0)
    shutil.rmtree(folder, ignore_errors=True)
    start = time.time()
    result = subprocess.run([sys.executable, "-c", code, str(prepared_dir),
                             str(args.subword_sampling), str(args.sampling_views)],
                            env=_env(), capture_output=True, text=True)
    seconds = time.time() - start
    if result.returncode:
        sys.exit(f"writing the sampled segmentations failed:\n{result.stderr[-3000:]}")
    manifest = json.loads((folder / sampling.MANIFEST_FILE).read_text())
    base = json.loads((pathlib.Path(prepared_dir) / "manifest.json").read_text())
    tokens = sum(v["target_tokens"] for v in manifest["views"]) / len(manifest["views"])
    return {"seconds": seconds, "bytes": folder_bytes(folder),
            "tokens_ratio": tokens / base["splits"]["train"]["target_tokens"]}


def run_startup(prepared_dir, workdir):
    """Seconds from launching `train` to the log line of its first update."""
    run_dir = pathlib.Path(workdir) / "startup_run"
    shutil.rmtree(run_dir, ignore_errors=True)
    command = [sys.executable, "-m", "keras_transformer", "train", "--data",
               str(prepared_dir), "--preset", "small", "--train-steps", "100",
               "--log-every", "1", "--validation-bleu-sentences", "0", "--export-dir", "",
               "--output-dir", str(run_dir)]
    start = time.time()
    process = subprocess.Popen(command, env=_env(), stderr=subprocess.PIPE, text=True)
    lines = []
    try:
        for line in process.stderr:
            lines.append(line.rstrip())
            if re.search(r"\bupdate 1/100\b", line):
                return time.time() - start, lines
    finally:
        process.kill()
        process.wait()
    sys.exit("train ended before its first update:\n" + "\n".join(lines[-30:]))


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--workdir", help="corpus, preparation and run go here (required)")
    parser.add_argument("--corpus", help="a text folder instead of the generated corpus")
    parser.add_argument("--pairs", type=int, default=4_500_000)
    parser.add_argument("--reuse-prepared", action="store_true",
                        help="do not prepare again when the folder is up to date")
    parser.add_argument("--tokens-per-batch", type=int, default=25_000)
    parser.add_argument("--max-length", type=int, default=256)
    parser.add_argument("--epochs", type=int, default=2)
    parser.add_argument("--max-batches", type=int, default=0,
                        help="stop each pipeline epoch after this many batches (0: whole)")
    parser.add_argument("--subword-sampling", type=float, default=0.0, metavar="ALPHA",
                        help="also write sampled segmentations (BPE-dropout ALPHA) and "
                             "time the pipeline reading them")
    parser.add_argument("--sampling-views", type=int, default=4,
                        help="sampled segmentations written (default 4)")
    parser.add_argument("--skip-startup", action="store_true")
    parser.add_argument("--json", help="also write the figures here")
    parser.add_argument("--pipeline-worker", metavar="PREPARED",
                        help="only the streaming pipeline over this prepared folder, in "
                             "this process (--tokens-per-batch, --max-length, --epochs, "
                             "--max-batches), printed as JSON: what each step's worker runs")
    args = parser.parse_args(argv)
    if args.pipeline_worker:
        return pipeline_worker(args.pipeline_worker, args)
    if not args.workdir:
        parser.error("--workdir is required")

    workdir = pathlib.Path(args.workdir)
    workdir.mkdir(parents=True, exist_ok=True)
    corpus, origin = make_corpus(args)
    text_bytes = sum((corpus / f"train.{lang}").stat().st_size for lang in ("en", "de"))
    prepared_dir = workdir / f"prepared_{corpus.name}"
    prepare = run_prepare(corpus, prepared_dir, args)
    manifest = json.loads((prepared_dir / "manifest.json").read_text())
    pipeline = run_pipeline(prepared_dir, args)
    sampled = sampled_pipeline = None
    if args.subword_sampling:
        sampled = run_sampling(prepared_dir, args)
        sampled_pipeline = run_pipeline(prepared_dir, args, args.subword_sampling)
    startup = None if args.skip_startup else run_startup(prepared_dir, workdir)[0]

    train = manifest["splits"]["train"]
    print()
    print(f"Corpus: {corpus} ({origin}), {train['pairs']:,} training pairs, "
          f"{text_bytes / 2**30:.2f} GiB of text; {os.cpu_count()} CPU cores")
    rows = [("prepare: wall time", f"{prepare['seconds']:.0f} s", ""),
            ("prepare: peak RSS", f"{prepare['peak_rss_mib']:,.0f} MiB", "<= 4,096 MiB"),
            ("prepare: bytes on disk", f"{prepare['bytes'] / 2**20:,.0f} MiB "
             f"({len(train['shards'])} shards)", "")]
    for number, epoch in enumerate(pipeline["epochs"], start=1):
        rows.append((f"pipeline epoch {number}: target tokens/s",
                     f"{epoch['tokens_per_second']:,.0f} ({epoch['batches']:,} batches, "
                     f"{epoch['seconds']:.0f} s, padding {epoch['padding']:.1%})",
                     ">= 1,000,000"))
    if not pipeline["epochs"]:
        rows.append(("pipeline: target tokens/s", f"{pipeline['tokens_per_second']:,.0f} "
                     f"({pipeline['batches']:,} batches)", ">= 1,000,000"))
    rows.append(("pipeline: pairs/s, target tokens/s (all epochs)",
                 f"{pipeline['pairs_per_second']:,.0f}, {pipeline['tokens_per_second']:,.0f}",
                 ""))
    if sampled:
        rows.append((f"sampling: {args.sampling_views} views written",
                     f"{sampled['seconds']:.0f} s, {sampled['bytes'] / 2**20:,.0f} MiB, "
                     f"{sampled['tokens_ratio']:.2f}x the target tokens", ""))
        rows.append(("pipeline, sampled: pairs/s, target tokens/s",
                     f"{sampled_pipeline['pairs_per_second']:,.0f}, "
                     f"{sampled_pipeline['tokens_per_second']:,.0f} "
                     f"({sampled_pipeline['pairs_per_second'] / pipeline['pairs_per_second']:.2f}x"
                     " the pairs/s)", ""))
    rss = pipeline["rss_mib"]
    if "1000" in rss and "10000" in rss:
        growth = rss["10000"] / rss["1000"] - 1
        rows.append(("pipeline RSS after 1,000 / 10,000 batches",
                     f"{rss['1000']:,.0f} / {rss['10000']:,.0f} MiB ({growth:+.1%})",
                     "within 10%"))
        rows.append(("pipeline RSS at " + " / ".join(f"{int(k):,}" for k in rss)
                     + " batches", " / ".join(f"{v:,.0f}" for v in rss.values()) + " MiB",
                     ""))
    if startup is not None:
        rows.append(("start-up: launch to first update", f"{startup:.1f} s", "<= 60 s"))
    width = max(len(r[0]) for r in rows)
    for name, value, target in rows:
        print(f"  {name:<{width}}  {value:<48} {('target ' + target) if target else ''}")
    print(f"(pipeline batches: {args.tokens_per_batch} tokens, max_length {args.max_length})")
    if args.json:
        pathlib.Path(args.json).write_text(json.dumps(
            {"corpus": str(corpus), "pairs": train["pairs"], "text_bytes": text_bytes,
             "prepare": prepare, "pipeline": pipeline, "startup_seconds": startup,
             "sampling": sampled, "sampled_pipeline": sampled_pipeline,
             "tokens_per_batch": args.tokens_per_batch, "max_length": args.max_length},
            indent=1))


if __name__ == "__main__":
    main()
