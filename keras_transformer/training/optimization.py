"""Training the paper's way: the optimizer, the compile helper, the training model.

`paper_optimizer` and `compile_model` set up Adam with the paper's schedule,
loss and metric; `build_training_model` builds and compiles the model under
a distribution strategy (`keras_transformer.training.strategy`). What a run
does between updates is `keras_transformer.training.guard`; the job that
uses all of this is `keras_transformer.training.job`.
"""

import contextlib

import keras

from keras_transformer.model.config import TransformerConfig
from keras_transformer.model.losses import LabelSmoothedCrossEntropy, MaskedAccuracy
from keras_transformer.model.schedules import TransformerSchedule


def paper_optimizer(config, *, learning_rate=None, **kwargs):
    """Adam(beta_1=0.9, beta_2=0.98, epsilon=1e-9) with `TransformerSchedule`.

    Args:
        config: the model's `TransformerConfig` (d_model, warmup_steps).
        learning_rate: a float or schedule replacing the paper's schedule.
        **kwargs: passed to `keras.optimizers.Adam` (e.g. `clipnorm`,
            `gradient_accumulation_steps`).
    """
    if learning_rate is None:
        learning_rate = TransformerSchedule(
            config.d_model, config.warmup_steps,
            accumulation_steps=kwargs.get("gradient_accumulation_steps") or 1)
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
            update; the paper's schedule is told, so it counts updates, not
            micro-batches.
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


def build_training_model(config, *, strategy=None, learning_rate_factor=1.0,
                         grad_accum_steps=1, jit_compile="auto", decay_steps=None):
    """`build_model(config)` under the strategy's scope, compiled the paper's way.

    Args:
        config: the `TransformerConfig`.
        strategy: a `tf.distribute.Strategy` (`strategy.get_strategy`), or `None`.
        learning_rate_factor: multiplies the paper's schedule (equation 3).
        grad_accum_steps: micro-batches per update (the schedule counts updates).
        jit_compile: `model.compile`'s `jit_compile` (`"auto"`, `True`,
            `False`, or the setting's strings `"true"` / `"false"`).
        decay_steps: the schedule decays linearly to zero at this update
            (`TransformerSchedule`); `None`: the paper's decay.

    Returns:
        The compiled model.
    """
    from keras_transformer.model.transformer import build_model

    if jit_compile != "auto":
        jit_compile = jit_compile in ("true", "1", True)
    scope = strategy.scope() if strategy is not None else contextlib.nullcontext()
    with scope:
        model = build_model(config)
        schedule = TransformerSchedule(config.d_model, config.warmup_steps,
                                       scale=learning_rate_factor,
                                       accumulation_steps=grad_accum_steps,
                                       decay_steps=decay_steps)
        compile_model(model, learning_rate=schedule,
                      gradient_accumulation_steps=grad_accum_steps, jit_compile=jit_compile)
    return model


def optimizer_updates(optimizer):
    """Number of parameter updates an optimizer has applied.

    Under `gradient_accumulation_steps=k` Keras' public `optimizer.iterations`
    already counts updates (k micro-batches each); learning-rate schedules,
    however, are called with the micro-batch count (see
    `TransformerSchedule(accumulation_steps=...)`).
    """
    return int(keras.ops.convert_to_numpy(optimizer.iterations))
