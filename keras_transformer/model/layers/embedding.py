"""Token embeddings shared by source, target and the pre-softmax projection."""

import math

import keras_hub
from keras import initializers, ops

from keras_transformer.model.serialization import register


@register
class SharedEmbedding(keras_hub.layers.ReversibleEmbedding):
    """Token embedding that doubles as the pre-softmax linear projection.

    Section 3.4 of the paper: the same weight matrix is used by the source and
    target embeddings and by the pre-softmax linear transformation, and the
    embeddings are multiplied by sqrt(d_model). `call(ids)` embeds,
    `call(x, reverse=True)` projects `(batch, T, d_model)` to logits
    `(batch, T, vocab_size)` with the transposed matrix.

    It is keras-hub's `ReversibleEmbedding` (Keras' own, with tied weights)
    plus the sqrt(d_model) scale, so Keras can quantize it:
    `model.quantize("int8")` stores the matrix as int8 with one scale per
    token, for the embedding lookup and the output projection alike.

    The default initializer is normal with standard deviation d_model^-0.5, so
    the scaled embeddings start with unit variance (as tensor2tensor and
    fairseq do).

    Args:
        vocab_size: number of tokens.
        d_model: embedding width.
        scale: multiply embeddings by sqrt(d_model).
        embeddings_initializer: initializer of the `(vocab_size, d_model)` matrix.

    Example:

    >>> embedding = SharedEmbedding(vocab_size=100, d_model=16)
    >>> x = embedding(np.array([[5, 7, 0]]))          # (1, 3, 16)
    >>> logits = embedding(x, reverse=True)           # (1, 3, 100)
    """

    def __init__(self, vocab_size, d_model, scale=True, embeddings_initializer=None,
                 **kwargs):
        for name, value in (("vocab_size", vocab_size), ("d_model", d_model)):
            if not isinstance(value, int) or value < 1:
                raise ValueError(
                    f"SharedEmbedding: {name} must be a positive integer, "
                    f"received {name}={value!r}"
                )
        if embeddings_initializer is None:
            embeddings_initializer = initializers.RandomNormal(stddev=d_model**-0.5)
        for name in ("input_dim", "output_dim", "tie_weights"):
            kwargs.pop(name, None)  # from get_config: given by the arguments above
        super().__init__(vocab_size, d_model, tie_weights=True,
                         embeddings_initializer=embeddings_initializer, **kwargs)
        self.vocab_size = vocab_size
        self.d_model = d_model
        self.scale = scale

    def _scaled(self, outputs, reverse):
        if reverse or not self.scale:
            return outputs
        return outputs * ops.cast(math.sqrt(self.d_model), outputs.dtype)

    def call(self, inputs, reverse=False):
        if not reverse:
            return self._scaled(super().call(inputs), reverse)
        # The projection to logits multiplies in `reverse_dtype`, by default
        # the compute dtype: under mixed_bfloat16 bf16 operands (the products
        # are summed in float32 by oneDNN, XLA and torch), the logits rounded
        # to bf16 (truncated by TensorFlow's own CPU kernel, which runs where
        # oneDNN has no bf16 product) and cast to float32 by the model before
        # the softmax and the loss. Keras' own layer would multiply the bf16 inputs by the
        # float32 matrix (embeddings are not autocast), i.e. in float32, a
        # large share of a step's FLOPs (docs/bf16.md, "What runs in bf16
        # and what stays float32", has the figures).
        dtype = self.reverse_dtype or self.compute_dtype
        kernel = ops.transpose(ops.cast(self.embeddings, dtype))
        return ops.matmul(ops.cast(inputs, dtype), kernel)

    def _int8_call(self, inputs, reverse=False):
        return self._scaled(super()._int8_call(inputs, reverse=reverse), reverse)

    def quantize(self, mode=None, type_check=True, config=None):
        # Keras refuses subclasses (`type_check`) because their `call` may
        # differ; this one only adds the scale, applied in `_int8_call` too.
        if mode != "int8":
            raise NotImplementedError(
                f"SharedEmbedding supports int8 quantization only, received {mode!r}")
        super().quantize(mode, type_check=False, config=config)

    def get_config(self):
        config = super().get_config()
        config.update({"vocab_size": self.vocab_size, "d_model": self.d_model,
                       "scale": self.scale})
        return config
