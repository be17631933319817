"""A shared layer-test helper in the spirit of keras' `run_layer_test`."""

import keras
import numpy as np


def to_np(x):
    return keras.ops.convert_to_numpy(x)


def weight_shapes(layer):
    """`{path: shape}` of all of a layer's weights, its sublayers' included."""
    return {v.path: tuple(v.shape) for v in layer.weights}


def assert_builds_from_shapes(layer, call_args, call_kwargs=None):
    """`build()` with one shape per tensor argument gives the weights of a call.

    Keras' convention: `build()` takes one `<argument>_shape` per tensor
    argument of `call()`, in the order of `call()`. Checks that a fresh copy of
    `layer` built directly from the shapes of `call_args`, and one built from
    `layer`'s recorded build config (what `.keras` loading does), have the
    same weights as `layer` built by calling it, and that calling them creates
    no further weights.
    """
    call_kwargs = call_kwargs or {}
    if not layer.built:
        layer(*call_args, **call_kwargs)
    expected = weight_shapes(layer)
    shapes = [tuple(np.shape(a)) for a in call_args]

    direct = layer.__class__.from_config(layer.get_config())
    direct.build(*shapes)
    assert direct.built
    assert all(sub.built for sub in direct._flatten_layers())
    assert weight_shapes(direct) == expected

    from_build_config = layer.__class__.from_config(layer.get_config())
    from_build_config.build_from_config(layer.get_build_config())
    assert from_build_config.built
    assert weight_shapes(from_build_config) == expected

    for built in (direct, from_build_config):
        built.set_weights(layer.get_weights())
        np.testing.assert_allclose(to_np(built(*call_args, **call_kwargs)),
                                   to_np(layer(*call_args, **call_kwargs)), atol=1e-6)
        assert weight_shapes(built) == expected


def assert_round_trips(layer, call_args, call_kwargs=None, tmp_path=None):
    """get_config/from_config and .keras save/load give a layer computing the same outputs."""
    call_kwargs = call_kwargs or {}
    expected = to_np(layer(*call_args, **call_kwargs))

    # Config round trip (from_config + same weights).
    clone = layer.__class__.from_config(layer.get_config())
    clone(*call_args, **call_kwargs)
    assert clone.get_config() == layer.get_config()
    clone.set_weights(layer.get_weights())
    np.testing.assert_allclose(to_np(clone(*call_args, **call_kwargs)), expected, atol=1e-6)

    # build() from the input shapes, directly and from the build config.
    assert_builds_from_shapes(layer, call_args, call_kwargs)

    # .keras round trip inside a functional model (safe mode on).
    if tmp_path is not None:
        inputs = [keras.Input(shape=np.shape(a)[1:], dtype=str(np.asarray(a).dtype))
                  for a in call_args]
        model = keras.Model(inputs, layer(*inputs, **call_kwargs))
        path = tmp_path / f"{layer.name}.keras"
        model.save(path)
        restored = keras.saving.load_model(path, safe_mode=True)
        np.testing.assert_allclose(
            to_np(restored(list(call_args))), expected, atol=1e-6)
