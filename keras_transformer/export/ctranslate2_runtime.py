"""Translating with an exported CTranslate2 folder (`keras_transformer.export.ctranslate2`).

`CTranslate2Translator` runs an exported folder with the front end of
`Translator` and the SavedModel, the graph functions of the folder's
`Tokenizer` (`spm.model`): source ids by `Tokenizer.encode_source` (invalid
UTF-8 replaced, pieces truncated to `max_length - 1`, so that with EOS the
source has at most `max_length` ids; blank sentences answered `""`), given
to CTranslate2 as pieces without the EOS (it appends its own), and output
ids cut at the sentence's length limit (`source ids + max_extra_length`),
then made text by `Tokenizer.decode_output` (cut at EOS, pad and BOS
dropped, detokenized). It needs `ctranslate2`, TensorFlow and TensorFlow Text
(the tokenizer's ops), and none of the package's Keras code (model, layers,
decoding): a benchmark can time it in a process of its own. (TensorFlow 2.16
and later imports the `keras` package when it is imported; this module never
uses it.)

Decoding differences with `keras_transformer.inference.decoding` at the same beam size:

- Greedy decoding (beam 1) gives the same tokens (CTranslate2's
  `min_decoding_length` is set to 0, as our search may emit EOS first).
- Beam search: CTranslate2 divides a finished hypothesis' log-probability
  by `|Y| ** length_penalty` (`|Y|` counting EOS, since `return_end_token`
  is set), ours by GNMT's `((5 + |Y|) / 6) ** alpha`. By default (`alpha`,
  no `length_penalty`) `CTranslate2Translator` asks CTranslate2 for all
  `beam_size` finished hypotheses with their raw log-probabilities
  (`length_penalty=0`, `num_hypotheses=beam_size`) and picks the best by
  GNMT's penalty, as ours does. What stays different is when a sentence
  stops: CTranslate2 once `beam_size` hypotheses have finished
  (`patience=1`), ours once no alive hypothesis can still beat the best
  finished one, so a few outputs differ from ours (fewer than with
  CTranslate2's own normalisation at `length_penalty=alpha`;
  `examples/compare_inference.py` measures the share of identical outputs,
  docs/results.md holds it). `length_penalty=` selects CTranslate2's own
  normalisation instead. Its length limit is one per
  batch (`max_decoding_length`), so `CTranslate2Translator` decodes up to
  the batch's longest limit and cuts each output to its own: exact for
  greedy decoding, while a beam that ours would have ended at the limit may
  come out otherwise.

Example:

>>> translator = CTranslate2Translator("saved_models/demo_tiny-ct2-int8")
>>> translator.translate(["Hello world."], beam_size=4, alpha=0.6)
['Hallo Welt.']
"""

import json
import pathlib

import numpy as np

from keras_transformer import names
from keras_transformer.model.config import DecodingOptions
from keras_transformer.model.config import length_penalty as gnmt_length_penalty
from keras_transformer.inference.shell import TranslatorShell

TOKENIZER_FILE = names.TOKENIZER_FILE
# What the converter writes beside CTranslate2's files: the model's config and its origin.
INFO_FILE = "keras_transformer.json"
# The decoding defaults (`DecodingOptions`: the paper's beam 4, alpha 0.6,
# outputs up to source length + 50 ids).
_DECODING = DecodingOptions()
INSTALL_HINT = ("CTranslate2 needs the ctranslate2 package: pip install ctranslate2 "
                "(or pip install 'keras-transformer[ctranslate2]')")

__all__ = ["CTranslate2NotInstalled", "CTranslate2Translator", "require_ctranslate2"]


class CTranslate2NotInstalled(ImportError):
    """The `ctranslate2` package is missing; the message says how to install it."""


def require_ctranslate2():
    """The `ctranslate2` module; `CTranslate2NotInstalled` without it."""
    try:
        import ctranslate2
    except ImportError:
        raise CTranslate2NotInstalled(INSTALL_HINT) from None
    return ctranslate2


class CTranslate2Translator(TranslatorShell):
    """Translates with an exported CTranslate2 folder, as `Translator` does.

    Sentences become source ids with the folder's tokenizer
    (`Tokenizer.encode_source` at the model's `max_length`: invalid UTF-8
    replaced, at most `max_length - 1` pieces, then EOS, which CTranslate2
    appends itself), are translated, cut at the sentence's length limit (its
    source ids, EOS included, plus `max_extra_length`) and made text by
    `Tokenizer.decode_output` (cut at EOS, pad and BOS dropped, detokenized):
    the front end of `Translator` and of the SavedModel, from the same
    `keras_transformer.inference.shell.TranslatorShell`. Blank (empty or
    all-whitespace) sentences translate to `""` without decoding.

    Needs `ctranslate2`, TensorFlow and TensorFlow Text (the tokenizer's
    graph ops), not the package's Keras model code.

    Args:
        model_dir: a folder written by `export_ctranslate2`.
        device: `"cpu"` or `"cuda"`.
        compute_type: CTranslate2's compute type (`"default"`: the stored
            weight type). With int8 weights on a CPU, CTranslate2 picks its
            int8 matrix product: Intel MKL's on Intel CPUs, oneDNN's
            elsewhere. Without VNNI instructions (an AVX2-only AMD CPU)
            oneDNN's product sums pairs of 8-bit products in saturating
            16-bit integers, which loses accuracy; `CT2_USE_MKL=1` in the
            environment (before the first model loads) makes CTranslate2 use
            MKL's there too, and `compute_type="float32"` computes in float32
            with the int8 weights dequantized.
        intra_threads: threads per translation (0: CTranslate2's default).
        inter_threads: translations run in parallel.
        batch_size: sentences per batch (`max_batch_size`).
        max_extra_length: outputs have at most source length + this many ids;
            default the folder's recorded decoding (`keras_transformer.json`'s
            `decoding`: the run's settings, `export_ctranslate2_from_run`),
            else the paper's 50.

    Example:

    >>> translator = CTranslate2Translator("saved_models/demo_tiny-ct2")
    >>> translator.translate(["Hello."], beam_size=1)
    ['Hallo.']
    """

    def __init__(self, model_dir, *, device="cpu", compute_type="default", intra_threads=0,
                 inter_threads=1, batch_size=32, max_extra_length=None):
        from keras_transformer.data.tokenizer import Tokenizer

        ctranslate2 = require_ctranslate2()
        model_dir = pathlib.Path(model_dir)
        info_file = model_dir / INFO_FILE
        if not info_file.is_file():
            raise FileNotFoundError(f"{model_dir} has no {INFO_FILE}; expected a folder "
                                    "written by export_ctranslate2")
        info = json.loads(info_file.read_text())
        self.model_dir = model_dir
        self.info = info
        self.config = info["config"]
        # The decoding the folder records (the run's), else the paper's.
        recorded = info.get("decoding") or {}
        self.decoding = _DECODING.replace(**{
            name: recorded.get(name) for name in ("beam_size", "alpha", "max_extra_length")})
        self.max_extra_length = (self.decoding.max_extra_length if max_extra_length is None
                                 else max_extra_length)
        super().__init__(Tokenizer.load(model_dir / info.get("tokenizer", TOKENIZER_FILE)),
                         self.config["max_length"], batch_size)
        self.translator = ctranslate2.Translator(
            str(model_dir), device=device, compute_type=compute_type,
            intra_threads=intra_threads, inter_threads=inter_threads)
        vocabulary = model_dir / "shared_vocabulary.json"
        if not vocabulary.is_file():
            vocabulary = model_dir / "target_vocabulary.json"
        # Output pieces -> ids by CTranslate2's own vocabulary (ids are ours by construction).
        self._target_ids = {piece: i for i, piece in
                            enumerate(json.loads(vocabulary.read_text(encoding="utf-8")))}
        # The longest output the position table allows (learned tables have max_length rows).
        self._max_positions = int(info.get("position_table_rows", self.config["max_length"]))

    # --- pieces and ids ----------------------------------------------------------

    def _pieces(self, ids):
        return [self.tokenizer.id_to_token(int(i)) for i in ids]

    def _ids(self, pieces):
        return [self._target_ids[p] for p in pieces]

    def _source_pieces(self, source_ids):
        eos = self.config["eos_id"]
        rows = []
        for ids in source_ids:
            ids = list(ids)
            if ids and ids[-1] == eos:
                ids = ids[:-1]  # CTranslate2 appends EOS (add_source_eos)
            rows.append(self._pieces(ids))
        return rows

    # --- decoding ------------------------------------------------------------------

    def _translate_rows(self, source_ids, beam_size, alpha, length_penalty):
        """Each sentence's best output ids, EOS and all, cut at its length limit."""
        if not source_ids:
            return []
        limits = [min(len(ids) + self.max_extra_length, self._max_positions)
                  for ids in source_ids]
        rerank = beam_size > 1 and length_penalty is None
        results = self.translator.translate_batch(
            self._source_pieces(source_ids), max_batch_size=self.batch_size,
            beam_size=beam_size, length_penalty=length_penalty or 0.0,
            patience=1, num_hypotheses=beam_size if rerank else 1, return_scores=rerank,
            max_input_length=0, max_decoding_length=max(limits), min_decoding_length=0,
            return_end_token=True)
        outputs = []
        for result, limit in zip(results, limits):
            best = result.hypotheses[0]
            if rerank:
                # Raw log-probabilities (length_penalty 0), EOS counted in |Y|.
                gnmt = [score / gnmt_length_penalty(len(hypothesis), alpha)
                        for hypothesis, score in zip(result.hypotheses, result.scores)]
                best = result.hypotheses[int(np.argmax(gnmt))]
            outputs.append(self._ids(best)[:limit])
        return outputs

    def decode_rows(self, source_ids, options):
        """`TranslatorShell.decode_rows`: `options` is `(beam_size, alpha, length_penalty)`."""
        return self._translate_rows(source_ids, *options), None

    def translate(self, sentences, *, beam_size=None, alpha=None, length_penalty=None):
        """Translates a list of sentences.

        Args:
            sentences: a list of strings.
            beam_size: 1 is greedy decoding; default the folder's recorded
                decoding (`self.decoding`), else the paper's 4.
            alpha: GNMT length-penalty strength, ours (`config.length_penalty`);
                default recorded, else 0.6:
                the finished hypotheses are ranked by
                `log P(Y) / ((5 + |Y|) / 6) ** alpha`, `|Y|` counting EOS.
            length_penalty: if given, CTranslate2's own normalisation instead,
                `log P(Y) / |Y| ** length_penalty` (see the module docstring).

        Returns:
            A list of strings, `""` for a blank sentence.
        """
        beam_size = self.decoding.beam_size if beam_size is None else beam_size
        alpha = self.decoding.alpha if alpha is None else alpha
        translations, _ = self.translate_sentences(sentences,
                                                   (beam_size, alpha, length_penalty))
        return translations
