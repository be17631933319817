"""Tests of keras_transformer.data.tokenizer: training, graph ops, round trips, export."""

import collections
import unicodedata

import numpy as np
import pytest
import sentencepiece
import tensorflow as tf

from keras_transformer import TransformerConfig
from keras_transformer.data import Tokenizer, train_tokenizer
from keras_transformer.data.demo import generate_pairs


@pytest.fixture(scope="module")
def demo_files(tmp_path_factory):
    """A small English and German text file from the demo generator."""
    folder = tmp_path_factory.mktemp("demo_text")
    pairs = generate_pairs(3000, seed=7)
    paths = folder / "demo.en", folder / "demo.de"
    for path, side in zip(paths, zip(*pairs)):
        path.write_text("\n".join(side) + "\n", encoding="utf-8")
    return paths


@pytest.fixture(scope="module")
def demo_tokenizer(demo_files, tmp_path_factory):
    model_file = tmp_path_factory.mktemp("demo_model") / "demo.model"
    return train_tokenizer(demo_files, 600, model_file)


@pytest.fixture(scope="module")
def _cache():
    return {}


@pytest.fixture
def multi30k_tokenizer(shared_data, _cache, tmp_path_factory):
    """The shared 8,000-token vocabulary of Multi30k train (trained once per module)."""
    if "multi30k" not in _cache:
        folder = shared_data / "multi30k"
        model_file = tmp_path_factory.mktemp("multi30k_model") / "multi30k.model"
        _cache["multi30k"] = train_tokenizer(
            [folder / "train.en", folder / "train.de"], 8000, model_file)
    return _cache["multi30k"]


def _processor(tokenizer):
    """The sentencepiece Python library on the same model: an independent reference."""
    return sentencepiece.SentencePieceProcessor(model_proto=tokenizer.model_proto)


def test_special_ids_match_the_model_config(demo_tokenizer):
    config = TransformerConfig()
    assert demo_tokenizer.pad_id == config.pad_id == 0
    assert demo_tokenizer.bos_id == config.bos_id == 1
    assert demo_tokenizer.eos_id == config.eos_id == 2
    assert demo_tokenizer.unk_id == config.unk_id == 3
    assert [demo_tokenizer.id_to_token(i) for i in range(4)] == [
        "<pad>", "<s>", "</s>", "<unk>"]
    assert demo_tokenizer.vocabulary_size() == 600
    assert _processor(demo_tokenizer).piece_to_id("<0x41>") == 4 + 0x41  # byte fallback


def test_graph_tokenize_equals_sentencepiece_python(demo_tokenizer, demo_files):
    lines = demo_files[1].read_text(encoding="utf-8").splitlines()[:500]
    ids = demo_tokenizer.tokenize(lines)
    assert isinstance(ids, tf.RaggedTensor)
    assert ids.to_list() == _processor(demo_tokenizer).encode(lines)
    # A scalar gives a dense vector.
    single = demo_tokenizer.tokenize(lines[0])
    assert single.shape.rank == 1
    assert single.numpy().tolist() == _processor(demo_tokenizer).encode(lines[0])


def test_round_trip_of_unusual_text(demo_tokenizer):
    texts = [
        "Straße, Äpfel & Öl — 3,50 €",
        "two  spaces,\ttab and trailing space ",
        "Bytes: 日本語 🙂 \u00a0(no-break space) \u00ad(soft hyphen) ´",
        "",
    ]
    ids = demo_tokenizer.tokenize(texts)
    out = [s.decode("utf-8") for s in demo_tokenizer.detokenize(ids).numpy()]
    assert out == texts
    # Characters outside the demo vocabulary are bytes, not <unk>.
    assert demo_tokenizer.unk_id not in ids.flat_values.numpy()
    # The one documented exception: leading whitespace is dropped.
    assert demo_tokenizer.detokenize(demo_tokenizer.tokenize("  x")).numpy() == b"x"


def test_detokenize_skips_pad_bos_and_eos(demo_tokenizer):
    text = "Anna hat am 5. Mai 2021 einundzwanzig Äpfel gekauft."
    ids = demo_tokenizer.tokenize(text).numpy().tolist()
    padded = np.array([[1] + ids + [2, 0, 0]], np.int32)
    assert demo_tokenizer.detokenize(padded).numpy().tolist() == [text.encode()]
    assert demo_tokenizer.detokenize([ids]).numpy().tolist() == [text.encode()]
    assert demo_tokenizer.detokenize(tf.constant(ids, tf.int64)).numpy() == text.encode()


def test_tokenize_inside_tf_data_and_tf_function(demo_tokenizer):
    texts = ["The train to Vienna leaves at 2:30 PM on Monday.", "Es ist 14:30 Uhr."]
    eager = demo_tokenizer.tokenize(texts).to_list()
    dataset = tf.data.Dataset.from_tensor_slices(texts).map(demo_tokenizer.tokenize)
    assert [x.numpy().tolist() for x in dataset] == eager

    @tf.function(input_signature=[tf.TensorSpec([None], tf.string)])
    def round_trip(text):
        return demo_tokenizer.detokenize(demo_tokenizer.tokenize(text))

    assert [s.decode() for s in round_trip(tf.constant(texts)).numpy()] == texts


def test_load_gives_the_same_tokenizer(demo_tokenizer):
    loaded = Tokenizer.load(demo_tokenizer.model_file)
    assert loaded.model_proto == demo_tokenizer.model_proto
    assert loaded.model_file == demo_tokenizer.model_file
    text = ["Kannst du mich morgen um 9:05 Uhr anrufen?"]
    assert loaded.tokenize(text).to_list() == demo_tokenizer.tokenize(text).to_list()


def test_tokenizer_survives_a_saved_model(demo_tokenizer, tmp_path):
    module = tf.Module()
    module.tokenizer = demo_tokenizer
    module.tokenize = tf.function(
        lambda text: demo_tokenizer.tokenize(text).to_tensor(),
        input_signature=[tf.TensorSpec([None], tf.string)],
    )
    tf.saved_model.save(module, str(tmp_path / "saved"))
    restored = tf.saved_model.load(str(tmp_path / "saved"))
    text = tf.constant(["Der Zug nach München fährt um 7:45 Uhr ab."])
    np.testing.assert_array_equal(restored.tokenize(text).numpy(),
                                  demo_tokenizer.tokenize(text).to_tensor().numpy())


def test_training_is_deterministic(demo_files, demo_tokenizer, tmp_path):
    again = train_tokenizer(demo_files, 600, tmp_path / "again.model")
    assert again.model_proto == demo_tokenizer.model_proto


def test_rejects_a_model_with_other_special_ids(demo_files, tmp_path):
    sentencepiece.SentencePieceTrainer.train(
        input=str(demo_files[0]), model_prefix=str(tmp_path / "default_ids"),
        vocab_size=300, minloglevel=2)  # defaults: unk=0, bos=1, eos=2, no pad
    with pytest.raises(ValueError, match=r"default_ids\.model has special ids .*pad_id=0"):
        Tokenizer.load(tmp_path / "default_ids.model")


def test_bad_arguments_are_named(demo_files, tmp_path):
    with pytest.raises(FileNotFoundError, match="missing.model"):
        Tokenizer.load(tmp_path / "missing.model")
    (tmp_path / "junk.model").write_bytes(b"not a model")
    with pytest.raises(ValueError, match="junk.model is not a SentencePiece model"):
        Tokenizer.load(tmp_path / "junk.model")
    with pytest.raises(FileNotFoundError, match="nowhere.txt"):
        train_tokenizer([tmp_path / "nowhere.txt"], 100, tmp_path / "x.model")
    with pytest.raises(ValueError, match="sets \\['pad_id'\\] itself"):
        train_tokenizer(demo_files, 300, tmp_path / "x.model", pad_id=5)
    with pytest.raises(ValueError, match="model_type"):
        train_tokenizer(demo_files, 300, tmp_path / "x.model", model_type="word")


def test_multi30k_shared_vocabulary(multi30k_tokenizer, shared_data):
    assert multi30k_tokenizer.vocabulary_size() == 8000
    lines = (shared_data / "multi30k" / "valid.de").read_text(encoding="utf-8").splitlines()
    ids = multi30k_tokenizer.tokenize(lines)
    assert ids.to_list() == _processor(multi30k_tokenizer).encode(lines)
    # One vocabulary for both languages: English and German words both have pieces.
    processor = _processor(multi30k_tokenizer)
    assert processor.piece_to_id("▁dog") != multi30k_tokenizer.unk_id
    assert processor.piece_to_id("▁Hund") != multi30k_tokenizer.unk_id


def _exception_kind(line, decoded):
    if line.strip() != line and decoded == line.lstrip():
        return "leading whitespace"
    if unicodedata.normalize("NFKC", line) == unicodedata.normalize("NFKC", decoded):
        return "unicode normalisation"
    return "other"


@pytest.mark.parametrize("language", ["en", "de"])
def test_newstest2014_round_trip(multi30k_tokenizer, shared_data, language):
    path = shared_data / "wmt14_newstest" / f"test.{language}"
    lines = path.read_text(encoding="utf-8").split("\n")[:-1]
    assert len(lines) == 3003
    decoded = multi30k_tokenizer.detokenize(multi30k_tokenizer.tokenize(lines)).numpy()
    decoded = [s.decode("utf-8") for s in decoded]
    failures = [(i, line, out) for i, (line, out) in enumerate(zip(lines, decoded))
                if line != out]
    rate = 1 - len(failures) / len(lines)
    kinds = collections.Counter(_exception_kind(line, out) for _, line, out in failures)
    print(f"\nnewstest2014.{language}: {rate:.2%} of {len(lines)} lines round-trip "
          f"identically; exceptions: {dict(kinds) or 'none'}")
    for i, line, out in failures[:5]:
        print(f"  line {i + 1}: {line!r} -> {out!r}")
    assert rate >= 0.99


def test_survives_keras_set_random_seed(demo_tokenizer):
    # tf.random.set_seed clears TensorFlow's kernel cache, which deletes
    # kernel-owned resources such as tf-text's default SentencePiece model.
    import keras

    text = "Es ist 9:05 Uhr."
    before = demo_tokenizer.tokenize(text).numpy().tolist()
    keras.utils.set_random_seed(1)
    tf.random.set_seed(2)
    assert demo_tokenizer.tokenize(text).numpy().tolist() == before


# --- the translation front end: encode_source and decode_output --------------------
#
# The reference is the sentencepiece Python library on the same model with the
# rules written out in plain Python: Python's UTF-8 decoding with
# errors="replace", `str.strip()` for blank lines, a list cut for truncation,
# and a loop for the cut at EOS. One known difference between the two
# SentencePiece builds: tf-text's detokenizer drops every leading space of a
# text (see test_round_trip_of_unusual_text), the Python library's only the
# dummy-prefix one; the reference strips them.

PAD, BOS, EOS = 0, 1, 2


def _reference_source(processor, text, max_length=None):
    if isinstance(text, bytes):
        text = text.decode("utf-8", errors="replace")
    if not text.strip():
        return []
    pieces = processor.EncodeAsIds(text)
    if max_length is not None:
        pieces = pieces[:max_length - 1]
    return pieces + [EOS]


def _reference_output(processor, row):
    kept = []
    for token in row:
        if token == EOS:
            break
        if token not in (PAD, BOS):
            kept.append(token)
    return kept, processor.DecodeIds(kept).lstrip(" ")


FRONT_END_TEXTS = [
    "Anna hat am 5. Mai 2021 einundzwanzig Äpfel gekauft.",
    "The train to Vienna leaves at 2:30 PM on Monday.",
    "",  # blank lines: empty, ASCII and Unicode whitespace
    " \t ",
    "\u00a0\u3000\u2028\x1c\x85",
    "  leading and trailing  ",
    "Grüße aus Köln – 東京 🙂 \u00ad",
    " ".join(["Hauptbahnhof"] * 40),  # far over any max_length below
    b"caf\xe9 au lait",  # invalid UTF-8: replaced by U+FFFD
    b"\xff\xfe\x00 The cat.",
    b"\xe2\x82 truncated, \xf0\x9f\x99 and \xed\xa0\x80 surrogate",
    b"\xc3",
    "\u200b",  # not whitespace for str.isspace: not blank
]


@pytest.mark.parametrize("max_length", [None, 1, 2, 8, 64])
def test_encode_source_equals_sentencepiece_python(demo_tokenizer, max_length):
    processor = _processor(demo_tokenizer)
    expected = [_reference_source(processor, t, max_length) for t in FRONT_END_TEXTS]
    # Over-long: one sentence has more pieces than every max_length below.
    assert max(len(_reference_source(processor, t)) for t in FRONT_END_TEXTS) > 64
    ids = demo_tokenizer.encode_source(FRONT_END_TEXTS, max_length)
    assert isinstance(ids, tf.RaggedTensor) and ids.dtype == tf.int32
    assert ids.to_list() == expected
    if max_length is not None:
        assert max(ids.row_lengths().numpy()) == max_length
    # A tf.string tensor, and the empty batch.
    assert demo_tokenizer.encode_source(tf.constant(FRONT_END_TEXTS), max_length
                                        ).to_list() == expected
    assert demo_tokenizer.encode_source([], max_length).to_list() == []


def test_blank_is_what_python_strip_removes(demo_tokenizer):
    whitespace = [chr(c) for c in range(0x110000) if chr(c).isspace()]
    assert len(whitespace) == 29
    ids = demo_tokenizer.encode_source(whitespace + [c + "x" for c in whitespace], 16)
    assert ids.row_lengths().numpy().tolist()[:29] == [0] * 29
    assert all(length > 1 for length in ids.row_lengths().numpy()[29:])
    # Characters just around the whitespace ranges are not blank.
    near = ["\x08", "\x0e", "\x1b", "!", "\x84", "\x86", "\x9f", "\xa1", "\u1681",
            "\u200b", "\u2027", "\u202a", "\u2030", "\u205e", "\u2060", "\u3001", "\ufeff"]
    assert not any(c.isspace() for c in near)
    assert all(demo_tokenizer.encode_source(near, 16).row_lengths().numpy() > 0)


def test_encode_source_rejects_a_single_string_and_bad_lengths(demo_tokenizer):
    with pytest.raises(ValueError, match="vector of sentences"):
        demo_tokenizer.encode_source("Hallo.")
    for bad in (0, -3, 2.5, True):
        with pytest.raises(ValueError, match="max_length"):
            demo_tokenizer.encode_source(["Hallo."], bad)


def _outputs(processor):
    """Decoder outputs: EOS in the middle, pad and BOS anywhere, no EOS, empty."""
    words = processor.EncodeAsIds("Der Hund biss den Mann am Montag um 9:05 Uhr.")
    umlauts = processor.EncodeAsIds("Grüße aus Köln 東京 🙂")
    spaces = processor.EncodeAsIds("   x\ty")  # leading spaces: dropped
    return [
        [BOS] + spaces + [EOS],
        [BOS] + words + [EOS, PAD, PAD],
        words[:3] + [EOS] + words[3:] + [EOS],  # only what precedes the first EOS
        [BOS, PAD] + words[:2] + [BOS, PAD] + words[2:5],  # no EOS: all of it
        [EOS] + words,  # nothing before EOS
        [PAD] * 4,  # a blank sentence's row
        umlauts + [EOS],
        [4 + 0xE2, 4 + 0x82, EOS],  # byte pieces that are not UTF-8 -> U+FFFD
        [4 + 0xC3, 4 + 0xA4, 4 + 0xFF, EOS],
        [],
    ]


def test_decode_output_equals_sentencepiece_python(demo_tokenizer):
    processor = _processor(demo_tokenizer)
    rows = _outputs(processor)
    expected_ids, expected_texts = zip(*[_reference_output(processor, r) for r in rows])
    assert "\ufffd" in expected_texts[7] and expected_texts[4] == expected_texts[5] == ""
    assert expected_texts[0] == "x\ty"
    width = max(map(len, rows))
    dense = np.zeros((len(rows), width), np.int32)  # pad-filled, as a search returns
    for i, row in enumerate(rows):
        dense[i, :len(row)] = row
    for ids in (rows, dense, dense.astype(np.int64), tf.constant(dense),
                tf.ragged.constant(rows, dtype=tf.int32)):
        assert demo_tokenizer.output_ids(ids).to_list() == list(expected_ids)
        texts = demo_tokenizer.decode_output(ids)
        assert texts.dtype == tf.string and texts.shape == (len(rows),)
        assert [t.decode("utf-8") for t in texts.numpy()] == list(expected_texts)
    assert demo_tokenizer.decode_output(np.zeros((0, 5), np.int32)).shape == (0,)
    assert demo_tokenizer.decode_output(np.zeros((2, 0), np.int32)).numpy().tolist() == \
        [b"", b""]


def test_front_end_round_trip_and_graph_functions(demo_tokenizer):
    texts = [t for t in FRONT_END_TEXTS if isinstance(t, str)]
    expected = demo_tokenizer.encode_source(texts, 12).to_list()

    @tf.function(input_signature=[tf.TensorSpec([None], tf.string)])
    def round_trip(text):
        ids = demo_tokenizer.encode_source(text, 12)
        return ids.to_tensor(), demo_tokenizer.decode_output(ids.to_tensor())

    ids, decoded = round_trip(tf.constant(texts))
    assert [[i for i in row if i] for row in ids.numpy().tolist()] == expected
    processor = _processor(demo_tokenizer)
    assert [t.decode() for t in decoded.numpy()] == [
        processor.DecodeIds(row[:-1]).lstrip(" ") for row in expected]
    # In tf.data, batched.
    dataset = tf.data.Dataset.from_tensor_slices(texts).batch(4).map(
        lambda text: demo_tokenizer.encode_source(text, 12))
    assert [row for batch in dataset for row in batch.to_list()] == expected
