"""Tests of keras_transformer.data.pipeline: bucketing, budgets, shifting, length policy."""

import collections
import json
import os
import subprocess
import sys
import textwrap

import numpy as np
import pytest
import sentencepiece
import tensorflow as tf

import keras_transformer
from keras_transformer.data import (
    batch_statistics,
    bucket_batch_sizes,
    bucket_boundaries,
    count_length_policy,
    load_parallel_text,
    make_dataset,
    train_tokenizer,
)
from keras_transformer.data.demo import generate_pairs

REPO_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


@pytest.fixture(scope="module")
def demo_pairs():
    return generate_pairs(1500, seed=3)


@pytest.fixture(scope="module")
def tokenizer(demo_pairs, tmp_path_factory):
    folder = tmp_path_factory.mktemp("pipeline_tokenizer")
    for index, suffix in enumerate(("en", "de")):
        (folder / f"text.{suffix}").write_text(
            "\n".join(pair[index] for pair in demo_pairs) + "\n", encoding="utf-8")
    return train_tokenizer([folder / "text.en", folder / "text.de"], 500,
                           folder / "demo.model")


def _reference(tokenizer, pairs):
    """Encodings by the sentencepiece Python library (independent of the graph ops)."""
    processor = sentencepiece.SentencePieceProcessor(model_proto=tokenizer.model_proto)
    sources, targets = zip(*pairs)
    return processor.encode(list(sources)), processor.encode(list(targets))


def _rows(dataset):
    """Every row of every batch, padding removed: (source, target_in, labels) tuples."""
    rows = []
    for inputs, labels in dataset.as_numpy_iterator():
        for source, target, label in zip(inputs["source_ids"], inputs["target_ids"], labels):
            rows.append((tuple(source[source != 0]), tuple(target[target != 0]),
                         tuple(label[label != 0])))
    return rows


def _check_batch(inputs, labels, tokens_per_batch, boundaries):
    source, target = inputs["source_ids"], inputs["target_ids"]
    assert source.dtype == target.dtype == labels.dtype == np.int32
    assert target.shape == labels.shape
    assert source.size <= tokens_per_batch and target.size <= tokens_per_batch
    assert source.shape[1] in boundaries and target.shape[1] == source.shape[1]
    source_lengths = (source != 0).sum(1)
    target_lengths = (target != 0).sum(1)
    np.testing.assert_array_equal(target_lengths, (labels != 0).sum(1))
    rows = np.arange(len(source))
    # source = subwords + EOS; target_ids = BOS + subwords; labels = subwords + EOS.
    np.testing.assert_array_equal(source[rows, source_lengths - 1], 2)
    np.testing.assert_array_equal(target[:, 0], 1)
    np.testing.assert_array_equal(labels[rows, target_lengths - 1], 2)
    # Labels are target_ids shifted left by one on real tokens.
    shifted = np.where(labels[:, :-1] == 2, 0, labels[:, :-1])
    np.testing.assert_array_equal(shifted, target[:, 1:])
    # Padding is trailing only.
    for ids, lengths in ((source, source_lengths), (target, target_lengths)):
        assert ((np.arange(ids.shape[1]) < lengths[:, None]) == (ids != 0)).all()


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


def test_evaluation_keeps_every_pair_with_the_right_ids(tokenizer, demo_pairs):
    assert count_length_policy(demo_pairs, tokenizer, 128).num_over_long == 0
    dataset = make_dataset(demo_pairs, tokenizer, tokens_per_batch=1024, max_length=128,
                           training=False)
    boundaries = bucket_boundaries(128)
    for inputs, labels in dataset.as_numpy_iterator():
        _check_batch(inputs, labels, 1024, boundaries)
    sources, targets = _reference(tokenizer, demo_pairs)
    expected = collections.Counter(
        (tuple(s) + (2,), (1,) + tuple(t), tuple(t) + (2,)) for s, t in zip(sources, targets))
    assert collections.Counter(_rows(dataset)) == expected


def test_full_batches_use_the_bucket_batch_size(tokenizer, demo_pairs):
    boundaries = [8, 16, 32, 48]
    sizes = dict(zip(boundaries, bucket_batch_sizes(boundaries, 600)))
    dataset = make_dataset(demo_pairs, tokenizer, tokens_per_batch=600, max_length=48,
                           training=True, boundaries=boundaries, seed=1)
    partial = collections.Counter()
    for inputs, labels in dataset.as_numpy_iterator():
        _check_batch(inputs, labels, 600, boundaries)
        batch, length = inputs["source_ids"].shape
        assert batch <= sizes[length]
        partial[length] += batch < sizes[length]
    assert all(count <= 1 for count in partial.values())  # one remainder per bucket


def test_training_drops_and_evaluation_truncates_over_long_pairs(tokenizer, demo_pairs):
    max_length = 16
    counts = count_length_policy(demo_pairs, tokenizer, max_length)
    sources, targets = _reference(tokenizer, demo_pairs)
    over_long = [len(s) + 1 > max_length or len(t) + 1 > max_length
                 for s, t in zip(sources, targets)]
    assert counts.num_pairs == len(demo_pairs)
    assert counts.num_over_long == sum(over_long) > 0
    assert counts.num_source_over_long == sum(len(s) + 1 > max_length for s in sources)
    assert counts.source_tokens == sum(len(s) + 1 for s in sources)
    assert counts.target_tokens == sum(len(t) + 1 for t in targets)

    training = make_dataset(demo_pairs, tokenizer, tokens_per_batch=256,
                            max_length=max_length, training=True, seed=0)
    kept = collections.Counter(
        (tuple(s) + (2,), (1,) + tuple(t), tuple(t) + (2,))
        for s, t, long_ in zip(sources, targets, over_long) if not long_)
    assert collections.Counter(_rows(training)) == kept
    assert counts.num_kept_for_training == sum(kept.values())

    evaluation = make_dataset(demo_pairs, tokenizer, tokens_per_batch=256,
                              max_length=max_length, training=False)
    cut = max_length - 1
    truncated = collections.Counter(
        (tuple(s[:cut]) + (2,), (1,) + tuple(t[:cut]), tuple(t[:cut]) + (2,))
        for s, t in zip(sources, targets))
    assert collections.Counter(_rows(evaluation)) == truncated


def test_pad_to_batch_max(tokenizer, demo_pairs):
    dataset = make_dataset(demo_pairs, tokenizer, tokens_per_batch=512, max_length=48,
                           training=True, seed=0, pad_to_bucket_boundary=False)
    padded_to_boundary = batch_statistics(make_dataset(
        demo_pairs, tokenizer, tokens_per_batch=512, max_length=48, training=True, seed=0))
    stats = batch_statistics(dataset)
    for inputs, labels in dataset.as_numpy_iterator():
        source, target = inputs["source_ids"], inputs["target_ids"]
        assert source.size <= 512 and target.size <= 512
        assert (source[:, -1] != 0).any() and (target[:, -1] != 0).any()  # batch max
    kept = count_length_policy(demo_pairs, tokenizer, 48).num_kept_for_training
    assert stats.num_pairs == padded_to_boundary.num_pairs == kept
    assert stats.padding_fraction < padded_to_boundary.padding_fraction


def test_deterministic_with_a_seed_and_shuffled_between_epochs(tokenizer, demo_pairs):
    def first_batches(seed):
        dataset = make_dataset(demo_pairs, tokenizer, tokens_per_batch=512, max_length=48,
                               training=True, seed=seed, deterministic=True)
        epochs = [[x["source_ids"] for x, _ in dataset.take(3).as_numpy_iterator()]
                  for _ in range(2)]
        return epochs

    run_a, run_b, other_seed = first_batches(5), first_batches(5), first_batches(6)
    for a, b in zip(run_a, run_b):
        for x, y in zip(a, b):
            np.testing.assert_array_equal(x, y)
    assert not np.array_equal(run_a[0][0], run_a[1][0]) or run_a[0][0].shape != run_a[1][0].shape
    assert any(x.shape != y.shape or not np.array_equal(x, y)
               for x, y in zip(run_a[0], other_seed[0]))


def test_input_forms_agree(tokenizer, demo_pairs, tmp_path):
    en, de = tmp_path / "p.en", tmp_path / "p.de"
    en.write_text("\n".join(p[0] for p in demo_pairs[:200]) + "\n", encoding="utf-8")
    de.write_text("\n".join(p[1] for p in demo_pairs[:200]) + "\n", encoding="utf-8")
    sources, targets = zip(*demo_pairs[:200])
    forms = [
        demo_pairs[:200],
        load_parallel_text(en, de),
        tf.data.Dataset.from_tensor_slices((list(sources), list(targets))),
    ]
    rows = [collections.Counter(_rows(make_dataset(
        form, tokenizer, tokens_per_batch=512, max_length=48, training=False)))
        for form in forms]
    assert rows[0] == rows[1] == rows[2]


def test_bad_arguments_are_explained(tokenizer, demo_pairs):
    with pytest.raises(ValueError, match="tokens_per_batch=100 is too small.*length 256"):
        make_dataset(demo_pairs, tokenizer, tokens_per_batch=100, max_length=256,
                     training=True)
    with pytest.raises(ValueError, match="end with max_length=64"):
        make_dataset(demo_pairs, tokenizer, tokens_per_batch=1000, max_length=64,
                     training=True, boundaries=[8, 16, 32])
    with pytest.raises(ValueError, match="element_spec"):
        make_dataset(tf.data.Dataset.range(3), tokenizer, tokens_per_batch=1000,
                     max_length=64, training=True)
    with pytest.raises(ValueError, match=r"pairs\[1\] must be a \(source, target\) pair"):
        make_dataset([("a", "b"), ("c",)], tokenizer, tokens_per_batch=1000,
                     max_length=64, training=True)
    with pytest.raises(ValueError, match="num_replicas"):
        make_dataset(demo_pairs, tokenizer, tokens_per_batch=1000, max_length=64,
                     training=True, num_replicas=0)


@pytest.mark.slow
@pytest.mark.every_backend
def test_feeds_model_fit_on_the_current_backend(tokenizer, demo_pairs):
    # One bucket, repeated: a single batch shape, so a single compilation.
    dataset = make_dataset(demo_pairs, tokenizer, tokens_per_batch=512, max_length=32,
                           training=True, seed=0, boundaries=[32], repeat=True)
    model = keras_transformer.build_model(
        preset="tiny", vocab_size=tokenizer.vocabulary_size(), num_layers=1, d_model=32,
        num_heads=2, d_ff=64, max_length=32)
    keras_transformer.compile_model(model)
    history = model.fit(dataset, steps_per_epoch=3, epochs=1, verbose=0, shuffle=False)
    assert np.isfinite(history.history["loss"][-1])


_DISTRIBUTE_SCRIPT = textwrap.dedent("""
    import json, sys
    import tensorflow as tf
    cpu = tf.config.list_physical_devices("CPU")[0]
    tf.config.set_logical_device_configuration(
        cpu, [tf.config.LogicalDeviceConfiguration()] * 2)
    from keras_transformer.data import make_dataset, train_tokenizer
    from keras_transformer.data.demo import generate_pairs
    pairs = generate_pairs(400, seed=0)
    folder = sys.argv[1]
    for i, suffix in enumerate(("en", "de")):
        with open(f"{folder}/t.{suffix}", "w", encoding="utf-8") as f:
            f.write("\\n".join(p[i] for p in pairs) + "\\n")
    tokenizer = train_tokenizer([f"{folder}/t.en", f"{folder}/t.de"], 500,
                                f"{folder}/t.model")
    strategy = tf.distribute.MirroredStrategy(["/cpu:0", "/cpu:1"])
    dataset = make_dataset(pairs, tokenizer, tokens_per_batch=512, max_length=32,
                           training=True, seed=0, drop_remainder=True,
                           num_replicas=strategy.num_replicas_in_sync)
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
    env = dict(os.environ, KERAS_BACKEND="tensorflow", TF_CPP_MIN_LOG_LEVEL="2",
               PYTHONPATH=REPO_ROOT + os.pathsep + os.environ.get("PYTHONPATH", ""))
    result = subprocess.run(
        [sys.executable, "-c", _DISTRIBUTE_SCRIPT, str(tmp_path)],
        capture_output=True, text=True, env=env, timeout=300)
    assert result.returncode == 0, result.stderr[-3000:]
    report = json.loads(result.stdout.strip().splitlines()[-1])
    assert report["replicas"] == 2 and report["batches"]
    for batch in report["batches"]:
        (batch_a, length_a), (batch_b, length_b) = batch["local"]
        assert batch_a == batch_b >= 1 and length_a == length_b  # split evenly
        assert (batch_a + batch_b) * length_a <= 512
        assert batch["source_tokens"] > 0


@pytest.mark.slow
def test_multi30k_batches(shared_data, tmp_path):
    """The acceptance check on Multi30k train with a shared vocabulary of 8,000."""
    folder = shared_data / "multi30k"
    pairs = load_parallel_text(folder / "train.en", folder / "train.de")
    tokenizer = train_tokenizer([folder / "train.en", folder / "train.de"], 8000,
                                tmp_path / "multi30k.model")
    tokens_per_batch, max_length = 4096, 40
    counts = count_length_policy(pairs, tokenizer, max_length)
    dataset = make_dataset(pairs, tokenizer, tokens_per_batch=tokens_per_batch,
                           max_length=max_length, training=True, seed=0)
    boundaries = bucket_boundaries(max_length)
    num_pairs = source_tokens = target_tokens = slots = 0
    for inputs, labels in dataset.as_numpy_iterator():
        _check_batch(inputs, labels, tokens_per_batch, boundaries)
        num_pairs += len(labels)
        source_tokens += int((inputs["source_ids"] != 0).sum())
        target_tokens += int((labels != 0).sum())
        slots += inputs["source_ids"].size + labels.size
    # No pair lost except those the length policy drops; the tokens match an
    # independent encoding of the kept pairs.
    sources, targets = _reference(tokenizer, list(pairs))
    kept = [(s, t) for s, t in zip(sources, targets)
            if len(s) < max_length and len(t) < max_length]
    assert counts.num_over_long == len(pairs) - len(kept) > 0
    assert num_pairs == counts.num_kept_for_training == len(kept)
    assert source_tokens == sum(len(s) + 1 for s, _ in kept)
    assert target_tokens == sum(len(t) + 1 for _, t in kept)
    padding = 1 - (source_tokens + target_tokens) / slots
    print(f"\nMulti30k train, vocab 8000, tokens_per_batch={tokens_per_batch}, "
          f"max_length={max_length}: {num_pairs} pairs kept, {counts.num_over_long} "
          f"dropped (over-long), padding fraction {padding:.1%}")
    assert padding < 0.35
