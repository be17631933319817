import keras
import numpy as np
import pytest

from keras_transformer import LabelSmoothedCrossEntropy, MaskedAccuracy


def numpy_log_softmax(logits):
    logits = logits.astype("float64")
    shifted = logits - logits.max(-1, keepdims=True)
    return shifted - np.log(np.exp(shifted).sum(-1, keepdims=True))


def numpy_smoothed_ce(labels, logits, eps, pad_id=0):
    """Dense reference: smoothed one-hot target (1-eps) + eps/V, mean over non-pad."""
    vocab = logits.shape[-1]
    target = np.full(logits.shape, eps / vocab)
    target += (1 - eps) * np.eye(vocab)[labels]
    per_token = -(target * numpy_log_softmax(logits)).sum(-1)
    mask = labels != pad_id
    return per_token[mask].mean()


def to_np(x):
    return keras.ops.convert_to_numpy(x)


@pytest.fixture
def batch():
    rng = np.random.default_rng(0)
    labels = rng.integers(1, 11, size=(3, 6))
    labels[0, 4:] = 0
    labels[2, 2:] = 0
    logits = rng.normal(size=(3, 6, 11)).astype("float32") * 3
    return labels, logits


def test_eps_zero_equals_sparse_cross_entropy_over_non_pad(batch):
    labels, logits = batch
    ours = to_np(LabelSmoothedCrossEntropy(0.0)(labels, logits))
    per_token = keras.losses.sparse_categorical_crossentropy(labels, logits, from_logits=True)
    mask = labels != 0
    expected = to_np(per_token)[mask].mean()
    np.testing.assert_allclose(ours, expected, rtol=1e-6)


def test_eps_point_one_equals_numpy_reference(batch):
    labels, logits = batch
    ours = to_np(LabelSmoothedCrossEntropy(0.1)(labels, logits))
    np.testing.assert_allclose(ours, numpy_smoothed_ce(labels, logits, 0.1), rtol=1e-6)


def test_padded_batch_equals_unpadded(batch):
    labels, logits = batch
    loss = LabelSmoothedCrossEntropy(0.1)
    row = slice(1, 2)  # the unpadded sentence
    padded_labels = np.concatenate([labels[row], np.zeros((1, 5), int)], axis=1)
    padded_logits = np.concatenate(
        [logits[row], np.random.default_rng(1).normal(size=(1, 5, 11)).astype("float32") * 100],
        axis=1)
    np.testing.assert_allclose(
        to_np(loss(padded_labels, padded_logits)), to_np(loss(labels[row], logits[row])), rtol=1e-6)


def test_sample_weight_and_sum_reduction(batch):
    labels, logits = batch
    per_token = to_np(LabelSmoothedCrossEntropy(0.1, reduction="none")(labels, logits))
    assert per_token.shape == labels.shape
    assert np.all(per_token[labels == 0] == 0)
    total = to_np(LabelSmoothedCrossEntropy(0.1, reduction="sum")(labels, logits))
    np.testing.assert_allclose(total, per_token.sum(), rtol=1e-6)
    weights = np.array([1.0, 0.0, 2.0])
    weighted = to_np(LabelSmoothedCrossEntropy(0.1)(labels, logits, sample_weight=weights))
    w = (labels != 0) * weights[:, None]
    np.testing.assert_allclose(weighted, (per_token * w).sum() / w.sum(), rtol=1e-6)


def test_uniform_logits_over_a_large_vocabulary_give_log_v():
    """Uniform predictions cost log(V) whatever the smoothing."""
    loss = LabelSmoothedCrossEntropy(0.1)
    labels = np.ones((1, 1), "int32")
    logits = np.zeros((1, 1, 37000), "float32")
    np.testing.assert_allclose(to_np(loss(labels, logits)), np.log(37000), rtol=1e-6)


def test_bad_arguments():
    with pytest.raises(ValueError, match="label_smoothing"):
        LabelSmoothedCrossEntropy(1.0)
    with pytest.raises(ValueError, match="padding"):
        LabelSmoothedCrossEntropy(0.1, reduction="sum_over_batch_size")


def test_loss_serializes():
    loss = LabelSmoothedCrossEntropy(0.2, pad_id=0)
    restored = keras.losses.deserialize(keras.losses.serialize(loss))
    assert isinstance(restored, LabelSmoothedCrossEntropy)
    assert restored.label_smoothing == 0.2


def test_masked_accuracy_counts_tokens_across_batches():
    metric = MaskedAccuracy()
    labels = np.array([[1, 2, 0, 0], [3, 4, 5, 6]])
    logits = np.eye(7)[np.array([[1, 5, 3, 3], [3, 4, 0, 6]])]
    metric.update_state(labels, logits)  # correct: 1 of 2, 3 of 4
    metric.update_state(np.array([[5, 0]]), np.eye(7)[np.array([[5, 5]])])  # 1 of 1
    np.testing.assert_allclose(to_np(metric.result()), 5 / 7, rtol=1e-6)
    metric.reset_state()
    assert float(to_np(metric.result())) == 0.0


def backend_gradient(fn, x):
    """d fn(x) / dx with the active backend's autodiff, as numpy."""
    backend = keras.backend.backend()
    if backend == "tensorflow":
        import tensorflow as tf

        x = tf.constant(x)
        with tf.GradientTape() as tape:
            tape.watch(x)
            y = fn(x)
        return tape.gradient(y, x).numpy()
    if backend == "jax":
        import jax

        return np.asarray(jax.grad(fn)(jax.numpy.asarray(x)))
    import torch

    x = torch.tensor(x, requires_grad=True)
    fn(x).backward()
    return x.grad.numpy()


def test_gradient_equals_softmax_minus_smoothed_target(batch):
    """The analytic gradient of the dense reference: (softmax - q) / non-pad count."""
    labels, logits = batch
    eps, vocab = 0.1, logits.shape[-1]
    loss = LabelSmoothedCrossEntropy(eps)
    grad = backend_gradient(lambda z: loss(labels, z), logits)
    softmax = np.exp(numpy_log_softmax(logits))
    target = np.full(logits.shape, eps / vocab) + (1 - eps) * np.eye(vocab)[labels]
    mask = (labels != 0)[..., None]
    expected = (softmax - target) * mask / mask.sum()
    np.testing.assert_allclose(grad, expected, rtol=1e-4, atol=1e-7)
    assert np.all(grad[labels == 0] == 0)


def test_masked_accuracy_counts_a_tie_for_the_maximum_as_a_hit():
    metric = MaskedAccuracy()
    labels = np.array([[3, 1, 0]])
    logits = np.zeros((1, 3, 5), "float32")  # every class ties
    logits[0, 1, 2] = 1.0  # position 1: class 2 wins, label 1 misses
    metric.update_state(labels, logits)
    np.testing.assert_allclose(to_np(metric.result()), 1 / 2, rtol=1e-6)
