"""Where a search runs: compiled once per model and setting, or eagerly.

`greedy_decode` and `beam_search` (`keras_transformer.inference.decoding`)
hand their search to `compiled_search`, which wraps it in
`tf.function(jit_compile=True)` under TensorFlow and `jax.jit` under JAX
(once per model, setting and input shape), and runs it eagerly under
`torch.no_grad()` under PyTorch. The compiled functions are kept per model
in a `WeakKeyDictionary`, so they go away with it.
"""

import weakref

import keras

# Compiled searches, per model and static setting: {model: {key: fn}}.
_COMPILED = weakref.WeakKeyDictionary()


def compiled_search(model, key, impl, jit_compile):
    """The search `impl` for `model`: compiled once per (model, key), or eager.

    The compiled functions hold the model weakly (they live in a
    `WeakKeyDictionary` keyed by the model), so they go away with it.

    Args:
        model: the `Transformer` the search decodes with.
        key: the search's static setting, a hashable tuple (its kind and
            arguments): one compiled function per model and key.
        impl: `impl(model, source_ids, dynamic_prefix=False)`, the search;
            `dynamic_prefix=True` where it runs eagerly, so that the uncached
            step decodes the growing prefix only.
        jit_compile: `None`: compiled under TensorFlow and JAX. `False`:
            not compiled (eager, or a plain graph inside a `tf.function`).
            PyTorch always runs eagerly.

    Returns:
        `fn(source_ids)`, the search's outputs.
    """
    backend = keras.backend.backend()
    if jit_compile is None:
        jit_compile = backend in ("tensorflow", "jax")
    if backend == "torch":  # always eager
        import torch

        def run_torch(source_ids):
            with torch.no_grad():
                return impl(model, source_ids, dynamic_prefix=True)

        return run_torch
    if not jit_compile:
        # Eager TensorFlow runs the loop in Python, so the uncached step can
        # decode the growing prefix; inside a graph (e.g. an exported
        # tf.function) or under JAX's lax.while_loop it cannot.
        def run_uncompiled(source_ids):
            eager = False
            if backend == "tensorflow":
                import tensorflow as tf

                eager = tf.executing_eagerly()
            return impl(model, source_ids, dynamic_prefix=eager)

        return run_uncompiled

    functions = _COMPILED.setdefault(model, {})
    # A quantized model (`model.quantize`) has other variables and calls.
    quantized = getattr(model.target_embedding, "quantization_mode", None)
    key = (backend, quantized) + key
    if key in functions:
        return functions[key]
    model_ref = weakref.ref(model)
    if backend == "tensorflow":
        import tensorflow as tf

        # No autograph: the loops are explicit `ops.while_loop`s already.
        function = tf.function(lambda source_ids: impl(model_ref(), source_ids),
                               jit_compile=True, autograph=False)
    elif backend == "jax":
        import jax

        # The weights are arguments, not constants baked into the program, so
        # the compiled search sees later weight updates (keras-hub's pattern).
        @jax.jit
        def stateless(variable_values, source_ids):
            model = model_ref()
            mapping = zip(model.variables, variable_values)
            with keras.StatelessScope(state_mapping=mapping):
                return impl(model, source_ids)

        def function(source_ids):
            return stateless([v.value for v in model_ref().variables], source_ids)
    else:
        raise ValueError(f"jit_compile=True is not supported on the {backend} backend")
    functions[key] = function
    return function
