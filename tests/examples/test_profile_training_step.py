"""examples/profile_training_step.py: op categories, and the script on the tiny preset."""

import json
import os
import pathlib
import subprocess
import sys

import pytest
from conftest import load_example

pytestmark = pytest.mark.backend_independent  # TensorFlow ops, profiled in a subprocess

SCRIPT = pathlib.Path(__file__).resolve().parents[2] / "examples" / "profile_training_step.py"


@pytest.fixture(scope="module")
def profile():
    return load_example("profile_training_step")


@pytest.mark.parametrize("name, kind, category", [
    # Op names as TensorFlow's profiler reports them for the small preset.
    ("gradient_tape/transformer_1/shared_embedding_5/Tensordot/MatMul/MatMul_1", "_MklMatMul",
     "matmul: output projection"),
    ("transformer_1/decoder_1/decoder_layer_0_1/self_attention_1/query_1/Tensordot/MatMul",
     "_MklMatMul", "matmul: attention Q/K/V/O"),
    ("transformer_1/encoder_1/encoder_layer_2_1/self_attention_1/attention_output_1/Tensordot/"
     "MatMul", "_MklMatMul", "matmul: attention Q/K/V/O"),
    ("gradient_tape/transformer_1/decoder_1/decoder_layer_1_1/ffn_inner_1/Tensordot/MatMul/"
     "MatMul", "_MklMatMul", "matmul: feed-forward"),
    ("transformer_1/decoder_1/decoder_layer_0_1/cross_attention_1/MatMul_1",
     "_MklBatchMatMulV2", "matmul: attention scores"),
    ("compile_loss/label_smoothed_ce/ReduceLogSumExp/Exp", "Exp", "loss over the vocabulary"),
    ("AddN_1/tmp_var_initializer", "Assign", "loss over the vocabulary"),
    ("adam/truediv", "RealDiv", "optimizer (Adam)"),
    ("transformer_1/encoder_1/encoder_layer_1_1/dropout_6_3/stateless_dropout/"
     "stateless_random_uniform/StatelessRandomUniformV2", "StatelessRandomUniformV2", "dropout"),
    ("gradient_tape/transformer_1/decoder_1/decoder_layer_2_1/ffn_norm_1/mul/Mul", "Mul",
     "layer norm"),
    ("transformer_1/Cast", "Cast", "casts"),
    ("transformer_1/encoder_1/encoder_layer_0_1/self_attention_1/transpose", "_MklTranspose",
     "head transposes"),
    ("transformer_1/decoder_1/decoder_layer_0_1/self_attention_1/SelectV2", "SelectV2",
     "attention softmax + mask"),
    ("gradient_tape/transformer_1/encoder_1/encoder_layer_0_1/ffn_inner_1/ReluGrad", "ReluGrad",
     "bias add + ReLU"),
    ("transformer_1/shared_embedding_1/GatherV2", "GatherV2", "embedding lookup + gradient"),
    ("transformer_1/decoder_1/add", "AddV2", "other"),
])
def test_ops_fall_in_their_category(profile, name, kind, category):
    assert profile.categorize(name, kind) == category


def test_summarize_sums_per_update(profile):
    times = {("adam/Sub", "Sub"): 0.02, ("adam/Mul", "Mul"): 0.04,
             ("transformer_1/Cast", "Cast"): 0.01}
    categories, ops = profile.summarize(times, steps=2)
    assert categories["optimizer (Adam)"] == pytest.approx(30.0)  # ms per update
    assert categories["casts"] == pytest.approx(5.0)
    assert sum(categories.values()) == pytest.approx(35.0)
    assert ops[0] == (pytest.approx(20.0), "adam/Mul", "Mul")


@pytest.mark.slow
def test_script_profiles_both_policies_of_the_tiny_preset(tmp_path):
    path = tmp_path / "profile.json"
    result = subprocess.run(
        [sys.executable, str(SCRIPT), "--preset", "tiny", "--tokens-per-batch", "256",
         "--seq-len", "16", "--steps", "1", "--warmup-steps", "1", "--top", "3",
         "--json", str(path)],
        env=dict(os.environ, KERAS_BACKEND="tensorflow"), capture_output=True, text=True,
        timeout=600)
    assert result.returncode == 0, result.stderr[-3000:]
    figures = json.loads(path.read_text())
    assert list(figures) == ["float32", "mixed_bfloat16"]
    for policy, figure in figures.items():
        assert figure["policy"] == policy and figure["wall_ms"] > 0
        # Every update multiplies and updates the weights.
        for category in ("matmul: output projection", "matmul: feed-forward",
                         "optimizer (Adam)"):
            assert figure["categories"][category] > 0, (policy, category)
        assert figure["total_ms"] == pytest.approx(sum(figure["categories"].values()))
    assert figures["float32"]["categories"]["casts"] < figures["mixed_bfloat16"][
        "categories"]["casts"]
    assert "op time per update" in result.stdout and "wall time per update" in result.stdout
    assert "the 3 costliest ops under mixed_bfloat16" in result.stdout
