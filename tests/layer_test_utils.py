"""A shared layer-test helper in the spirit of keras' `run_layer_test`."""

import keras
import numpy as np


def to_np(x):
    return keras.ops.convert_to_numpy(x)


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
