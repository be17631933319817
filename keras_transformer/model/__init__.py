"""The model: its config and presets, the layers, the functional Transformer,
the loss and metric, the learning-rate schedule, the dtype policies and the
Keras registration of its classes. Backend-agnostic (`keras.ops`); imports no
other stage."""
