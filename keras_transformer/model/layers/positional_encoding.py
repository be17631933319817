"""Position information added to the embeddings (section 3.5 of the paper)."""

from keras import initializers, layers, ops

from keras_transformer.model.serialization import register


def sinusoid(positions, d_model, dtype="float32"):
    """The paper's encoding for integer `positions` `(T,)`, shape `(T, d_model)`.

    PE(pos, 2i) = sin(pos / 10000^(2i / d_model)) and
    PE(pos, 2i+1) = cos(pos / 10000^(2i / d_model)), interleaved: even
    dimensions hold sines, odd dimensions cosines.
    """
    two_i = ops.arange(0, d_model, 2, dtype="float32")  # (ceil(d/2),)
    inverse_frequency = ops.power(10000.0, -two_i / float(d_model))
    angles = ops.cast(positions, "float32")[:, None] * inverse_frequency[None, :]
    # stack on a new last axis then flatten: [sin0, cos0, sin1, cos1, ...]
    encoding = ops.stack([ops.sin(angles), ops.cos(angles)], axis=-1)
    encoding = ops.reshape(encoding, (ops.shape(angles)[0], -1))[:, :d_model]
    return ops.cast(encoding, dtype)


@register
class PositionalEncoding(layers.Layer):
    """Adds position encodings: returns `x + PE[start_index : start_index + T]`.

    By default the fixed sinusoid of the paper (computed from the positions, so
    any length works and the layer has no weights). With `learned=True`, a
    trained `(max_length, d_model)` table (Table 3, row E).

    Args:
        max_length: number of positions of the learned table. Ignored by the
            sinusoid, which extrapolates to any length.
        learned: use learned position embeddings instead of the sinusoid.
        initializer: initializer of the learned table.

    Call arguments:
        inputs: `(batch, T, d_model)` embeddings.
        start_index: absolute position of `inputs[:, 0]` (int or scalar
            tensor), used by incremental decoding.

    Example:

    >>> x = np.zeros((1, 4, 8), "float32")
    >>> PositionalEncoding()(x, start_index=10)  # PE rows 10..13
    """

    def __init__(self, max_length=None, learned=False, initializer="glorot_uniform",
                 **kwargs):
        super().__init__(**kwargs)
        if learned and (not isinstance(max_length, int) or max_length < 1):
            raise ValueError(
                "PositionalEncoding(learned=True) needs a positive integer "
                f"max_length, received max_length={max_length!r}"
            )
        self.max_length = max_length
        self.learned = learned
        self.initializer = initializers.get(initializer)

    def build(self, inputs_shape):
        self.d_model = inputs_shape[-1]
        if self.learned:
            self.position_embeddings = self.add_weight(
                name="position_embeddings",
                shape=(self.max_length, self.d_model),
                initializer=self.initializer,
            )
        self.built = True

    def call(self, inputs, start_index=0):
        length = ops.shape(inputs)[1]
        if self.learned and isinstance(length, int) and isinstance(start_index, int):
            if start_index + length > self.max_length:
                raise ValueError(
                    f"Sequence positions up to {start_index + length} exceed the "
                    f"learned position table (max_length={self.max_length})"
                )
        positions = ops.arange(length, dtype="int32") + ops.cast(start_index, "int32")
        if self.learned:
            encoding = ops.take(self.position_embeddings, positions, axis=0)
        else:
            encoding = sinusoid(positions, self.d_model)
        return inputs + ops.cast(encoding, inputs.dtype)[None, :, :]

    def compute_output_shape(self, inputs_shape):
        return inputs_shape

    def get_config(self):
        config = super().get_config()
        config.update(
            {
                "max_length": self.max_length,
                "learned": self.learned,
                "initializer": initializers.serialize(self.initializer),
            }
        )
        return config
