"""Concurrent batches on one model: what TF Serving's `num_batch_threads` buys.

    python examples/benchmark_serving_threads.py --model saved_models/multi30k/1 \
        --input ../shared/data/multi30k/test.en --threads 1 2 --rounds 3

TF Serving with `--enable_batching` runs up to `num_batch_threads` batches
at once, all in the one TensorFlow runtime of the server process (sharing
its intra-op thread pool). This script does the same in one process: it
loads the SavedModel with TensorFlow and TensorFlow Text (as the model
server does), replays its warm-up requests, and then, in rounds, for each
of `--threads` T (the order alternating between rounds), sends the input's
sentences as requests of `--batch-size` sentences from T threads at once.
It prints, per T, the median over rounds of sentences/s and of the requests'
p50 and p90 latency, and fails if concurrent requests are answered
differently from the same requests sent one at a time. `docs/serving.md`
("Batching") uses it to choose `num_batch_threads`.
"""

import argparse
import os
import statistics
import sys
import threading
import time

EXAMPLES = os.path.dirname(os.path.abspath(__file__))
REPO_ROOT = os.path.dirname(EXAMPLES)
for _path in (REPO_ROOT, EXAMPLES):
    if _path not in sys.path:
        sys.path.insert(0, _path)

from benchmark_decoding import percentile  # noqa: E402 (imports no framework)


def parse_args(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", required=True, help="a SavedModel version folder")
    parser.add_argument("--input", required=True, help="sentences, one per line")
    parser.add_argument("--signature", default="serving_default",
                        help="default serving_default (beam search)")
    parser.add_argument("--batch-size", type=int, default=32,
                        help="sentences per request (default 32)")
    parser.add_argument("--threads", type=int, nargs="+", default=[1, 2],
                        help="concurrent requests to compare (default 1 2)")
    parser.add_argument("--max-sentences", type=int, help="only the first N sentences")
    parser.add_argument("--rounds", type=int, default=3, help="default 3")
    args = parser.parse_args(argv)
    if min(args.threads) < 1 or args.batch_size < 1 or args.rounds < 1 \
            or (args.max_sentences is not None and args.max_sentences < 1):
        parser.error("--threads, --batch-size, --rounds and --max-sentences must be positive")
    if not os.path.isfile(os.path.join(args.model, "saved_model.pb")):
        parser.error(f"{args.model} is not a SavedModel version folder (no saved_model.pb)")
    if not os.path.isfile(args.input):
        parser.error(f"{args.input} not found")
    return args


def serve(signature, requests, threads):
    """Sends `requests` from `threads` threads at once; (seconds, latencies, answers)."""
    import tensorflow as tf

    pending = list(reversed(list(enumerate(requests))))
    lock, latencies, answers = threading.Lock(), [], [None] * len(requests)

    def worker():
        while True:
            with lock:
                if not pending:
                    return
                index, request = pending.pop()
            start = time.perf_counter()
            answer = signature(text=tf.constant(request))["translation"].numpy().tolist()
            with lock:
                latencies.append(time.perf_counter() - start)
                answers[index] = answer

    workers = [threading.Thread(target=worker) for _ in range(threads)]
    start = time.perf_counter()
    for thread in workers:
        thread.start()
    for thread in workers:
        thread.join()
    return time.perf_counter() - start, latencies, answers


def main(argv=None):
    args = parse_args(argv)
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    import tensorflow as tf
    import tensorflow_text  # noqa: F401 - registers the SentencePiece ops

    with open(args.input, encoding="utf-8") as f:
        sentences = [line.rstrip("\r\n") for line in f][: args.max_sentences]
    requests = [sentences[i:i + args.batch_size]
                for i in range(0, len(sentences), args.batch_size)]
    start = time.perf_counter()
    from keras_transformer.files import native_stderr_silenced

    with native_stderr_silenced():  # tf-text's SentencePiece notice
        loaded = tf.saved_model.load(args.model)
    from keras_transformer.export.warmup import replay_warmup_requests  # reads the records

    replay_warmup_requests(args.model, loaded=loaded)
    print(f"loaded and warmed up in {time.perf_counter() - start:.1f} s", flush=True)
    signature = loaded.signatures[args.signature]
    # Every shape once more, untimed; one request at a time gives the reference answers.
    _, _, reference = serve(signature, requests, 1)
    figures = {threads: [] for threads in args.threads}
    for index in range(args.rounds):
        order = args.threads if index % 2 == 0 else list(reversed(args.threads))
        for threads in order:
            seconds, latencies, answers = serve(signature, requests, threads)
            if answers != reference:
                raise SystemExit(f"benchmark_serving_threads.py: error: {threads} requests "
                                 "at once answered differently from one at a time")
            figures[threads].append((len(sentences) / seconds, percentile(latencies, 50),
                                     percentile(latencies, 90)))
            print(f"round {index + 1}/{args.rounds}, {threads} at once: "
                  f"{len(sentences) / seconds:.2f} sentences/s", flush=True)
    print(f"\n{len(sentences)} sentences in requests of {args.batch_size}, "
          f"{args.signature}, {args.rounds} round(s)")
    print("| requests at once | sentences/s (median) | min-max | request p50 ms | "
          "request p90 ms |")
    print("|---|---|---|---|---|")
    for threads, rows in figures.items():
        speeds = [row[0] for row in rows]
        print(f"| {threads} | {statistics.median(speeds):.2f} | {min(speeds):.2f}-"
              f"{max(speeds):.2f} | {1000 * statistics.median(r[1] for r in rows):.0f} | "
              f"{1000 * statistics.median(r[2] for r in rows):.0f} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
