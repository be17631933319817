"""What training costs: the time of its steps (and the throughput) and peak memory.

The job reports both after `fit` (`keras_transformer.training.job.FitReport`)
and in results.json; the benchmarks in examples/ use them too.
"""

import os
import resource
import time

import keras


class TrainingTimer(keras.callbacks.Callback):
    """Times the training batches of `fit`, without validation and callbacks.

    `seconds` sums the time from each `on_train_batch_begin` to its
    `on_train_batch_end` (the training step itself: with the default
    `steps_per_execution=1` a step's results are fetched before its end hook
    runs), and `steps` counts them. Keras calls the callbacks' hooks in list
    order: put the timer first, or it times the end hooks of the callbacks
    before it (a validation, a checkpoint). `tokens_per_second(tokens_per_step)`
    turns that into throughput. `elapsed` is the wall-clock time of the whole
    `fit` call, validation included.
    """

    def __init__(self):
        super().__init__()
        self.seconds = 0.0
        self.steps = 0
        self.elapsed = 0.0
        self._batch_start = None
        self._fit_start = None

    def on_train_begin(self, logs=None):
        self._fit_start = time.perf_counter()

    def on_train_batch_begin(self, batch, logs=None):
        self._batch_start = time.perf_counter()

    def on_train_batch_end(self, batch, logs=None):
        if self._batch_start is not None:
            self.seconds += time.perf_counter() - self._batch_start
            self.steps += 1
            self._batch_start = None

    def on_train_end(self, logs=None):
        if self._fit_start is not None:
            self.elapsed += time.perf_counter() - self._fit_start

    def tokens_per_second(self, tokens_per_step):
        """Throughput given the mean number of tokens in one training step."""
        return tokens_per_step * self.steps / self.seconds if self.seconds else 0.0


def peak_memory_mib():
    """Peak resident memory of this process (Linux/macOS `ru_maxrss`) in MiB."""
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    # Linux reports KiB, macOS bytes.
    return peak / (1024 * 1024) if os.uname().sysname == "Darwin" else peak / 1024
