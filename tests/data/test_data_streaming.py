"""Tests of keras_transformer.data.streaming: buckets, budgets, replicas, fit on every backend.

What one pass of `PreparedCorpus.dataset` holds (every pair once, as
SentencePiece's Python API encodes it; the length policy; BOS/EOS layout) is
tested in test_data_prepared.py, on the same batcher.
"""

import json
import os
import subprocess
import sys
import textwrap

import numpy as np
import pytest

import keras_transformer
from keras_transformer.data import bucket_batch_sizes, bucket_boundaries, write_parallel_text
from keras_transformer.data import preparation
from keras_transformer.data.demo import generate_pairs

REPO_ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def _prepare_demo(folder, num_pairs, vocab_size=500):
    """`num_pairs` demo pairs written as text and prepared (the in-memory pairs recipe)."""
    pairs = generate_pairs(num_pairs, seed=3)
    for split, part in (("train", pairs), ("valid", pairs[:50]), ("test", pairs[:5])):
        write_parallel_text(part, folder / f"{split}.en", folder / f"{split}.de")
    return preparation.ensure_prepared(preparation.text_inputs(folder), folder / "prepared",
                                       vocab_size=vocab_size)


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
    return _prepare_demo(tmp_path_factory.mktemp("streaming"), 1500)


def test_bucket_boundaries_and_batch_sizes_are_pinned():
    assert bucket_boundaries(64) == [8, 16, 24, 32, 40, 48, 56, 64]
    assert bucket_boundaries(256) == [8, 16, 24, 32, 40, 48, 56, 64, 72, 80, 88, 104,
                                      120, 136, 152, 168, 192, 216, 240, 256]
    assert bucket_boundaries(5) == [5]
    assert bucket_boundaries(20, min_length=4, growth=2.0, multiple=4) == [4, 8, 16, 20]
    assert bucket_batch_sizes([8, 16, 24, 32], 100) == [12, 6, 4, 3]
    assert bucket_batch_sizes([8, 16, 24, 32], 100, num_replicas=2) == [12, 6, 4, 2]
    # The paper's 25,000 tokens and the base model's 256 positions.
    sizes = bucket_batch_sizes(bucket_boundaries(256), 25_000, num_replicas=8)
    assert sizes[0] == 3120 and sizes[-1] == 96
    assert all(size % 8 == 0 for size in sizes)


def test_bad_arguments_are_explained():
    with pytest.raises(ValueError, match="too small"):
        bucket_batch_sizes(bucket_boundaries(256), 100)
    with pytest.raises(ValueError, match="max_length must be a positive integer"):
        bucket_boundaries(0)
    with pytest.raises(ValueError, match="num_replicas must be a positive integer"):
        bucket_batch_sizes([8], 100, num_replicas=0)


def test_every_batch_is_a_bucket_shape_within_the_budget(corpus):
    boundaries = bucket_boundaries(48)
    sizes = dict(zip(boundaries, bucket_batch_sizes(boundaries, 600)))
    dataset = corpus.dataset("train", tokens_per_batch=600, max_length=48, training=True,
                             seed=0)
    shapes = set()
    for inputs, labels in dataset.as_numpy_iterator():
        source = inputs["source_ids"]
        assert source.shape == inputs["target_ids"].shape == labels.shape
        assert source.shape[1] in sizes and source.shape[0] == sizes[source.shape[1]]
        assert source.size <= 600
        shapes.add(source.shape)
    assert len(shapes) <= len(boundaries)


def test_a_finer_bucket_multiple_pads_less_and_the_plan_follows(corpus):
    from keras_transformer.data import corpora

    # Bounds grow by 10% (rounded up to the multiple), at least by the multiple.
    assert bucket_boundaries(48, multiple=2) == [8, 10, 12, 14, 16, 18, 20, 22, 26, 30, 34,
                                                 38, 42, 48]
    measured = {}
    for multiple in (8, 2):
        bounds = set(bucket_boundaries(48, multiple=multiple))
        train_ds, _, per_update = corpora.training_datasets(
            corpus, tokens_per_batch=600, max_length=48, seed=0, bucket_multiple=multiple)
        tokens = slots = batches = 0
        for inputs, labels in train_ds.take(300).as_numpy_iterator():
            assert labels.shape[1] in bounds and inputs["source_ids"].shape == labels.shape
            tokens += int((labels != 0).sum())
            slots += labels.size
            batches += 1
        # The plan's expected non-pad target tokens per update (from the
        # manifest's histograms) is what the batches hold.
        assert per_update == pytest.approx(tokens / batches, rel=0.05)
        measured[multiple] = tokens / slots
    assert measured[2] > measured[8] + 0.05


@pytest.mark.slow
@pytest.mark.every_backend
def test_feeds_model_fit_on_the_current_backend(corpus):
    dataset = corpus.dataset("train", tokens_per_batch=512, max_length=32, training=True,
                             seed=0, repeat=True)
    model = keras_transformer.build_model(
        preset="tiny", vocab_size=corpus.vocab_size, num_layers=1, d_model=32,
        num_heads=2, d_ff=64, max_length=32)
    keras_transformer.compile_model(model)
    history = model.fit(dataset, steps_per_epoch=3, epochs=1, verbose=0, shuffle=False)
    assert np.isfinite(history.history["loss"][-1])


_DISTRIBUTE_SCRIPT = textwrap.dedent("""
    import json, pathlib, sys
    import tensorflow as tf
    cpu = tf.config.list_physical_devices("CPU")[0]
    tf.config.set_logical_device_configuration(
        cpu, [tf.config.LogicalDeviceConfiguration()] * 2)
    from keras_transformer.data.prepared import PreparedCorpus
    corpus = PreparedCorpus(sys.argv[1])
    strategy = tf.distribute.MirroredStrategy(["/cpu:0", "/cpu:1"])
    dataset = corpus.dataset("train", tokens_per_batch=512, max_length=32, training=True,
                             seed=0, num_replicas=strategy.num_replicas_in_sync)
    batches = []
    for inputs, labels in strategy.experimental_distribute_dataset(dataset):
        local = [x.shape.as_list() for x in strategy.experimental_local_results(labels)]
        total = strategy.reduce("SUM", strategy.run(
            lambda x: tf.reduce_sum(tf.cast(x["source_ids"] != 0, tf.int32)),
            args=(inputs,)), axis=None)
        batches.append({"local": local, "source_tokens": int(total)})
    print(json.dumps({"replicas": strategy.num_replicas_in_sync, "batches": batches}))
""")


@pytest.mark.slow
def test_distributes_over_two_replicas(tmp_path):
    # Logical devices must be configured before TensorFlow initialises them,
    # so this runs in a fresh interpreter.
    corpus = _prepare_demo(tmp_path, 400)
    env = dict(os.environ, KERAS_BACKEND="tensorflow", TF_CPP_MIN_LOG_LEVEL="2",
               PYTHONPATH=REPO_ROOT + os.pathsep + os.environ.get("PYTHONPATH", ""))
    result = subprocess.run(
        [sys.executable, "-c", _DISTRIBUTE_SCRIPT, str(corpus.directory)],
        capture_output=True, text=True, env=env, timeout=300)
    assert result.returncode == 0, result.stderr[-3000:]
    report = json.loads(result.stdout.strip().splitlines()[-1])
    assert report["replicas"] == 2 and report["batches"]
    for batch in report["batches"]:
        (batch_a, length_a), (batch_b, length_b) = batch["local"]
        assert batch_a == batch_b >= 1 and length_a == length_b  # split evenly
        assert (batch_a + batch_b) * length_a <= 512
        assert batch["source_tokens"] > 0
