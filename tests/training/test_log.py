"""The training log's rows: Keras' loss and accuracy over exactly each row's batches.

Runs under every backend: the rows depend on resetting the model's metrics
inside `fit` (`Callback.model` and the JAX state sync).
"""

import csv
import types

import keras
import numpy as np
import pytest

from keras_transformer import runs
from keras_transformer.model.losses import MaskedAccuracy
from keras_transformer.training.log import TrainingLog

VOCAB = 7


def _crafted_batch(rows, tokens, correct, rng):
    """Labels `(rows, T)` with `tokens` non-pad ids and logits where `correct` of them win."""
    length = -(-tokens // rows)
    labels = np.zeros((rows, length), "int32")
    labels.flat[:tokens] = rng.integers(1, VOCAB, tokens)
    logits = rng.normal(size=(rows, length, VOCAB)).astype("float32")
    positions = np.flatnonzero(labels)
    win = np.zeros(labels.size, bool)
    win[positions[:correct]] = True
    flat = logits.reshape(-1, VOCAB)
    flat[np.arange(labels.size), labels.ravel()] = np.where(win, 10.0, -10.0)
    return labels, logits


class _FakeModel:
    """What `TrainingLog.write_row` uses of a model: the optimizer's rate and the reset."""

    def __init__(self, *metrics):
        self.metrics = metrics
        self.optimizer = types.SimpleNamespace(learning_rate=np.float32(1e-3))

    def reset_metrics(self):
        for metric in self.metrics:
            metric.reset_state()


# (rows, non-pad tokens, correct tokens, loss) of each batch; "row" writes a row.
BIG_RIGHT_THEN_SMALL_WRONG = [(8, 100, 100, 1.0), "row", (1, 5, 0, 9.0), (1, 5, 0, 7.0), "row"]
SMALL_RIGHT_THEN_BIG_WRONG = [(1, 2, 2, 1.0), "row", (8, 200, 0, 9.0), "row",
                              (2, 9, 4, 3.0), (4, 40, 30, 2.0), (1, 3, 3, 5.0), "row"]


@pytest.mark.parametrize("plan", [BIG_RIGHT_THEN_SMALL_WRONG, SMALL_RIGHT_THEN_BIG_WRONG],
                         ids=["big-right-then-small-wrong", "small-right-then-big-wrong"])
def test_each_row_holds_the_token_accuracy_and_sentence_weighted_loss_of_its_batches(
        plan, tmp_path):
    """Batches of unequal sizes: a difference of running means got these rows wrong.

    The accuracy is the share of the row's non-pad tokens whose label logit
    is the largest (numpy, from the batches themselves); the loss is the
    mean of the batch losses weighted by their sentences, as Keras' loss
    tracker weights them.
    """
    rng = np.random.default_rng(0)
    accuracy = MaskedAccuracy(pad_id=0)
    loss_tracker = keras.metrics.Mean(name="loss")
    model = _FakeModel(accuracy, loss_tracker)
    run = runs.RunFolder(tmp_path)
    log = TrainingLog(run, every=1, total_updates=len(plan), target_tokens_per_update=10)
    log.begin(0)
    expected, hits, tokens, losses, sentences = [], 0, 0, [], []
    update = 0
    for step in plan:
        if step == "row":
            update += 1
            row = log.write_row(model, update)
            assert 0.0 <= row["accuracy"] <= 1.0
            expected.append((hits / tokens, np.average(losses, weights=sentences)))
            np.testing.assert_allclose([row["accuracy"], row["loss"]], expected[-1],
                                       rtol=1e-6, atol=1e-7)
            hits, tokens, losses, sentences = 0, 0, [], []
            continue
        rows, count, correct, loss = step
        labels, logits = _crafted_batch(rows, count, correct, rng)
        accuracy.update_state(labels, logits)
        loss_tracker.update_state(loss, sample_weight=rows)
        log.observe({"loss": loss_tracker.result(), "accuracy": accuracy.result()})
        mask = labels != 0
        label_logit = np.take_along_axis(logits, labels[..., None], -1)[..., 0]
        hits += int(((label_logit >= logits.max(-1)) & mask).sum())
        tokens += int(mask.sum())
        losses.append(loss)
        sentences.append(rows)
    log.close()
    with open(run.log_file, newline="") as handle:
        written = [(float(r["accuracy"]), float(r["loss"])) for r in csv.DictReader(handle)]
    np.testing.assert_allclose(written, expected, rtol=1e-6, atol=1e-7)


def test_a_row_without_training_batches_is_empty(tmp_path):
    model = _FakeModel(MaskedAccuracy())
    run = runs.RunFolder(tmp_path)
    log = TrainingLog(run, every=1, total_updates=1, target_tokens_per_update=10)
    log.begin(0)
    row = log.write_row(model, 1, {"val_loss": 2.0})
    log.close()
    assert np.isnan(row["loss"]) and np.isnan(row["accuracy"])
    with open(run.log_file, newline="") as handle:
        (written,) = csv.DictReader(handle)
    assert (written["loss"], written["accuracy"], written["val_loss"]) == ("", "", "2.0")


def _numpy_row_values(logits, labels, label_smoothing):
    """Token accuracy and mean label-smoothed loss of a row's batches of equal rows (numpy)."""
    hits = tokens = 0
    losses = []
    for z, y in zip(logits, labels):
        z = z.astype("float64")
        mask = y != 0
        label_logit = np.take_along_axis(z, y[..., None], -1)[..., 0]
        hits += int(((label_logit >= z.max(-1)) & mask).sum())
        tokens += int(mask.sum())
        top = z.max(-1, keepdims=True)
        log_normalizer = np.log(np.exp(z - top).sum(-1)) + top[..., 0]
        per_token = ((1 - label_smoothing) * (log_normalizer - label_logit)
                     + label_smoothing * (log_normalizer - z.mean(-1)))
        losses.append(per_token[mask].sum() / mask.sum())
    return hits / tokens, np.mean(losses)


def test_fit_rows_hold_each_rows_own_accuracy_under_this_backend(tiny_config, tmp_path):
    """A real `fit` with the guard, learning rate 0 (the logits stay as predicted).

    Batches of 4 sentences with 24 or 4 target tokens, labels chosen
    against the model's own argmax (all right, all wrong or a mix), a row
    every 2 updates: each row's accuracy and loss are computed with numpy
    from the logits of the batches it covers.
    """
    from keras_transformer import build_model
    from keras_transformer.training.checkpoints import StateSaver, WeightWriter
    from keras_transformer.training.divergence import DivergenceRule
    from keras_transformer.training.guard import RunGuard
    from keras_transformer.training.optimization import compile_model

    keras.utils.set_random_seed(0)
    rng = np.random.default_rng(0)
    config = tiny_config.replace(num_layers=1, d_model=16, num_heads=2, d_ff=32)
    model = build_model(config)
    compile_model(model, learning_rate=0.0)
    vocab, rows, length = config.vocab_size, 4, 6
    # (target tokens per sentence, which labels the model gets right) of each batch
    plan = [(6, "right"), (1, "wrong"), (6, "wrong"), (1, "right"),
            (6, "mix"), (1, "wrong"), (6, "wrong"), (1, "mix")]
    source = rng.integers(4, vocab, (len(plan) * rows, length)).astype("int32")
    target = rng.integers(4, vocab, (len(plan) * rows, length)).astype("int32")
    for i, (tokens, _) in enumerate(plan):
        target[i * rows:(i + 1) * rows, tokens:] = 0  # padding
    inputs = {"source_ids": source, "target_ids": target}
    logits = model.predict(inputs, batch_size=len(target), verbose=0)
    predicted = logits.argmax(-1)
    wrong = predicted % (vocab - 1) + 1  # another id, never the pad id
    right = np.concatenate([
        {"right": np.ones((rows, length), bool), "wrong": np.zeros((rows, length), bool),
         "mix": rng.random((rows, length)) < 0.5}[kind] for _, kind in plan])
    labels = np.where(right, predicted, wrong).astype("int32")
    top2 = np.sort(logits, -1)[..., -2:]
    labels[(target == 0) | (top2[..., 1] - top2[..., 0] < 1e-3)] = 0  # pads, near ties
    weights = [np.array(w) for w in model.get_weights()]

    run = runs.RunFolder(tmp_path)
    writer = WeightWriter()
    guard = RunGuard(
        start_update=0, accumulation_steps=1, writer=writer,
        saver=StateSaver(run, writer, checkpoint_every=1000, keep=1, backup_minutes=0),
        log=TrainingLog(run, every=2, total_updates=len(plan), target_tokens_per_update=14),
        divergence=DivergenceRule(vocab))
    model.fit(inputs, labels, batch_size=rows, epochs=1, shuffle=False, verbose=0,
              callbacks=[guard])
    for before, after in zip(weights, model.get_weights()):
        np.testing.assert_array_equal(before, np.asarray(after))  # nothing trained

    with open(run.log_file, newline="") as handle:
        written = list(csv.DictReader(handle))
    assert [int(r["step"]) for r in written] == [2, 4, 6, 8]
    observed = np.array([[float(r["accuracy"]), float(r["loss"])] for r in written])
    per_row = 2 * rows
    expected = np.array([
        _numpy_row_values(logits[i:i + per_row].reshape(2, rows, length, vocab),
                          labels[i:i + per_row].reshape(2, rows, length),
                          config.label_smoothing)
        for i in range(0, len(target), per_row)])
    assert ((observed[:, 0] >= 0) & (observed[:, 0] <= 1)).all()
    np.testing.assert_allclose(observed[:, 0], expected[:, 0], atol=1e-6)
    np.testing.assert_allclose(observed[:, 1], expected[:, 1], rtol=1e-4)
