import keras
import numpy as np
import pytest

from keras_transformer import MultiHeadAttention
from layer_test_utils import to_np


def numpy_attention(layer, query, value, mask=None):
    """softmax(Q K^T / sqrt(d_k)) V per head, concatenated, projected (eq. 1 and 2)."""
    w = {v.path.split("/")[-2] + "/" + v.name: to_np(v) for v in layer.weights}
    h, dk, dv = layer.num_heads, layer.key_dim, layer.value_dim
    q = query @ w["query/kernel"] + w["query/bias"]
    k = value @ w["key/kernel"] + w["key/bias"]
    v = value @ w["value/kernel"] + w["value/bias"]
    heads, all_weights = [], []
    for i in range(h):
        qi, ki, vi = (q[..., i * dk:(i + 1) * dk], k[..., i * dk:(i + 1) * dk],
                      v[..., i * dv:(i + 1) * dv])
        logits = qi @ np.swapaxes(ki, -1, -2) / np.sqrt(dk)
        if mask is not None:
            logits = np.where(mask, logits, -np.inf)
        weights = np.exp(logits - logits.max(-1, keepdims=True))
        weights /= weights.sum(-1, keepdims=True)
        heads.append(weights @ vi)
        all_weights.append(weights)
    concat = np.concatenate(heads, axis=-1)
    out = concat @ w["attention_output/kernel"] + w["attention_output/bias"]
    return out, np.stack(all_weights, axis=1)


@pytest.fixture
def inputs():
    rng = np.random.default_rng(0)
    return (rng.normal(size=(2, 4, 12)).astype("float32"),
            rng.normal(size=(2, 6, 12)).astype("float32"))


def test_equals_numpy_reference(inputs):
    query, value = inputs
    layer = MultiHeadAttention(num_heads=3, key_dim=4, value_dim=5)
    out, weights = layer(query, value, return_attention_scores=True)
    ref_out, ref_weights = numpy_attention(layer, query.astype("float64"), value.astype("float64"))
    assert weights.shape == (2, 3, 4, 6)
    np.testing.assert_allclose(to_np(out), ref_out, rtol=1e-4, atol=1e-5)
    np.testing.assert_allclose(to_np(weights), ref_weights, rtol=1e-4, atol=1e-6)


def test_one_query_per_row_equals_numpy_reference(inputs):
    """The decoding step's path (products and sums for a single query) against eq. 1."""
    query, value = inputs
    query = query[:, :1]
    key_mask = np.array([[True] * 4 + [False] * 2, [True] * 6])
    layer = MultiHeadAttention(num_heads=3, key_dim=4, value_dim=5)
    out, weights = layer(query, value, attention_mask=key_mask, return_attention_scores=True)
    ref_out, ref_weights = numpy_attention(layer, query.astype("float64"),
                                           value.astype("float64"), mask=key_mask[:, None, :])
    assert weights.shape == (2, 3, 1, 6) and np.all(to_np(weights)[0, :, :, 4:] == 0.0)
    np.testing.assert_allclose(to_np(out), ref_out, rtol=1e-4, atol=1e-5)
    np.testing.assert_allclose(to_np(weights), ref_weights, rtol=1e-4, atol=1e-6)


def test_padded_keys_get_exactly_zero_weight_and_rows_sum_to_one(inputs):
    query, value = inputs
    key_mask = np.array([[True] * 4 + [False] * 2, [True] * 6])
    layer = MultiHeadAttention(num_heads=2, key_dim=6)
    out, weights = layer(query, value, attention_mask=key_mask, return_attention_scores=True)
    weights = to_np(weights)
    assert np.all(weights[0, :, :, 4:] == 0.0)
    assert np.all(weights[0, :, :, :4] > 0.0)
    np.testing.assert_allclose(weights.sum(-1), 1.0, rtol=1e-6)
    ref_out, _ = numpy_attention(layer, query, value, mask=key_mask[:, None, :])
    np.testing.assert_allclose(to_np(out), ref_out, rtol=1e-4, atol=1e-5)
    # Changing the padded values does not move the output.
    perturbed = value.copy()
    perturbed[0, 4:] = 1e3
    np.testing.assert_allclose(to_np(layer(query, perturbed, attention_mask=key_mask)),
                               to_np(out), atol=1e-5)


def test_causal_mask(inputs):
    x = inputs[1]
    layer = MultiHeadAttention(num_heads=2, key_dim=6)
    out, weights = layer(x, x, use_causal_mask=True, return_attention_scores=True)
    weights = to_np(weights)
    assert np.all(np.triu(np.ones((6, 6)), k=1)[None, None] * weights == 0.0)
    ref_out, _ = numpy_attention(layer, x, x, mask=np.tril(np.ones((6, 6), bool))[None])
    np.testing.assert_allclose(to_np(out), ref_out, rtol=1e-4, atol=1e-5)


def test_full_mask_3d(inputs):
    query, value = inputs
    mask = np.random.default_rng(1).random((2, 4, 6)) > 0.3
    mask[..., 0] = True
    layer = MultiHeadAttention(num_heads=2, key_dim=3)
    out = layer(query, value, attention_mask=mask)
    ref_out, _ = numpy_attention(layer, query, value, mask=mask)
    np.testing.assert_allclose(to_np(out), ref_out, rtol=1e-4, atol=1e-5)
    with pytest.raises(ValueError, match="attention_mask must have shape"):
        layer(query, value, attention_mask=np.ones((2, 1, 4, 6), bool))


def test_cached_self_attention_equals_full_pass(inputs):
    """Writing one step at a time into a fixed-size cache gives the causal full pass."""
    x = inputs[1]
    layer = MultiHeadAttention(num_heads=3, key_dim=4, value_dim=2)
    full = to_np(layer(x, x, use_causal_mask=True))
    cache = (keras.ops.zeros((2, 3, 8, 4)), keras.ops.zeros((2, 3, 8, 2)))
    steps = []
    for t in range(6):
        out, cache = layer(x[:, t:t + 1], x[:, t:t + 1], use_causal_mask=True,
                           cache=cache, cache_update_index=t)
        steps.append(to_np(out))
    np.testing.assert_allclose(np.concatenate(steps, axis=1), full, rtol=1e-5, atol=1e-5)
    # Precomputed (cross-attention) cache: same as attending to the value input.
    query = inputs[0]
    kv = layer.compute_key_value(x)
    np.testing.assert_allclose(to_np(layer(query, cache=kv)), to_np(layer(query, x)),
                               rtol=1e-5, atol=1e-6)


def test_mixed_precision_softmax_in_float32(inputs):
    query, value = inputs
    layer = MultiHeadAttention(num_heads=2, key_dim=6, dtype="mixed_float16")
    out, weights = layer(query, value, attention_mask=np.array([[1] * 3 + [0] * 3] * 2, bool),
                         return_attention_scores=True)
    assert keras.backend.standardize_dtype(out.dtype) == "float16"
    weights = to_np(weights).astype("float32")
    assert np.all(np.isfinite(weights)) and np.all(weights[..., 3:] == 0)
