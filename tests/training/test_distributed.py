"""Training under tf.distribute matches a single device (TensorFlow only)."""

import os
import pathlib
import subprocess
import sys

import pytest

REPO = pathlib.Path(__file__).resolve().parents[2]

# Runs in a fresh process: logical CPU devices must be set before TF starts.
_MIRRORED = r"""
import numpy as np
import tensorflow as tf
cpu = tf.config.list_physical_devices("CPU")[0]
tf.config.set_logical_device_configuration(cpu, [tf.config.LogicalDeviceConfiguration()] * 2)
import keras
import keras_transformer as kt

config = kt.TransformerConfig.preset("tiny", vocab_size=60, num_layers=2, d_model=32,
                                     num_heads=4, d_ff=64, dropout=0.0)
rng = np.random.default_rng(0)
batch, length = 8, 9
source = rng.integers(4, 60, (batch, length)).astype("int32")
target = rng.integers(4, 60, (batch, length)).astype("int32")
labels = rng.integers(4, 60, (batch, length)).astype("int32")
# Ragged padding, different on the two replicas' halves of the batch.
for i, n in enumerate([9, 2, 5, 9, 3, 1, 7, 4]):
    source[i, n:] = 0; target[i, n:] = 0; labels[i, n:] = 0
inputs = {"source_ids": source, "target_ids": target}

def fit_steps(model):
    # fit() splits each global batch across replicas (train_on_batch does not).
    data = tf.data.Dataset.from_tensors((inputs, labels)).repeat()
    history = model.fit(data, epochs=4, steps_per_epoch=1, verbose=0)
    return history.history["loss"]

keras.utils.set_random_seed(0)
single = kt.compile_model(kt.build_model(config), learning_rate=1e-3)
initial = single.get_weights()
single_steps = fit_steps(single)

strategy = tf.distribute.MirroredStrategy(["/cpu:0", "/cpu:1"])
assert strategy.num_replicas_in_sync == 2
with strategy.scope():
    mirrored = kt.compile_model(kt.build_model(config), learning_rate=1e-3)
mirrored.set_weights(initial)
assert mirrored.distribute_strategy is strategy
mirrored_steps = fit_steps(mirrored)
print("single", single_steps)
print("mirrored", mirrored_steps)
np.testing.assert_allclose(mirrored_steps, single_steps, rtol=1e-4)
# Weights themselves are ill-conditioned under Adam (a near-zero gradient's
# sign flips with rounding); the trained models' outputs must agree.
np.testing.assert_allclose(keras.ops.convert_to_numpy(mirrored(inputs)),
                           keras.ops.convert_to_numpy(single(inputs)), rtol=1e-3, atol=1e-3)
print("OK")
"""


def run_tf(script, tmp_path, timeout=300):
    path = tmp_path / "script.py"
    path.write_text(script)
    env = dict(os.environ, KERAS_BACKEND="tensorflow",
               PYTHONPATH=os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")]))
    return subprocess.run([sys.executable, str(path)], env=env, capture_output=True,
                          text=True, timeout=timeout, cwd=tmp_path)


@pytest.mark.slow
def test_mirrored_strategy_matches_single_device(tmp_path):
    result = run_tf(_MIRRORED, tmp_path)
    assert result.returncode == 0 and "OK" in result.stdout, (
        result.stdout[-2000:] + result.stderr[-4000:])


_WORKER = r"""
import json, os, sys
import numpy as np
import tensorflow as tf
strategy = tf.distribute.MultiWorkerMirroredStrategy()
import keras
import keras_transformer as kt

task = json.loads(os.environ["TF_CONFIG"])["task"]["index"]
config = kt.TransformerConfig.preset("tiny", vocab_size=60, num_layers=1, d_model=32,
                                     num_heads=4, d_ff=64, dropout=0.0)
rng = np.random.default_rng(0)  # same global data on both workers
source = rng.integers(4, 60, (8, 7)).astype("int32")
target = rng.integers(4, 60, (8, 6)).astype("int32")
labels = rng.integers(4, 60, (8, 6)).astype("int32")
data = tf.data.Dataset.from_tensors(({"source_ids": source, "target_ids": target}, labels))
data = data.repeat()
keras.utils.set_random_seed(task)  # different initial weights: the strategy must sync them
with strategy.scope():
    model = kt.compile_model(kt.build_model(config), learning_rate=1e-3)
history = model.fit(data, epochs=3, steps_per_epoch=1, verbose=0)
np.savez(sys.argv[1] + f"/worker{task}.npz", *model.get_weights())
print("losses", history.history["loss"])
"""


def _free_ports(count):
    import socket

    sockets = [socket.socket() for _ in range(count)]
    for s in sockets:
        s.bind(("127.0.0.1", 0))
    ports = [s.getsockname()[1] for s in sockets]
    for s in sockets:
        s.close()
    return ports


@pytest.mark.slow
def test_multi_worker_mirrored_strategy_two_processes(tmp_path):
    import json

    import numpy as np

    script = tmp_path / "worker.py"
    script.write_text(_WORKER)
    workers = [f"127.0.0.1:{port}" for port in _free_ports(2)]
    processes = []
    for index in range(2):
        tf_config = {"cluster": {"worker": workers}, "task": {"type": "worker", "index": index}}
        env = dict(os.environ, KERAS_BACKEND="tensorflow", TF_CONFIG=json.dumps(tf_config),
                   TF_CPP_MIN_LOG_LEVEL="2",
                   PYTHONPATH=os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")]))
        processes.append(subprocess.Popen(
            [sys.executable, str(script), str(tmp_path)], env=env, cwd=tmp_path,
            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True))
    outputs = []
    try:
        for process in processes:
            outputs.append(process.communicate(timeout=300)[0])
    finally:
        for process in processes:
            process.kill()
    for process, output in zip(processes, outputs):
        assert process.returncode == 0, output[-4000:]
    first = np.load(tmp_path / "worker0.npz")
    second = np.load(tmp_path / "worker1.npz")
    assert len(first.files) == len(second.files) > 0
    for name in first.files:
        np.testing.assert_array_equal(first[name], second[name])
    assert "losses" in outputs[0]


_JAX_DATA_PARALLEL = r"""
import numpy as np
import keras
import keras_transformer as kt
from keras_transformer.training.strategy import get_strategy, num_replicas

config = kt.TransformerConfig.preset("tiny", vocab_size=60, num_layers=1, d_model=32,
                                     num_heads=4, d_ff=64, dropout=0.0)
rng = np.random.default_rng(0)
inputs = {"source_ids": rng.integers(4, 60, (8, 7)).astype("int32"),
          "target_ids": rng.integers(4, 60, (8, 6)).astype("int32")}
labels = rng.integers(4, 60, (8, 6)).astype("int32")
labels[:3, 4:] = 0

keras.utils.set_random_seed(0)
single = kt.compile_model(kt.build_model(config), learning_rate=1e-3)
initial = single.get_weights()
single_losses = single.fit(inputs, labels, batch_size=8, epochs=3, verbose=0).history["loss"]

assert get_strategy("auto") is None
assert num_replicas(None) == 2, num_replicas(None)
parallel = kt.compile_model(kt.build_model(config), learning_rate=1e-3)
parallel.set_weights(initial)
losses = parallel.fit(inputs, labels, batch_size=8, epochs=3, verbose=0).history["loss"]
print("single", single_losses, "data parallel", losses)
np.testing.assert_allclose(losses, single_losses, rtol=1e-4)
print("OK")
"""


@pytest.mark.slow
def test_jax_data_parallel_over_two_cpu_devices(tmp_path):
    path = tmp_path / "jax_dp.py"
    path.write_text(_JAX_DATA_PARALLEL)
    env = dict(os.environ, KERAS_BACKEND="jax",
               XLA_FLAGS="--xla_force_host_platform_device_count=2",
               PYTHONPATH=os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")]))
    result = subprocess.run([sys.executable, str(path)], env=env, capture_output=True,
                            text=True, timeout=300, cwd=tmp_path)
    assert result.returncode == 0 and "OK" in result.stdout, (
        result.stdout[-2000:] + result.stderr[-4000:])
