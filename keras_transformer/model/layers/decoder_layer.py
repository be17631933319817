"""One decoder layer: masked self-attention, encoder-decoder attention, FFN."""

from keras import layers

from keras_transformer.model.serialization import register
from keras_transformer.model.layers.encoder_layer import (
    _SublayerMixin,
    feed_forward_layers,
    layer_norm,
)


@register
class DecoderLayer(_SublayerMixin, layers.Layer):
    """Decoder layer: causal self-attention, attention over the encoder output, FFN.

    Residual wrapping as in `EncoderLayer`. The self-attention is always causal:
    position t attends to positions <= t only.

    For incremental decoding, pass `self_attention_cache` (a `(keys, values)`
    tuple of `(batch, num_heads, T_max, d)` tensors, zeros at first) with
    `cache_update_index`, and `cross_attention_cache` (from
    `compute_cross_attention_cache`) instead of recomputing the encoder keys
    and values at every step. The layer then returns `(outputs, new_cache)`.

    Its arguments are `EncoderLayer`'s.

    Call arguments:
        inputs: `(batch, T, d_model)` target-side inputs.
        encoder_output: `(batch, S, d_model)`; unused with `cross_attention_cache`.
        decoder_padding_mask: bool `(batch, T)`, `True` at real target tokens.
        encoder_padding_mask: bool `(batch, S)`, `True` at real source tokens.
        self_attention_cache: see above.
        cross_attention_cache: see above.
        cache_update_index: position of `inputs[:, 0]` in the cache.
        return_attention_scores: also return a dict with the weights of
            `"self_attention"` and `"cross_attention"`.
        training: whether dropout is active.

    Returns:
        `outputs`, then the scores dict if requested, then the updated
        self-attention cache if one was given.

    Example:

    >>> layer = DecoderLayer(num_heads=8, key_dim=64, d_ff=2048)
    >>> y = layer(np.zeros((2, 5, 512), "float32"), np.zeros((2, 7, 512), "float32"))
    """

    def __init__(self, num_heads, key_dim, value_dim=None, d_ff=2048, dropout=0.1,
                 attention_dropout=0.0, activation_dropout=0.0, norm_first=False,
                 layer_norm_epsilon=1e-6, **kwargs):
        super().__init__(**kwargs)
        self._store_common(num_heads, key_dim, value_dim, d_ff, dropout,
                           attention_dropout, activation_dropout, norm_first,
                           layer_norm_epsilon)

    def build(self, inputs_shape, encoder_output_shape=None):
        # Keras passes the shape of each tensor argument of `call` as
        # `<argument>_shape`: `inputs_shape`, and `encoder_output_shape` unless
        # the layer is first called with only a `cross_attention_cache`. The
        # cross-attention's keys and values are built for the encoder output's
        # width, which defaults to the decoder's (d_model).
        d_model = inputs_shape[-1]
        encoder_width = d_model if encoder_output_shape is None else encoder_output_shape[-1]
        self.self_attention = self._attention("self_attention", d_model)
        self.self_attention_norm = layer_norm(self, "self_attention_norm", d_model)
        self.cross_attention = self._attention("cross_attention", d_model, encoder_width)
        self.cross_attention_norm = layer_norm(self, "cross_attention_norm", d_model)
        feed_forward_layers(self, d_model)
        self.ffn_norm = layer_norm(self, "ffn_norm", d_model)
        self.residual_dropout = layers.Dropout(self.dropout, dtype=self.dtype_policy)
        self.built = True

    def compute_cross_attention_cache(self, encoder_output):
        """Encoder keys/values of this layer's cross-attention, computed once."""
        return self.cross_attention.compute_key_value(encoder_output)

    def call(
        self,
        inputs,
        encoder_output=None,
        decoder_padding_mask=None,
        encoder_padding_mask=None,
        self_attention_cache=None,
        cross_attention_cache=None,
        cache_update_index=None,
        return_attention_scores=False,
        training=None,
    ):
        if encoder_output is None and cross_attention_cache is None:
            raise ValueError(
                "DecoderLayer needs encoder_output or cross_attention_cache"
            )
        if (self_attention_cache is None) != (cache_update_index is None):
            raise ValueError(
                "self_attention_cache and cache_update_index must be given together"
            )
        # Masked (causal) self-attention.
        residual = inputs
        x = self._pre(inputs, self.self_attention_norm)
        outputs = self.self_attention(
            x, x,
            attention_mask=decoder_padding_mask,
            use_causal_mask=True,
            cache=self_attention_cache,
            cache_update_index=cache_update_index,
            return_attention_scores=True,
            training=training,
        )
        if self_attention_cache is not None:
            x, self_scores, self_attention_cache = outputs
        else:
            x, self_scores = outputs
        x = self._post(x, residual, self.self_attention_norm, training)

        # Encoder-decoder attention.
        residual = x
        x = self._pre(x, self.cross_attention_norm)
        x, cross_scores = self.cross_attention(
            x, encoder_output,
            attention_mask=encoder_padding_mask,
            cache=cross_attention_cache,
            return_attention_scores=True,
            training=training,
        )
        x = self._post(x, residual, self.cross_attention_norm, training)

        x = self._feed_forward(x, training)

        results = (x,)
        if return_attention_scores:
            results += ({"self_attention": self_scores, "cross_attention": cross_scores},)
        if self_attention_cache is not None:
            results += (self_attention_cache,)
        return results[0] if len(results) == 1 else results

    def compute_output_shape(self, inputs_shape, encoder_output_shape=None):
        return inputs_shape

    def get_config(self):
        config = super().get_config()
        config.update(self._common_config())
        return config
