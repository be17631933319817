"""Multi-head scaled dot-product attention (section 3.2 of the paper)."""

import math

from keras import initializers, layers, ops

from keras_transformer.model.serialization import register
from keras_transformer.model.layers.masks import causal_mask, merge_masks
from keras_transformer.model.layers.updates import slice_update

# Added to the logits of masked keys. The logits are computed in float32, so
# exp(-1e9 - max) underflows to exactly 0 and masked keys get weight 0.0.
_MASK_LOGIT = -1e9


@register
class MultiHeadAttention(layers.Layer):
    """Multi-head attention, softmax(Q K^T / sqrt(d_k)) V over h heads.

    Queries, keys and values are projected to `num_heads` heads of size
    `key_dim` (queries, keys) and `value_dim` (values); the heads' outputs are
    concatenated and projected back to the query width (or `output_dim`).

    Masks use `True` for "may attend". `attention_mask` is either a key padding
    mask `(batch, T_k)` or a full mask `(batch, T_q, T_k)`; `use_causal_mask`
    adds the decoder's causal mask. The attention logits and softmax are
    computed in float32, also under a mixed-precision policy.

    For incremental decoding the layer takes a key/value cache, a tuple
    `(keys, values)` of shapes `(batch, num_heads, T_max, key_dim)` and
    `(batch, num_heads, T_max, value_dim)`:
      - with `cache_update_index=None` the cache is used as the keys and values
        (cross-attention over a precomputed encoder output: see
        `compute_key_value`), and `key`/`value` are ignored;
      - with `cache_update_index=i` the keys and values of the current
        `value` input are written into the cache at time steps `i, i+1, ...`
        (a fixed-shape update that compiles under XLA), attention runs over
        the whole cache, and the updated cache is returned.

    Args:
        num_heads: h, the number of heads.
        key_dim: d_k, size of each head for queries and keys.
        value_dim: d_v, size of each head for values; defaults to `key_dim`.
        dropout: dropout rate on the attention weights.
        output_dim: width of the output; defaults to the query width.
        use_bias: whether the four projections have biases.
        kernel_initializer: initializer of the projections' kernels.
        bias_initializer: initializer of the projections' biases.

    Call arguments:
        query: `(batch, T_q, d_query)`.
        value: `(batch, T_k, d_value)`; defaults to `query` (self-attention).
        key: `(batch, T_k, d_key)`; defaults to `value`.
        attention_mask: bool mask `(batch, T_k)` or `(batch, T_q, T_k)`.
        use_causal_mask: mask keys after each query's position.
        cache: `(keys, values)` tuple, see above.
        cache_update_index: int or scalar tensor, see above.
        return_attention_scores: also return the weights
            `(batch, num_heads, T_q, T_k)`.
        training: whether dropout is active.

    Returns:
        `output` of shape `(batch, T_q, output_dim)`, followed by the attention
        weights if `return_attention_scores`, followed by the updated cache if
        `cache_update_index` was given.

    Example:

    >>> mha = MultiHeadAttention(num_heads=8, key_dim=64)
    >>> x = np.random.rand(2, 10, 512).astype("float32")
    >>> mha(x, x, use_causal_mask=True).shape
    (2, 10, 512)

    References:
        Vaswani et al., "Attention Is All You Need", 2017, section 3.2.
    """

    def __init__(
        self,
        num_heads,
        key_dim,
        value_dim=None,
        dropout=0.0,
        output_dim=None,
        use_bias=True,
        kernel_initializer="glorot_uniform",
        bias_initializer="zeros",
        **kwargs,
    ):
        super().__init__(**kwargs)
        for name, value in (("num_heads", num_heads), ("key_dim", key_dim),
                            ("value_dim", value_dim if value_dim is not None else key_dim)):
            if not isinstance(value, int) or value < 1:
                raise ValueError(
                    f"MultiHeadAttention: {name} must be a positive integer, "
                    f"received {name}={value!r}"
                )
        if not 0.0 <= dropout < 1.0:
            raise ValueError(
                f"MultiHeadAttention: dropout must be in [0, 1), received {dropout!r}"
            )
        self.num_heads = num_heads
        self.key_dim = key_dim
        self.value_dim = value_dim if value_dim is not None else key_dim
        self.dropout = dropout
        self.output_dim = output_dim
        self.use_bias = use_bias
        self.kernel_initializer = initializers.get(kernel_initializer)
        self.bias_initializer = initializers.get(bias_initializer)
        self.supports_masking = False

    def _dense(self, units, name):
        return layers.Dense(
            units,
            use_bias=self.use_bias,
            kernel_initializer=self.kernel_initializer,
            bias_initializer=self.bias_initializer,
            dtype=self.dtype_policy,
            name=name,
        )

    def build(self, query_shape, value_shape=None, key_shape=None):
        value_shape = query_shape if value_shape is None else value_shape
        key_shape = value_shape if key_shape is None else key_shape
        self.query_dense = self._dense(self.num_heads * self.key_dim, "query")
        self.query_dense.build(query_shape)
        self.key_dense = self._dense(self.num_heads * self.key_dim, "key")
        self.key_dense.build(key_shape)
        self.value_dense = self._dense(self.num_heads * self.value_dim, "value")
        self.value_dense.build(value_shape)
        output_dim = self.output_dim or query_shape[-1]
        self.output_dense = self._dense(output_dim, "attention_output")
        self.output_dense.build(tuple(query_shape[:-1]) + (self.num_heads * self.value_dim,))
        self.dropout_layer = layers.Dropout(self.dropout, dtype=self.dtype_policy)
        self.built = True

    def _split_heads(self, x, head_dim):
        # (batch, T, h * d) -> (batch, h, T, d)
        shape = ops.shape(x)
        x = ops.reshape(x, (shape[0], shape[1], self.num_heads, head_dim))
        return ops.transpose(x, (0, 2, 1, 3))

    def compute_key_value(self, key, value=None):
        """Projects `key`/`value` `(batch, T_k, d)` to a cache tuple.

        Returns `(keys, values)` of shapes `(batch, h, T_k, key_dim)` and
        `(batch, h, T_k, value_dim)`, the form `call(cache=...)` takes.
        """
        value = key if value is None else value
        return (
            self._split_heads(self.key_dense(key), self.key_dim),
            self._split_heads(self.value_dense(value), self.value_dim),
        )

    def call(
        self,
        query,
        value=None,
        key=None,
        attention_mask=None,
        use_causal_mask=False,
        cache=None,
        cache_update_index=None,
        return_attention_scores=False,
        training=None,
    ):
        value = query if value is None else value
        key = value if key is None else key

        q = self._split_heads(self.query_dense(query), self.key_dim)  # (B, h, Tq, dk)
        if cache is not None and cache_update_index is None:
            k, v = cache  # precomputed (cross-attention)
        else:
            k, v = self.compute_key_value(key, value)  # (B, h, Tk, dk|dv)
            if cache is not None:
                start = [0, 0, cache_update_index, 0]
                k = slice_update(cache[0], start, ops.cast(k, cache[0].dtype))
                v = slice_update(cache[1], start, ops.cast(v, cache[1].dtype))
                cache = (k, v)

        query_length = ops.shape(q)[2]
        key_length = ops.shape(k)[2]
        mask = attention_mask
        if mask is not None:
            mask = ops.cast(mask, "bool")
            if len(mask.shape) == 2:  # key padding mask (B, Tk)
                mask = mask[:, None, None, :]
            elif len(mask.shape) == 3:  # (B, Tq, Tk)
                mask = mask[:, None, :, :]
            else:
                raise ValueError(
                    "attention_mask must have shape (batch, T_k) or "
                    f"(batch, T_q, T_k), received shape {mask.shape}"
                )
        if use_causal_mask:
            start_index = 0 if cache_update_index is None else cache_update_index
            causal = causal_mask(query_length, key_length, start_index)
            mask = merge_masks(mask, causal[None, None, :, :])

        # One query per row (a step of incremental decoding): products and sums
        # instead of batched matrix products of one row, which in CPU graphs
        # (the SavedModel) cost oneDNN far more per call than their few FLOPs.
        one_query = q.shape[2] == 1

        # (B, h, Tq, dk) x (B, h, dk, Tk) -> (B, h, Tq, Tk), in float32.
        q = ops.multiply(q, ops.cast(1.0 / math.sqrt(self.key_dim), q.dtype))
        if one_query:  # (B, h, 1, dk) * (B, h, Tk, dk) summed over dk
            logits = ops.expand_dims(ops.sum(ops.multiply(q, k), axis=-1), 2)
        else:
            logits = ops.matmul(q, ops.transpose(k, (0, 1, 3, 2)))
        logits = ops.cast(logits, "float32")
        if mask is not None:
            logits = ops.where(mask, logits, _MASK_LOGIT)
        if one_query:  # written out: oneDNN's softmax op costs more than this
            logits = ops.exp(logits - ops.max(logits, axis=-1, keepdims=True))
            weights = logits / ops.sum(logits, axis=-1, keepdims=True)
        else:
            weights = ops.softmax(logits, axis=-1)
        weights = ops.cast(weights, self.compute_dtype)
        dropped = self.dropout_layer(weights, training=training)

        # (B, h, Tq, Tk) x (B, h, Tk, dv) -> (B, h, Tq, dv) -> (B, Tq, h * dv)
        if one_query:  # (B, h, Tk, 1) * (B, h, Tk, dv) summed over Tk
            context = ops.sum(ops.multiply(ops.swapaxes(dropped, 2, 3),
                                           ops.cast(v, dropped.dtype)), axis=2, keepdims=True)
        else:
            context = ops.matmul(dropped, ops.cast(v, dropped.dtype))
        context = ops.transpose(context, (0, 2, 1, 3))
        shape = ops.shape(context)
        context = ops.reshape(context, (shape[0], shape[1], self.num_heads * self.value_dim))
        output = self.output_dense(context)

        outputs = (output,)
        if return_attention_scores:
            outputs += (weights,)
        if cache is not None and cache_update_index is not None:
            outputs += (cache,)
        return outputs[0] if len(outputs) == 1 else outputs

    def compute_output_shape(self, query_shape, value_shape=None, key_shape=None):
        return tuple(query_shape[:-1]) + (self.output_dim or query_shape[-1],)

    def get_config(self):
        config = super().get_config()
        config.update(
            {
                "num_heads": self.num_heads,
                "key_dim": self.key_dim,
                "value_dim": self.value_dim,
                "dropout": self.dropout,
                "output_dim": self.output_dim,
                "use_bias": self.use_bias,
                "kernel_initializer": initializers.serialize(self.kernel_initializer),
                "bias_initializer": initializers.serialize(self.bias_initializer),
            }
        )
        return config
