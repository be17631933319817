"""Smoke test of examples/benchmark_training.py: a few steps on a tiny config."""

import importlib.util
import pathlib

import keras
import numpy as np
import pytest

torch = pytest.importorskip("torch")

SCRIPT = pathlib.Path(__file__).resolve().parents[1] / "examples" / "benchmark_training.py"


@pytest.fixture(scope="module")
def bench():
    spec = importlib.util.spec_from_file_location("benchmark_training", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_flops_count_weight_matrices_and_attention(bench, tiny_config):
    """With S == T every weight matrix sees every token: 6 * B*T * its size."""
    from keras_transformer import build_model

    c = tiny_config
    model = build_model(c)
    matrix_parameters = sum(int(np.prod(w.shape)) for w in model.trainable_weights
                            if len(w.shape) == 2)  # kernels and the tied embedding
    B, T = 3, 5
    attention = 6 * 2 * B * c.num_layers * c.d_model * (3 * T * T)  # enc, dec, cross
    assert bench.training_flops(c, B, T, T) == 6 * B * T * matrix_parameters + attention


def test_synthetic_batch_shapes_and_padding(bench, tiny_config):
    batch = bench.synthetic_batch(tiny_config, 4, 10, pad_fraction=0.2)
    assert {k: v.shape for k, v in batch.items()} == {
        "source_ids": (4, 10), "target_ids": (4, 10), "labels": (4, 10)}
    assert all(v.dtype == np.int32 for v in batch.values())
    np.testing.assert_array_equal(batch["target_ids"][:, 1:] != 0,
                                  batch["labels"][:, 1:] != 0)
    assert (batch["target_ids"][:, 0] == tiny_config.bos_id).all()


@pytest.fixture
def one_torch_thread():
    # Two OpenMP threads on a busy 2-core machine can make tiny torch steps
    # 50x slower; the smoke test checks the mechanics, not the speed.
    threads = torch.get_num_threads()
    yield 1
    torch.set_num_threads(threads)


def test_run_benchmark_on_tiny_config(bench, tiny_config, one_torch_thread, capsys):
    config = tiny_config.replace(dropout=0.1, num_layers=1)
    config_dict = config.to_dict()
    result = bench.run_benchmark(
        config_dict, tokens_per_batch=64, seq_len=8, steps=1, warmup_steps=1, repeats=2,
        torch_threads=one_torch_thread, isolate=False, matmul_size=256, log=print,
    )
    print(bench.format_result(result))
    printed = capsys.readouterr().out
    assert "ratio keras/torch" in printed
    assert keras.backend.backend() in result["keras"]["name"]

    assert result["matmul_peak_gflops"] > 0 and result["ratio"] > 0
    for kind in ("keras", "torch"):
        for key in ("tokens_per_second", "best_tokens_per_second", "gflops",
                    "fraction_of_peak", "peak_rss_mb", "cpu_seconds"):
            assert result[kind][key] > 0, (kind, key)
        assert len(result[kind]["rounds"]) == 2
        assert result[kind]["matmul_peak_gflops"] > 0
        assert result[kind]["other_cores"] is None or result[kind]["other_cores"] >= 0

    # Same model up to torch.nn.Transformer's final encoder/decoder LayerNorms.
    assert result["keras"]["num_parameters"] == config.num_parameters()
    assert result["parameter_difference"] == bench.expected_parameter_difference(config)
    assert result["parameter_difference"] == 4 * config.d_model
