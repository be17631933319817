"""The ops of an exported SavedModel, and those TF Serving cannot run.

The stock model server links TensorFlow's core ops and TensorFlow Text's,
runs no Python and no XLA cluster by default: an export that holds a Python
callback (`PyFunc`), a TF Addons custom op or an XLA-only op outside a
compiled cluster would load and then fail on its first request. The export
lists the op types of its graphs and function library (`saved_model_ops`)
and refuses to finish when any of them is among those (`forbidden_ops`).
"""

import pathlib

# Ops TF Serving cannot run: Python callbacks, TF Addons custom ops, and
# XLA-only ops outside a compiled cluster.
_FORBIDDEN_OPS = ("PyFunc", "PyFuncStateless", "EagerPyFunc")
_FORBIDDEN_PREFIXES = ("Addons>", "Xla", "_Xla")

__all__ = ["forbidden_ops", "saved_model_ops"]


def saved_model_ops(export_dir):
    """The set of op types in a SavedModel's graphs and function library.

    Args:
        export_dir: a SavedModel directory (with `saved_model.pb`).

    Returns:
        A sorted list of op type names.
    """
    from tensorflow.core.protobuf import saved_model_pb2

    path = pathlib.Path(export_dir) / "saved_model.pb"
    proto = saved_model_pb2.SavedModel()
    proto.ParseFromString(path.read_bytes())
    ops = set()
    for meta_graph in proto.meta_graphs:
        graph = meta_graph.graph_def
        ops.update(node.op for node in graph.node)
        for function in graph.library.function:
            ops.update(node.op for node in function.node_def)
    return sorted(ops)


def forbidden_ops(ops):
    """The ops among `ops` that TF Serving cannot run (PyFunc, Addons, XLA-only)."""
    return sorted(op for op in ops
                  if op in _FORBIDDEN_OPS or op.startswith(_FORBIDDEN_PREFIXES))
