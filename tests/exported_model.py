"""The tiny exported SavedModel that the export, serving and command tests share.

One tiny model and tokenizer are exported once per session (`exported()`).
Under JAX and PyTorch the export runs in a TensorFlow-backend subprocess; the
reference translations always come from `Translator.translate` in this
process, on this backend.
"""

import keras
import pytest
import tensorflow as tf

from keras_transformer.data import generate_pairs, train_tokenizer
from keras_transformer.export.saved_model import export_saved_model
from keras_transformer.inference.translator import Translator
from keras_transformer.model.config import TransformerConfig
from keras_transformer.model.transformer import build_model

BEAM_SIZE, ALPHA, MAX_LENGTH, MAX_EXTRA = 3, 0.6, 32, 6
LONG_INPUT = "word " * 5000


def _sentences():
    pairs = generate_pairs(14, seed=11)
    return [en for en, _ in pairs] + [
        "", "   ", LONG_INPUT, "Hello world.", "Grüße aus Köln – 東京 🙂",
        "The cat sat on the mat.",
    ]


def _build(work):
    """Tokenizer, tiny model and Translator; the model avoids byte pieces."""
    pairs = generate_pairs(2000, seed=0)
    (work / "train.en").write_text("\n".join(p[0] for p in pairs), encoding="utf-8")
    (work / "train.de").write_text("\n".join(p[1] for p in pairs), encoding="utf-8")
    run = work / "run"
    tokenizer = train_tokenizer([work / "train.en", work / "train.de"], 400,
                                run / "spm.model")
    keras.utils.set_random_seed(7)
    config = TransformerConfig.preset(
        "tiny", vocab_size=tokenizer.vocabulary_size(), num_layers=2, d_model=32,
        num_heads=4, d_ff=64, dropout=0.0, max_length=MAX_LENGTH)
    model = build_model(config)
    # Zero embeddings (so logit 0) for the special ids and the byte-fallback
    # pieces: whatever the backend's random init, the outputs are then word
    # pieces up to the length limit, never empty.
    V = config.vocab_size
    zeroed = [i for i in range(V)
              if i < 4 or tokenizer.id_to_token(i).startswith("<0x")]
    for variable in model.weights:
        if tuple(variable.shape) == (V, config.d_model):
            value = keras.ops.convert_to_numpy(variable.value).copy()
            value[zeroed] = 0.0
            variable.assign(value)
    model.save(run / "model.keras")
    return Translator(model, tokenizer, batch_size=8, max_extra_length=MAX_EXTRA), run


_CACHE = {}


def exported(tmp_path_factory):
    """The session's export: dict with paths, translator and reference outputs."""
    if "export" not in _CACHE:
        work = tmp_path_factory.mktemp("export")
        translator, run = _build(work)
        base = work / "saved_models"
        # Chunks of 8: the 20 sentences are decoded in three chunks of
        # different widths, the last one with 4 sentences and the blank rows.
        path = export_saved_model(translator, base, beam_size=BEAM_SIZE, alpha=ALPHA,
                                  batch_size=8)
        sentences = _sentences()
        _CACHE["export"] = dict(
            path=path, base=base, run=run, translator=translator, sentences=sentences,
            beam=translator.translate(sentences, beam_size=BEAM_SIZE, alpha=ALPHA),
            greedy=translator.translate(sentences, beam_size=1))
    return _CACHE["export"]


@pytest.fixture(scope="module")
def export(tmp_path_factory):
    return exported(tmp_path_factory)


@pytest.fixture(scope="module")
def loaded(export):
    return tf.saved_model.load(str(export["path"]))
