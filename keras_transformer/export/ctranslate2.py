"""Exports a `Transformer` to a CTranslate2 model folder.

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

The folder is run by `keras_transformer.export.ctranslate2_runtime.CTranslate2Translator`
(how it decodes, and how that differs from `keras_transformer.inference.decoding`, is
said there).

Example:

>>> export_ctranslate2_from_run("runs/demo_tiny", quantization="int8")
PosixPath('saved_models/demo_tiny-ct2-int8')
"""

import json
import pathlib

import numpy as np

from keras_transformer import names
from keras_transformer.model.config import DecodingOptions
from keras_transformer.export.ctranslate2_runtime import (INFO_FILE, TOKENIZER_FILE,
                                                   require_ctranslate2)
from keras_transformer.files import replace_with_staged, staging_dir

DEFAULT_BASE = names.EXPORT_ROOT
FOLDER_SUFFIX = "-ct2"
# Weight types of CTranslate2's `quantization` argument (float32 is the default).
QUANTIZATIONS = names.CTRANSLATE2_QUANTIZATIONS
# The decoding defaults (`DecodingOptions`: the paper's beam 4, alpha 0.6,
# outputs up to source length + 50 ids).
_DECODING = DecodingOptions()
# Positions of the sinusoid table beyond `max_length`: the default
# max_extra_length, the longest output `Translator` produces by default.
EXTRA_POSITIONS = _DECODING.max_extra_length

__all__ = [
    "QUANTIZATIONS", "default_ctranslate2_dir", "export_ctranslate2",
    "export_ctranslate2_from_run",
]


def default_ctranslate2_dir(export_dir, model_name, quantization=None):
    """`<export_dir>/<model_name>-ct2[-<quantization>]`: a CTranslate2 export's default folder."""
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
        `keras_transformer.model.layers.positional_encoding` (the function the
        layer adds) for positions 0, 1, ... (float32 also under a
        mixed-precision policy).
    """
    from keras_transformer.model.layers.positional_encoding import sinusoid

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
    require_ctranslate2()
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
                       extra_positions=EXTRA_POSITIONS, source=None, decoding=None):
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
        decoding: optional dict stored as `keras_transformer.json`'s
            `decoding`: the beam size, alpha and length limit the model is
            meant to be decoded with (CTranslate2 takes them when it
            translates; `export_ctranslate2_from_run` records the run's).

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
    ctranslate2 = require_ctranslate2()
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
            "decoding": decoding or {},
        }
        (written / INFO_FILE).write_text(json.dumps(info, indent=2) + "\n")
        replace_with_staged(written, output_dir)
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
    from keras_transformer.inference.loading import (check_run, load_run, resolve_weights,
                                                     run_decoding)

    run_dir = pathlib.Path(run_dir)
    check_run(run_dir)
    if model_name is None:
        model_name = run_dir.resolve().name
    if output_dir is None:
        output_dir = default_ctranslate2_dir(export_dir, model_name, quantization)
    output_dir = pathlib.Path(output_dir)
    if output_dir.exists() and not overwrite:  # before loading anything
        raise FileExistsError(f"{output_dir} already exists; pass --overwrite to replace it")
    if quantization is not None and quantization not in QUANTIZATIONS:
        raise ValueError(f"quantization must be one of {', '.join(QUANTIZATIONS)}, "
                         f"received {quantization!r}")
    require_ctranslate2()
    if weights is not None:
        resolve_weights(run_dir, str(weights))  # a clear error for a wrong name
    model, tokenizer = load_run(run_dir, weights)
    # The run's decoding (settings.json, else the paper's), recorded as the
    # SavedModel export records it; the position table covers its length limit.
    decoding = run_decoding(run_dir)
    path = export_ctranslate2(
        model, tokenizer, output_dir, quantization=quantization, overwrite=overwrite,
        extra_positions=max(EXTRA_POSITIONS, decoding.options.max_extra_length),
        source={"run": str(run_dir.resolve()), "weights": None if weights is None
                else str(weights)},
        decoding=dict(decoding.values, sources=decoding.sources))
    if verbose:
        kind = quantization or "float32"
        print(f"Exported a CTranslate2 model ({kind} weights) to {path}; decode it with "
              f"{decoding.describe()}")
    return path
