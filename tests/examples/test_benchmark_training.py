"""Tests of examples/benchmark_training.py: a few steps on tiny configs, the device peak
table, mixed precision and MirroredStrategy on CPU devices."""

import json
import os
import pathlib
import subprocess
import sys

import keras
import numpy as np
import pytest
from conftest import load_example

torch = pytest.importorskip("torch")

SCRIPT = pathlib.Path(__file__).resolve().parents[2] / "examples" / "benchmark_training.py"


@pytest.fixture(scope="module")
def bench():
    return load_example("benchmark_training")


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
        # Measured wherever /proc/stat is readable; None only where it is not.
        assert isinstance(result[kind]["other_cores"], float) \
            == os.access("/proc/stat", os.R_OK)

    # Same model up to torch.nn.Transformer's final encoder/decoder LayerNorms.
    assert result["keras"]["num_parameters"] == config.num_parameters()
    assert result["parameter_difference"] == bench.expected_parameter_difference(config)
    assert result["parameter_difference"] == 4 * config.d_model

    assert result["sides"] == ["keras", "torch"] and result["scaling"] is None
    assert (result["keras"]["precision"], result["torch"]["precision"]) == ("float32",
                                                                            "float32")
    for kind in ("keras", "torch"):
        r = result[kind]
        if r["platform"] == "cpu":
            assert r["device_memory"] == "n/a (CPU)" and r["device_memory_bytes"] is None
        else:
            assert r["device_memory_bytes"] > 0
    table = bench.format_table([("this-run", result), ("other-run", None)])
    assert f"{result['ratio']:5.2f}x" in table.splitlines()[2]
    assert table.splitlines()[3].split() == ["other-run", "failed"]


def test_two_policies_side_by_side(bench, tiny_config, capsys):
    """float32 and mixed_bfloat16 in the same alternating rounds, each against its own peak."""
    config = tiny_config.replace(num_layers=1).to_dict()
    result = bench.run_benchmark(
        config, tokens_per_batch=64, seq_len=8, steps=1, warmup_steps=1, repeats=2,
        isolate=False, matmul_size=128, reference=False,
        mixed_precision=["none", "mixed_bfloat16"], log=print)
    print(bench.format_result(result))
    printed = capsys.readouterr().out
    assert result["sides"] == ["keras", "keras_bf16"]
    assert result["precisions"] == ["none", "mixed_bfloat16"]
    keras_side, bf16_side = result["keras"], result["keras_bf16"]
    assert (keras_side["precision"], bf16_side["precision"]) == ("float32", "mixed_bfloat16")
    assert (keras_side["matmul_dtype"], bf16_side["matmul_dtype"]) == ("float32", "bfloat16")
    # Each side's share of peak is of the peak in its own compute dtype.
    peaks = result["compute_matmul_peaks"]
    assert set(peaks) == {"float32", "bfloat16"} and min(peaks.values()) > 0
    assert bf16_side["fraction_of_peak"] == pytest.approx(
        bf16_side["gflops"] / peaks["bfloat16"])
    assert keras_side["fraction_of_peak"] == pytest.approx(
        keras_side["gflops"] / peaks["float32"])
    assert result["precision_ratios"]["keras"] == pytest.approx(
        bf16_side["tokens_per_second"] / keras_side["tokens_per_second"])
    # The rounds alternate: each side timed once per round, the order flipped.
    assert len(keras_side["rounds"]) == len(bf16_side["rounds"]) == 2
    lines = [line for line in printed.splitlines() if "round " in line]
    assert [line.split()[2] for line in lines] == ["keras", "keras_bf16",
                                                   "keras_bf16", "keras"]
    assert "bfloat16 matmul peak (CPU)" in printed
    assert "mixed_bfloat16 over none (keras):" in printed
    table = bench.format_table([("this-run", result)])
    assert "bfloat16 tok/s" in table.splitlines()[0]
    assert f"{result['precision_ratios']['keras']:5.2f}x" in table.splitlines()[2]
    with pytest.raises(ValueError, match="one or two different policies"):
        bench.run_benchmark(config, mixed_precision=["none", "none"], isolate=False)


# --- Accelerator figures, mixed precision, MirroredStrategy ---------------------


def test_device_peak_table(bench):
    peak = bench.device_peak_flops
    assert peak("NVIDIA H200", "bf16") == 989e12
    assert peak("NVIDIA H100 80GB HBM3", "bf16") == 989e12  # SXM
    assert peak("NVIDIA H100 PCIe", "bf16") == 756e12
    assert peak("NVIDIA H100 NVL", "bf16") == 835e12
    assert peak("NVIDIA A100-SXM4-80GB", "bf16") == 312e12
    assert peak("NVIDIA A100-SXM4-80GB", "tf32") == 156e12
    assert peak("NVIDIA A10", "bf16") == 125e12  # not the A100's
    assert peak("NVIDIA L4", "bf16") == 121e12
    assert peak("NVIDIA L40S", "bf16") == 362e12  # not the L4's
    assert peak("Tesla V100-SXM2-16GB", "fp16") == 125e12
    assert peak("Tesla V100-PCIE-32GB", "fp16") == 112e12
    assert peak("Tesla V100-SXM2-16GB", "tf32") == 15.7e12  # no TF32: fp32
    assert peak("Tesla V100-SXM2-16GB", "bf16") is None  # no bf16 tensor cores
    assert peak("Some Future Accelerator", "bf16") is None
    assert peak(None, "bf16") is None


def test_fraction_of_peak_and_scaling_by_hand(bench):
    # 6e12 FLOPs per global step in 0.02 s = 300 TFLOP/s; on 2 devices 150 each.
    assert bench.fraction_of_peak(6e12, 0.02, 989e12) == pytest.approx(300 / 989)
    assert bench.fraction_of_peak(6e12, 0.02, 989e12, devices=2) == pytest.approx(150 / 989)
    assert bench.fraction_of_peak(6e12, 0.02, None) is None
    assert bench.scaling_efficiency(1000.0, 1800.0, 2) == pytest.approx(0.9)
    assert bench.scaling_efficiency(1000.0, 7600.0, 8) == pytest.approx(0.95)
    assert [bench.steps_per_round(s) for s in (2.0, 0.6, 0.1, 0.001)] == [1, 2, 10, 50]


def test_side_result_on_an_accelerator(bench):
    """The GPU figures, from a made-up worker report: per device, table peak, memory."""
    info = {"platform": "gpu", "device_name": "NVIDIA H200", "replicas": 2,
            "peak_precision": "bf16", "target_tokens": 8000, "batch_size": 256,
            "matmul_peak_gflops": None}
    rounds = [{"seconds": s, "steps": 5, "cpu_seconds": 0.05, "other_cores": None}
              for s in (0.1, 0.12, 0.2)]  # median 0.024 s/step
    closing = {"device_memory_bytes": 3 * 2**30, "peak_rss_mb": 900.0}
    r = bench._side_result(info, rounds, closing, None, 100.0, flops=1.2e13)
    assert r["step_seconds"] == pytest.approx(0.024)
    assert r["tokens_per_second"] == pytest.approx(8000 / 0.024)
    assert r["tokens_per_second_per_device"] == pytest.approx(4000 / 0.024)
    # 1.2e13 / 0.024 = 5e14 FLOP/s on 2 devices: 2.5e14 each of 989e12.
    assert r["fraction_of_peak"] == pytest.approx(2.5e14 / 989e12)
    assert "989 TFLOP/s" in r["peak_source"] and "no sparsity" in r["peak_source"]
    assert r["device_memory"] == "3.00 GiB (the most of 2 devices)"

    unknown = bench._side_result(dict(info, device_name="Mystery GPU"), rounds, closing,
                                 None, 100.0, flops=1.2e13)
    assert unknown["fraction_of_peak"] is None
    assert "unknown peak" in unknown["peak_source"]


def test_torch_trainer_autocast_bfloat16(bench, tiny_config, one_torch_thread):
    config = tiny_config.to_dict()
    batch = bench.synthetic_batch(config, 2, 6)
    trainer = bench.TorchTrainer(config, batch, num_threads=one_torch_thread,
                                 mixed_precision="mixed_bfloat16", device="cpu")
    dtypes = []
    linear = trainer.model.transformer.encoder.layers[0].linear1
    linear.register_forward_hook(lambda module, inputs, output: dtypes.append(output.dtype))
    loss = trainer.step()
    assert trainer.precision == "autocast bfloat16"
    assert dtypes == [torch.bfloat16] and np.isfinite(loss)
    assert linear.weight.dtype == torch.float32  # float32 master weights


def test_keras_trainer_mixed_precision_restores_the_global_policy(bench, tiny_config):
    batch = bench.synthetic_batch(tiny_config, 2, 6)
    before = keras.mixed_precision.global_policy().name
    trainer = bench.KerasTrainer(tiny_config.to_dict(), batch, mixed_precision="mixed_bfloat16")
    assert trainer.precision == "mixed_bfloat16"
    assert trainer.model.get_layer("logits").dtype_policy.name == "float32"
    assert keras.mixed_precision.global_policy().name == before


def test_start_trainer_drops_xla_when_it_fails_under_mirrored(bench, tiny_config,
                                                              monkeypatch):
    """On GPUs XLA under MirroredStrategy is tried; a failing first step retries without."""

    class FakeMirroredTrainer:
        def __init__(self, jit_compile):
            self.strategy, self.jit_compile, self.replicas = object(), jit_compile, 2
            self.name, self.num_parameters, self.precision, self.notes = "fake", 1, "x", []

        def step(self):
            if self.jit_compile:
                raise RuntimeError("merge_call inside an XLA function")
            return 1.0

    made = []

    def make_trainer(kind, config, batch, options, devices=None):
        made.append(options["jit_compile"])
        return FakeMirroredTrainer(options["jit_compile"])

    monkeypatch.setattr(bench, "make_trainer", make_trainer)
    monkeypatch.setattr(bench, "setup_tensorflow_devices", lambda *args: ["/gpu:0", "/gpu:1"])
    monkeypatch.setattr(bench, "describe_device", lambda kind: ("gpu", "NVIDIA H200"))
    monkeypatch.setattr(bench, "float32_peak_precision", lambda kind: "tf32")
    batch = bench.synthetic_batch(tiny_config, 3, 4)
    trainer, info = bench.start_trainer(
        "keras", tiny_config.to_dict(), batch,
        {"jit_compile": True, "distribute": "mirrored"}, warmup_steps=2)
    assert made == [True, False]
    assert info["jit_compile"] is False and "failed under MirroredStrategy" in info["notes"][0]
    assert (info["replicas"], info["batch_size"], info["target_tokens"]) == (2, 6, 24)
    assert info["matmul_peak_gflops"] is None  # not measured off the CPU
    assert info["peak_precision"] == "tf32"


def _run_script(tmp_path, *arguments, backend=None):
    """Runs the script on the CPU (GPUs hidden); returns (stdout, result dict)."""
    path = tmp_path / "result.json"
    env = dict(os.environ, CUDA_VISIBLE_DEVICES="")
    if backend:
        env["KERAS_BACKEND"] = backend
    completed = subprocess.run(
        [sys.executable, str(SCRIPT), "--preset", "tiny", "--vocab-size", "200",
         "--tokens-per-batch", "64", "--seq-len", "8", "--steps", "1", "--warmup-steps",
         "1", "--repeats", "2", "--matmul-size", "128", "--json", str(path), *arguments],
        env=env, capture_output=True, text=True, timeout=300)
    assert completed.returncode == 0, completed.stdout[-3000:] + completed.stderr[-3000:]
    return completed.stdout, json.loads(path.read_text())


@pytest.mark.slow
def test_script_mixed_bfloat16_without_reference_on_cpu(tmp_path):
    printed, result = _run_script(tmp_path, "--mixed-precision", "mixed_bfloat16",
                                  "--no-reference")
    keras_side = result["keras"]
    assert result["sides"] == ["keras"] and "torch" not in result and result["ratio"] is None
    assert result["mixed_precision"] == keras_side["precision"] == "mixed_bfloat16"
    assert keras_side["platform"] == "cpu" and keras_side["replicas"] == 1
    assert keras_side["target_tokens"] == 8 * 8
    assert keras_side["tokens_per_second"] > 0 and keras_side["peak_rss_mb"] > 0
    assert keras_side["tokens_per_second_per_device"] == keras_side["tokens_per_second"]
    assert keras_side["device_memory"] == "n/a (CPU)"
    assert keras_side["device_memory_bytes"] is None
    # The side computes in bf16: its fraction is of the bf16 matmul peak, not float32's.
    assert keras_side["matmul_dtype"] == "bfloat16"
    bf16_peak = result["compute_matmul_peaks"]["bfloat16"]
    assert bf16_peak == keras_side["matmul_peak_gflops"] > 0
    assert 0 < keras_side["fraction_of_peak"] == pytest.approx(keras_side["gflops"] / bf16_peak)
    assert np.isfinite([r["loss"] for r in keras_side["rounds"]]).all()
    assert "[mixed_bfloat16]" in printed and "device memory peak n/a (CPU)" in printed
    assert "torch reference skipped" in printed
    assert "published figures, not measured here" in printed


@pytest.mark.slow
@pytest.mark.backend_independent  # pinned to TensorFlow
def test_script_mirrored_on_two_logical_cpu_devices(tmp_path):
    printed, result = _run_script(tmp_path, "--distribute", "mirrored", "--jit-compile",
                                  "true", "--no-reference", backend="tensorflow")
    one, many, scaling = result["keras"], result["keras_mirrored"], result["scaling"]
    assert result["sides"] == ["keras", "keras_mirrored"]
    assert (one["replicas"], many["replicas"], scaling["replicas"]) == (1, 2, 2)
    # The global batch is the per-device batch times the replicas.
    assert many["batch_size"] == 2 * one["batch_size"] == 2 * 8
    assert many["target_tokens"] == 2 * one["target_tokens"]
    assert scaling["one_device_tokens_per_second"] == one["tokens_per_second"] > 0
    assert scaling["efficiency"] == pytest.approx(
        many["tokens_per_second"] / (2 * one["tokens_per_second"]))
    assert scaling["efficiency"] > 0
    # XLA under MirroredStrategy fails on CPU devices: turned off, with a note.
    assert not one["jit_compile"] and not many["jit_compile"]
    assert any("jit_compile forced off" in note for note in many["notes"])
    assert "jit_compile forced off" in printed
    assert "MirroredStrategy: 1 device" in printed and "scaling efficiency" in printed
    assert "logical CPU devices share the same cores" in printed
    assert many["device_memory"] == "n/a (CPU)"
