"""The paper's learning-rate schedule, equation (3), and its budgeted variant."""

import keras
from keras import ops

from keras_transformer.model.serialization import register


@register
class TransformerSchedule(keras.optimizers.schedules.LearningRateSchedule):
    """lrate = d_model^-0.5 * min(step_num^-0.5, step_num * warmup_steps^-1.5).

    Linear warm-up for `warmup_steps` updates, then decay with the inverse
    square root of the step number (equation 3 of the paper).

    Keras calls a schedule with `optimizer.iterations`, the number of updates
    already applied, starting at 0. The paper numbers steps from 1, so the
    update being computed is `step_num = step + 1`: `schedule(0)` is the rate
    of the first update, equation (3) at step_num 1, never inf or nan.

    Under gradient accumulation Keras calls the schedule with the number of
    micro-batches seen, not of updates. Pass the same `accumulation_steps`
    as the optimizer's `gradient_accumulation_steps` (`compile_model` does)
    and the schedule counts optimizer updates: update n uses step_num n.

    With `decay_steps` set, the decay after the warm-up is linear instead, from
    the same peak to zero at update `decay_steps` (and zero after it): under a
    fixed budget of updates, linear decay to zero was the most robust of the
    budget-aware schedules compared by Li et al. (ICLR 2020, "Budgeted
    Training"), where the inverse square root still stands at half its peak
    after four times the warm-up.

    Args:
        d_model: model width.
        warmup_steps: number of warm-up updates.
        scale: an extra multiplier (1.0 in the paper).
        accumulation_steps: micro-batches per optimizer update.
        decay_steps: `None` (the paper's inverse square root), or the update
            at which a linear decay reaches zero (the run's budget); more
            than `warmup_steps`.

    Example:

    >>> schedule = TransformerSchedule(512, warmup_steps=4000)
    >>> float(schedule(3999))  # step_num 4000, the peak
    0.000698771...
    """

    def __init__(self, d_model, warmup_steps=4000, scale=1.0, accumulation_steps=1,
                 decay_steps=None):
        if not d_model or d_model < 1:
            raise ValueError(f"d_model must be positive, received {d_model!r}")
        if not warmup_steps or warmup_steps < 1:
            raise ValueError(f"warmup_steps must be positive, received {warmup_steps!r}")
        if not accumulation_steps or accumulation_steps < 1:
            raise ValueError(
                f"accumulation_steps must be >= 1, received {accumulation_steps!r}"
            )
        if decay_steps is not None and not decay_steps > warmup_steps:
            raise ValueError(f"decay_steps must be more than warmup_steps "
                             f"({warmup_steps}), received {decay_steps!r}")
        self.d_model = d_model
        self.warmup_steps = warmup_steps
        self.scale = scale
        self.accumulation_steps = accumulation_steps
        self.decay_steps = decay_steps

    def __call__(self, step):
        updates = ops.floor_divide(ops.cast(step, "int64"), self.accumulation_steps)
        step_num = ops.cast(updates, "float32") + 1.0
        warmup = step_num * self.warmup_steps ** -1.5
        if self.decay_steps is None:
            decay = ops.rsqrt(step_num)
        else:  # from the peak, warmup_steps^-0.5, to 0 at decay_steps
            decay = (self.warmup_steps ** -0.5 * ops.maximum(self.decay_steps - step_num, 0.0)
                     / (self.decay_steps - self.warmup_steps))
        return self.scale * (self.d_model ** -0.5) * ops.minimum(warmup, decay)

    def get_config(self):
        return {"d_model": self.d_model, "warmup_steps": self.warmup_steps,
                "scale": self.scale, "accumulation_steps": self.accumulation_steps,
                "decay_steps": self.decay_steps}
