"""Compiling a model the paper's way (section 5.3 and 5.4)."""

import keras

from keras_transformer.config import TransformerConfig
from keras_transformer.losses import LabelSmoothedCrossEntropy, MaskedAccuracy
from keras_transformer.schedules import TransformerSchedule


def paper_optimizer(config, *, learning_rate=None, **kwargs):
    """Adam(beta_1=0.9, beta_2=0.98, epsilon=1e-9) with `TransformerSchedule`.

    Args:
        config: the model's `TransformerConfig` (d_model, warmup_steps).
        learning_rate: a float or schedule replacing the paper's schedule.
        **kwargs: passed to `keras.optimizers.Adam` (e.g. `clipnorm`,
            `gradient_accumulation_steps`).
    """
    if learning_rate is None:
        learning_rate = TransformerSchedule(config.d_model, config.warmup_steps)
    return keras.optimizers.Adam(
        learning_rate=learning_rate, beta_1=0.9, beta_2=0.98, epsilon=1e-9, **kwargs
    )


def compile_model(model, config=None, *, learning_rate=None,
                  gradient_accumulation_steps=None, **compile_kwargs):
    """Compiles `model` with the paper's optimizer, loss and a token-accuracy metric.

    Args:
        model: a model built by `build_model`.
        config: its `TransformerConfig`; defaults to `model.config`.
        learning_rate: replaces the paper's schedule (a float or schedule).
        gradient_accumulation_steps: accumulate this many micro-batches per
            update (the schedule still counts updates).
        **compile_kwargs: passed to `model.compile` (e.g. `jit_compile`,
            `steps_per_execution`).

    Returns:
        The model, compiled.

    Example:

    >>> model = compile_model(build_model(preset="tiny"))
    >>> model.fit(dataset, epochs=1)
    """
    config = config or getattr(model, "config", None)
    if not isinstance(config, TransformerConfig):
        raise ValueError("compile_model needs the model's TransformerConfig")
    optimizer_kwargs = {}
    if gradient_accumulation_steps and gradient_accumulation_steps > 1:
        optimizer_kwargs["gradient_accumulation_steps"] = gradient_accumulation_steps
    model.compile(
        optimizer=paper_optimizer(config, learning_rate=learning_rate, **optimizer_kwargs),
        loss=LabelSmoothedCrossEntropy(config.label_smoothing, pad_id=config.pad_id),
        metrics=[MaskedAccuracy(pad_id=config.pad_id)],
        **compile_kwargs,
    )
    return model
