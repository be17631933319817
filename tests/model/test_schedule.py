import keras
import numpy as np
import pytest

from keras_transformer import TransformerSchedule


def equation_3(step_num, d_model=512, warmup_steps=4000):
    """lrate = d_model^-0.5 * min(step_num^-0.5, step_num * warmup_steps^-1.5)."""
    return d_model**-0.5 * min(step_num**-0.5, step_num * warmup_steps**-1.5)


@pytest.mark.parametrize("step_num", [1, 100, 4000, 100000])
def test_values_equal_equation_3(step_num):
    schedule = TransformerSchedule(512, warmup_steps=4000)
    # Keras passes optimizer.iterations (updates done so far); update number
    # step_num is computed at iterations == step_num - 1.
    value = float(keras.ops.convert_to_numpy(schedule(step_num - 1)))
    np.testing.assert_allclose(value, equation_3(step_num), rtol=1e-6)


def test_step_zero_is_finite_and_peak_is_at_warmup():
    schedule = TransformerSchedule(512, warmup_steps=4000)
    values = keras.ops.convert_to_numpy(schedule(np.arange(0, 20000, dtype="int64")))
    assert np.all(np.isfinite(values)) and values[0] > 0
    assert int(np.argmax(values)) == 3999
    np.testing.assert_allclose(values.max(), 512**-0.5 * 4000**-0.5, rtol=1e-6)


def test_serializable():
    schedule = TransformerSchedule(256, warmup_steps=100)
    restored = keras.saving.deserialize_keras_object(keras.saving.serialize_keras_object(schedule))
    assert isinstance(restored, TransformerSchedule)
    assert restored.get_config() == schedule.get_config()
    optimizer = keras.optimizers.Adam(learning_rate=schedule)
    restored = keras.optimizers.Adam.from_config(optimizer.get_config())
    assert isinstance(restored.learning_rate if not callable(restored._learning_rate) else restored._learning_rate, TransformerSchedule)


def test_schedule_follows_optimizer_updates():
    """After n real updates the optimizer's step is n and the next rate is eq. (3) at n+1."""
    schedule = TransformerSchedule(64, warmup_steps=10)
    variable = keras.Variable(np.ones(3, "float32"))
    optimizer = keras.optimizers.Adam(learning_rate=schedule)
    optimizer.build([variable])
    for _ in range(5):
        optimizer.apply_gradients([(keras.ops.ones(3), variable)])
    assert int(keras.ops.convert_to_numpy(optimizer.iterations)) == 5
    np.testing.assert_allclose(
        float(keras.ops.convert_to_numpy(optimizer.learning_rate)),
        equation_3(6, 64, 10), rtol=1e-6)


@pytest.mark.parametrize(
    "d_model, warmup_steps, step_num, expected",
    [
        # lrate = d_model^-0.5 * min(step_num^-0.5, step_num * warmup_steps^-1.5),
        # evaluated by hand (30-digit decimal arithmetic), written as literals.
        (512, 4000, 1, 1.74692810742171070e-7),        # warm-up: 1/(sqrt(512) 4000^1.5)
        (512, 4000, 100, 1.74692810742171070e-5),      # warm-up: linear in step_num
        (512, 4000, 4000, 6.98771242968684280e-4),     # peak: 1/(sqrt(512) sqrt(4000))
        (512, 4000, 4001, 6.98683912937352979e-4),     # decay: 1/(sqrt(512) sqrt(4001))
        (512, 4000, 100000, 1.39754248593736856e-4),   # decay: 1/(sqrt(512) sqrt(1e5))
        (1024, 4000, 1, 1.23526471100327318e-7),       # the big model's d_model
        (1024, 4000, 100000, 9.88211768802618541e-5),
        (64, 10, 6, 2.37170824512628450e-2),           # warm-up: 6 / (8 * 10^1.5)
    ],
)
def test_values_equal_hand_computed_literals(d_model, warmup_steps, step_num, expected):
    schedule = TransformerSchedule(d_model, warmup_steps=warmup_steps)
    # Update number step_num is computed at optimizer.iterations == step_num - 1.
    value = float(keras.ops.convert_to_numpy(schedule(step_num - 1)))
    np.testing.assert_allclose(value, expected, rtol=1e-6)


def test_bad_arguments():
    with pytest.raises(ValueError, match="warmup_steps"):
        TransformerSchedule(512, warmup_steps=0)


def test_linear_decay_goes_from_the_papers_peak_to_zero_at_the_budget():
    """`decay_steps`: equation (3)'s warm-up, then a straight line to 0 at the budget."""
    d_model, warmup, budget = 256, 100, 500
    schedule = TransformerSchedule(d_model, warmup_steps=warmup, decay_steps=budget)
    values = keras.ops.convert_to_numpy(schedule(np.arange(0, 700, dtype="int64")))
    step_num = np.arange(1, 701)
    peak = d_model**-0.5 * warmup**-0.5
    # Warm-up as in the paper; after it, the line through (warmup, peak) and (budget, 0).
    expected = np.where(step_num <= warmup, d_model**-0.5 * step_num * warmup**-1.5,
                        peak * np.clip((budget - step_num) / (budget - warmup), 0, None))
    np.testing.assert_allclose(values, expected, rtol=1e-5, atol=1e-12)
    assert int(np.argmax(values)) == warmup - 1 and values[budget - 1] == 0
    assert np.all(values[budget - 1:] == 0) and np.all(np.diff(values[warmup:budget]) < 0)
    # Halfway through the decay: half the peak (the paper's would be at 0.58).
    np.testing.assert_allclose(values[299], peak / 2, rtol=1e-5)
    restored = keras.saving.deserialize_keras_object(
        keras.saving.serialize_keras_object(schedule))
    assert restored.get_config()["decay_steps"] == budget
    with pytest.raises(ValueError, match="decay_steps must be more than warmup_steps"):
        TransformerSchedule(d_model, warmup_steps=warmup, decay_steps=warmup)
