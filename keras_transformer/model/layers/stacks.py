"""The encoder and decoder stacks: positions, embedding dropout, N layers."""

from keras import layers, ops

from keras_transformer.model.serialization import register
from keras_transformer.model.layers.decoder_layer import DecoderLayer
from keras_transformer.model.layers.encoder_layer import EncoderLayer
from keras_transformer.model.layers.positional_encoding import PositionalEncoding


class _StackMixin:
    def _store(self, num_layers, num_heads, key_dim, value_dim, d_ff, dropout,
               attention_dropout, activation_dropout, norm_first, layer_norm_epsilon,
               max_length, position_embedding):
        if not isinstance(num_layers, int) or num_layers < 1:
            raise ValueError(
                f"num_layers must be a positive integer, received {num_layers!r}"
            )
        if position_embedding not in ("sinusoidal", "learned"):
            raise ValueError(
                "position_embedding must be 'sinusoidal' or 'learned', "
                f"received {position_embedding!r}"
            )
        self.num_layers = num_layers
        self.layer_kwargs = dict(
            num_heads=num_heads, key_dim=key_dim, value_dim=value_dim, d_ff=d_ff,
            dropout=dropout, attention_dropout=attention_dropout,
            activation_dropout=activation_dropout, norm_first=norm_first,
            layer_norm_epsilon=layer_norm_epsilon,
        )
        self.max_length = max_length
        self.position_embedding = position_embedding

    def _build_common(self, d_model, layer_cls, prefix, encoder_output_shape=None):
        self.d_model = d_model
        self.positional_encoding = PositionalEncoding(
            max_length=self.max_length,
            learned=self.position_embedding == "learned",
            dtype=self.dtype_policy,
            name="positional_encoding",
        )
        self.positional_encoding.build((None, None, d_model))
        self.embedding_dropout = layers.Dropout(self.layer_kwargs["dropout"],
                                                dtype=self.dtype_policy)
        self.stack = []
        for i in range(self.num_layers):
            layer = layer_cls(**self.layer_kwargs, dtype=self.dtype_policy,
                              name=f"{prefix}_layer_{i}")
            if encoder_output_shape is None:
                layer.build((None, None, d_model))
            else:
                layer.build((None, None, d_model), (None, None, encoder_output_shape[-1]))
            self.stack.append(layer)
        # Pre-norm needs a final normalisation; post-norm outputs are normalised.
        self.final_norm = None
        if self.layer_kwargs["norm_first"]:
            self.final_norm = layers.LayerNormalization(
                epsilon=self.layer_kwargs["layer_norm_epsilon"],
                dtype=self.dtype_policy, name="final_norm")
            self.final_norm.build((None, None, d_model))
        self.built = True

    def _embed(self, embeddings, start_index, training):
        x = self.positional_encoding(embeddings, start_index=start_index)
        return self.embedding_dropout(x, training=training)

    def _finish(self, x):
        return self.final_norm(x) if self.final_norm is not None else x

    def get_config(self):
        config = super().get_config()
        config.update(self.layer_kwargs)
        config.update({
            "num_layers": self.num_layers,
            "max_length": self.max_length,
            "position_embedding": self.position_embedding,
        })
        return config


@register
class TransformerEncoder(_StackMixin, layers.Layer):
    """The encoder: positional encoding, dropout, then N `EncoderLayer`s.

    Takes token embeddings (already scaled by sqrt(d_model), see
    `SharedEmbedding`) and the source padding mask.

    Args:
        num_layers: N.
        max_length: size of the learned position table (if learned).
        position_embedding: `"sinusoidal"` or `"learned"`.
        num_heads: as `EncoderLayer`'s, and so are `key_dim`, `value_dim`,
            `d_ff`, `dropout`, `attention_dropout`, `activation_dropout`,
            `norm_first` and `layer_norm_epsilon`.

    Call arguments:
        embeddings: `(batch, S, d_model)`.
        padding_mask: bool `(batch, S)`, `True` at real tokens.
        return_attention_scores: also return the list of per-layer
            self-attention weights.
        training: whether dropout is active.

    Example:

    >>> encoder = TransformerEncoder(num_layers=6, num_heads=8, key_dim=64, d_ff=2048)
    >>> y = encoder(np.zeros((2, 7, 512), "float32"), padding_mask=np.ones((2, 7), bool))
    """

    def __init__(self, num_layers, num_heads, key_dim, value_dim=None, d_ff=2048,
                 dropout=0.1, attention_dropout=0.0, activation_dropout=0.0,
                 norm_first=False, layer_norm_epsilon=1e-6, max_length=None,
                 position_embedding="sinusoidal", **kwargs):
        super().__init__(**kwargs)
        self._store(num_layers, num_heads, key_dim, value_dim, d_ff, dropout,
                    attention_dropout, activation_dropout, norm_first,
                    layer_norm_epsilon, max_length, position_embedding)

    def build(self, embeddings_shape):
        self._build_common(embeddings_shape[-1], EncoderLayer, "encoder")

    def compute_output_shape(self, embeddings_shape):
        return embeddings_shape

    def call(self, embeddings, padding_mask=None, return_attention_scores=False,
             training=None):
        x = self._embed(embeddings, 0, training)
        all_scores = []
        for layer in self.stack:
            x, scores = layer(x, padding_mask=padding_mask,
                              return_attention_scores=True, training=training)
            all_scores.append(scores)
        x = self._finish(x)
        return (x, all_scores) if return_attention_scores else x


@register
class TransformerDecoder(_StackMixin, layers.Layer):
    """The decoder: positional encoding, dropout, then N `DecoderLayer`s.

    Runs either on a whole (right-shifted) target sequence, or one step at a
    time with key/value caches:

    >>> cross = decoder.compute_cross_attention_cache(encoder_output)
    >>> cache = decoder.init_self_attention_cache(batch_size, max_length)
    >>> y, cache = decoder(step_embeddings, encoder_padding_mask=source_mask,
    ...                    self_attention_cache=cache, cross_attention_cache=cross,
    ...                    cache_update_index=t)

    Its arguments are `TransformerEncoder`'s.

    Call arguments:
        embeddings: `(batch, T, d_model)` target embeddings.
        encoder_output: `(batch, S, d_model)`; unused with `cross_attention_cache`.
        decoder_padding_mask: bool `(batch, T)`.
        encoder_padding_mask: bool `(batch, S)`.
        self_attention_cache: list (one per layer) of `(keys, values)` tuples.
        cross_attention_cache: list (one per layer) of `(keys, values)` tuples.
        cache_update_index: position of `embeddings[:, 0]`.
        return_attention_scores: also return the list of per-layer score dicts.
        training: whether dropout is active.
    """

    def __init__(self, num_layers, num_heads, key_dim, value_dim=None, d_ff=2048,
                 dropout=0.1, attention_dropout=0.0, activation_dropout=0.0,
                 norm_first=False, layer_norm_epsilon=1e-6, max_length=None,
                 position_embedding="sinusoidal", **kwargs):
        super().__init__(**kwargs)
        self._store(num_layers, num_heads, key_dim, value_dim, d_ff, dropout,
                    attention_dropout, activation_dropout, norm_first,
                    layer_norm_epsilon, max_length, position_embedding)

    def build(self, embeddings_shape, encoder_output_shape=None):
        # One `<argument>_shape` per tensor argument of `call` (Keras'
        # convention); `encoder_output_shape` is absent when the decoder is
        # first called with only a `cross_attention_cache`.
        self._build_common(embeddings_shape[-1], DecoderLayer, "decoder",
                           encoder_output_shape)

    def compute_output_shape(self, embeddings_shape, encoder_output_shape=None):
        return embeddings_shape

    def compute_cross_attention_cache(self, encoder_output):
        """One `(keys, values)` tuple per layer, from the encoder output."""
        return [layer.compute_cross_attention_cache(encoder_output)
                for layer in self.stack]

    def init_self_attention_cache(self, batch_size, max_length, dtype=None):
        """Zero `(keys, values)` caches of `max_length` steps, one per layer."""
        dtype = dtype or self.compute_dtype
        h = self.layer_kwargs["num_heads"]
        key_dim = self.layer_kwargs["key_dim"]
        value_dim = self.layer_kwargs["value_dim"] or key_dim
        return [
            (ops.zeros((batch_size, h, max_length, key_dim), dtype),
             ops.zeros((batch_size, h, max_length, value_dim), dtype))
            for _ in range(self.num_layers)
        ]

    def grow_self_attention_cache(self, cache, max_length):
        """The caches of `init_self_attention_cache`, zero-padded to `max_length` steps.

        Incremental decoding can start with a short cache and grow it as the
        outputs get longer: every step reads (and beam search reorders) the
        whole cache, so a cache sized for the longest possible output costs
        memory traffic on every step of a short one. `max_length` may be a
        scalar tensor in a TensorFlow graph (a cache of dynamic length); the
        caller then makes sure it is not shorter than the cache.
        """
        def grow(t):
            extra = max_length - ops.shape(t)[2]
            if not isinstance(extra, int):  # dynamic: checked by the caller
                return ops.pad(t, [[0, 0], [0, 0], [0, extra], [0, 0]])
            if extra < 0:
                raise ValueError(f"cannot shrink a cache of {t.shape[2]} steps to {max_length}")
            return ops.pad(t, [[0, 0], [0, 0], [0, extra], [0, 0]]) if extra else t

        return [tuple(grow(t) for t in layer_cache) for layer_cache in cache]

    def call(
        self,
        embeddings,
        encoder_output=None,
        decoder_padding_mask=None,
        encoder_padding_mask=None,
        self_attention_cache=None,
        cross_attention_cache=None,
        cache_update_index=None,
        return_attention_scores=False,
        training=None,
    ):
        if (self_attention_cache is None) != (cache_update_index is None):
            raise ValueError(
                "self_attention_cache and cache_update_index must be given together"
            )
        start_index = 0 if cache_update_index is None else cache_update_index
        x = self._embed(embeddings, start_index, training)
        all_scores, new_cache = [], []
        for i, layer in enumerate(self.stack):
            outputs = layer(
                x,
                encoder_output,
                decoder_padding_mask=decoder_padding_mask,
                encoder_padding_mask=encoder_padding_mask,
                self_attention_cache=(None if self_attention_cache is None
                                      else self_attention_cache[i]),
                cross_attention_cache=(None if cross_attention_cache is None
                                       else cross_attention_cache[i]),
                cache_update_index=cache_update_index,
                return_attention_scores=True,
                training=training,
            )
            if self_attention_cache is not None:
                x, scores, layer_cache = outputs
                new_cache.append(layer_cache)
            else:
                x, scores = outputs
            all_scores.append(scores)
        x = self._finish(x)
        results = (x,)
        if return_attention_scores:
            results += (all_scores,)
        if self_attention_cache is not None:
            results += (new_cache,)
        return results[0] if len(results) == 1 else results
