"""Keras serialization: the public classes are registered as `keras_transformer>Name`.

Every layer, loss and schedule of the package is registered, so that
`model.keras` files and `get_config()` round trips find the classes again
(`keras.saving.load_model`, `keras.layers.deserialize`).
"""

import keras

PACKAGE = "keras_transformer"


def register(cls):
    """Registers `cls` with Keras under `keras_transformer>{cls.__name__}`; returns it."""
    return keras.saving.register_keras_serializable(package=PACKAGE)(cls)
