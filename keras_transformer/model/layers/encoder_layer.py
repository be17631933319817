"""One encoder layer: self-attention and a feed-forward network (section 3.1)."""

from keras import layers

from keras_transformer.model.serialization import register
from keras_transformer.model.layers.multi_head_attention import MultiHeadAttention


def feed_forward_layers(layer, d_model):
    """Builds FFN(x) = max(0, x W1 + b1) W2 + b2 on `layer` (section 3.3)."""
    layer.ffn_inner = layers.Dense(layer.d_ff, activation="relu",
                                   dtype=layer.dtype_policy, name="ffn_inner")
    layer.ffn_inner.build((None, None, d_model))
    layer.ffn_activation_dropout = layers.Dropout(layer.activation_dropout,
                                                  dtype=layer.dtype_policy)
    layer.ffn_output = layers.Dense(d_model, dtype=layer.dtype_policy, name="ffn_output")
    layer.ffn_output.build((None, None, layer.d_ff))


def layer_norm(layer, name, d_model):
    norm = layers.LayerNormalization(epsilon=layer.layer_norm_epsilon,
                                     dtype=layer.dtype_policy, name=name)
    norm.build((None, None, d_model))
    return norm


class _SublayerMixin:
    """Residual connection around a sub-layer, post-norm or pre-norm.

    Post-norm (the paper): LayerNorm(x + Dropout(Sublayer(x))).
    Pre-norm: x + Dropout(Sublayer(LayerNorm(x))).
    """

    def _pre(self, x, norm):
        return norm(x) if self.norm_first else x

    def _post(self, x, residual, norm, training):
        x = residual + self.residual_dropout(x, training=training)
        return x if self.norm_first else norm(x)

    def _feed_forward(self, x, training):
        residual = x
        x = self._pre(x, self.ffn_norm)
        x = self.ffn_inner(x)
        x = self.ffn_activation_dropout(x, training=training)
        x = self.ffn_output(x)
        return self._post(x, residual, self.ffn_norm, training)

    def _common_config(self):
        return {
            "num_heads": self.num_heads,
            "key_dim": self.key_dim,
            "value_dim": self.value_dim,
            "d_ff": self.d_ff,
            "dropout": self.dropout,
            "attention_dropout": self.attention_dropout,
            "activation_dropout": self.activation_dropout,
            "norm_first": self.norm_first,
            "layer_norm_epsilon": self.layer_norm_epsilon,
        }

    def _store_common(self, num_heads, key_dim, value_dim, d_ff, dropout,
                      attention_dropout, activation_dropout, norm_first,
                      layer_norm_epsilon):
        if not isinstance(d_ff, int) or d_ff < 1:
            raise ValueError(f"d_ff must be a positive integer, received d_ff={d_ff!r}")
        for name, value in (("dropout", dropout), ("attention_dropout", attention_dropout),
                            ("activation_dropout", activation_dropout)):
            if not 0.0 <= value < 1.0:
                raise ValueError(f"{name} must be in [0, 1), received {name}={value!r}")
        self.num_heads = num_heads
        self.key_dim = key_dim
        self.value_dim = value_dim if value_dim is not None else key_dim
        self.d_ff = d_ff
        self.dropout = dropout
        self.attention_dropout = attention_dropout
        self.activation_dropout = activation_dropout
        self.norm_first = norm_first
        self.layer_norm_epsilon = layer_norm_epsilon

    def _attention(self, name, d_model, value_width=None):
        """Attention from `d_model`-wide queries over `value_width`-wide keys/values.

        `value_width` defaults to `d_model` (self-attention); the output has
        the query width, `d_model`.
        """
        value_width = d_model if value_width is None else value_width
        attention = MultiHeadAttention(
            num_heads=self.num_heads,
            key_dim=self.key_dim,
            value_dim=self.value_dim,
            dropout=self.attention_dropout,
            dtype=self.dtype_policy,
            name=name,
        )
        attention.build((None, None, d_model), (None, None, value_width))
        return attention


@register
class EncoderLayer(_SublayerMixin, layers.Layer):
    """Encoder layer: multi-head self-attention, then a ReLU feed-forward network.

    Each sub-layer is wrapped as LayerNorm(x + Dropout(Sublayer(x))) (post-norm,
    the paper) or x + Dropout(Sublayer(LayerNorm(x))) with `norm_first=True`.

    Args:
        num_heads: h.
        key_dim: d_k per head.
        value_dim: d_v per head; defaults to `key_dim`.
        d_ff: inner width of the feed-forward network.
        dropout: residual dropout, P_drop.
        attention_dropout: dropout on attention weights.
        activation_dropout: dropout after the ReLU.
        norm_first: pre-norm instead of the paper's post-norm.
        layer_norm_epsilon: epsilon of the layer normalizations.

    Call arguments:
        inputs: `(batch, S, d_model)`.
        padding_mask: bool `(batch, S)`, `True` at real tokens.
        return_attention_scores: also return the self-attention weights
            `(batch, num_heads, S, S)`.
        training: whether dropout is active.

    Example:

    >>> layer = EncoderLayer(num_heads=8, key_dim=64, d_ff=2048)
    >>> y = layer(np.zeros((2, 7, 512), "float32"), padding_mask=np.ones((2, 7), bool))
    """

    def __init__(self, num_heads, key_dim, value_dim=None, d_ff=2048, dropout=0.1,
                 attention_dropout=0.0, activation_dropout=0.0, norm_first=False,
                 layer_norm_epsilon=1e-6, **kwargs):
        super().__init__(**kwargs)
        self._store_common(num_heads, key_dim, value_dim, d_ff, dropout,
                           attention_dropout, activation_dropout, norm_first,
                           layer_norm_epsilon)

    def build(self, inputs_shape):
        d_model = inputs_shape[-1]
        self.self_attention = self._attention("self_attention", d_model)
        self.self_attention_norm = layer_norm(self, "self_attention_norm", d_model)
        feed_forward_layers(self, d_model)
        self.ffn_norm = layer_norm(self, "ffn_norm", d_model)
        self.residual_dropout = layers.Dropout(self.dropout, dtype=self.dtype_policy)
        self.built = True

    def call(self, inputs, padding_mask=None, return_attention_scores=False,
             training=None):
        residual = inputs
        x = self._pre(inputs, self.self_attention_norm)
        x, scores = self.self_attention(
            x, x, attention_mask=padding_mask, return_attention_scores=True,
            training=training,
        )
        x = self._post(x, residual, self.self_attention_norm, training)
        x = self._feed_forward(x, training)
        return (x, scores) if return_attention_scores else x

    def compute_output_shape(self, inputs_shape):
        return inputs_shape

    def get_config(self):
        config = super().get_config()
        config.update(self._common_config())
        return config
