"""Attention masks. `True` means "may attend", `False` means "masked out"."""

from keras import layers, ops

from keras_transformer.model.serialization import register


def padding_mask(token_ids, pad_id=0):
    """`(batch, T)` bool mask, `True` at real (non-pad) tokens."""
    return ops.not_equal(token_ids, pad_id)


def causal_mask(query_length, key_length=None, start_index=0):
    """`(query_length, key_length)` bool mask, `True` where key <= query.

    `start_index` is the absolute position of the first query, so that a
    single decoding step at position `i` sees keys `0..i`.
    """
    key_length = query_length if key_length is None else key_length
    query_positions = ops.arange(query_length)[:, None] + start_index
    key_positions = ops.arange(key_length)[None, :]
    return ops.greater_equal(query_positions, key_positions)


def merge_masks(*masks):
    """Logical AND of broadcastable masks, ignoring `None`s."""
    result = None
    for mask in masks:
        if mask is None:
            continue
        mask = ops.cast(mask, "bool")
        result = mask if result is None else ops.logical_and(result, mask)
    return result


@register
class PaddingMask(layers.Layer):
    """Computes the `(batch, T)` padding mask of token ids in a functional model.

    Args:
        pad_id: id of the padding token.

    Example:

    >>> mask = PaddingMask(pad_id=0)(np.array([[5, 6, 0]]))  # [[True, True, False]]
    """

    def __init__(self, pad_id=0, **kwargs):
        super().__init__(**kwargs)
        self.pad_id = pad_id
        self.built = True

    def call(self, token_ids):
        return padding_mask(token_ids, self.pad_id)

    def compute_output_spec(self, token_ids):
        from keras import KerasTensor

        return KerasTensor(token_ids.shape, dtype="bool")

    def get_config(self):
        config = super().get_config()
        config.update({"pad_id": self.pad_id})
        return config
