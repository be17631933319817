"""Exports a `Transformer` to CTranslate2, and translates with the exported folder.

`export_ctranslate2` fills a `ctranslate2.specs.TransformerSpec` with the
model's weights (read as NumPy arrays through the layers' attributes, so it
works under any Keras backend) and saves it through a small
`ctranslate2.converters.Converter`, optionally quantized. The folder holds
what `ctranslate2.Translator` loads (`model.bin`, `config.json`,
`shared_vocabulary.json`, or `source_`/`target_vocabulary.json` for untied
embeddings), plus `spm.model` (the SentencePiece model, to make the pieces)
and `keras_transformer.json` (the model's `TransformerConfig` and how the
folder was made).

How our model maps onto CTranslate2's Transformer:

- Post-norm (the paper) is `pre_norm=False`; pre-norm (`norm_first`) is
  `pre_norm=True` with the stacks' final LayerNorms. The LayerNorm epsilon is
  written to the model's `config.json` (`layer_norm_epsilon`).
- Embeddings: the shared (or source/target) matrices, scaled by
  sqrt(d_model) (`scale_embeddings`); the tied pre-softmax projection is the
  target matrix, an untied `output_projection` its kernel and bias.
- Positions: our encodings are the paper's interleaved sin/cos with the
  first token (BOS in the decoder) at position 0, while CTranslate2's
  built-in sinusoid is [sin | cos] halves starting at position 1. The
  encodings are therefore written as a table (`position_encodings/
  encodings`): the learned table as it is (`max_length` rows), or our
  sinusoid for `max_length + max_extra_length` positions (the longest
  output `Translator` produces from a `max_length`-id source).
- Attention: the query, key and value projections are fused as CTranslate2
  expects (q|k|v for self-attention, k|v for cross-attention); heads of
  `key_dim != d_model / num_heads` are declared with `head_dim`. Keys and
  values of different widths (`value_dim != key_dim`) have no CTranslate2
  layout and are refused.
- Tokens: the vocabulary is the SentencePiece pieces in id order, so
  CTranslate2's ids are ours; `bos_token`, `eos_token`, `unk_token` and the
  `decoder_start_token` are the pieces of our BOS, EOS and UNK ids, and
  `add_source_eos=True` appends EOS to the source as
  `Tokenizer.encode_source` does (no BOS).

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

Decoding differences with `keras_transformer.decoding` at the same beam size:

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
  finished one (on the Multi30k test set with a trained `small` model:
  99.2% of the outputs identical to ours, against 95.5% with CTranslate2's
  own normalisation at `length_penalty=alpha`). `length_penalty=` selects
  CTranslate2's own normalisation instead. Its length limit is one per
  batch (`max_decoding_length`), so `CTranslate2Translator` decodes up to
  the batch's longest limit and cuts each output to its own: exact for
  greedy decoding, while a beam that ours would have ended at the limit may
  come out otherwise.

Example:

>>> export_ctranslate2_from_run("runs/demo_tiny", quantization="int8")
PosixPath('saved_models/demo_tiny-ct2-int8')
>>> translator = CTranslate2Translator("saved_models/demo_tiny-ct2-int8")
>>> translator.translate(["Hello world."], beam_size=4, alpha=0.6)
['Hallo Welt.']
"""

import json
import os
import pathlib
import shutil

import numpy as np

from keras_transformer import names
from keras_transformer.config import DecodingOptions
from keras_transformer.config import length_penalty as gnmt_length_penalty
from keras_transformer.files import staging_dir

DEFAULT_BASE = names.EXPORT_ROOT
FOLDER_SUFFIX = "-ct2"
TOKENIZER_FILE = names.TOKENIZER_FILE
INFO_FILE = "keras_transformer.json"
# Weight types of CTranslate2's `quantization` argument (float32 is the default).
QUANTIZATIONS = names.CTRANSLATE2_QUANTIZATIONS
# The decoding defaults (`DecodingOptions`: the paper's beam 4, alpha 0.6,
# outputs up to source length + 50 ids).
_DECODING = DecodingOptions()
# Positions of the sinusoid table beyond `max_length`: the default
# max_extra_length, the longest output `Translator` produces by default.
EXTRA_POSITIONS = _DECODING.max_extra_length
INSTALL_HINT = ("CTranslate2 export needs the ctranslate2 package: pip install ctranslate2 "
                "(or pip install 'keras-transformer[ctranslate2]')")

__all__ = [
    "CTranslate2NotInstalled", "CTranslate2Translator", "QUANTIZATIONS",
    "default_output_dir", "export_ctranslate2", "export_ctranslate2_from_run",
]


class CTranslate2NotInstalled(ImportError):
    """The `ctranslate2` package is missing; the message says how to install it."""


def _ctranslate2():
    try:
        import ctranslate2
    except ImportError:
        raise CTranslate2NotInstalled(INSTALL_HINT) from None
    return ctranslate2


def default_output_dir(export_dir, model_name, quantization=None):
    """`<export_dir>/<model_name>-ct2[-<quantization>]`, the command's default folder."""
    suffix = FOLDER_SUFFIX + (f"-{quantization}" if quantization else "")
    return pathlib.Path(export_dir) / f"{model_name}{suffix}"


# --- weights as NumPy arrays -------------------------------------------------------


def _numpy(variable):
    import keras

    return np.asarray(keras.ops.convert_to_numpy(variable), dtype="float32")


def _check_float_layer(layer):
    mode = getattr(layer, "quantization_mode", None)
    if mode is not None:
        raise ValueError(
            f"layer {layer.name} is quantized by Keras ({mode}); export the float model "
            "and let CTranslate2 quantize it (quantization='int8', --quantize int8)")


def _set_linear(spec, dense, bias=True):
    """A Keras Dense `(in, out)` kernel into a CTranslate2 `(out, in)` LinearSpec."""
    _check_float_layer(dense)
    spec.weight = np.ascontiguousarray(_numpy(dense.kernel).T)
    if bias and dense.use_bias:
        spec.bias = _numpy(dense.bias)


def _set_fused(spec, denses):
    """Several Dense layers of one input as one LinearSpec, outputs concatenated."""
    for dense in denses:
        _check_float_layer(dense)
    spec.weight = np.ascontiguousarray(
        np.concatenate([_numpy(d.kernel).T for d in denses], axis=0))
    if all(d.use_bias for d in denses):
        spec.bias = np.concatenate([_numpy(d.bias) for d in denses], axis=0)
    elif any(d.use_bias for d in denses):
        raise ValueError("attention projections with and without biases cannot be fused")


def _set_layer_norm(spec, norm):
    if not (norm.center and norm.scale):
        raise ValueError(f"LayerNormalization {norm.name} needs both gamma and beta")
    spec.gamma = _numpy(norm.gamma)
    spec.beta = _numpy(norm.beta)


def _set_self_attention(spec, attention, norm):
    _set_fused(spec.linear[0], [attention.query_dense, attention.key_dense,
                                attention.value_dense])
    _set_linear(spec.linear[1], attention.output_dense)
    _set_layer_norm(spec.layer_norm, norm)


def _set_cross_attention(spec, attention, norm):
    _set_linear(spec.linear[0], attention.query_dense)
    _set_fused(spec.linear[1], [attention.key_dense, attention.value_dense])
    _set_linear(spec.linear[2], attention.output_dense)
    _set_layer_norm(spec.layer_norm, norm)


def _set_ffn(spec, layer):
    _set_linear(spec.linear_0, layer.ffn_inner)
    _set_linear(spec.linear_1, layer.ffn_output)
    _set_layer_norm(spec.layer_norm, layer.ffn_norm)


def _embedding_matrix(embedding):
    _check_float_layer(embedding)
    return _numpy(embedding.embeddings)  # (vocab_size, d_model)


def position_table(stack, num_positions):
    """The `(num_positions, d_model)` encodings a stack adds, row p for position p.

    Args:
        stack: a built `TransformerEncoder` or `TransformerDecoder`.
        num_positions: rows of the sinusoid table (a learned table keeps its
            own `max_length` rows).

    Returns:
        A float32 NumPy array: the learned table as it is, or the sinusoid of
        `keras_transformer.layers.positional_encoding` (the function the
        layer adds) for positions 0, 1, ... (float32 also under a
        mixed-precision policy).
    """
    from keras_transformer.layers.positional_encoding import sinusoid

    layer = stack.positional_encoding
    if layer.learned:
        return _numpy(layer.position_embeddings)
    return _numpy(sinusoid(np.arange(num_positions, dtype="int32"), stack.d_model))


def _check_supported(config):
    if config.value_dim != config.key_dim:
        raise ValueError(
            f"CTranslate2 needs value_dim == key_dim (fused key/value projections); "
            f"this model has key_dim={config.key_dim}, value_dim={config.value_dim}")


def build_spec(model, tokenizer, *, extra_positions=EXTRA_POSITIONS):
    """A validated `ctranslate2.specs.TransformerSpec` holding the model's weights.

    Args:
        model: a built `keras_transformer.Transformer`.
        tokenizer: its `keras_transformer.data.Tokenizer` (the pieces become
            the vocabulary).
        extra_positions: sinusoid rows beyond `config.max_length`.

    Returns:
        The spec, ready for `spec.optimize(...)` and `spec.save(...)`.
    """
    _ctranslate2()
    from ctranslate2.specs import common_spec, transformer_spec

    config = model.config
    _check_supported(config)
    head_dim = None
    if config.key_dim * config.num_heads != config.d_model:
        head_dim = config.key_dim
    common = dict(pre_norm=config.norm_first, activation=common_spec.Activation.RELU,
                  head_dim=head_dim)
    encoder_spec = transformer_spec.TransformerEncoderSpec(
        config.num_layers, config.num_heads, **common)
    decoder_spec = transformer_spec.TransformerDecoderSpec(
        config.num_layers, config.num_heads, **common)
    spec = transformer_spec.TransformerSpec(encoder_spec, decoder_spec)

    num_positions = config.max_length + extra_positions
    source_matrix = _embedding_matrix(model.source_embedding)
    target_matrix = _embedding_matrix(model.target_embedding)

    # Encoder.
    encoder = model.encoder
    encoder_spec.embeddings[0].weight = source_matrix
    encoder_spec.scale_embeddings = bool(model.source_embedding.scale)
    encoder_spec.position_encodings.encodings = position_table(encoder, num_positions)
    for layer_spec, layer in zip(encoder_spec.layer, encoder.stack):
        _set_self_attention(layer_spec.self_attention, layer.self_attention,
                            layer.self_attention_norm)
        _set_ffn(layer_spec.ffn, layer)
    if config.norm_first:
        _set_layer_norm(encoder_spec.layer_norm, encoder.final_norm)

    # Decoder.
    decoder = model.decoder
    decoder_spec.embeddings.weight = target_matrix
    decoder_spec.scale_embeddings = bool(model.target_embedding.scale)
    decoder_spec.position_encodings.encodings = position_table(decoder, num_positions)
    for layer_spec, layer in zip(decoder_spec.layer, decoder.stack):
        _set_self_attention(layer_spec.self_attention, layer.self_attention,
                            layer.self_attention_norm)
        _set_cross_attention(layer_spec.attention, layer.cross_attention,
                             layer.cross_attention_norm)
        _set_ffn(layer_spec.ffn, layer)
    if config.norm_first:
        _set_layer_norm(decoder_spec.layer_norm, decoder.final_norm)
    if model.output_projection is None:
        decoder_spec.projection.weight = target_matrix  # tied: logits = x E^T
    else:
        _set_linear(decoder_spec.projection, model.output_projection)

    # Vocabulary and special tokens.
    pieces = vocabulary_pieces(tokenizer, config.vocab_size)
    spec.register_source_vocabulary(pieces)
    spec.register_target_vocabulary(pieces)
    spec.config.bos_token = pieces[config.bos_id]
    spec.config.eos_token = pieces[config.eos_id]
    spec.config.unk_token = pieces[config.unk_id]
    spec.config.decoder_start_token = pieces[config.bos_id]
    spec.config.add_source_bos = False
    spec.config.add_source_eos = True
    spec.config.layer_norm_epsilon = float(config.layer_norm_epsilon)
    spec.validate()
    return spec


def vocabulary_pieces(tokenizer, vocab_size):
    """The SentencePiece pieces in id order, padded with unused names to `vocab_size`."""
    import sentencepiece

    processor = sentencepiece.SentencePieceProcessor()
    processor.LoadFromSerializedProto(tokenizer.model_proto)
    pieces = [processor.IdToPiece(i) for i in range(processor.GetPieceSize())]
    if len(pieces) > vocab_size:
        raise ValueError(f"the tokenizer has {len(pieces)} pieces but the model's "
                         f"vocabulary only {vocab_size}")
    taken = set(pieces)
    i = 0
    while len(pieces) < vocab_size:  # ids the tokenizer never produces
        name = f"<unused_{i}>"
        i += 1
        if name not in taken:
            pieces.append(name)
    if len(set(pieces)) != len(pieces):
        raise ValueError("the tokenizer's pieces are not unique; CTranslate2 maps "
                         "pieces to ids by name")
    return pieces


def _converter(spec):
    """A `ctranslate2.converters.Converter` whose `_load` returns `spec`."""
    from ctranslate2.converters import Converter

    class _SpecConverter(Converter):
        def _load(self):
            return spec

    return _SpecConverter()


# --- export ------------------------------------------------------------------------


def export_ctranslate2(model, tokenizer, output_dir, *, quantization=None, overwrite=False,
                       extra_positions=EXTRA_POSITIONS, source=None):
    """Writes a model as a CTranslate2 model folder that `ctranslate2.Translator` loads.

    Works under any Keras backend. The folder is written next to
    `output_dir` under a hidden temporary name and renamed into place, so a
    failed export leaves nothing under `output_dir`.

    Args:
        model: a `keras_transformer.Transformer` (float weights; Keras-quantized
            models are refused: pass `quantization` instead).
        tokenizer: its `keras_transformer.data.Tokenizer`.
        output_dir: the model folder to write.
        quantization: `None` (float32 weights) or one of `QUANTIZATIONS`,
            e.g. `"int8"` (CTranslate2 quantizes the linear and embedding
            weights per output row).
        overwrite: replace an existing `output_dir`; otherwise an existing
            folder raises `FileExistsError`.
        extra_positions: sinusoid positions beyond `config.max_length`.
        source: optional dict stored in `keras_transformer.json` (e.g. the
            run folder and weights it came from).

    Returns:
        The `pathlib.Path` of the written folder.

    Raises:
        CTranslate2NotInstalled: the ctranslate2 package is missing.
        FileExistsError: `output_dir` exists and `overwrite` is false.
        ValueError: the model has no CTranslate2 equivalent, or a bad
            `quantization`.

    Example:

    >>> export_ctranslate2(model, tokenizer, "ct2/demo", quantization="int8")
    PosixPath('ct2/demo')
    """
    if quantization is not None and quantization not in QUANTIZATIONS:
        raise ValueError(f"quantization must be one of {', '.join(QUANTIZATIONS)} or None, "
                         f"received {quantization!r}")
    output_dir = pathlib.Path(output_dir)
    if output_dir.exists() and not overwrite:
        raise FileExistsError(f"{output_dir} already exists; pass overwrite=True "
                              "(--overwrite) to replace it")
    ctranslate2 = _ctranslate2()
    spec = build_spec(model, tokenizer, extra_positions=extra_positions)
    # Read before `convert` optimizes the spec (equal tables become aliases).
    position_rows = int(spec.decoder.position_encodings.encodings.shape[0])
    # A killed conversion's staging folder is removed by the next one here.
    with staging_dir(output_dir.parent, output_dir.name) as staging:
        written = staging / "model"
        _converter(spec).convert(str(written), quantization=quantization)
        (written / TOKENIZER_FILE).write_bytes(tokenizer.model_proto)
        info = {
            "format": "ctranslate2",
            "config": model.config.to_dict(),
            "quantization": quantization,
            "tokenizer": TOKENIZER_FILE,
            "position_table_rows": position_rows,
            "ctranslate2": ctranslate2.__version__,
            "source": source or {},
        }
        (written / INFO_FILE).write_text(json.dumps(info, indent=2) + "\n")
        if output_dir.exists():
            shutil.rmtree(output_dir)
        os.replace(written, output_dir)
    return output_dir


def export_ctranslate2_from_run(run_dir, export_dir=DEFAULT_BASE, *, model_name=None,
                                weights=None, quantization=None, output_dir=None,
                                overwrite=False, verbose=False):
    """Exports a training run folder as a CTranslate2 model folder.

    Args:
        run_dir: the training job's output folder (`model.keras` or
            `config.json` + checkpoints, and `spm.model`).
        export_dir: base folder; the model goes to
            `<export_dir>/<model_name>-ct2[-<quantization>]`.
        model_name: default the run folder's name.
        weights: other weights than `model.keras`': a name of
            `loading.resolve_weights` (`best`, `last`, `averaged`,
            `ckpt-<update>`) or a `.weights.h5` path.
        quantization: as in `export_ctranslate2`.
        output_dir: write exactly this folder instead (overrides
            `export_dir` and `model_name`).
        overwrite: replace an existing folder.
        verbose: print what is written.

    Returns:
        The `pathlib.Path` of the written folder.

    Example:

    >>> export_ctranslate2_from_run("runs/demo_tiny")
    PosixPath('saved_models/demo_tiny-ct2')
    """
    from keras_transformer.loading import check_run, load_run, resolve_weights

    run_dir = pathlib.Path(run_dir)
    check_run(run_dir)
    if model_name is None:
        model_name = run_dir.resolve().name
    if output_dir is None:
        output_dir = default_output_dir(export_dir, model_name, quantization)
    output_dir = pathlib.Path(output_dir)
    if output_dir.exists() and not overwrite:  # before loading anything
        raise FileExistsError(f"{output_dir} already exists; pass --overwrite to replace it")
    if quantization is not None and quantization not in QUANTIZATIONS:
        raise ValueError(f"quantization must be one of {', '.join(QUANTIZATIONS)}, "
                         f"received {quantization!r}")
    _ctranslate2()
    if weights is not None:
        resolve_weights(run_dir, str(weights))  # a clear error for a wrong name
    model, tokenizer = load_run(run_dir, weights)
    path = export_ctranslate2(
        model, tokenizer, output_dir, quantization=quantization, overwrite=overwrite,
        source={"run": str(run_dir.resolve()), "weights": None if weights is None
                else str(weights)})
    if verbose:
        kind = quantization or "float32"
        print(f"Exported a CTranslate2 model ({kind} weights) to {path}")
    return path


# --- translating with an exported folder ---------------------------------------------


class CTranslate2Translator:
    """Translates with an exported CTranslate2 folder, as `Translator` does.

    Sentences become source ids with the folder's tokenizer
    (`Tokenizer.encode_source` at the model's `max_length`: invalid UTF-8
    replaced, at most `max_length - 1` pieces, then EOS, which CTranslate2
    appends itself), are translated, cut at the sentence's length limit (its
    source ids, EOS included, plus `max_extra_length`) and made text by
    `Tokenizer.decode_output` (cut at EOS, pad and BOS dropped, detokenized):
    the front end of `Translator` and of the SavedModel. Blank (empty or
    all-whitespace) sentences translate to `""` without decoding.

    Needs `ctranslate2`, TensorFlow and TensorFlow Text (the tokenizer's
    graph ops), not the package's Keras model code.

    Args:
        model_dir: a folder written by `export_ctranslate2`.
        device: `"cpu"` or `"cuda"`.
        compute_type: CTranslate2's compute type (`"default"`: the stored
            weight type).
        intra_threads: threads per translation (0: CTranslate2's default).
        inter_threads: translations run in parallel.
        batch_size: sentences per batch (`max_batch_size`).
        max_extra_length: outputs have at most source length + this many ids.

    Example:

    >>> translator = CTranslate2Translator("saved_models/demo_tiny-ct2")
    >>> translator.translate(["Hello."], beam_size=1)
    ['Hallo.']
    """

    def __init__(self, model_dir, *, device="cpu", compute_type="default", intra_threads=0,
                 inter_threads=1, batch_size=32,
                 max_extra_length=_DECODING.max_extra_length):
        from keras_transformer.data.tokenizer import Tokenizer

        ctranslate2 = _ctranslate2()
        model_dir = pathlib.Path(model_dir)
        info_file = model_dir / INFO_FILE
        if not info_file.is_file():
            raise FileNotFoundError(f"{model_dir} has no {INFO_FILE}; expected a folder "
                                    "written by export_ctranslate2")
        info = json.loads(info_file.read_text())
        self.model_dir = model_dir
        self.info = info
        self.config = info["config"]
        self.batch_size = batch_size
        self.max_extra_length = max_extra_length
        self.tokenizer = Tokenizer.load(model_dir / info.get("tokenizer", TOKENIZER_FILE))
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

    def encode(self, sentences):
        """Source ids of each sentence (`Tokenizer.encode_source` at the model's `max_length`).

        Args:
            sentences: a list of `str` or `bytes`.

        Returns:
            A list of int lists: pieces, truncated, then EOS; `[]` for a blank
            sentence.
        """
        if not sentences:
            return []
        return self.tokenizer.encode_source(list(sentences), self.config["max_length"]
                                            ).to_list()

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

    def translate_ids(self, source_ids, *, beam_size=_DECODING.beam_size,
                      alpha=_DECODING.alpha, length_penalty=None):
        """Output ids of EOS-terminated source id lists (`Translator.encode`'s form).

        Args:
            source_ids: list of int lists, each ending with EOS.
            beam_size: 1 is greedy decoding.
            alpha: GNMT length-penalty strength, ours (`config.length_penalty`):
                the finished hypotheses are ranked by
                `log P(Y) / ((5 + |Y|) / 6) ** alpha`, `|Y|` counting EOS.
            length_penalty: if given, CTranslate2's own normalisation instead,
                `log P(Y) / |Y| ** length_penalty` (see the module docstring).

        Returns:
            A list of int lists: the output ids up to (not including) EOS,
            pad and BOS dropped (`Tokenizer.output_ids`).
        """
        return self.tokenizer.output_ids(
            self._translate_rows(source_ids, beam_size, alpha, length_penalty)).to_list()

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

    def translate(self, sentences, *, beam_size=_DECODING.beam_size, alpha=_DECODING.alpha,
                  length_penalty=None):
        """Translates a list of sentences; see `translate_ids` for the arguments."""
        if isinstance(sentences, (str, bytes)):
            raise TypeError("translate expects a list of strings; wrap one sentence in a "
                            "list: translate([sentence])")
        source_ids = self.encode([s if isinstance(s, bytes) else str(s) for s in sentences])
        todo = [i for i, ids in enumerate(source_ids) if ids]  # blank: no ids, ""
        rows = self._translate_rows([source_ids[i] for i in todo], beam_size, alpha,
                                    length_penalty)
        translations = [""] * len(source_ids)
        for i, text in zip(todo, self.tokenizer.decode_output(rows).numpy()):
            translations[i] = text.decode("utf-8")
        return translations

    def score_ids(self, source_ids, target_ids):
        """Teacher-forced log-probabilities of each target id, then of EOS.

        Args:
            source_ids: EOS-terminated source id lists.
            target_ids: target id lists without BOS or EOS.

        Returns:
            A list of float32 NumPy arrays, `len(target) + 1` values each
            (the last is EOS's).
        """
        results = self.translator.score_batch(
            self._source_pieces(source_ids), [self._pieces(t) for t in target_ids],
            max_batch_size=self.batch_size, max_input_length=0)
        return [np.asarray(r.log_probs, "float32") for r in results]
