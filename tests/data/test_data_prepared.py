"""Prepared corpora: the manifest, the streamed batches, reuse and re-preparation, damage."""

import collections
import dataclasses
import errno
import json
import logging
import os
import pathlib
import subprocess
import sys

import pytest
import sentencepiece

from keras_transformer.data import preparation, prepared
from keras_transformer.data.streaming import bucket_boundaries
from keras_transformer.files import file_sha256

REPO = pathlib.Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def corpus_dir(tmp_path_factory):
    """1,200 Multi30k training pairs (with two empty lines and a very long pair), 150 valid."""
    from conftest import multi30k_head

    folder = multi30k_head(tmp_path_factory.mktemp("prep") / "m30k", (
        ("train", "train", 1200), ("valid", "valid", 150), ("test", "test", 8)))
    for lang, extra in (("en", ["", "A dog.", " ".join(["very long"] * 60)]),
                        ("de", ["Ein Hund.", "", " ".join(["sehr lang"] * 60)])):
        path = folder / f"train.{lang}"
        path.write_text(path.read_text(encoding="utf-8") + "\n".join(extra) + "\n",
                        encoding="utf-8")
    return folder


@pytest.fixture(scope="module")
def corpus(corpus_dir, tmp_path_factory):
    output = tmp_path_factory.mktemp("prepared") / "m30k_v600"
    return preparation.ensure_prepared(preparation.text_inputs(corpus_dir), output,
                                       vocab_size=600, num_shards=3, max_length=48)


def _lines(path):
    return path.read_text(encoding="utf-8").split("\n")[:-1]


def _expected_pairs(corpus, corpus_dir, split, max_length, training):
    """The pairs a pass must hold, encoded by SentencePiece's own Python API."""
    processor = sentencepiece.SentencePieceProcessor(model_file=str(corpus.tokenizer_file))
    pairs = collections.Counter()
    for source, target in zip(_lines(corpus_dir / f"{split}.en"),
                              _lines(corpus_dir / f"{split}.de")):
        if not source.strip() or not target.strip():
            continue
        source_ids, target_ids = processor.encode(source), processor.encode(target)
        if training and max(len(source_ids), len(target_ids)) + 1 > max_length:
            continue
        pairs[(tuple(source_ids[:max_length - 1]) + (2,),
               tuple(target_ids[:max_length - 1]) + (2,))] += 1
    return pairs


def _pass(dataset, tokens_per_batch, num_replicas=1):
    """The pairs of one pass, checking every batch's shape and BOS/EOS layout."""
    pairs, shapes, batches = collections.Counter(), set(), 0
    for inputs, labels in dataset.as_numpy_iterator():
        source, target = inputs["source_ids"], inputs["target_ids"]
        assert source.shape == target.shape == labels.shape
        assert source.size <= tokens_per_batch and source.shape[0] % num_replicas == 0
        shapes.add(source.shape)
        batches += 1
        for s, t, l in zip(source, target, labels):
            if not l.any():  # a row that completes a window's last batch
                assert not s.any() and not t.any()
                continue
            real = l[l != 0]
            assert t[0] == 1 and list(t[1:len(real)]) == list(real[:-1]) and real[-1] == 2
            assert not t[len(real):].any() and not l[len(real):].any()
            pairs[(tuple(s[s != 0]), tuple(real))] += 1
    return pairs, shapes, batches


@pytest.mark.parametrize("training", [True, False])
def test_one_pass_holds_every_pair_once_as_sentencepiece_encodes_it(corpus, corpus_dir,
                                                                    training):
    split, max_length = ("train", 48) if training else ("valid", 24)
    dataset = corpus.dataset(split, tokens_per_batch=512, max_length=max_length,
                             training=training, num_replicas=2, seed=1, window_size=300)
    pairs, shapes, batches = _pass(dataset, 512, num_replicas=2)
    assert pairs == _expected_pairs(corpus, corpus_dir, split, max_length, training)
    bounds = bucket_boundaries(max_length)
    assert {shape[1] for shape in shapes} <= set(bounds)
    assert len(shapes) <= len(bounds)  # one shape per bucket: few XLA/JAX traces
    if not training:  # evaluation: one window, the count the manifest predicts
        assert batches == corpus.batch_plan(split, tokens_per_batch=512,
                                            max_length=max_length, training=False,
                                            num_replicas=2)[0]


def test_manifest_counts_match_the_data(corpus, corpus_dir):
    from keras_transformer.data import LengthPolicyCounts

    train = corpus.split("train")
    assert train["pairs_read"] == 1203
    assert train["dropped"] == {"empty_side": 2, "side_over_65535_subwords": 0}
    assert train["pairs"] == 1201 == sum(s["pairs"] for s in train["shards"])
    assert len(train["shards"]) == 3 and all(s["pairs"] > 300 for s in train["shards"])
    assert sum(s["bytes"] for s in train["shards"]) == sum(
        (corpus.directory / s["file"]).stat().st_size for s in train["shards"])
    # Token counts and the length policy (from the manifest's histograms),
    # against SentencePiece's Python API on the same text.
    processor = sentencepiece.SentencePieceProcessor(model_file=str(corpus.tokenizer_file))
    lengths = [(len(processor.encode(s)) + 1, len(processor.encode(t)) + 1)  # + EOS
               for s, t in zip(_lines(corpus_dir / "train.en"), _lines(corpus_dir / "train.de"))
               if s.strip() and t.strip()]
    for max_length in (16, 48, 500):
        assert corpus.length_policy("train", max_length) == LengthPolicyCounts(
            num_pairs=len(lengths),
            num_over_long=sum(max(s, t) > max_length for s, t in lengths),
            num_source_over_long=sum(s > max_length for s, _ in lengths),
            num_target_over_long=sum(t > max_length for _, t in lengths),
            source_tokens=sum(s for s, _ in lengths), target_tokens=sum(t for _, t in lengths))
    assert train["length_policy"]["max_length"] == 48
    assert train["length_policy"]["num_over_long"] == corpus.length_policy(
        "train", 48).num_over_long > 0
    lengths = train["lengths"]
    assert sum(lengths["pair"].values()) == train["pairs"]
    assert sum(int(k) * v for k, v in lengths["target"].items()) == train["target_tokens"]
    assert corpus.manifest["tokenizer"]["sha256"] == file_sha256(
        corpus.tokenizer_file)
    assert corpus.split("valid")["pairs"] == 150
    assert corpus.text_paths("test") == (corpus_dir.resolve() / "test.en",
                                         corpus_dir.resolve() / "test.de")
    # The expected batches of a training pass are close to what one pass cuts.
    dataset = corpus.dataset("train", tokens_per_batch=512, max_length=48, training=True,
                             seed=0)
    _, _, batches = _pass(dataset, 512)
    expected, tokens = corpus.batch_plan("train", tokens_per_batch=512, max_length=48,
                                         training=True)
    assert abs(expected - batches) <= 2 and tokens == sum(
        n for (_, t), n in _expected_pairs(corpus, corpus_dir, "train", 48, True).items()
        for n in [n * len(t)])


def test_the_seed_fixes_the_batches(corpus):
    def first(seed, n=12):
        dataset = corpus.dataset("train", tokens_per_batch=512, max_length=48,
                                 training=True, seed=seed, repeat=True, window_size=400)
        return [labels for _, labels in dataset.take(n).as_numpy_iterator()]

    a, b, c = first(3), first(3), first(4)
    assert all(x.shape == y.shape and (x == y).all() for x, y in zip(a, b))
    assert any(x.shape != y.shape or (x != y).any() for x, y in zip(a, c))


def test_prepare_then_train_equals_training_on_the_folder(corpus_dir, tmp_path, monkeypatch):
    """`prepare` + `train --data <prepared>` reads exactly the batches of `train --data <folder>`."""
    from keras_transformer import run_vocabulary, runs
    from keras_transformer.data import corpora
    from keras_transformer.training import job
    from keras_transformer.training.strategy import plan_batches
    from keras_transformer.training.settings import load_settings

    monkeypatch.chdir(tmp_path)  # the default prepared root, runs/prepared, is relative

    result = subprocess.run(
        [sys.executable, "-m", "keras_transformer", "prepare", "--data", str(corpus_dir),
         "--vocab-size", "600", "--prepared-dir", str(tmp_path / "ahead")],
        capture_output=True, text=True, timeout=300, cwd=tmp_path)
    assert result.returncode == 0, result.stderr[-3000:]
    assert "1,201 training pairs" in result.stdout

    def batches(data, run_dir, **given):
        settings = load_settings(given=dict(
            data=str(data), preset="tiny", tokens_per_batch=512, max_length=48,
            output_dir=str(run_dir), seed=5, **given))
        run = runs.RunFolder(run_dir)
        corpus = job.prepare_data(settings, run)
        run_vocabulary.adopt(run, corpus)
        plan = plan_batches(512, max_length=48)
        train_ds, valid_ds, per_update = corpora.training_datasets(
            corpus, tokens_per_batch=plan.micro_batch_tokens, max_length=48, seed=5)
        train = [(x["source_ids"], y) for x, y in train_ds.take(30).as_numpy_iterator()]
        valid = [y for _, y in valid_ds.as_numpy_iterator()]
        return settings, train, valid, per_update

    settings, direct, direct_valid, per_update = batches(
        corpus_dir, tmp_path / "runs" / "direct", vocab_size=600)
    # --data <folder> prepared under the hood, with the vocabulary size asked for.
    assert settings.vocab_size == 600
    assert (tmp_path / "runs" / "prepared" / "m30k_v600" / "manifest.json").is_file()
    # The prepared folder brings its vocabulary size: no --vocab-size needed.
    _, ahead, ahead_valid, per_update_ahead = batches(tmp_path / "ahead",
                                                      tmp_path / "runs" / "ahead")
    assert per_update == per_update_ahead > 0
    assert len(direct) == len(ahead) == 30
    for (s1, l1), (s2, l2) in zip(direct, ahead):
        assert s1.shape == s2.shape and (s1 == s2).all() and (l1 == l2).all()
    assert len(direct_valid) == len(ahead_valid) and all(
        (a == b).all() for a, b in zip(direct_valid, ahead_valid))


def test_a_changed_input_or_vocabulary_prepares_again(corpus_dir, tmp_path, caplog):
    from conftest import copy_corpus_head

    folder = copy_corpus_head(corpus_dir, tmp_path / "c", (("train", "train", 300),
                                                           ("valid", "valid", 20),
                                                           ("test", "test", 5)))
    inputs = preparation.text_inputs(folder)
    output = tmp_path / "p"
    caplog.set_level(logging.INFO, logger="keras_transformer")

    def prepare(vocab_size=400):
        caplog.clear()
        corpus = preparation.ensure_prepared(inputs, output, vocab_size=vocab_size)
        return corpus, caplog.text

    first, log = prepare()
    assert "not prepared yet" in log and first.split("train")["pairs"] == 300
    created = first.manifest["created"], (output / "manifest.json").stat().st_mtime_ns
    _, log = prepare()
    assert "Using the prepared corpus" in log and "Preparing" not in log
    # Same bytes, new modification time (a copy, a checkout): reused.
    os.utime(folder / "train.en", ns=(1, 1))
    again, log = prepare()
    assert "Using the prepared corpus" in log
    assert (output / "manifest.json").stat().st_mtime_ns == created[1]
    # Changed contents, same size: prepared again.
    text = (folder / "train.en").read_text(encoding="utf-8")
    (folder / "train.en").write_text(text.replace("A", "B", 1), encoding="utf-8")
    changed, log = prepare()
    assert f"{folder / 'train.en'} changed since it was prepared" in log
    assert changed.manifest["inputs"]["files"]["train"][0]["sha256"] != \
        first.manifest["inputs"]["files"]["train"][0]["sha256"]
    # Another vocabulary size: prepared again.
    resized, log = prepare(vocab_size=420)
    assert "prepared with vocabulary size 400, now 420" in log
    assert resized.manifest["tokenizer"]["vocabulary_size"] == 420
    # No partial folders or leftovers.
    assert sorted(p.name for p in tmp_path.iterdir() if not p.name.startswith(".")) == \
        ["c", "p"]


def test_a_damaged_shard_is_named(corpus, tmp_path):
    import shutil

    import tensorflow as tf

    copy = tmp_path / "copy"
    shutil.copytree(corpus.directory, copy)
    damaged = prepared.PreparedCorpus(copy)
    shard = damaged.shard_paths("train")[1]
    data = bytearray(shard.read_bytes())
    data[len(data) // 2] ^= 0xFF  # one flipped byte: same size, bad CRC
    shard.write_bytes(bytes(data))
    damaged.check()  # the quick check (sizes) passes
    with pytest.raises(prepared.PreparedCorpusError, match=f"{shard}.* is corrupt"):
        damaged.check(deep=True)
    with pytest.raises(tf.errors.DataLossError):
        for _ in damaged.dataset("train", tokens_per_batch=512, max_length=48,
                                 training=False):
            pass
    shard.write_bytes(bytes(data[:-10]))  # truncated: found before any training
    with pytest.raises(prepared.PreparedCorpusError,
                       match=f"{shard} has {len(data) - 10} bytes, the manifest says"):
        damaged.check()


@pytest.mark.slow
def test_training_on_a_damaged_shard_stops_with_one_line_naming_it(corpus, tmp_path):
    import shutil

    copy = tmp_path / "copy"
    shutil.copytree(corpus.directory, copy)
    shard = prepared.PreparedCorpus(copy).shard_paths("train")[0]
    data = bytearray(shard.read_bytes())
    for offset in range(100, len(data), 997):  # many records, so the first batch hits one
        data[offset] ^= 0xFF
    shard.write_bytes(bytes(data))
    env = dict(os.environ, PYTHONPATH=str(REPO))
    env.pop("TF_CPP_MIN_LOG_LEVEL", None)  # as in a user's shell
    result = subprocess.run(
        [sys.executable, "-m", "keras_transformer", "train", "--data", str(copy),
         "--preset", "tiny", "--max-length", "48", "--tokens-per-batch", "512",
         "--train-steps", "4", "--validation-bleu-sentences", "0", "--export-dir", "",
         "--output-dir", str(tmp_path / "run"), "--verbose", "0"],
        capture_output=True, text=True, timeout=600, env=env, cwd=tmp_path)
    assert result.returncode == 1, result.stderr[-3000:]
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and f"prepared shard {shard} is corrupt" in lines[0], lines


def test_a_prepared_folder_brings_its_vocabulary_and_refuses_another(corpus, tmp_path):
    from keras_transformer import runs
    from keras_transformer.training import job
    from keras_transformer.training.settings import load_settings

    settings = load_settings(given=dict(
        data=str(corpus.directory), preset="tiny", output_dir=str(tmp_path / "run")))
    assert settings.vocab_size == 600  # not the tiny preset's 4000
    settings = load_settings(given=dict(
        data=str(corpus.directory), preset="tiny", vocab_size=4000,
        output_dir=str(tmp_path / "run")))
    with pytest.raises(prepared.PreparedCorpusError, match="has vocabulary size 600"):
        job.prepare_data(settings, runs.RunFolder(tmp_path / "run"))


def test_the_manifest_is_json_with_the_documented_fields(corpus):
    manifest = json.loads((corpus.directory / "manifest.json").read_text())
    assert manifest["format"] == prepared.FORMAT
    assert set(manifest) >= {"inputs", "tokenizer", "record", "splits", "text", "seed",
                             "prepare_seconds", "prepare_peak_rss_mib"}
    assert manifest["record"]["dtype"] == "uint16"
    for shard in manifest["splits"]["train"]["shards"]:
        assert file_sha256(corpus.directory / shard["file"]) == shard["sha256"]


def test_a_tf_data_corpus_prepares_like_its_text_files(corpus, corpus_dir, tmp_path):
    """The tfds WMT14 path: splits given as (functions returning) Datasets of string pairs."""
    import tensorflow as tf

    def dataset(split):
        def load():  # what load_wmt14(split) returns: (en, de) scalar strings
            return tf.data.Dataset.from_tensor_slices(
                (_lines(corpus_dir / f"{split}.en"), _lines(corpus_dir / f"{split}.de")))
        return load

    inputs = preparation.CorpusInputs("wmt14", train=dataset("train"), valid=dataset("valid"),
                                      test=dataset("test"), key={"tfds": "test", "v": 1})
    from_data = preparation.ensure_prepared(inputs, tmp_path / "p", vocab_size=600,
                                            num_shards=3, max_length=48)
    # The same pairs, statistics and (same seed) the same shards as from the files.
    for split in ("train", "valid"):
        ours, theirs = from_data.split(split), corpus.split(split)
        assert {k: v for k, v in ours.items()} == {k: v for k, v in theirs.items()}
    # valid/test text is kept for BLEU; the key decides reuse.
    assert _lines(from_data.text_paths("test")[1]) == _lines(corpus_dir / "test.de")
    assert preparation.stale_reason(tmp_path / "p", inputs, vocab_size=600) is None
    other = dataclasses.replace(inputs, key={"tfds": "test", "v": 2})
    assert "was prepared from" in preparation.stale_reason(tmp_path / "p", other, vocab_size=600)


def test_train_finds_what_prepare_wrote_whatever_its_output_dir(corpus_dir, tmp_path,
                                                                monkeypatch, caplog):
    """`prepare --data X` then `train --data X --output-dir <anywhere>`: no second preparation."""
    from keras_transformer import runs
    from keras_transformer.training import job
    from keras_transformer.training.settings import load_settings

    monkeypatch.chdir(tmp_path)
    result = subprocess.run(
        [sys.executable, "-m", "keras_transformer", "prepare", "--data", str(corpus_dir),
         "--vocab-size", "600"], capture_output=True, text=True, timeout=300, cwd=tmp_path)
    assert result.returncode == 0, result.stderr[-3000:]
    written = tmp_path / "runs" / "prepared" / "m30k_v600"
    assert str(written.relative_to(tmp_path)) in result.stdout
    manifest = (written / "manifest.json").read_bytes()
    caplog.set_level(logging.INFO, logger="keras_transformer")
    for output_dir in (tmp_path / "elsewhere" / "deep" / "run", tmp_path / "runs" / "r2"):
        settings = load_settings(given=dict(data=str(corpus_dir), preset="tiny",
                                            vocab_size=600, output_dir=str(output_dir)))
        corpus = job.prepare_data(settings, runs.RunFolder(output_dir))
        assert corpus.directory.resolve() == written.resolve()
        assert corpus.reused
    assert (written / "manifest.json").read_bytes() == manifest  # not prepared again
    assert not any("Preparing" in r.getMessage() for r in caplog.records)
    assert not (tmp_path / "elsewhere" / "deep" / "prepared").exists()


# --- a write that fails (a full disk) -----------------------------------------------------


ENOSPC_TEXT = os.strerror(28)  # "No space left on device"


@pytest.fixture(scope="module")
def small_corpus_dir(tmp_path_factory):
    """300 Multi30k training pairs, 30 valid, 5 test: a preparation in a second or two."""
    from conftest import multi30k_head

    return multi30k_head(tmp_path_factory.mktemp("small") / "s30k", (
        ("train", "train", 300), ("valid", "valid", 30), ("test", "test", 5)))


def _prepare_command(capsys, data, output, vocab_size):
    """`keras-transformer prepare` in this process.

    Returns:
        `(status, stdout, lines)`: `lines` are stderr's lines other than the
        log's timestamped ones.
    """
    import re

    from keras_transformer.commands import main

    capsys.readouterr()
    status = main(["prepare", "--data", str(data), "--vocab-size", str(vocab_size),
                   "--prepared-dir", str(output)])
    captured = capsys.readouterr()
    lines = [line for line in captured.err.splitlines()
             if line.strip() and not re.match(r"\d{4}-\d\d-\d\d \d\d:\d\d:\d\d ", line)]
    return status, captured.out, lines


def _files(folder):
    return {str(p.relative_to(folder)): p.read_bytes()
            for p in sorted(folder.rglob("*")) if p.is_file()}


def _fail_tfrecord_write_after(monkeypatch, records):
    """TensorFlow's TFRecordWriter hits a full disk after `records` records, as TF says it."""
    import tensorflow as tf

    written = [0]
    real = tf.io.TFRecordWriter.write

    def write(self, record):
        if written[0] >= records:
            raise tf.errors.ResourceExhaustedError(
                None, None, "/elsewhere/some.tfrecord; No space left on device")
        written[0] += 1
        return real(self, record)

    monkeypatch.setattr(tf.io.TFRecordWriter, "write", write)


def _fail_part_write(monkeypatch):
    """Python's write of the `.part-*` files hits a full disk (after a few writes)."""
    real_open = open

    class Full:
        def __init__(self, handle):
            self.handle, self.writes = handle, 0

        def write(self, data):
            self.writes += 1
            if self.writes > 4:
                raise OSError(errno.ENOSPC, ENOSPC_TEXT)
            return self.handle.write(data)

        def close(self):
            self.handle.close()

    def fake_open(path, *args, **kwargs):
        handle = real_open(path, *args, **kwargs)
        return Full(handle) if pathlib.Path(path).name.startswith(".part-") else handle

    monkeypatch.setattr(preparation, "open", fake_open, raising=False)


def _fail_path_write(monkeypatch, method, name):
    """`pathlib.Path.<method>` of the file called `name` hits a full disk."""
    real = getattr(pathlib.Path, method)

    def write(self, *args, **kwargs):
        if self.name == name:
            raise OSError(errno.ENOSPC, ENOSPC_TEXT)
        return real(self, *args, **kwargs)

    monkeypatch.setattr(pathlib.Path, method, write)

# (failure, the file the line must name); the corpus has 300 training pairs (1 shard).
_WRITE_FAILURES = {
    "train shard": (lambda mp: _fail_tfrecord_write_after(mp, 3),
                    "train-00000-of-00001.tfrecord"),
    "valid shard": (lambda mp: _fail_tfrecord_write_after(mp, 300 + 3),
                    "valid-00000-of-00001.tfrecord"),
    "part file": (_fail_part_write, ".part-00000"),
    "vocabulary": (lambda mp: _fail_path_write(mp, "write_bytes", prepared.TOKENIZER_FILE),
                   prepared.TOKENIZER_FILE),
    "manifest": (lambda mp: _fail_path_write(mp, "write_text", prepared.MANIFEST_FILE),
                 prepared.MANIFEST_FILE),
}


def _assert_one_line_and_nothing_kept(status, lines, output, failed_file):
    assert status == 1
    assert lines == [
        f"keras-transformer prepare: error: preparing {output} failed: {ENOSPC_TEXT} "
        f"(writing {failed_file}); nothing was kept. Free space (or fix the folder) and run "
        "the same command"], lines
    assert not list(output.parent.glob(".tmp-*"))  # the staging folder is gone


@pytest.mark.parametrize("failure", sorted(_WRITE_FAILURES))
def test_a_full_disk_while_preparing_is_one_line_and_keeps_the_previous_preparation(
        failure, small_corpus_dir, tmp_path, monkeypatch, capsys):
    output = tmp_path / "prep"
    status, _, lines = _prepare_command(capsys, small_corpus_dir, output, 400)
    assert status == 0 and lines == []
    before = _files(output)
    assert prepared.MANIFEST_FILE in before

    make_fail, failed_file = _WRITE_FAILURES[failure]
    make_fail(monkeypatch)
    # Another vocabulary size: prepared again, and the disk fills.
    status, _, lines = _prepare_command(capsys, small_corpus_dir, output, 420)
    _assert_one_line_and_nothing_kept(status, lines, output, failed_file)
    assert _files(output) == before  # the previous preparation, byte for byte
    assert sorted(p.name for p in tmp_path.iterdir()) == [".prep.lock", "prep"]

    monkeypatch.undo()  # space again
    status, out, lines = _prepare_command(capsys, small_corpus_dir, output, 400)
    assert status == 0 and lines == [] and "(up to date, shards verified)" in out
    status, out, lines = _prepare_command(capsys, small_corpus_dir, output, 420)
    assert status == 0 and lines == [] and "up to date" not in out
    assert json.loads((output / prepared.MANIFEST_FILE).read_text())["vocab_size"] == 420


def test_a_full_disk_on_a_first_preparation_leaves_nothing(small_corpus_dir, tmp_path,
                                                           monkeypatch, capsys):
    output = tmp_path / "deep" / "prep"
    _fail_tfrecord_write_after(monkeypatch, 3)
    status, _, lines = _prepare_command(capsys, small_corpus_dir, output, 400)
    _assert_one_line_and_nothing_kept(status, lines, output, "train-00000-of-00001.tfrecord")
    assert not output.exists()  # nothing a later prepare or train would trust
    monkeypatch.undo()
    status, _, lines = _prepare_command(capsys, small_corpus_dir, output, 400)
    assert status == 0 and lines == []
    assert prepared.PreparedCorpus(output).split("train")["pairs"] == 300


def test_a_full_disk_writing_a_dataset_corpus_text_is_said(small_corpus_dir, tmp_path,
                                                           monkeypatch):
    """A tf.data corpus's valid/test text (kept for BLEU) that cannot be written."""
    import tensorflow as tf

    from keras_transformer.data import readers

    def dataset(split):
        return tf.data.Dataset.from_tensor_slices(
            (_lines(small_corpus_dir / f"{split}.en"), _lines(small_corpus_dir / f"{split}.de")))

    inputs = preparation.CorpusInputs("wmt14", train=dataset("train"), valid=dataset("valid"),
                                      test=dataset("test"), key={"tfds": "test"})
    real_open = open

    def fake_open(path, mode="r", *args, **kwargs):
        if "w" in mode and pathlib.Path(path).parent.name == prepared.TEXT_DIR:
            raise OSError(errno.ENOSPC, ENOSPC_TEXT)
        return real_open(path, mode, *args, **kwargs)

    monkeypatch.setattr(readers, "open", fake_open, raising=False)
    output = tmp_path / "prep"
    with pytest.raises(preparation.PreparationWriteError) as raised:
        preparation.ensure_prepared(inputs, output, vocab_size=400)
    assert str(raised.value) == (
        f"preparing {output} failed: {ENOSPC_TEXT} (writing valid.{{en,de}}); nothing was "
        "kept. Free space (or fix the folder) and run the same command")
    assert isinstance(raised.value, OSError)  # what the commands show as one line
    assert sorted(p.name for p in tmp_path.iterdir()) == [".prep.lock"]
