"""Tests of keras_transformer.data.readers: aligned text files and WMT14 through tfds."""

import gzip
import logging
import time

import pytest
import tensorflow as tf
import tensorflow_datasets as tfds

from keras_transformer.data import (
    CorpusError,
    ParallelText,
    load_parallel_text,
    load_wmt14,
    write_parallel_text,
)
from keras_transformer.data import readers

EN = ["Two dogs play.", "A man, a plan.", "Über 3,50 €?"]
DE = ["Zwei Hunde spielen.", "Ein Mann, ein Plan.", "Über 3,50 €?"]


def _write(path, data):
    path.write_bytes(data)
    return path


def _lines(lines, newline="\n"):
    return "".join(line + newline for line in lines).encode("utf-8")


def test_reads_aligned_pairs(tmp_path):
    pairs = load_parallel_text(_write(tmp_path / "a.en", _lines(EN)),
                               _write(tmp_path / "a.de", _lines(DE)))
    assert isinstance(pairs, ParallelText)
    assert list(pairs) == list(zip(EN, DE))
    assert len(pairs) == 3 and pairs[1] == (EN[1], DE[1])
    assert pairs.dropped_lines == ()
    assert pairs.source_path.endswith("a.en") and pairs.target_path.endswith("a.de")


def test_gzip_crlf_bom_and_missing_final_newline_read_the_same(tmp_path):
    plain = load_parallel_text(_write(tmp_path / "p.en", _lines(EN)),
                               _write(tmp_path / "p.de", _lines(DE)))
    gzipped = load_parallel_text(
        _write(tmp_path / "g.en.gz", gzip.compress(_lines(EN))),
        _write(tmp_path / "g.de", gzip.compress(_lines(DE))),  # found by magic bytes
    )
    crlf = load_parallel_text(
        _write(tmp_path / "c.en", b"\xef\xbb\xbf" + _lines(EN, "\r\n")),
        _write(tmp_path / "c.de", _lines(DE, "\r\n")[:-2]),  # no final line end
    )
    assert list(plain) == list(gzipped) == list(crlf) == list(zip(EN, DE))


def test_unicode_line_separators_stay_inside_their_line(tmp_path):
    # str.splitlines() would split these and shift every later pair.
    source = ["a\u2028b", "c\x85d", "e\x0cf", "g\rh"]
    target = ["1", "2", "3", "4"]
    pairs = load_parallel_text(_write(tmp_path / "s.en", _lines(source)),
                               _write(tmp_path / "s.de", _lines(target)))
    assert list(pairs) == list(zip(source, target))


def test_different_line_counts_name_the_files_and_line(tmp_path):
    source = _write(tmp_path / "train.en", _lines(EN))
    target = _write(tmp_path / "train.de", _lines(DE[:2]))
    with pytest.raises(CorpusError) as error:
        load_parallel_text(source, target)
    message = str(error.value)
    assert "train.de has 2 lines" in message
    assert "train.en, line 3 has no counterpart" in message
    with pytest.raises(CorpusError, match=r"train\.de, line 3 has no counterpart in .*train\.en"):
        load_parallel_text(_write(tmp_path / "train.en", _lines(EN[:2])),
                           _write(tmp_path / "train.de", _lines(DE)))


def test_invalid_utf8_names_file_line_and_byte(tmp_path):
    latin1 = "Zwei Hunde spielen.\nGrüße aus Köln.\n".encode("latin-1")
    source = _write(tmp_path / "x.en", _lines(EN[:2]))
    target = _write(tmp_path / "x.de", latin1)
    with pytest.raises(CorpusError, match=r"x\.de, line 2, byte 3: not UTF-8 \(b'\\xfc"):
        load_parallel_text(source, target)


def test_empty_file_is_named(tmp_path):
    source = _write(tmp_path / "e.en", b"")
    target = _write(tmp_path / "e.de", _lines(DE))
    with pytest.raises(CorpusError, match=r"e\.en is empty"):
        load_parallel_text(source, target)
    with pytest.raises(CorpusError, match=r"e\.en is empty"):
        load_parallel_text(target, source)


def test_empty_lines_drop_the_pair_and_are_counted(tmp_path, caplog):
    source = ["one", "", "three", "four", "   ", "six"]
    target = ["eins", "zwei", "", "vier", "fünf", "sechs"]
    with caplog.at_level(logging.WARNING, logger=readers.__name__):
        pairs = load_parallel_text(_write(tmp_path / "d.en", _lines(source)),
                                   _write(tmp_path / "d.de", _lines(target)))
    assert list(pairs) == [("one", "eins"), ("four", "vier"), ("six", "sechs")]
    assert pairs.dropped_lines == (2, 3, 5)
    assert "dropped 3 pair(s) with an empty side (line 2, 3, 5)" in caplog.text


def test_broken_gzip_and_missing_file(tmp_path):
    broken = _write(tmp_path / "b.en.gz", gzip.compress(_lines(EN))[:-12])
    target = _write(tmp_path / "b.de", _lines(DE))
    with pytest.raises(CorpusError, match=r"b\.en\.gz, line \d+: cannot read the file"):
        load_parallel_text(broken, target)
    with pytest.raises(FileNotFoundError, match="nothing.en"):
        load_parallel_text(tmp_path / "nothing.en", target)


def test_write_parallel_text_round_trip(tmp_path):
    pairs = list(zip(EN, DE)) + [(b"bytes \xc3\xa4".decode(), "ä")]
    count = write_parallel_text(pairs, tmp_path / "out" / "w.en", tmp_path / "out" / "w.de")
    assert count == 4
    assert (tmp_path / "out" / "w.en").read_bytes() == _lines([p[0] for p in pairs])
    assert list(load_parallel_text(tmp_path / "out" / "w.en",
                                   tmp_path / "out" / "w.de")) == pairs
    with pytest.raises(CorpusError, match=r"pair 1 for .*w\.de contains a line break"):
        write_parallel_text([("a", "b\nc")], tmp_path / "w.en", tmp_path / "w.de")


def test_multi30k(shared_data):
    folder = shared_data / "multi30k"
    pairs = load_parallel_text(folder / "train.en", folder / "train.de")
    assert len(pairs) == 29000 and pairs.dropped_lines == ()
    with open(folder / "train.de", encoding="utf-8", newline="\n") as f:
        german = f.read().split("\n")[:-1]
    assert list(pairs.target) == german
    # The 47 no-break spaces of train.de are kept (see the data README).
    assert sum(line.count("\u00a0") for line in pairs.target) == 47


def _fake_wmt14(builder, *args, **kwargs):
    return tf.data.Dataset.from_tensor_slices(
        {"en": ["Good morning.", "Thank you."], "de": ["Guten Morgen.", "Danke."]})


def test_load_wmt14_with_mock_data():
    with tfds.testing.mock_data(num_examples=4):
        dataset = load_wmt14("train")
        assert dataset.element_spec == (tf.TensorSpec([], tf.string),
                                        tf.TensorSpec([], tf.string))
        assert len(list(dataset)) == 4
    # English first: the task is English to German.
    with tfds.testing.mock_data(as_dataset_fn=_fake_wmt14):
        pairs = list(load_wmt14("validation").as_numpy_iterator())
    assert pairs == [(b"Good morning.", b"Guten Morgen."), (b"Thank you.", b"Danke.")]


def test_load_wmt14_offline_fails_fast_naming_alternatives(tmp_path, monkeypatch):
    # A host that never resolves (RFC 6761), so the test is offline everywhere.
    monkeypatch.setattr(readers, "_WMT14_HOST", "statmt.invalid")
    start = time.perf_counter()
    with pytest.raises(RuntimeError) as error:
        load_wmt14("test", data_dir=tmp_path)
    assert time.perf_counter() - start < 10
    message = str(error.value)
    assert "statmt.invalid is unreachable" in message
    for alternative in ("--data demo", "load_parallel_text", "tfds build wmt14_translate/de-en"):
        assert alternative in message
    with pytest.raises(RuntimeError, match="download=False"):
        load_wmt14("test", data_dir=tmp_path, download=False)
