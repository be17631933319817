"""Token embeddings shared by source, target and the pre-softmax projection."""

import math

from keras import initializers, layers, ops

from keras_transformer.api import register


@register
class SharedEmbedding(layers.Layer):
    """Token embedding that doubles as the pre-softmax linear projection.

    Section 3.4 of the paper: the same weight matrix is used by the source and
    target embeddings and by the pre-softmax linear transformation, and the
    embeddings are multiplied by sqrt(d_model). `call(ids)` embeds,
    `call(x, reverse=True)` projects `(batch, T, d_model)` to logits
    `(batch, T, vocab_size)` with the transposed matrix.

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
        super().__init__(**kwargs)
        for name, value in (("vocab_size", vocab_size), ("d_model", d_model)):
            if not isinstance(value, int) or value < 1:
                raise ValueError(
                    f"SharedEmbedding: {name} must be a positive integer, "
                    f"received {name}={value!r}"
                )
        self.vocab_size = vocab_size
        self.d_model = d_model
        self.scale = scale
        if embeddings_initializer is None:
            embeddings_initializer = initializers.RandomNormal(stddev=d_model**-0.5)
        self.embeddings_initializer = initializers.get(embeddings_initializer)

    def build(self, inputs_shape=None):
        self.embeddings = self.add_weight(
            name="embeddings",
            shape=(self.vocab_size, self.d_model),
            initializer=self.embeddings_initializer,
        )
        self.built = True

    def call(self, inputs, reverse=False):
        if reverse:
            # (batch, T, d_model) x (d_model, vocab) -> (batch, T, vocab)
            kernel = ops.cast(ops.transpose(self.embeddings), inputs.dtype)
            return ops.matmul(inputs, kernel)
        if "int" not in str(inputs.dtype):
            inputs = ops.cast(inputs, "int32")
        outputs = ops.take(self.embeddings, inputs, axis=0)
        if self.scale:
            outputs = outputs * ops.cast(math.sqrt(self.d_model), outputs.dtype)
        return outputs

    def compute_output_spec(self, inputs, reverse=False):
        from keras import KerasTensor

        if reverse:
            return KerasTensor(tuple(inputs.shape[:-1]) + (self.vocab_size,),
                               dtype=self.compute_dtype)
        return KerasTensor(tuple(inputs.shape) + (self.d_model,), dtype=self.compute_dtype)

    def get_config(self):
        config = super().get_config()
        config.update(
            {
                "vocab_size": self.vocab_size,
                "d_model": self.d_model,
                "scale": self.scale,
                "embeddings_initializer": initializers.serialize(
                    self.embeddings_initializer
                ),
            }
        )
        return config
