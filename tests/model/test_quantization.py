"""int8 weights: the quantized shared embedding against NumPy, the model against float32.

The reference for `SharedEmbedding` in int8 is the quantization written out in
NumPy (per-token absmax scales of the matrix, per-row absmax scales of the
projected activations, the sqrt(d_model) scale of the paper); the reference
for the quantized model is the float32 model it was copied from.
"""

import math

import keras
import numpy as np
import pytest

from keras_transformer.model.config import DecodingOptions
from keras_transformer.model.layers import SharedEmbedding
from keras_transformer.model.transformer import build_model, quantized
from keras_transformer.inference.translator import Translator
from word_tokenizer import word_tokenizer, words


def _absmax_int8(x, axis):
    """Keras' AbsMaxQuantizer: int8 values and the scale that maps back (q / scale)."""
    scale = 127.0 / (np.max(np.abs(x), axis=axis, keepdims=True) + keras.backend.epsilon())
    return np.clip(np.round(x * scale), -127, 127), scale


def test_int8_shared_embedding_matches_numpy_quantization():
    vocab, d_model = 50, 16
    layer = SharedEmbedding(vocab, d_model)
    layer.build()
    matrix = keras.ops.convert_to_numpy(layer.embeddings).copy()
    layer.quantize("int8")
    assert keras.backend.standardize_dtype(layer._embeddings.dtype) == "int8"

    q, scale = _absmax_int8(matrix, axis=-1)  # one scale per token
    ids = np.array([[3, 7, 0, 49]], "int32")
    expected = q[ids] / scale[ids] * math.sqrt(d_model)
    np.testing.assert_allclose(keras.ops.convert_to_numpy(layer(ids)), expected,
                               rtol=1e-5, atol=1e-6)

    x = np.random.RandomState(0).normal(size=(2, 3, d_model)).astype("float32")
    xq, x_scale = _absmax_int8(x, axis=-1)  # activations: one scale per position
    expected = (xq @ q.T) / (x_scale * scale.T)
    np.testing.assert_allclose(keras.ops.convert_to_numpy(layer(x, reverse=True)), expected,
                               rtol=1e-4, atol=1e-5)
    # And the float32 projection it approximates, within the quantization error.
    np.testing.assert_allclose(expected, x @ matrix.T, atol=0.05)


def test_shared_embedding_refuses_other_modes():
    layer = SharedEmbedding(10, 8)
    layer.build()
    with pytest.raises(NotImplementedError, match="int8 quantization only"):
        layer.quantize("float8")


def _model():
    keras.utils.set_random_seed(3)
    return build_model(preset="tiny", vocab_size=200, dropout=0.0)


@pytest.fixture(scope="module")
def model_and_int8():
    """A float32 model, its weights before quantizing, and its int8 copy."""
    model = _model()
    before = [keras.ops.convert_to_numpy(w).copy() for w in model.weights]
    return model, before, quantized(model, "int8")


def test_quantized_copy_quantizes_dense_and_embedding_and_leaves_the_original(
        model_and_int8):
    model, before, model8 = model_and_int8
    modes = {layer.name: layer.quantization_mode for layer in model8._flatten_layers()
             if getattr(layer, "quantization_mode", None)}
    assert modes["shared_embedding"] == "int8"
    for name in ("query", "key", "value", "attention_output", "ffn_inner", "ffn_output"):
        assert modes[name] == "int8"
    after = [keras.ops.convert_to_numpy(w) for w in model.weights]
    assert all(np.array_equal(a, b) for a, b in zip(before, after))
    assert getattr(model.target_embedding, "quantization_mode", None) is None
    with pytest.raises(ValueError, match="quantized already"):
        quantized(model8, "int8")
    with pytest.raises(ValueError, match="one of int8"):
        quantized(model, "int4")


def test_int8_log_probabilities_stay_close_to_float32(model_and_int8):
    """The stated tolerance: log-probabilities within 0.1 (max) and 0.02 (mean)."""
    model, _, model8 = model_and_int8
    rng = np.random.RandomState(0)
    inputs = {"source_ids": rng.randint(4, 200, (4, 12)).astype("int32"),
              "target_ids": rng.randint(4, 200, (4, 9)).astype("int32")}

    def log_probs(m):
        logits = keras.ops.convert_to_numpy(m(inputs, training=False)).astype("float64")
        return logits - np.log(np.exp(logits).sum(-1, keepdims=True))

    reference, int8 = log_probs(model), log_probs(model8)
    difference = np.abs(reference - int8)
    assert difference.max() < 0.1 and difference.mean() < 0.02
    assert difference.max() > 0  # the weights really changed


def test_translator_scores_with_a_quantized_model_are_its_teacher_forced_scores():
    """The cached int8 search against the int8 model's own full (uncached) pass."""
    model = _model()
    # Zero rows (logit 0) for pad and BOS: a random model then never emits
    # them, so every output id shows in the text (the Translator drops both).
    matrix = keras.ops.convert_to_numpy(model.target_embedding.embeddings).copy()
    matrix[:2] = 0.0
    model.target_embedding.embeddings.assign(matrix)
    model8 = quantized(model, "int8")
    alpha, extra = 0.6, 5
    # min_length 1: a random model may pick EOS first; the outputs are then non-empty.
    options = DecodingOptions(beam_size=2, alpha=alpha, max_extra_length=extra, min_length=1)
    # A word tokenizer of the model's 200 ids: every output id is a word of
    # the text, read back by the sentencepiece library (`<unk>` as well).
    tokenizer, processor = word_tokenizer(words(model.config.vocab_size - 4))
    translator = Translator(model8, tokenizer, options, batch_size=2)
    sources = ["w5 w6 w7", "w8 w9", ""]
    texts, scores = translator.translate_with_scores(sources)
    assert texts[2] == "" and scores[2] == 0.0
    for source, text, score in zip(sources[:2], texts[:2], scores[:2]):
        source_ids = processor.EncodeAsIds(source) + [2]
        output = processor.EncodeAsIds(text)
        limit = len(source_ids) + extra  # EOS included
        assert 1 <= len(output) <= limit
        # Shorter than the limit: the search ended with EOS, which the score counts.
        target = output + [2] if len(output) < limit else output
        logits = keras.ops.convert_to_numpy(model8(
            {"source_ids": np.array([source_ids], "int32"),
             "target_ids": np.array([[1] + target[:-1]], "int32")}, training=False))[0]
        logits = logits.astype("float64")
        log_probs = logits - np.log(np.exp(logits - logits.max(-1, keepdims=True)).sum(
            -1, keepdims=True)) - logits.max(-1, keepdims=True)
        expected = sum(log_probs[t, y] for t, y in enumerate(target))
        expected /= ((5 + len(target)) / 6) ** alpha
        # Not the float32 test's 1e-4: the cached and the full pass compute the
        # activations in different orders, and a last-bit difference can move
        # an activation across an int8 rounding boundary (one 1/127 step of its
        # row's absmax). Measured up to 4e-3 on another CPU; a wrong cache or
        # length penalty is off by far more than 1e-2.
        assert score == pytest.approx(expected, abs=1e-2)
