"""Serving latency: the exported SavedModel's `serving_default` vs the in-process Translator.

Builds a `small`-preset model with random weights and a SentencePiece
tokenizer trained on a sample of the demo corpus, exports it with
`keras_transformer.export_saved_model` (beam 4, alpha 0.6), loads the export
the way a model server does (TensorFlow + TensorFlow Text only) and prints,
for batches of 1 and 32 English demo sentences, the p50 / p95 latency of one
call and the sentences/s of

- `saved_model`: the loaded `serving_default` signature (tokenize, cached
  beam search, detokenize, all graph ops, no XLA: what TF Serving runs);
- `translator`: `Translator.translate` in this process (XLA-compiled search
  under TensorFlow and JAX, eager under PyTorch; tokenization in Python
  around it).

Random weights rarely choose EOS, so every sentence decodes to its length
limit (source length + `--max-extra-length`): the figures are for the
longest outputs a sentence can have. Warm-up calls (tracing, XLA
compilation, the SavedModel's first call of each shape bucket) are excluded.

Usage:

    python examples/benchmark_serving.py
    python examples/benchmark_serving.py --max-extra-length 20 --calls 10
    KERAS_BACKEND=jax python examples/benchmark_serving.py  # Translator under JAX
"""

import argparse
import os
import sys
import tempfile
import time

# Run from a checkout without installing the package.
REPO_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if REPO_ROOT not in sys.path:
    sys.path.insert(0, REPO_ROOT)


def parse_args(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--preset", default="small")
    parser.add_argument("--vocab-size", type=int, default=1000,
                        help="tokenizer vocabulary, trained on the demo sample")
    parser.add_argument("--max-length", type=int, default=64,
                        help="config.max_length = max_source_length of the export")
    parser.add_argument("--max-extra-length", type=int, default=30)
    parser.add_argument("--beam-size", type=int, default=4)
    parser.add_argument("--alpha", type=float, default=0.6)
    parser.add_argument("--batch-sizes", type=int, nargs="+", default=[1, 32])
    parser.add_argument("--calls", type=int, default=12,
                        help="timed calls per batch size and path")
    parser.add_argument("--output-dir", help="keep the export here (default: a temp folder)")
    return parser.parse_args(argv)


def percentile(values, q):
    values = sorted(values)
    index = min(len(values) - 1, max(0, round(q / 100 * (len(values) - 1))))
    return values[index]


def time_calls(fn, batches):
    latencies = []
    for batch in batches:
        start = time.perf_counter()
        fn(batch)
        latencies.append(time.perf_counter() - start)
    return latencies


def main(argv=None):
    args = parse_args(argv)
    import keras
    import tensorflow as tf

    from keras_transformer.config import TransformerConfig
    from keras_transformer.data import generate_pairs, train_tokenizer
    from keras_transformer.export import export_saved_model
    from keras_transformer.model import build_model
    from keras_transformer.translate import Translator

    work = tempfile.TemporaryDirectory(prefix="kt_bench_serving_")
    out_dir = args.output_dir or work.name
    start = time.time()
    pairs = generate_pairs(3000, seed=0)
    sample = os.path.join(work.name, "sample.txt")
    with open(sample, "w", encoding="utf-8") as f:
        f.writelines(f"{en}\n{de}\n" for en, de in pairs)
    tokenizer = train_tokenizer([sample], args.vocab_size,
                                os.path.join(work.name, "spm.model"))
    keras.utils.set_random_seed(0)
    config = TransformerConfig.preset(args.preset, vocab_size=tokenizer.vocabulary_size(),
                                      max_length=args.max_length, dropout=0.0)
    model = build_model(config)
    translator = Translator(model, tokenizer, batch_size=max(args.batch_sizes),
                            max_extra_length=args.max_extra_length)
    print(f"Keras {keras.__version__} ({keras.backend.backend()}), TensorFlow "
          f"{tf.__version__}; preset {args.preset}: {model.count_params():,} parameters, "
          f"vocabulary {config.vocab_size}; beam {args.beam_size}, alpha {args.alpha}, "
          f"outputs up to source + {args.max_extra_length} tokens")

    t = time.time()
    path = export_saved_model(translator, out_dir, beam_size=args.beam_size, alpha=args.alpha,
                              batch_buckets=tuple(sorted(set(args.batch_sizes))),
                              overwrite=True, version=1)
    export_seconds = time.time() - t
    t = time.time()
    import tensorflow_text  # noqa: F401  (registers the SentencePiece ops)

    loaded = tf.saved_model.load(str(path))
    serving_default = loaded.signatures["serving_default"]
    load_seconds = time.time() - t
    print(f"Exported to {path} in {export_seconds:.0f} s; loaded in {load_seconds:.1f} s")

    sentences = [en for en, _ in generate_pairs(400, seed=1)]

    def run_saved_model(batch):
        return serving_default(text=tf.constant(batch))["translation"].numpy()

    def run_translator(batch):
        return translator.translate(batch, beam_size=args.beam_size, alpha=args.alpha)

    rows = []
    for batch_size in args.batch_sizes:
        batches = [sentences[(i * batch_size) % len(sentences):][:batch_size]
                   for i in range(args.calls)]
        batches = [b if len(b) == batch_size else sentences[:batch_size] for b in batches]
        for name, fn in (("saved_model", run_saved_model), ("translator", run_translator)):
            t = time.time()
            for batch in batches:  # warm-up: every shape the timed calls use
                fn(batch)
            warmup = time.time() - t
            latencies = time_calls(fn, batches)
            rows.append((name, batch_size, percentile(latencies, 50) * 1000,
                         percentile(latencies, 95) * 1000,
                         batch_size * len(latencies) / sum(latencies), warmup))

    print(f"\n{'path':12s} {'batch':>5s} {'p50 ms':>9s} {'p95 ms':>9s} "
          f"{'sent/s':>8s} {'warm-up s':>10s}")
    for name, batch_size, p50, p95, rate, warmup in rows:
        print(f"{name:12s} {batch_size:5d} {p50:9.1f} {p95:9.1f} {rate:8.1f} {warmup:10.1f}")
    print(f"\n{args.calls} timed calls per row after a warm-up pass over the same batches; "
          f"total {time.time() - start:.0f} s")
    work.cleanup()


if __name__ == "__main__":
    main()
