"""Label-smoothed cross-entropy over non-pad tokens, and masked token accuracy."""

import keras
from keras import ops

from keras_transformer.model.serialization import register


def token_weights(labels, pad_id, sample_weight=None):
    """float32 weights `(batch, T)`: 0 at pad labels, else `sample_weight` (or 1).

    `sample_weight` may be per sentence `(batch,)` or per token `(batch, T)`.
    """
    weights = ops.cast(ops.not_equal(ops.cast(labels, "int32"), pad_id), "float32")
    if sample_weight is not None:
        sample_weight = ops.cast(sample_weight, "float32")
        while len(sample_weight.shape) < len(weights.shape):
            sample_weight = ops.expand_dims(sample_weight, -1)
        weights = weights * sample_weight
    return weights


def _multi_replica_context():
    """The tf.distribute replica context of a multi-replica step, else None."""
    if keras.backend.backend() != "tensorflow":
        return None
    import tensorflow as tf

    if not tf.distribute.has_strategy() or tf.distribute.in_cross_replica_context():
        return None
    context = tf.distribute.get_replica_context()
    if context is None or context.num_replicas_in_sync == 1:
        return None
    return context


@register
class LabelSmoothedCrossEntropy(keras.losses.Loss):
    """Cross-entropy with label smoothing (Szegedy et al., 2016), ignoring padding.

    The smoothed target puts (1 - eps) on the true token and eps spread uniformly
    over all `vocab_size` classes (eps / V each, the true token included), the
    convention of Szegedy et al. and of Keras' dense cross-entropy. Per token:

        loss = logsumexp(z) - (1 - eps) * z[y] - eps * mean(z)

    which needs no smoothed target distribution. z[y] is a gather on JAX and
    PyTorch; on TensorFlow it is a one-hot product (the same value): the
    gradient of TensorFlow's gather is a scatter (`UnsortedSegmentSum`),
    slower on a CPU than the product's dense one, at the cost of one more
    tensor of the logits' size (the loss's costs: docs/bf16.md, "Where the
    step's time goes"). Positions whose label is
    `pad_id` contribute nothing; the default reduction is the mean over
    non-pad tokens (weighted by `sample_weight` when given). Logits are taken
    in float32. Under `tf.distribute` the mean is over the tokens of the
    global batch (each replica divides its sum by the all-reduced token
    count), so training matches a single device on the same global batch.

    Args:
        label_smoothing: eps in [0, 1).
        pad_id: label id that is ignored.
        reduction: `"mean_with_sample_weight"` (mean over non-pad tokens),
            `"sum"` (sum over non-pad tokens) or `"none"` (per-token losses,
            zero at padding).
        name: loss name.

    Example:

    >>> loss = LabelSmoothedCrossEntropy(label_smoothing=0.1)
    >>> loss(labels, logits)   # labels (batch, T) int, logits (batch, T, V)
    """

    def __init__(self, label_smoothing=0.1, pad_id=0,
                 reduction="mean_with_sample_weight", name="label_smoothed_ce",
                 dtype=None):
        if reduction not in ("mean_with_sample_weight", "sum", "none", None):
            raise ValueError(
                "reduction must be 'mean_with_sample_weight' (mean over non-pad "
                "tokens), 'sum' or 'none'; a mean over all positions would count "
                f"padding. Received reduction={reduction!r}"
            )
        if not 0.0 <= label_smoothing < 1.0:
            raise ValueError(
                f"label_smoothing must be in [0, 1), received {label_smoothing!r}"
            )
        super().__init__(name=name, reduction=reduction, dtype=dtype or "float32")
        self.label_smoothing = label_smoothing
        self.pad_id = pad_id

    def __call__(self, y_true, y_pred, sample_weight=None):
        weights = token_weights(y_true, self.pad_id, sample_weight)
        replica_context = _multi_replica_context()
        if self.reduction != "mean_with_sample_weight" or replica_context is None:
            return super().__call__(y_true, y_pred, sample_weight=weights)
        # Under tf.distribute each replica sees a slice of the global batch.
        # Dividing by the global token count (fairseq's normalisation) makes
        # the summed replica gradients equal the single-device gradient of
        # the mean over all non-pad tokens, whatever the split. The result
        # is already "scaled for distribution" in Keras' sense.
        import tensorflow as tf

        total = ops.sum(ops.cast(self.call(y_true, y_pred), "float32") * weights)
        count = replica_context.all_reduce(tf.distribute.ReduceOp.SUM, ops.sum(weights))
        return ops.divide_no_nan(total, count)

    def call(self, y_true, y_pred):
        labels = ops.cast(y_true, "int32")
        logits = ops.cast(y_pred, "float32")
        log_normalizer = ops.logsumexp(logits, axis=-1)
        # Pad positions are zeroed below.
        if keras.backend.backend() == "tensorflow":
            # TensorFlow's gradient of a gather along the last axis is a dense
            # UnsortedSegmentSum; a one-hot product is the same value with a
            # cheaper gradient (see the class docstring). Out-of-range labels
            # give a zero row.
            one_hot = ops.one_hot(labels, ops.shape(logits)[-1], dtype=logits.dtype)
            target_logit = ops.sum(one_hot * logits, axis=-1)
        else:
            target_logit = ops.take_along_axis(logits, labels[..., None], axis=-1)[..., 0]
        nll = log_normalizer - target_logit
        eps = self.label_smoothing
        if eps:
            smooth = log_normalizer - ops.mean(logits, axis=-1)
            loss = (1.0 - eps) * nll + eps * smooth
        else:
            loss = nll
        # where(), not multiply: inf/nan at pad positions must not leak.
        return ops.where(ops.not_equal(labels, self.pad_id), loss, 0.0)

    def get_config(self):
        return {
            "label_smoothing": self.label_smoothing,
            "pad_id": self.pad_id,
            "reduction": self.reduction,
            "name": self.name,
        }


@register
class MaskedAccuracy(keras.metrics.Metric):
    """Token accuracy of argmax predictions over non-pad labels.

    A token counts as correct when the label's logit is the largest one
    (compared with `>=`, so a tie for the maximum counts as a hit); this
    avoids a full argmax over the vocabulary in every training step.

    Counts correct and non-pad tokens across batches (and replicas), so the
    result is exact token accuracy, not a mean of per-batch means.

    Args:
        pad_id: label id that is ignored.
        name: metric name.
    """

    def __init__(self, pad_id=0, name="accuracy", dtype=None):
        super().__init__(name=name, dtype=dtype or "float32")
        self.pad_id = pad_id
        self.correct = self.add_variable(shape=(), initializer="zeros",
                                         dtype="float32", name="correct")
        self.count = self.add_variable(shape=(), initializer="zeros",
                                       dtype="float32", name="count")

    def update_state(self, y_true, y_pred, sample_weight=None):
        labels = ops.cast(y_true, "int32")
        logits = ops.convert_to_tensor(y_pred)
        safe_labels = ops.clip(labels, 0, ops.shape(logits)[-1] - 1)
        label_logit = ops.take_along_axis(logits, safe_labels[..., None], axis=-1)[..., 0]
        weights = token_weights(labels, self.pad_id, sample_weight)
        hits = ops.cast(label_logit >= ops.max(logits, axis=-1), "float32") * weights
        self.correct.assign_add(ops.sum(hits))
        self.count.assign_add(ops.sum(weights))

    def result(self):
        return ops.divide_no_nan(self.correct, self.count)

    def reset_state(self):
        self.correct.assign(0.0)
        self.count.assign(0.0)

    def get_config(self):
        return {"pad_id": self.pad_id, "name": self.name}
