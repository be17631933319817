"""keras_transformer: the Transformer of "Attention Is All You Need" in Keras 3.

Public names are imported on first use (PEP 562), so that the
`keras-transformer` command can set up TensorFlow's logging before Keras
and TensorFlow load, and `keras_transformer.model.config` or
`keras_transformer.training.settings` can be read without importing them at all.
"""

import importlib


def _version():
    """The version pyproject.toml gives: the installed package's metadata, or
    the file itself in a source tree that is not installed."""
    import importlib.metadata
    import pathlib
    import tomllib

    try:
        return importlib.metadata.version("keras-transformer")
    except importlib.metadata.PackageNotFoundError:
        pyproject = pathlib.Path(__file__).resolve().parent.parent / "pyproject.toml"
        try:
            return tomllib.loads(pyproject.read_text())["project"]["version"]
        except (OSError, KeyError, tomllib.TOMLDecodeError):
            return "unknown"


__version__ = _version()

_EXPORTS = {
    # model/
    "keras_transformer.model.config": ["DecodingOptions", "TransformerConfig", "length_penalty"],
    "keras_transformer.model.layers": ["DecoderLayer", "EncoderLayer", "MultiHeadAttention",
                                       "PaddingMask", "PositionalEncoding", "SharedEmbedding",
                                       "TransformerDecoder", "TransformerEncoder"],
    "keras_transformer.model.losses": ["LabelSmoothedCrossEntropy", "MaskedAccuracy"],
    "keras_transformer.model.schedules": ["TransformerSchedule"],
    "keras_transformer.model.transformer": ["Transformer", "build_model", "quantized",
                                            "with_dtype"],
    # the run folder
    "keras_transformer.runs": ["list_checkpoints"],
    # training/
    "keras_transformer.training.averaging": ["average_checkpoints"],
    "keras_transformer.training.measurement": ["TrainingTimer", "peak_memory_mib"],
    "keras_transformer.training.optimization": ["build_training_model", "compile_model",
                                                "optimizer_updates", "paper_optimizer"],
    "keras_transformer.training.plotting": ["plot_attention", "plot_training"],
    # inference/
    "keras_transformer.inference.decoding": ["beam_search", "decode", "greedy_decode"],
    "keras_transformer.inference.evaluation": ["BleuResult", "evaluate_bleu", "evaluate_run",
                                               "score_translations"],
    "keras_transformer.inference.translator": ["Translator"],
    # export/ (TensorFlow-only)
    "keras_transformer.export.saved_model": ["export_saved_model"],
}
_MODULE_OF = {name: module for module, names in _EXPORTS.items() for name in names}
__all__ = sorted(_MODULE_OF)


def __getattr__(name):
    module = _MODULE_OF.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value


def __dir__():
    return sorted(set(globals()) | set(__all__))
