"""Translator (batching, order, truncation, scores, attention), sacreBLEU evaluation, plots.

The tokenizer is a real `Tokenizer`: a SentencePiece word model whose pieces
are the words `w0` ... `w45` (with the 4 special ids: 50 ids). References
come from the sentencepiece Python library on the same model and from the
model's own logits.
"""

import types

import numpy as np
import pytest

from keras_transformer.model.config import DecodingOptions, TransformerConfig
from keras_transformer.data.tokenizer import Tokenizer
from keras_transformer.inference.decoding import beam_search
from keras_transformer.model.transformer import build_model
from keras_transformer.training.plotting import plot_attention
from keras_transformer.inference.evaluation import evaluate_bleu, score_translations
from keras_transformer.inference.translator import Translator
from layer_test_utils import to_np
from word_tokenizer import BOS, EOS, PAD, word_model_proto, word_tokenizer, words

WORDS = words(46)  # with the 4 special tokens: 50 ids


@pytest.fixture(scope="module")
def _word_tokenizer():
    return word_tokenizer(WORDS)


@pytest.fixture(scope="module")
def tokenizer(_word_tokenizer):
    return _word_tokenizer[0]


@pytest.fixture(scope="module")
def processor(_word_tokenizer):
    """The sentencepiece Python library on the same model: the reference."""
    return _word_tokenizer[1]


def tiny_config(**overrides):
    values = dict(vocab_size=50, num_layers=2, d_model=32, num_heads=4, d_ff=64,
                  dropout=0.0, max_length=32, tie_output_embeddings=False)
    values.update(overrides)
    return TransformerConfig.preset("tiny", **values)


@pytest.fixture(scope="module")
def model():
    import keras

    keras.utils.set_random_seed(3)
    model = build_model(tiny_config())
    # The output bias: pad and BOS are never chosen (so every generated id is
    # in the text and the teacher-forced references see what the search saw),
    # and EOS often enough that outputs end both ways (EOS, length limit).
    bias = keras.ops.convert_to_numpy(model.output_projection.bias).copy()
    bias[[PAD, BOS]] = -30.0
    bias[EOS] = 2.0
    model.output_projection.bias.assign(bias)
    return model


def reference_source(processor, sentence):
    return processor.EncodeAsIds(sentence) + [EOS]


def reference_text(processor, row):
    """The output's text: ids before the first EOS, pad and BOS dropped, detokenized."""
    kept = []
    for token in row:
        if token == EOS:
            break
        if token not in (PAD, BOS):
            kept.append(int(token))
    return processor.DecodeIds(kept)


def sentences(count, seed=0):
    rng = np.random.default_rng(seed)
    return [" ".join(rng.choice(WORDS, rng.integers(1, 12))) for _ in range(count)]


def test_translate_matches_direct_decoding_in_input_order(model, tokenizer, processor, capsys):
    # Width 16 for every batch: batches of 3 sorted sentences, then 1.
    translator = Translator(model, tokenizer, batch_size=3, max_extra_length=5,
                            length_multiple=16)
    inputs = sentences(7) + ["", "   ", "\u00a0"]
    translations = translator.translate(inputs, beam_size=2, alpha=0.6, progress=True)
    assert "10/10" in capsys.readouterr().out  # the progress bar reached the end
    assert len(translations) == 10 and translations[7:] == ["", "", ""]
    # Reference: the sentences in input (not length) order, 3 per batch as
    # (3, 16) arrays (the shapes the Translator compiled), decoded directly.
    ids = [reference_source(processor, s) for s in inputs[:7]]
    source = np.zeros((9, 16), "int32")
    for row, row_ids in enumerate(ids):
        source[row, :len(row_ids)] = row_ids
    tokens = np.concatenate([to_np(beam_search(model, source[i:i + 3], beam_size=2, alpha=0.6,
                                               max_extra_length=5)[0]) for i in (0, 3, 6)])
    for row, translation in enumerate(translations[:7]):
        assert translation == reference_text(processor, tokens[row])
        assert len(translation.split()) <= len(ids[row]) + 5


@pytest.mark.backend_independent  # no model: the shell around any decoder
def test_the_shell_skips_blanks_batches_longest_first_and_keeps_the_input_order(
        tokenizer, processor):
    from keras_transformer.inference.shell import TranslatorShell

    class Echo(TranslatorShell):  # "decodes" a source into itself, scored by its length
        batches = []

        def decode_rows(self, source_ids, options):
            self.batches.append([len(ids) for ids in source_ids])
            assert options == "the options"
            return [list(ids) for ids in source_ids], [float(len(ids)) for ids in source_ids]

    shell = Echo(tokenizer, max_length=6, batch_size=2)
    inputs = ["w1", "", "w1 w2 w3", " \t", "w4 w5", b"w6 w7 w8 w9 w10 w11 w12", "w3"]
    seen = []
    translations, scores = shell.translate_sentences(
        inputs, "the options", on_batch=lambda indices, ids, rows: seen.extend(indices))
    # Truncated to max_length - 1 pieces (then EOS), blank ones untouched.
    assert translations == ["w1", "", "w1 w2 w3", "", "w4 w5", "w6 w7 w8 w9 w10", "w3"]
    assert scores == [2.0, 0.0, 4.0, 0.0, 3.0, 6.0, 2.0]
    assert Echo.batches == [[6, 4], [3, 2], [2]]  # longest first, batch_size at a time
    assert seen == [5, 2, 4, 0, 6]
    for sentence, translation in zip(inputs, translations):  # the sentencepiece library's
        text = sentence.decode() if isinstance(sentence, bytes) else sentence
        if text.strip():
            assert translation == processor.DecodeIds(processor.EncodeAsIds(text)[:5])
    with pytest.raises(TypeError, match=r"wrap one sentence in a list: go\(\[sentence\]\)"):
        shell.translate_sentences("w1", None, caller="go")


def test_encode_appends_eos_and_truncates_to_max_length(model, tokenizer, processor):
    translator = Translator(model, tokenizer)
    long = " ".join(["w5"] * 100)
    ids = translator.encode(["w1 w2", long, " \t", b"w3 \xff"])
    assert ids[0] == [processor.PieceToId("\u2581w1"), processor.PieceToId("\u2581w2"), EOS]
    assert ids[1] == reference_source(processor, long)[:model.config.max_length - 1] + [EOS]
    assert len(ids[1]) == model.config.max_length
    assert ids[2] == []  # blank: no ids, not decoded
    assert ids[3] == reference_source(processor, "w3 \ufffd")  # invalid UTF-8 replaced
    assert translator.translate([]) == []
    with pytest.raises(TypeError, match="list of strings"):
        translator.translate("w1 w2")


def test_translator_checks_the_tokenizer(model, tokenizer, processor):
    with pytest.raises(TypeError, match="keras_transformer.data.Tokenizer"):
        Translator(model, processor)  # any other object, e.g. a SentencePieceProcessor
    other_ids = types.SimpleNamespace(config=tiny_config(eos_id=3, unk_id=2))
    with pytest.raises(ValueError, match="eos_id"):
        Translator(other_ids, tokenizer)
    with pytest.raises(ValueError, match="vocabulary"):
        Translator(model, Tokenizer(word_model_proto(WORDS + ["extra"])))


def test_scores_are_teacher_forced_log_probabilities_over_the_gnmt_penalty(
        model, tokenizer, processor):
    """`translate_with_scores` against the model's logits and the formula written out."""
    import keras

    extra = 4
    # Sources of 9, 2, 6, 2, 12 and 11 ids: with EOS forbidden below 7 output
    # ids, the two of 2 ids end at their limit of 6 ids without EOS, and the
    # others may end with EOS (the model's EOS bias makes that likely).
    options = DecodingOptions(max_extra_length=extra, min_length=7)
    translator = Translator(model, tokenizer, options, batch_size=4)
    inputs = sentences(6, seed=5) + [""]
    ended = []
    for beam_size, alpha in ((1, 0.6), (3, 0.6), (3, 2.0)):
        texts, scores = translator.translate_with_scores(inputs, beam_size=beam_size,
                                                         alpha=alpha)
        assert texts[-1] == "" and scores[-1] == 0.0
        # The output ids, EOS included when generated (pad and BOS never are).
        _, attention = translator.translate(inputs[:-1], beam_size=beam_size, alpha=alpha,
                                            return_attention=True)
        for sentence, text, score, record in zip(inputs, texts, scores, attention):
            source = reference_source(processor, sentence)
            output = [processor.PieceToId(piece) for piece in record["target_tokens"]]
            assert text == reference_text(processor, output)
            ended.append(output[-1:] == [EOS])
            assert ended[-1] or len(output) == len(source) + extra
            logits = keras.ops.convert_to_numpy(model(
                {"source_ids": np.array([source], "int32"),
                 "target_ids": np.array([[BOS] + output[:-1]], "int32")}, training=False))[0]
            logits = logits.astype("float64")
            log_probs = logits - logits.max(-1, keepdims=True)
            log_probs -= np.log(np.exp(log_probs).sum(-1, keepdims=True))
            log_p = sum(log_probs[t, y] for t, y in enumerate(output))
            assert score == pytest.approx(log_p / ((5 + len(output)) / 6) ** alpha,
                                          rel=1e-4, abs=1e-4), (beam_size, alpha, sentence)
    assert len(ended) == 18 and 0 < sum(ended) < 18  # both ways of ending are exercised


def test_attention_weights_and_plots(model, tokenizer, processor, tmp_path):
    translator = Translator(model, tokenizer, batch_size=4, max_extra_length=3)
    inputs = ["w1 w2 w3 w4", "w7", "w9 w9"]
    translations, attention = translator.translate(inputs, beam_size=1,
                                                   return_attention=True)
    assert translations == translator.translate(inputs, beam_size=1)
    for sentence, translation, record in zip(inputs, translations, attention):
        source_length = len(sentence.split()) + 1
        assert record["source_tokens"] == ["\u2581" + w for w in sentence.split()] + ["</s>"]
        target_length = len(record["target_tokens"])
        assert 1 <= target_length <= source_length + 3
        pieces = [t for t in record["target_tokens"] if t != "</s>"]
        assert processor.DecodePieces(pieces) == translation
        assert record["encoder_self_attention"].shape == (2, 4, source_length, source_length)
        assert record["cross_attention"].shape == (2, 4, target_length, source_length)
        assert record["decoder_self_attention"].shape == (2, 4, target_length, target_length)
        for key in ("encoder_self_attention", "cross_attention", "decoder_self_attention"):
            np.testing.assert_allclose(record[key].sum(-1), 1.0, atol=1e-5)
        # Causal: no weight on later target positions.
        assert np.all(np.triu(record["decoder_self_attention"], k=1) == 0)

    from matplotlib.image import imread

    for kind in ("cross", "encoder", "decoder"):
        path = plot_attention(attention[0], tmp_path / "plots" / f"{kind}.png", kind=kind,
                              layer=-1)
        assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
        image = imread(path)
        assert image.ndim == 3 and image.shape[0] > 100 and image.shape[1] > 200
        assert image[..., :3].std() > 0.05  # not a blank canvas
    path = plot_attention(np.full((3, 4), 0.25), tmp_path / "array.png",
                          query_tokens=list("abc"), key_tokens=list("wxyz"), heads=[0])
    assert path.stat().st_size > 1000
    with pytest.raises(ValueError, match="kind"):
        plot_attention(attention[0], tmp_path / "bad.png", kind="self")
    with pytest.raises(ValueError, match="query tokens"):
        plot_attention(np.ones((2, 3)), tmp_path / "bad.png", query_tokens=["a"])


class ReferenceTranslator:
    """Returns the reference of each source line: BLEU must be 100."""

    def __init__(self, sources, references):
        self.table = dict(zip(sources, references))
        self.calls = []

    def translate(self, lines, **kwargs):
        self.calls.append(kwargs)
        return [self.table[line] for line in lines]


@pytest.mark.shared_data
def test_evaluate_bleu_of_the_reference_is_100(shared_data, tmp_path, capsys):
    folder = shared_data / "wmt14_newstest"
    sources = (folder / "test.en").read_text(encoding="utf-8").splitlines()[:40]
    references = (folder / "test.de").read_text(encoding="utf-8").splitlines()[:40]
    translator = ReferenceTranslator(sources, references)
    result = evaluate_bleu(translator, folder / "test.en", folder / "test.de",
                           max_sentences=40, output_file=tmp_path / "hyp.de")
    assert result.bleu == pytest.approx(100.0) and result.chrf == pytest.approx(100.0)
    assert result.num_sentences == 40
    # No beam size or alpha given: the translator's own options decide.
    assert translator.calls == [{"beam_size": None, "alpha": None, "progress": False}]
    assert result.bleu_signature.startswith("nrefs:1|case:mixed|eff:no|tok:13a")
    assert result.bleu_signature in capsys.readouterr().out
    assert (tmp_path / "hyp.de").read_text(encoding="utf-8").splitlines() == references


def test_score_translations_bounds():
    references = ["Der Hund biss den Mann.", "Es war nicht unerwartet."]
    assert score_translations(references, references).bleu == pytest.approx(100.0)
    assert score_translations(["x y z", "q r s"], references).bleu == pytest.approx(0.0)
    with pytest.raises(ValueError, match="hypotheses"):
        score_translations(references, references[:1])


def test_lowercased_bleu_is_sacrebleus_bleu_of_the_lowercased_text():
    from sacrebleu.metrics import BLEU

    references = ["Der Hund biss den Mann im Park.", "Es war nicht unerwartet, sagte er."]
    hypotheses = ["der Hund biss den mann im Park.", "Es war nicht erwartet, sagte Er."]
    result = score_translations(hypotheses, references)
    # The reference: sacreBLEU's default BLEU of text lowercased by Python.
    expected = BLEU().corpus_score([h.lower() for h in hypotheses],
                                   [[r.lower() for r in references]]).score
    assert result.bleu_lowercase == pytest.approx(expected)
    assert result.bleu < result.bleu_lowercase < 100
    assert result.bleu_lowercase_signature.startswith("nrefs:1|case:lc|eff:no|tok:13a")
    assert "BLEU, lowercased = " in str(result)


def test_evaluate_bleu_checks_line_counts(tmp_path):
    (tmp_path / "a.txt").write_text("x\ny\n", encoding="utf-8")
    (tmp_path / "b.txt").write_text("x\n", encoding="utf-8")
    with pytest.raises(ValueError, match="aligned"):
        evaluate_bleu(ReferenceTranslator([], []), tmp_path / "a.txt", tmp_path / "b.txt")


@pytest.mark.shared_data
def test_translator_with_the_sentencepiece_tokenizer(shared_data, tmp_path, capsys):
    from keras_transformer.data.tokenizer import train_tokenizer

    folder = shared_data / "wmt14_newstest"
    tokenizer = train_tokenizer([folder / "valid.en", folder / "valid.de"], vocab_size=400,
                                model_file=tmp_path / "tiny.model", max_sentences=2000)
    import keras

    keras.utils.set_random_seed(0)
    # Sources are truncated to 24 ids: one batch of 4 short decodes.
    model = build_model(tiny_config(vocab_size=400, max_length=24))
    translator = Translator(model, tokenizer, batch_size=4, max_extra_length=4)
    result = evaluate_bleu(translator, folder / "test.en", folder / "test.de", beam_size=2,
                           max_sentences=4)
    assert "BLEU = " in capsys.readouterr().out
    # The hypotheses are the first 4 sources encoded by SentencePiece's own
    # library (truncated to 23 pieces + EOS), beam-searched as one batch in the
    # Translator's order and shape (longest first, width a multiple of 8) and
    # decoded by the library; the scores are sacreBLEU's against the first 4
    # reference lines.
    import sentencepiece

    processor = sentencepiece.SentencePieceProcessor(model_proto=tokenizer.model_proto)
    sources = (folder / "test.en").read_text(encoding="utf-8").splitlines()[:4]
    references = (folder / "test.de").read_text(encoding="utf-8").splitlines()[:4]
    ids = [processor.EncodeAsIds(s)[:23] + [EOS] for s in sources]
    order = sorted(range(4), key=lambda i: -len(ids[i]))
    source = np.zeros((4, -(-max(map(len, ids)) // 8) * 8), "int32")
    for row, i in enumerate(order):
        source[row, :len(ids[i])] = ids[i]
    tokens = to_np(beam_search(model, source, beam_size=2, alpha=0.6, max_extra_length=4)[0])
    expected = [None] * 4
    for row, i in enumerate(order):
        expected[i] = reference_text(processor, tokens[row])
    assert result.hypotheses == expected
    assert result.num_sentences == 4
    import sacrebleu

    assert result.bleu == pytest.approx(
        sacrebleu.corpus_bleu(result.hypotheses, [references]).score)
    assert result.chrf == pytest.approx(
        sacrebleu.corpus_chrf(result.hypotheses, [references]).score)
