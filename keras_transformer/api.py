"""Registration helper: every public layer is serializable as `keras_transformer>Name`."""

import keras

PACKAGE = "keras_transformer"


def register(cls):
    return keras.saving.register_keras_serializable(package=PACKAGE)(cls)
