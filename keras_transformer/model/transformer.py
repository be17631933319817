"""The encoder-decoder Transformer as one functional Keras model."""

import keras
from keras import layers

from keras_transformer import names
from keras_transformer.model.serialization import register
from keras_transformer.model.config import TransformerConfig
from keras_transformer.model.layers.embedding import SharedEmbedding
from keras_transformer.model.layers.masks import PaddingMask
from keras_transformer.model.layers.stacks import TransformerDecoder, TransformerEncoder


def _stack_kwargs(config):
    return dict(
        num_layers=config.num_layers,
        num_heads=config.num_heads,
        key_dim=config.key_dim,
        value_dim=config.value_dim,
        d_ff=config.d_ff,
        dropout=config.dropout,
        attention_dropout=config.attention_dropout,
        activation_dropout=config.activation_dropout,
        norm_first=config.norm_first,
        layer_norm_epsilon=config.layer_norm_epsilon,
        max_length=config.max_length,
        position_embedding=config.position_embedding,
    )


@register
class Transformer(keras.Model):
    """The paper's encoder-decoder model, a functional `keras.Model`.

    Inputs are a dict `{"source_ids": (batch, S) int32, "target_ids": (batch, T)
    int32}`, where `target_ids` is the right-shifted target (BOS first) and 0 is
    padding. The output is float32 logits `(batch, T, vocab_size)`, also under a
    mixed-precision policy.

    The parts that incremental decoding needs are attributes:
    `source_embedding`, `target_embedding`, `encoder`, `decoder`, and
    `project(x)` for the pre-softmax projection.

    Args:
        config: a `TransformerConfig` (or its dict form).

    Example:

    >>> model = Transformer(TransformerConfig.preset("tiny"))
    >>> logits = model({"source_ids": src, "target_ids": tgt})
    """

    def __init__(self, config=None, **kwargs):
        if config is None:
            config = TransformerConfig()
        if isinstance(config, dict):
            config = TransformerConfig.from_dict(config)
        if not isinstance(config, TransformerConfig):
            raise TypeError(
                f"config must be a TransformerConfig or dict, received {type(config)}"
            )
        c = config

        # === Layers ===
        source_embedding = SharedEmbedding(
            c.vocab_size, c.d_model,
            name="shared_embedding" if c.share_embeddings else "source_embedding",
        )
        target_embedding = source_embedding
        if not c.share_embeddings:
            target_embedding = SharedEmbedding(c.vocab_size, c.d_model,
                                               name="target_embedding")
        output_projection = None
        if not c.tie_output_embeddings:
            output_projection = layers.Dense(c.vocab_size, name="output_projection")
        encoder = TransformerEncoder(**_stack_kwargs(c), name="encoder")
        decoder = TransformerDecoder(**_stack_kwargs(c), name="decoder")
        to_float32 = layers.Activation("linear", dtype="float32", name="logits")

        # === Functional graph ===
        source_ids = keras.Input(shape=(None,), dtype="int32", name="source_ids")
        target_ids = keras.Input(shape=(None,), dtype="int32", name="target_ids")
        source_mask = PaddingMask(c.pad_id, name="source_padding_mask")(source_ids)
        target_mask = PaddingMask(c.pad_id, name="target_padding_mask")(target_ids)
        encoder_output = encoder(source_embedding(source_ids), padding_mask=source_mask)
        decoder_output = decoder(
            target_embedding(target_ids),
            encoder_output,
            decoder_padding_mask=target_mask,
            encoder_padding_mask=source_mask,
        )
        if output_projection is None:
            logits = target_embedding(decoder_output, reverse=True)
        else:
            logits = output_projection(decoder_output)
        logits = to_float32(logits)

        super().__init__(
            inputs={"source_ids": source_ids, "target_ids": target_ids},
            outputs=logits,
            **kwargs,
        )

        # === Config and handles for decoding ===
        self.config = c
        self.source_embedding = source_embedding
        self.target_embedding = target_embedding
        self.output_projection = output_projection
        self.encoder = encoder
        self.decoder = decoder

    def project(self, decoder_output):
        """Pre-softmax projection of decoder outputs to float32 logits."""
        if self.output_projection is None:
            logits = self.target_embedding(decoder_output, reverse=True)
        else:
            logits = self.output_projection(decoder_output)
        return keras.ops.cast(logits, "float32")

    def _maybe_symbolic_build(self, iterator=None, data_batch=None):
        # Keras 3 (TensorFlow trainer, up to at least 3.15) builds a model
        # under tf.distribute from the first batch reduced with a single
        # `strategy.reduce("MEAN", batch)`, which MultiWorkerMirroredStrategy
        # rejects for nested inputs such as our dict. The symbolic build only
        # needs shapes and dtypes, so take the first replica's values instead.
        strategy = getattr(self, "_distribute_strategy", None)
        if strategy is None or iterator is None:
            return super()._maybe_symbolic_build(iterator=iterator, data_batch=data_batch)
        import tensorflow as tf

        for _, _, it in iterator:
            data_batch = next(it)
            break

        def first_replica(value):
            if isinstance(value, tf.distribute.DistributedValues):
                return strategy.experimental_local_results(value)[0]
            return value

        data_batch = keras.tree.map_structure(first_replica, data_batch)
        return super()._maybe_symbolic_build(data_batch=data_batch)

    def _in_multi_worker_mode(self):
        strategy = getattr(self, "_distribute_strategy", None)
        extended = getattr(strategy, "extended", None)
        return bool(extended is not None and getattr(extended, "_in_multi_worker_mode",
                                                      lambda: False)())

    def _rank_one_logs(self, logs):
        # Keras 3's TensorFlow trainer reduces step outputs under
        # MultiWorkerMirroredStrategy with strategy.reduce("MEAN", v, axis=0),
        # which fails on scalar logs ("Invalid reduction dimension 0 for input
        # with 0 dimensions", tensorflow/tensorflow#72388). Metric values are
        # already synchronised across workers, so shape (1,) reduces to the
        # same scalar.
        if not self._in_multi_worker_mode() or not isinstance(logs, dict):
            return logs
        return {k: keras.ops.reshape(v, (1,)) if len(getattr(v, "shape", (0,))) == 0
                else v for k, v in logs.items()}

    def train_step(self, *args, **kwargs):
        return self._rank_one_logs(super().train_step(*args, **kwargs))

    def test_step(self, *args, **kwargs):
        return self._rank_one_logs(super().test_step(*args, **kwargs))

    def get_config(self):
        return {"config": self.config.to_dict(), "name": self.name,
                "trainable": self.trainable}

    @classmethod
    def from_config(cls, config):
        return cls(**config)


def build_model(config=None, *, preset="base", vocab_size=None, **overrides):
    """Builds the Transformer from a config or a preset.

    Args:
        config: a `TransformerConfig`; if `None`, `TransformerConfig.preset(preset)`.
        preset: preset name used when `config` is `None` (`"base"`, `"big"`,
            `"small"`, `"tiny"`).
        vocab_size: the shared vocabulary size (overrides the config's).
        **overrides: any other `TransformerConfig` field.

    Returns:
        A `Transformer` (functional `keras.Model`) with inputs `source_ids`,
        `target_ids` and float32 logits.

    Example:

    >>> model = build_model(preset="base", vocab_size=37000)
    >>> model.count_params()
    63082496
    """
    if vocab_size is not None:
        overrides["vocab_size"] = vocab_size
    if config is None:
        config = TransformerConfig.preset(preset, **overrides)
    elif overrides:
        config = config.replace(**overrides)
    return Transformer(config)


DECODING_DTYPES = names.DECODING_DTYPES


def with_dtype(model, dtype):
    """A copy of a `Transformer` whose weights and arithmetic are in `dtype`, for inference.

    `"bfloat16"`: every weight is stored in bf16 (half the memory) and every
    layer computes in bf16, except what stays float32 under any policy (the
    attention softmax, LayerNorm's statistics, the logits; see
    `keras_transformer.model.precision`). `"float32"`: a float32 copy, e.g. of a
    model built under `mixed_bfloat16` for training. The model passed in is
    left as it is.

    Args:
        model: a `Transformer`.
        dtype: `"float32"` or `"bfloat16"`.

    Returns:
        A new `Transformer` with the same config and the weights cast to `dtype`.

    Example:

    >>> model16 = with_dtype(model, "bfloat16")
    >>> Translator(model16, tokenizer).translate(["Hello."])
    """
    from keras_transformer.model.precision import policy_scope

    if dtype not in DECODING_DTYPES:
        raise ValueError(f"dtype must be one of {', '.join(DECODING_DTYPES)}, "
                         f"received {dtype!r}")
    _check_float_transformer(model, "the model is quantized ({mode}); cast the float model, "
                                    "then quantize")
    with policy_scope(dtype):
        copy = Transformer(model.config, name=model.name)
    copy.set_weights([keras.ops.convert_to_numpy(keras.ops.cast(w, "float32"))
                      for w in model.weights])
    return copy


def _check_float_transformer(model, quantized_message):
    """Raise unless `model` is a `Transformer` with float (unquantized) weights.

    `quantized_message` is the error's text, with `{mode}` for the model's
    quantization mode.
    """
    if not isinstance(model, Transformer):
        raise TypeError(f"model must be a keras_transformer.Transformer, received "
                        f"{type(model).__name__}")
    mode = getattr(model.target_embedding, "quantization_mode", None)
    if mode:
        raise ValueError(quantized_message.format(mode=mode))


QUANTIZATION_MODES = names.KERAS_QUANTIZATIONS


def quantized(model, mode="int8"):
    """A weight-quantized copy of a `Transformer`, for inference.

    Keras' own `model.quantize(mode)` on a copy (the model passed in is left
    as it is): every `Dense` layer (attention projections, feed-forward) and
    the shared embedding / pre-softmax projection (`SharedEmbedding`, a
    `ReversibleEmbedding`) store int8 weights with per-channel scales, and
    quantize their inputs per token on the fly. Layer norms, positions and
    the softmax stay float32. The copy is for decoding and export only: Keras
    does not train quantized int8 weights.

    Args:
        model: a `Transformer`.
        mode: `"int8"`.

    Returns:
        A new `Transformer` with the same config and quantized weights.

    Example:

    >>> model8 = quantized(model, "int8")
    >>> Translator(model8, tokenizer).translate(["Hello."])
    """
    import warnings

    if mode not in QUANTIZATION_MODES:
        raise ValueError(f"quantization mode must be one of {', '.join(QUANTIZATION_MODES)}, "
                         f"received {mode!r}")
    _check_float_transformer(model, "the model is quantized already ({mode})")
    copy = Transformer(model.config, name=model.name)
    copy.set_weights(model.get_weights())
    with warnings.catch_warnings():
        # Keras warns for each layer without weights to quantize (norms, masks...).
        warnings.filterwarnings("ignore", message=".*does not have a `quantize` method")
        copy.quantize(mode)
    return copy
