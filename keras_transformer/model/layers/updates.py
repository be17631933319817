"""`slice_update` that every graph runs: XLA, plain TensorFlow graphs and TF Serving.

Incremental decoding writes one time step at a time into fixed-shape buffers
(the self-attention key/value cache, the hypotheses). `keras.ops.slice_update`
does it with `XlaDynamicUpdateSlice` under the TensorFlow backend, an op that
runs only where XLA compiles the graph: a SavedModel traced without
`jit_compile` (what the stock TF Serving runs, tensorflow/serving#2217) would
contain it and fail. Its core-op equivalent, `TensorStridedSliceUpdate`, is
the opposite: plain graphs run it, XLA cannot compile it with a dynamic
start. `slice_update` picks, at trace time, the op the surrounding graph can
run, so the decoding code is written once and the export patches nothing.
"""

from keras import backend, ops

__all__ = ["slice_update"]


def _in_tensorflow_graph_without_xla():
    import tensorflow as tf

    if tf.executing_eagerly():
        return False
    try:
        from tensorflow.python.ops import control_flow_util
    except ImportError:  # pragma: no cover - TensorFlow moved it
        return False
    graph = tf.compat.v1.get_default_graph()
    return not control_flow_util.GraphOrParentsInXlaContext(graph)


def slice_update(inputs, start_indices, updates):
    """`keras.ops.slice_update`, with a core TensorFlow op outside XLA.

    Args:
        inputs: the tensor to update.
        start_indices: one start index (int or scalar tensor) per dimension.
        updates: the values, of the rank of `inputs`; cast to its dtype.

    Returns:
        `inputs` with `updates` written from `start_indices` on. A start
        that leaves no room for the update is clamped so that it fits under
        TensorFlow and JAX (`XlaDynamicUpdateSlice`'s rule, kept by the
        core-op path) and raises `IndexError` under PyTorch; decoding never
        passes one (the caches grow before they would overflow).

    Example:

    >>> cache = ops.zeros((2, 4, 10, 8))
    >>> cache = slice_update(cache, [0, 0, 3, 0], ops.ones((2, 4, 1, 8)))
    """
    if backend.backend() != "tensorflow" or not _in_tensorflow_graph_without_xla():
        return ops.slice_update(inputs, start_indices, updates)
    import tensorflow as tf

    inputs = tf.convert_to_tensor(inputs)
    updates = tf.cast(updates, inputs.dtype)
    start = tf.stack([tf.cast(i, tf.int32) for i in start_indices])
    start = tf.clip_by_value(start, 0, tf.shape(inputs) - tf.shape(updates))
    return tf.raw_ops.TensorStridedSliceUpdate(
        input=inputs, begin=start, end=start + tf.shape(updates),
        strides=tf.ones_like(start), value=updates)
