"""The ops of an exported SavedModel, and those TF Serving cannot run.

The stock model server links TensorFlow's core ops and TensorFlow Text's,
runs no Python and no XLA cluster by default: an export that holds a Python
callback (`PyFunc`), a TF Addons custom op or an XLA-only op outside a
compiled cluster would load and then fail on its first request. The export
lists the op types of its graphs and function library (`saved_model_ops`)
and refuses to finish when any of them is among those (`forbidden_ops`).
A compiled export (`export --xla`) holds functions that run under XLA
(`_XlaMustCompile`), where XLA-only ops belong: `outside_compiled=True`
leaves out their ops and those of every function they call.
"""

import pathlib

# Ops TF Serving cannot run: Python callbacks, TF Addons custom ops, and
# XLA-only ops outside a compiled cluster.
_FORBIDDEN_OPS = ("PyFunc", "PyFuncStateless", "EagerPyFunc")
_FORBIDDEN_PREFIXES = ("Addons>", "Xla", "_Xla")

__all__ = ["forbidden_ops", "saved_model_ops"]


def saved_model_ops(export_dir, *, outside_compiled=False):
    """The set of op types in a SavedModel's graphs and function library.

    Args:
        export_dir: a SavedModel directory (with `saved_model.pb`).
        outside_compiled: leave out the functions that XLA compiles (their
            `_XlaMustCompile` attribute is true) and the functions they
            call (loop bodies, branches), which run inside the compiled
            cluster.

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
        functions = {f.signature.name: f for f in graph.library.function}
        compiled = _compiled_functions(functions) if outside_compiled else set()
        for name, function in functions.items():
            if name not in compiled:
                ops.update(node.op for node in function.node_def)
    return sorted(ops)


def _called(function):
    """Names of the functions a `FunctionDef`'s nodes call (attributes and ops)."""
    names = set()
    for node in function.node_def:
        names.add(node.op)  # a function called as an op
        for value in node.attr.values():
            if value.HasField("func"):
                names.add(value.func.name)
            names.update(f.name for f in value.list.func)
    return names


def _compiled_functions(functions):
    """The functions marked `_XlaMustCompile` and all those they reach."""
    todo = [name for name, f in functions.items()
            if "_XlaMustCompile" in f.attr and f.attr["_XlaMustCompile"].b]
    seen = set()
    while todo:
        name = todo.pop()
        if name in seen or name not in functions:
            continue
        seen.add(name)
        todo.extend(_called(functions[name]))
    return seen


def forbidden_ops(ops):
    """The ops among `ops` that TF Serving cannot run (PyFunc, Addons, XLA-only)."""
    return sorted(op for op in ops
                  if op in _FORBIDDEN_OPS or op.startswith(_FORBIDDEN_PREFIXES))
