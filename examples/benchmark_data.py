"""Is the input pipeline fast enough? Pipeline throughput vs. what training consumes.

Measures, on one corpus:

1. the tf.data pipeline of `keras_transformer.data.make_dataset` alone, in
   sentence pairs and tokens per second: the first training epoch (tokenize,
   length policy, shuffle, bucket, pad, batch) and the next one (tokenized
   ids cached in memory);
2. what `model.fit` of the tiny preset consumes on the current Keras backend,
   in target tokens per second, on batches cached in memory (so the pipeline
   is not part of the measurement), after an epoch that compiles every shape.

The pipeline should deliver at least 3x what training consumes (compared on
the slower, first epoch; the script exits with 1 otherwise). Both run on
the same CPU here; on an accelerator training is faster, so rerun it there.

Usage:

    python examples/benchmark_data.py                 # Multi30k if present, else demo
    python examples/benchmark_data.py --data demo --tokens-per-batch 4096
    KERAS_BACKEND=jax python examples/benchmark_data.py
"""

import argparse
import os
import pathlib
import sys
import tempfile
import time

REPO_ROOT = pathlib.Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO_ROOT))

import keras  # noqa: E402
import tensorflow as tf  # noqa: E402

import keras_transformer  # noqa: E402
from keras_transformer import data  # noqa: E402
from keras_transformer.data import demo  # noqa: E402

SHARED_DATA = pathlib.Path(
    os.environ.get("KT_SHARED_DATA", REPO_ROOT.parent / "shared" / "data"))


def corpus_paths(name, workdir):
    """(source_path, target_path, description) of the training corpus."""
    multi30k = SHARED_DATA / "multi30k"
    if name in ("auto", "multi30k") and (multi30k / "train.en").exists():
        return multi30k / "train.en", multi30k / "train.de", f"Multi30k train ({multi30k})"
    if name == "multi30k":
        sys.exit(f"Multi30k not found under {SHARED_DATA}; set KT_SHARED_DATA or use --data demo")
    paths = demo.write_demo_corpus(pathlib.Path(workdir) / "demo", seed=0)
    return (*paths["train"], "demo corpus (generated, 50,000 train pairs)")


def time_pipeline(pairs, tokenizer, args):
    """Statistics and seconds of the first epoch (tokenizes) and the second (cached ids)."""
    dataset = data.make_dataset(pairs, tokenizer, tokens_per_batch=args.tokens_per_batch,
                                max_length=args.max_length, training=True, seed=0)
    seconds = []
    for _ in range(2):
        start = time.perf_counter()
        stats = data.batch_statistics(dataset)
        seconds.append(time.perf_counter() - start)
    return dataset, stats, seconds


class _EpochTimer(keras.callbacks.Callback):
    def on_epoch_begin(self, epoch, logs=None):
        self.start = time.perf_counter()

    def on_epoch_end(self, epoch, logs=None):
        self.seconds = time.perf_counter() - self.start


def time_training(dataset, vocab_size, num_batches):
    """Target tokens/s that `model.fit` of the tiny preset consumes."""
    batches = list(dataset.take(num_batches).as_numpy_iterator())
    target_tokens = sum(int((inputs["target_ids"] != 0).sum()) for inputs, _ in batches)

    def cached():  # the batches, from memory, with a known number of steps
        dataset = tf.data.Dataset.from_tensors(batches[0])
        for batch in batches[1:]:
            dataset = dataset.concatenate(tf.data.Dataset.from_tensors(batch))
        return dataset

    model = keras_transformer.build_model(preset="tiny", vocab_size=vocab_size)
    keras_transformer.compile_model(model)
    model.fit(cached(), epochs=1, verbose=0, shuffle=False)  # compiles every shape
    timer = _EpochTimer()
    model.fit(cached(), epochs=1, verbose=0, shuffle=False, callbacks=[timer])
    return target_tokens, len(batches), timer.seconds


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--data", choices=("auto", "multi30k", "demo"), default="auto")
    parser.add_argument("--vocab-size", type=int, default=8000)
    parser.add_argument("--tokens-per-batch", type=int, default=4096)
    parser.add_argument("--max-length", type=int, default=64)
    parser.add_argument("--train-batches", type=int, default=16,
                        help="batches timed in model.fit (after a compile epoch)")
    args = parser.parse_args(argv)

    with tempfile.TemporaryDirectory() as workdir:
        source_path, target_path, description = corpus_paths(args.data, workdir)
        start = time.perf_counter()
        pairs = data.load_parallel_text(source_path, target_path)
        tokenizer = data.train_tokenizer([source_path, target_path], args.vocab_size,
                                         pathlib.Path(workdir) / "bench.model")
        prepare = time.perf_counter() - start
        print(f"corpus: {description}: {len(pairs)} pairs "
              f"(read + tokenizer training, vocab {tokenizer.vocabulary_size()}: {prepare:.1f} s)")
        counts = data.count_length_policy(pairs, tokenizer, args.max_length)
        print(f"length policy (max_length={args.max_length}): training drops "
              f"{counts.num_over_long} of {counts.num_pairs} pairs")

        dataset, stats, seconds = time_pipeline(pairs, tokenizer, args)
        tokens = stats.source_tokens + stats.target_tokens
        print(f"pipeline: {stats.num_pairs} pairs, {stats.num_batches} batches per epoch "
              f"(tokens_per_batch={args.tokens_per_batch}, {len(stats.shapes)} shapes, "
              f"padding {stats.padding_fraction:.1%})")
        for name, epoch_seconds in zip(("first epoch (tokenizes)", "next epochs (cached)"),
                                       seconds):
            print(f"  {name}: {epoch_seconds:.2f} s: "
                  f"{stats.num_pairs / epoch_seconds:,.0f} pairs/s, "
                  f"{tokens / epoch_seconds:,.0f} tokens/s (source+target), "
                  f"{stats.target_tokens / epoch_seconds:,.0f} target tokens/s")
        # The verdict uses the slower, first epoch.
        pipeline_target = stats.target_tokens / max(seconds)

        target_tokens, num_batches, train_seconds = time_training(
            dataset, tokenizer.vocabulary_size(), args.train_batches)
        training_target = target_tokens / train_seconds
        print(f"training: tiny preset, backend {keras.backend.backend()}: "
              f"{num_batches} steps in {train_seconds:.2f} s: "
              f"{num_batches / train_seconds:.2f} steps/s, "
              f"{training_target:,.0f} target tokens/s")
        ratio = pipeline_target / training_target
        verdict = "OK" if ratio >= 3 else "BOTTLENECK (< 3x)"
        print(f"pipeline (first epoch) / training, target tokens/s: {ratio:.1f}x -> {verdict}")
    return 0 if ratio >= 3 else 1


if __name__ == "__main__":
    sys.exit(main())
