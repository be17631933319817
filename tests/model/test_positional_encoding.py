import keras
import numpy as np
import pytest

from keras_transformer import PositionalEncoding


def paper_pe(pos, i, d_model):
    """Section 3.5, written out: even dims sin, odd dims cos, same frequency per pair."""
    angle = pos / 10000 ** ((i - i % 2) / d_model)
    return np.sin(angle) if i % 2 == 0 else np.cos(angle)


@pytest.mark.parametrize("d_model", [512, 30])
def test_values_equal_the_formula(d_model):
    length = 120
    x = np.zeros((2, length, d_model), "float32")
    pe = keras.ops.convert_to_numpy(PositionalEncoding()(x))
    for pos in [0, 1, 7, 63, 119]:
        for i in [0, 1, 2, 3, 10, 11, d_model // 2, d_model // 2 + 1, d_model - 2, d_model - 1]:
            np.testing.assert_allclose(pe[1, pos, i], paper_pe(pos, i, d_model), atol=2e-5,
                                       err_msg=f"pos={pos} i={i}")


def test_start_index_returns_later_rows_and_adds_to_input():
    d_model = 16
    x = np.random.default_rng(0).normal(size=(3, 4, d_model)).astype("float32")
    out = keras.ops.convert_to_numpy(PositionalEncoding()(x, start_index=37))
    expected = np.array([[paper_pe(p, i, d_model) for i in range(d_model)] for p in range(37, 41)])
    np.testing.assert_allclose(out - x, np.broadcast_to(expected, x.shape), atol=2e-5)


def test_learned_positions():
    layer = PositionalEncoding(max_length=10, learned=True)
    x = np.zeros((1, 4, 8), "float32")
    out = keras.ops.convert_to_numpy(layer(x, start_index=3))
    table = keras.ops.convert_to_numpy(layer.position_embeddings)
    np.testing.assert_allclose(out[0], table[3:7], rtol=1e-6)
    with pytest.raises(ValueError, match="max_length=10"):
        layer(np.zeros((1, 11, 8), "float32"))
    with pytest.raises(ValueError, match="max_length"):
        PositionalEncoding(learned=True)
