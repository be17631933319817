"""Tests of keras_transformer.data.sampling and of a continued training stream.

The references are independent of the code under test: SentencePiece's own
deterministic encoding and decoding of the corpus text, and the uninterrupted
stream a continued one must equal batch for batch.
"""

import json

import numpy as np
import pytest
import sentencepiece

from keras_transformer.data import bucket_boundaries, corpora, prepared, sampling
from keras_transformer.data.readers import iter_parallel_lines
from keras_transformer.training.settings import Settings, SettingsError

from test_data_streaming import _prepare_demo


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
    return _prepare_demo(tmp_path_factory.mktemp("sampling"), 600)


@pytest.fixture(scope="module")
def views(corpus):
    return sampling.ensure_sampled(corpus, alpha=0.2, views=3, seed=0)


def _records(paths, typecode="H"):
    import tensorflow as tf

    pairs = []
    for path in paths:
        for record in tf.data.TFRecordDataset(str(path)).as_numpy_iterator():
            ids = np.frombuffer(record, np.uint16 if typecode == "H" else np.int32)
            pairs.append((ids[1:1 + ids[0]].tolist(), ids[1 + ids[0]:].tolist()))
    return pairs


def test_views_decode_to_the_text_and_differ_from_each_other(corpus, views):
    processor = sentencepiece.SentencePieceProcessor(model_file=str(corpus.tokenizer_file))
    base = _records(corpus.shard_paths("train"))
    sampled = [_records(view) for view in views.shard_views()]
    assert len(sampled) == 3 and all(len(view) == len(base) == 600 for view in sampled)
    # The training text, as SentencePiece normalises it, in the shards' order.
    text = {processor.decode(processor.encode(s)) for _, s, _ in iter_parallel_lines(
        corpus.directory.parent / "train.en", corpus.directory.parent / "train.de")}
    for view in sampled:
        for (source, target), (base_source, base_target) in zip(view, base):
            assert processor.decode(source) == processor.decode(base_source)
            assert processor.decode(target) == processor.decode(base_target)
            assert processor.decode(source) in text
    # Dropped merges: longer and different segmentations, another one per view.
    base_tokens = sum(len(s) + len(t) for s, t in base)
    for view in sampled:
        assert sum(len(s) + len(t) for s, t in view) > 1.1 * base_tokens
        assert sum(pair != b for pair, b in zip(view, base)) > 0.5 * len(base)
    assert sum(a != b for a, b in zip(sampled[0], sampled[1])) > 0.5 * len(base)


def test_source_only_sampling_keeps_the_best_target_segmentation(corpus):
    processor = sentencepiece.SentencePieceProcessor(model_file=str(corpus.tokenizer_file))
    views = sampling.ensure_sampled(corpus, alpha=0.2, views=2, seed=0, sides="source")
    assert views.directory.name == "sampled_alpha0.2_source_views2_seed0"
    base = _records(corpus.shard_paths("train"))
    for view in views.shard_views():
        sampled = _records(view)
        # Targets: the deterministic encoding, id for id; sources: resampled.
        assert [t for _, t in sampled] == [t for _, t in base]
        assert sum(s != b for (s, _), (b, _) in zip(sampled, base)) > 0.5 * len(base)
        assert all(processor.decode(s) == processor.decode(b)
                   for (s, _), (b, _) in zip(sampled, base))
    with pytest.raises(ValueError, match="sides must be one of both, source"):
        sampling.ensure_sampled(corpus, alpha=0.2, sides="target")


def test_the_same_seed_writes_the_same_views_and_they_are_reused(corpus, views, tmp_path):
    manifest = json.loads((views.directory / sampling.MANIFEST_FILE).read_text())
    again = sampling.ensure_sampled(corpus, alpha=0.2, views=3, seed=0)
    assert again.manifest == manifest  # reused, not written again
    other = prepared.PreparedCorpus(corpus.directory)
    # Written again into another folder: the same bytes for the same seed.
    copy = tmp_path / "copy"
    import shutil

    shutil.copytree(corpus.directory, copy, ignore=shutil.ignore_patterns("sampled_*"))
    rewritten = sampling.ensure_sampled(prepared.PreparedCorpus(copy), alpha=0.2, views=3,
                                        seed=0)
    sha = lambda m: [[s["sha256"] for s in v["shards"]] for v in m["views"]]  # noqa: E731
    assert sha(rewritten.manifest) == sha(manifest)
    reseeded = sampling.ensure_sampled(prepared.PreparedCorpus(copy), alpha=0.2, views=3,
                                       seed=1)
    assert sha(reseeded.manifest)[0] != sha(manifest)[0]
    assert other.tokenizer_sha256 == manifest["tokenizer_sha256"]


def _labels(dataset, count):
    return [labels for _, labels in dataset.take(count).as_numpy_iterator()]


def _rows(labels):
    """The target ids of every real row of some label batches (EOS and padding cut)."""
    rows = []
    for batch in labels:
        for row in batch:
            if row[0]:
                rows.append(tuple(int(i) for i in row[:list(row).index(2)]))
    return rows


def test_each_epoch_reads_its_view_and_validation_stays_deterministic(corpus, views):
    common = dict(tokens_per_batch=1280, max_length=128, seed=0)
    train, valid, _ = corpora.training_datasets(corpus, sampled=views, **common)
    rows = _rows(_labels(train, 2000))
    # Epoch e holds the targets of view e mod 3, each once (the length policy
    # keeps every demo pair).
    per_epoch = 600
    targets = [sorted(tuple(t) for _, t in _records(view)) for view in views.shard_views()]
    assert max(len(t) for view in targets for t in view) < 127
    for epoch in range(4):
        assert sorted(rows[epoch * per_epoch:(epoch + 1) * per_epoch]) == targets[epoch % 3]
    # Validation: the deterministic encoding, as without sampling.
    _, plain_valid, _ = corpora.training_datasets(corpus, **common)
    processor = sentencepiece.SentencePieceProcessor(model_file=str(corpus.tokenizer_file))
    references = sorted(tuple(processor.encode(t)) for _, _, t in iter_parallel_lines(
        corpus.directory.parent / "valid.en", corpus.directory.parent / "valid.de"))
    assert sorted(_rows(_labels(valid, 100))) == references
    assert sorted(_rows(_labels(plain_valid, 100))) == references
    # Test: the text, encoded by the tokenizer the test score and every export
    # use (tf-text), twice: the deterministic encoding both times.
    tests = [s for _, s, _ in iter_parallel_lines(corpus.directory.parent / "test.en",
                                                  corpus.directory.parent / "test.de")]
    tokenizer = corpus.tokenizer()
    for _ in range(2):
        assert tokenizer.tokenize(tests).to_list() == processor.encode(tests)


@pytest.mark.parametrize("sampled", [False, True])
def test_a_continued_stream_is_the_tail_of_the_uninterrupted_one(corpus, views, sampled):
    common = dict(tokens_per_batch=600, max_length=48, seed=4, grad_accum_steps=2,
                  sampled=views if sampled else None, bucket_multiple=2)
    full, _, _ = corpora.training_datasets(corpus, **common)
    full = list(full.take(400).as_numpy_iterator())
    # The last update below is two epochs in.
    assert corpus.stream_position(
        "train", 300, training=True, seed=4, sampled=common["sampled"],
        boundaries=bucket_boundaries(48, multiple=2), tokens_per_batch=600,
        max_length=48)[0] >= 2
    # Updates of 2 micro-batches: mid-epoch, and across the first epoch boundaries.
    for update in (3, 97, 150):
        continued, _, _ = corpora.training_datasets(corpus, start_update=update, **common)
        for (inputs, labels), (ref_inputs, ref_labels) in zip(
                continued.take(10).as_numpy_iterator(), full[2 * update:2 * update + 10]):
            np.testing.assert_array_equal(labels, ref_labels)
            np.testing.assert_array_equal(inputs["source_ids"], ref_inputs["source_ids"])


def test_settings_check_the_sampling_values(corpus):
    assert Settings(preset="tiny", subword_sampling=0.1).subword_sampling == 0.1
    for bad in (1.0, -0.1, True, "0.1"):
        with pytest.raises(SettingsError, match="--subword-sampling must be a number"):
            Settings(preset="tiny", subword_sampling=bad)
    with pytest.raises(SettingsError, match="--sampling-views must be a positive integer"):
        Settings(preset="tiny", sampling_views=0)
    with pytest.raises(ValueError, match="alpha must be a number between 0 and 1"):
        sampling.ensure_sampled(corpus, alpha=1.0)
