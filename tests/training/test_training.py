import pathlib
import time

import keras
import numpy as np
import pytest

import keras_transformer as kt
from keras_transformer import LabelSmoothedCrossEntropy, TransformerSchedule


def random_pairs(config, num_pairs=64, max_length=10, seed=0):
    """Random source/target sentences of varied lengths, padded, in the data convention."""
    rng = np.random.default_rng(seed)
    source = np.zeros((num_pairs, max_length + 1), "int32")
    target_ids = np.zeros((num_pairs, max_length + 1), "int32")
    labels = np.zeros((num_pairs, max_length + 1), "int32")
    for i in range(num_pairs):
        s = rng.integers(4, config.vocab_size, rng.integers(3, max_length + 1))
        t = rng.integers(4, config.vocab_size, rng.integers(3, max_length + 1))
        source[i, :len(s) + 1] = np.append(s, config.eos_id)
        target_ids[i, :len(t) + 1] = np.insert(t, 0, config.bos_id)
        labels[i, :len(t) + 1] = np.append(t, config.eos_id)
    return {"source_ids": source, "target_ids": target_ids}, labels


def test_compile_model_uses_the_papers_recipe():
    model = kt.compile_model(kt.build_model(preset="tiny"))
    optimizer = model.optimizer
    assert isinstance(optimizer, keras.optimizers.Adam)
    assert (optimizer.beta_1, optimizer.beta_2, optimizer.epsilon) == (0.9, 0.98, 1e-9)
    assert isinstance(optimizer._learning_rate, TransformerSchedule)
    assert optimizer._learning_rate.d_model == 128
    assert isinstance(model.loss, LabelSmoothedCrossEntropy)
    assert model.loss.label_smoothing == 0.1


@pytest.mark.slow
@pytest.mark.every_backend
def test_tiny_model_memorises_64_random_pairs(tiny_config):
    """Sanity check of the whole training path: fit drives token accuracy to >= 0.99.

    The accuracy that stops training and that is asserted is measured
    independently of the metric (argmax of the teacher-forced logits of the
    weights as they are after the epoch, not the running mean over an epoch
    whose weights kept changing); the metric is then checked against it.
    """
    keras.utils.set_random_seed(0)
    config = tiny_config.replace(d_model=64, num_heads=4, d_ff=128, vocab_size=40,
                                 dropout=0.0, label_smoothing=0.0)
    model = kt.compile_model(kt.build_model(config), learning_rate=3e-3)
    inputs, labels = random_pairs(config)
    mask = labels != 0

    def token_accuracy():
        predictions = np.argmax(keras.ops.convert_to_numpy(model(inputs)), axis=-1)
        return (predictions[mask] == labels[mask]).mean()

    stop = keras.callbacks.LambdaCallback(on_epoch_end=lambda epoch, logs: setattr(
        model, "stop_training", token_accuracy() >= 0.995))
    model.fit(inputs, labels, batch_size=16, epochs=300, shuffle=True, verbose=0,
              callbacks=[stop])
    accuracy = token_accuracy()
    assert accuracy >= 0.99
    # MaskedAccuracy on the frozen weights is the same share of non-pad tokens.
    evaluated = model.evaluate(inputs, labels, batch_size=64, verbose=0, return_dict=True)
    assert evaluated["accuracy"] == pytest.approx(accuracy, abs=1e-6)


def test_average_checkpoints_of_two_known_weight_sets_is_their_mean(tiny_config, tmp_path):
    model = kt.build_model(tiny_config)
    first = [w.copy() for w in model.get_weights()]
    model.save_weights(tmp_path / "a.weights.h5")
    second = [np.random.default_rng(i).normal(size=w.shape).astype(w.dtype)
              for i, w in enumerate(first)]
    model.set_weights(second)
    model.save_weights(tmp_path / "b.weights.h5")

    out = kt.average_checkpoints([tmp_path / "a.weights.h5", tmp_path / "b.weights.h5"],
                                 tmp_path / "avg.weights.h5")
    fresh = kt.build_model(tiny_config)
    fresh.load_weights(out)
    for got, a, b in zip(fresh.get_weights(), first, second):
        np.testing.assert_allclose(got, (a.astype("float64") + b) / 2, rtol=1e-6, atol=1e-7)

    with pytest.raises(FileNotFoundError, match="missing.weights.h5"):
        kt.average_checkpoints([tmp_path / "missing.weights.h5"], tmp_path / "x.weights.h5")
    other = kt.build_model(tiny_config, num_layers=1)
    other.save_weights(tmp_path / "other.weights.h5")
    with pytest.raises(ValueError, match="same variables"):
        kt.average_checkpoints([tmp_path / "a.weights.h5", tmp_path / "other.weights.h5"],
                               tmp_path / "y.weights.h5")


def test_gradient_accumulation_equals_one_larger_batch(tiny_config):
    """k accumulated micro-batches make one update equal to one k-times larger batch."""
    config = tiny_config.replace(dropout=0.0)
    k, micro = 3, 4
    rng = np.random.default_rng(0)
    # Unpadded micro-batches hold equal token counts, so the mean of their
    # token means is the token mean of the large batch.
    source = rng.integers(4, config.vocab_size, (k * micro, 6)).astype("int32")
    target = rng.integers(4, config.vocab_size, (k * micro, 5)).astype("int32")
    labels = rng.integers(4, config.vocab_size, (k * micro, 5)).astype("int32")
    inputs = {"source_ids": source, "target_ids": target}

    large = kt.build_model(config)
    initial = large.get_weights()
    large.compile(optimizer=keras.optimizers.SGD(0.5),
                  loss=LabelSmoothedCrossEntropy(0.1))
    large.fit(inputs, labels, batch_size=k * micro, epochs=1, shuffle=False, verbose=0)

    accumulated = kt.build_model(config)
    accumulated.set_weights(initial)
    accumulated.compile(optimizer=keras.optimizers.SGD(0.5, gradient_accumulation_steps=k),
                        loss=LabelSmoothedCrossEntropy(0.1))
    accumulated.fit(inputs, labels, batch_size=micro, epochs=1, shuffle=False, verbose=0)

    assert int(keras.ops.convert_to_numpy(accumulated.optimizer.iterations)) == 1
    moved = False
    for a, b, w0 in zip(accumulated.get_weights(), large.get_weights(), initial):
        np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-6)
        moved |= not np.allclose(b, w0)
    assert moved


def test_schedule_counts_updates_under_accumulation(tiny_config):
    """After n updates of k micro-batches each, the schedule's step is n."""
    config = tiny_config.replace(warmup_steps=50)
    model = kt.compile_model(kt.build_model(config), gradient_accumulation_steps=4)
    inputs, labels = random_pairs(config, num_pairs=24)
    model.fit(inputs, labels, batch_size=2, epochs=1, verbose=0)  # 12 micro-batches
    optimizer = model.optimizer
    assert int(keras.ops.convert_to_numpy(optimizer.iterations)) == 3
    np.testing.assert_allclose(
        float(keras.ops.convert_to_numpy(optimizer.learning_rate)),
        float(keras.ops.convert_to_numpy(TransformerSchedule(config.d_model, 50)(3))),
        rtol=1e-6)


def test_build_training_model_scales_the_papers_schedule(tiny_config):
    """The job's model: equation (3) times the factor, counted in updates; Adam(0.9, 0.98, 1e-9)."""
    config = tiny_config.replace(warmup_steps=50)
    model = kt.build_training_model(config, learning_rate_factor=2.0, grad_accum_steps=2,
                                    jit_compile="false")
    optimizer = model.optimizer
    assert (optimizer.beta_1, optimizer.beta_2, optimizer.epsilon) == (0.9, 0.98, 1e-9)
    assert optimizer.gradient_accumulation_steps == 2
    inputs, labels = random_pairs(config, num_pairs=12)
    model.fit(inputs, labels, batch_size=2, epochs=1, verbose=0)  # 6 micro-batches
    updates = kt.optimizer_updates(optimizer)
    assert updates == 3
    step = updates + 1  # the rate of the next update, steps numbered from 1
    paper = config.d_model ** -0.5 * min(step ** -0.5, step * 50 ** -1.5)
    np.testing.assert_allclose(
        float(keras.ops.convert_to_numpy(optimizer.learning_rate)), 2.0 * paper, rtol=1e-6)


def test_training_timer_counts_steps_and_tokens(tiny_config):
    model = kt.compile_model(kt.build_model(tiny_config))
    inputs, labels = random_pairs(tiny_config, num_pairs=12)
    timer = kt.TrainingTimer()
    start = time.perf_counter()
    model.fit(inputs, labels, batch_size=4, epochs=2, verbose=0, callbacks=[timer],
              validation_data=(inputs, labels))
    wall = time.perf_counter() - start
    assert timer.steps == 6
    assert 0 < timer.seconds <= timer.elapsed <= wall
    np.testing.assert_allclose(timer.tokens_per_second(100.0),
                               100.0 * 6 / timer.seconds, rtol=1e-9)


def test_the_jobs_step_time_leaves_out_its_callbacks(tiny_config, tmp_path, monkeypatch):
    """job.fit's `step_seconds` (the log's and results.json's "tokens/s
    in training steps") leaves out what the job's callbacks do after a step:
    here a validation that takes 0.2 s more, after every update."""
    import tensorflow as tf

    from keras_transformer import runs

    from keras_transformer.training import job

    from keras_transformer.training.settings import merge_settings
    from keras_transformer.training.validation import Validator

    validate = Validator.validate

    def slow_validate(self, model, update):
        time.sleep(0.2)
        return validate(self, model, update)

    monkeypatch.setattr(Validator, "validate", slow_validate)
    model = kt.compile_model(kt.build_model(tiny_config))
    inputs, labels = random_pairs(tiny_config, num_pairs=16)
    train_ds = tf.data.Dataset.from_tensor_slices((inputs, labels)).batch(4).repeat()
    valid_ds = tf.data.Dataset.from_tensor_slices((inputs, labels)).batch(4)
    settings = merge_settings(dict(preset="tiny", data="demo", output_dir=str(tmp_path),
                                   train_steps=5, validate_every=1, checkpoint_every=10**6,
                                   validation_bleu_sentences=0))
    report = job.fit(model, runs.RunFolder(tmp_path), settings, train_ds, valid_ds,
                            start_update=0, tokens_per_update=40.0)
    assert report.outcome.kind == "finished" and report.outcome.update == 5
    assert report.steps == 5 and report.seconds >= 5 * 0.2
    assert report.step_seconds <= report.seconds - 5 * 0.2
    assert report.tokens_per_second == pytest.approx(40.0 * 5 / report.step_seconds)


def test_peak_memory_matches_the_kernels_high_water_mark():
    status = pathlib.Path("/proc/self/status")
    if not status.exists():
        pytest.skip("needs Linux /proc")
    ballast = np.ones(64 * 1024 * 1024 // 8)  # 64 MiB touched
    peak = kt.peak_memory_mib()
    vm_hwm = next(int(line.split()[1]) for line in status.read_text().splitlines()
                  if line.startswith("VmHWM:")) / 1024
    assert abs(peak - vm_hwm) <= 0.05 * vm_hwm
    assert peak >= ballast.nbytes / 2**20
