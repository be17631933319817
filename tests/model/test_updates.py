"""`layers.updates.slice_update`: NumPy values on every backend, and the op it picks in TF graphs.

Under TensorFlow it must emit the core op `TensorStridedSliceUpdate` in a
plain graph (what TF Serving runs) and Keras' `XlaDynamicUpdateSlice` inside
an XLA-compiled function (where the core op cannot take a dynamic start).
Telling the two apart reads a private TensorFlow module
(`control_flow_util.GraphOrParentsInXlaContext`); if TensorFlow moves it,
the XLA half of this test fails.
"""

import keras
import numpy as np
import pytest
from keras import ops

from keras_transformer.model.layers.updates import slice_update


def _expected(inputs, start, updates):
    """NumPy, with XlaDynamicUpdateSlice's clamping of the start."""
    out = inputs.copy()
    start = [min(max(s, 0), n - u) for s, n, u in zip(start, inputs.shape, updates.shape)]
    index = tuple(slice(s, s + u) for s, u in zip(start, updates.shape))
    out[index] = updates
    return out


@pytest.mark.parametrize("start", [[0, 1, 2], [1, 0, 4], [0, 0, 9]],
                         ids=["inside", "at the end", "clamped"])
def test_values_equal_numpy(start):
    inputs = np.arange(2 * 3 * 6, dtype="float32").reshape(2, 3, 6)
    updates = -np.ones((1, 2, 2), "float32")
    if start[-1] + updates.shape[-1] > inputs.shape[-1] and keras.backend.backend() == "torch":
        # Keras' torch slice_update indexes without clamping: an error, not a wrong value.
        with pytest.raises(IndexError):
            slice_update(ops.convert_to_tensor(inputs),
                         [ops.convert_to_tensor(s, "int32") for s in start], updates)
        return
    got = slice_update(ops.convert_to_tensor(inputs),
                       [ops.convert_to_tensor(s, "int32") for s in start], updates)
    np.testing.assert_array_equal(ops.convert_to_numpy(got), _expected(inputs, start, updates))


@pytest.mark.skipif(keras.backend.backend() != "tensorflow", reason="TensorFlow graphs")
def test_tensorflow_graphs_get_the_op_they_can_run():
    import tensorflow as tf

    inputs = np.zeros((2, 4, 8), "float32")
    updates = np.ones((2, 1, 8), "float32")

    def update(x, index):
        return slice_update(x, [0, index, 0], updates)

    def op_types(function):
        graph = function.get_concrete_function(
            tf.TensorSpec(inputs.shape, tf.float32), tf.TensorSpec([], tf.int32)).graph
        return {op.type for op in graph.get_operations()}

    plain = tf.function(update, autograph=False)
    assert "TensorStridedSliceUpdate" in op_types(plain)
    assert "XlaDynamicUpdateSlice" not in op_types(plain)
    compiled = tf.function(update, autograph=False, jit_compile=True)
    assert "XlaDynamicUpdateSlice" in op_types(compiled)
    expected = _expected(inputs, [0, 3, 0], updates)
    for function in (plain, compiled):
        np.testing.assert_array_equal(function(inputs, tf.constant(3)).numpy(), expected)
