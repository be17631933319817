"""Weights saved under one Keras backend give the same logits under the others."""

import json
import os
import pathlib
import subprocess
import sys

import keras
import numpy as np
import pytest

import keras_transformer as kt

BACKENDS = ["tensorflow", "jax", "torch"]

_CHILD = r"""
import json, sys
import numpy as np
import keras, keras_transformer as kt
work = sys.argv[1]
config = kt.TransformerConfig.from_dict(json.load(open(f"{work}/config.json")))
inputs = dict(np.load(f"{work}/inputs.npz"))
model = kt.build_model(config)
model.load_weights(f"{work}/model.weights.h5")
from_weights = keras.ops.convert_to_numpy(model(inputs))
restored = keras.saving.load_model(f"{work}/model.keras")
from_file = keras.ops.convert_to_numpy(restored(inputs))
np.savez(f"{work}/logits_{keras.backend.backend()}.npz", from_weights=from_weights, from_file=from_file)
"""


@pytest.mark.slow
@pytest.mark.every_backend
def test_weights_load_across_backends(tiny_config, tmp_path):
    this = keras.backend.backend()
    config = tiny_config.replace(position_embedding="learned", share_embeddings=False)
    model = kt.build_model(config)
    rng = np.random.default_rng(0)
    source = rng.integers(4, config.vocab_size, (2, 9)).astype("int32")
    source[0, 6:] = 0
    target = rng.integers(4, config.vocab_size, (2, 7)).astype("int32")
    inputs = {"source_ids": source, "target_ids": target}
    expected = keras.ops.convert_to_numpy(model(inputs))

    model.save_weights(tmp_path / "model.weights.h5")
    model.save(tmp_path / "model.keras")
    (tmp_path / "config.json").write_text(json.dumps(config.to_dict()))
    np.savez(tmp_path / "inputs.npz", **inputs)
    script = tmp_path / "child.py"
    script.write_text(_CHILD)

    repo = pathlib.Path(__file__).resolve().parents[2]
    for backend in [b for b in BACKENDS if b != this]:
        env = dict(os.environ, KERAS_BACKEND=backend,
                   PYTHONPATH=os.pathsep.join([str(repo), os.environ.get("PYTHONPATH", "")]))
        result = subprocess.run([sys.executable, str(script), str(tmp_path)], env=env,
                                capture_output=True, text=True, timeout=300)
        assert result.returncode == 0, f"{backend} failed:\n{result.stderr[-3000:]}"
        logits = np.load(tmp_path / f"logits_{backend}.npz")
        np.testing.assert_allclose(logits["from_weights"], expected, atol=1e-4,
                                   err_msg=f"{this} -> {backend} (weights file)")
        np.testing.assert_allclose(logits["from_file"], expected, atol=1e-4,
                                   err_msg=f"{this} -> {backend} (.keras file)")
