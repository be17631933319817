"""keras_transformer: the Transformer of "Attention Is All You Need" in Keras 3."""

from keras_transformer.config import TransformerConfig
from keras_transformer.decoding import beam_search, greedy_decode, length_penalty
from keras_transformer.layers import (
    DecoderLayer,
    EncoderLayer,
    MultiHeadAttention,
    PaddingMask,
    PositionalEncoding,
    SharedEmbedding,
    TransformerDecoder,
    TransformerEncoder,
)
from keras_transformer.losses import LabelSmoothedCrossEntropy, MaskedAccuracy
from keras_transformer.model import Transformer, build_model
from keras_transformer.plotting import plot_attention
from keras_transformer.schedules import TransformerSchedule
from keras_transformer.training import (
    LearningRateLogger,
    StepCheckpoint,
    StopAtUpdate,
    TrainingTimer,
    average_checkpoints,
    compile_model,
    list_checkpoints,
    optimizer_updates,
    paper_optimizer,
    peak_memory_mib,
    plot_training,
)
from keras_transformer.translate import BleuResult, Translator, evaluate_bleu

__version__ = "0.1.0"


def __getattr__(name):
    # The SavedModel export is TensorFlow-only: import it on first use.
    if name == "export_saved_model":
        from keras_transformer.export import export_saved_model

        return export_saved_model
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
