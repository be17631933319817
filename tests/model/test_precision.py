"""bf16: the policy `auto` picks, a bf16 model against the float32 model, runs across policies."""

import json
import math
import os
import pathlib
import subprocess

import keras
import numpy as np
import pytest
from conftest import subprocess_env, tiny_train_command

from keras_transformer import build_model, runs

from keras_transformer.inference import loading

from keras_transformer.model import precision
from keras_transformer.model.transformer import quantized, with_dtype
from keras_transformer.model.precision import choose_precision, policy_scope

# --- the policy "auto" picks -----------------------------------------------------------

ZEN4_FLAGS = "fpu vme avx2 avx512f avx512bw avx512_vnni avx512_bf16 sha_ni"
SKYLAKE_FLAGS = "fpu vme avx2 avx512f avx512bw avx512_vnni"


def _fake_cpu(monkeypatch, tmp_path, flags):
    """This machine's CPU replaced by one with `flags`, and no GPU."""
    cpuinfo = tmp_path / "cpuinfo"
    cpuinfo.write_text(f"processor\t: 0\nmodel name\t: a CPU\nflags\t\t: {flags}\n\n"
                       f"processor\t: 1\nflags\t\t: {flags}\n")
    read = precision.cpu_flags
    monkeypatch.setattr(precision, "cpu_flags", lambda path=None: read(cpuinfo))
    monkeypatch.setattr(precision, "gpu_bf16", lambda backend=None: None)


@pytest.mark.backend_independent  # plain Python: the backend is an argument
def test_cpu_flags_reads_the_flags_line(tmp_path):
    cpuinfo = tmp_path / "cpuinfo"
    cpuinfo.write_text(f"processor\t: 0\nmodel name\t: AMD EPYC\nflags\t\t: {ZEN4_FLAGS}\n")
    assert precision.cpu_flags(cpuinfo) == frozenset(ZEN4_FLAGS.split())
    assert precision.cpu_flags(tmp_path / "absent") == frozenset()  # not Linux: no flags


@pytest.mark.backend_independent  # plain Python: the backend is an argument
def test_the_machine_is_named_by_its_gpu_else_its_cpu_and_cores(monkeypatch, tmp_path):
    cpuinfo = tmp_path / "cpuinfo"
    cpuinfo.write_text(f"processor\t: 0\nmodel name\t: AMD EPYC 9R14 96-Core Processor\n"
                       f"flags\t\t: {ZEN4_FLAGS}\n\nprocessor\t: 1\n"
                       "model name\t: AMD EPYC 9R14 96-Core Processor\n")
    assert precision.cpu_name(cpuinfo) == "AMD EPYC 9R14 96-Core Processor"
    assert precision.cpu_name(tmp_path / "absent") == "CPU"  # not Linux
    read = precision.cpu_name
    monkeypatch.setattr(precision, "cpu_name", lambda path=None: read(cpuinfo))
    monkeypatch.setattr(precision, "gpu_bf16", lambda backend=None: None)
    monkeypatch.setattr(precision.os, "sched_getaffinity", lambda pid: {0, 1}, raising=False)
    assert precision.machine("torch") == "AMD EPYC 9R14 96-Core Processor, 2 cores"
    monkeypatch.setattr(precision, "gpu_bf16", lambda backend=None: ("NVIDIA H100", True))
    assert precision.machine("jax") == "GPU NVIDIA H100"


@pytest.mark.backend_independent  # plain Python: the backend is an argument
@pytest.mark.parametrize("backend", ["tensorflow", "torch"])
def test_auto_is_bf16_on_a_cpu_with_avx512_bf16_under_onednn_backends(
        monkeypatch, tmp_path, backend):
    _fake_cpu(monkeypatch, tmp_path, ZEN4_FLAGS)
    chosen = choose_precision("auto", backend=backend)
    assert chosen.policy == "mixed_bfloat16" and chosen.mixed
    assert "avx512_bf16" in chosen.reason and backend in chosen.reason


@pytest.mark.backend_independent  # plain Python: the backend is an argument
def test_auto_takes_amx_bf16_too(monkeypatch, tmp_path):
    _fake_cpu(monkeypatch, tmp_path, "avx512f amx_bf16 amx_tile")
    assert choose_precision("auto", backend="tensorflow").policy == "mixed_bfloat16"


@pytest.mark.backend_independent  # plain Python: the backend is an argument
@pytest.mark.parametrize("backend", ["tensorflow", "jax", "torch"])
def test_auto_is_float32_on_a_cpu_without_bf16_instructions(monkeypatch, tmp_path, backend):
    _fake_cpu(monkeypatch, tmp_path, SKYLAKE_FLAGS)
    chosen = choose_precision("auto", backend=backend)
    assert chosen.policy == "float32" and not chosen.mixed
    assert "no bf16 instructions" in chosen.reason and "slower" in chosen.reason


@pytest.mark.backend_independent  # plain Python: the backend is an argument
def test_auto_is_float32_under_jax_whose_xla_cpu_gains_nothing(monkeypatch, tmp_path):
    _fake_cpu(monkeypatch, tmp_path, ZEN4_FLAGS)
    chosen = choose_precision("auto", backend="jax")
    assert chosen.policy == "float32" and "XLA:CPU" in chosen.reason


@pytest.mark.backend_independent  # plain Python: the backend is an argument
@pytest.mark.parametrize("gpu, policy", [(("NVIDIA H100", True), "mixed_bfloat16"),
                                         (("Tesla V100", False), "float32")])
def test_auto_on_a_gpu_follows_its_bf16_units(monkeypatch, tmp_path, gpu, policy):
    _fake_cpu(monkeypatch, tmp_path, SKYLAKE_FLAGS)  # the GPU decides, not the host CPU
    monkeypatch.setattr(precision, "gpu_bf16", lambda backend=None: gpu)
    chosen = choose_precision("auto", backend="jax")
    assert chosen.policy == policy and gpu[0] in chosen.reason


@pytest.mark.backend_independent  # plain Python: the backend is an argument
def test_explicit_settings_are_taken_as_given(monkeypatch, tmp_path):
    _fake_cpu(monkeypatch, tmp_path, SKYLAKE_FLAGS)
    assert choose_precision("none").policy == "float32"
    assert choose_precision("mixed_bfloat16").policy == "mixed_bfloat16"  # even without the units
    assert choose_precision("mixed_float16").reason == "--mixed-precision mixed_float16"
    with pytest.raises(ValueError, match="mixed_precision must be one of .*received 'bf16'"):
        choose_precision("bf16")


@pytest.mark.backend_independent  # plain Python: the backend is an argument
def test_the_settings_offer_every_choice_of_choose_precision():
    from keras_transformer.training.settings import Settings

    field = Settings.__dataclass_fields__["mixed_precision"]
    assert set(field.metadata["choices"]) == set(precision.SETTINGS)


def test_policy_scope_restores_the_global_policy():
    before = keras.config.dtype_policy().name
    with policy_scope("mixed_bfloat16"):
        assert keras.config.dtype_policy().name == "mixed_bfloat16"
        with pytest.raises(RuntimeError):
            with policy_scope("float32"):
                raise RuntimeError("a failing build")
        assert keras.config.dtype_policy().name == "mixed_bfloat16"
    assert keras.config.dtype_policy().name == before


# --- a bf16 model against the float32 model ------------------------------------------

# bf16 keeps 8 significant bits: rounding a value to nearest costs at most
# 2**-8 of it (half the spacing of bf16 values there), its unit roundoff.
BF16_EPSILON = 2.0 ** -8


def _batch(config, rows=4, length=12, seed=0):
    rng = np.random.default_rng(seed)
    source = rng.integers(4, config.vocab_size, (rows, length)).astype("int32")
    target = rng.integers(4, config.vocab_size, (rows, length)).astype("int32")
    source[1, 7:] = target[2, 9:] = 0  # padding too
    target[:, 0] = config.bos_id
    return {"source_ids": source, "target_ids": target}


def _bf16_product_rounding(inner_sizes=(16, 64, 128), seed=0):
    """How far the backend's bf16 matrix product lands from the exact one, in BF16_EPSILONs.

    The reference does not depend on the backend: the operands are bf16
    values, whose products and sums float64 NumPy computes exactly (to
    2**-52 of them). A kernel that sums in float32 and rounds its output to
    nearest lands within half a bf16 spacing of it, 1.0 here (oneDNN on a
    CPU with avx512_bf16 or AMX, XLA, PyTorch). One that truncates its float32
    sum to bf16 lands within a whole spacing, 2.0, always towards zero:
    TensorFlow's own CPU kernel, which runs where oneDNN has no bf16 product
    (a CPU without AVX-512, e.g. an AMD EPYC of the Zen 3 generation).
    Measured on outputs of at least 1/16 of the largest (where the float32
    sum's own error is nothing against a bf16 spacing), at the reduction
    lengths of the test's model (key_dim, d_model, d_ff).
    """
    rng = np.random.default_rng(seed)
    worst = 0.0
    for inner in inner_sizes:
        a, b = (keras.ops.cast(rng.normal(size=shape).astype("float32"), "bfloat16")
                for shape in ((48, inner), (inner, 96)))
        exact = (keras.ops.convert_to_numpy(keras.ops.cast(a, "float32")).astype("float64")
                 @ keras.ops.convert_to_numpy(keras.ops.cast(b, "float32")).astype("float64"))
        product = keras.ops.convert_to_numpy(
            keras.ops.cast(keras.ops.matmul(a, b), "float32")).astype("float64")
        large = np.abs(exact) >= np.abs(exact).max() / 16
        # BF16_EPSILON of the power of two at or below each output: half its spacing.
        unit = BF16_EPSILON * 2.0 ** np.floor(np.log2(np.abs(exact[large])))
        worst = max(worst, float((np.abs(product - exact)[large] / unit).max()))
    return worst


def test_bf16_logits_are_the_float32_logits_within_bf16_rounding(tiny_config):
    """Mixed-bf16 and all-bf16 logits of the same weights against float32's.

    Tolerance: every matrix product rounds its operands to bf16 (relative
    error up to BF16_EPSILON each) and its output, by `rounding`
    BF16_EPSILONs at most: the backend's, measured by
    `_bf16_product_rounding` (1 where the kernel rounds to nearest, 2 where
    it truncates). The logits themselves are such a product's output,
    rounded to bf16 before the float32 cast. Through 2 x 2 layers, each a few
    products with residual sums and LayerNorms that renormalise (a
    truncation's shrink towards zero included), errors of independent
    roundings add up roughly as a random walk: the logits' error stays a
    small multiple of `rounding * BF16_EPSILON` of their scale. We allow 4
    of them of the largest logit at any position (1.6% where products round
    to nearest), and 1 on average; the argmax (what greedy decoding takes)
    must agree where float32's top two logits are further apart than twice
    that bound, which must hold for a quarter of the positions at least (so
    that the check is not empty).
    """
    config = tiny_config.replace(num_layers=2, d_model=64, d_ff=128, num_heads=4,
                                 key_dim=16, value_dim=16, vocab_size=300)
    rounding = max(1.0, _bf16_product_rounding())
    model = build_model(config)
    batch = _batch(config)
    reference = keras.ops.convert_to_numpy(model(batch, training=False))
    scale = np.abs(reference).max()
    bound = 4 * rounding * BF16_EPSILON * scale
    with policy_scope("mixed_bfloat16"):
        mixed = build_model(config)
    mixed.set_weights(model.get_weights())
    for name, candidate in (("mixed_bfloat16", mixed), ("bfloat16", with_dtype(model, "bfloat16"))):
        logits = keras.ops.convert_to_numpy(candidate(batch, training=False))
        assert logits.dtype == np.float32, name  # the float32 logits layer
        error = np.abs(logits - reference)
        assert 0 < error.max() <= bound, (name, error.max(), scale, rounding)
        assert error.mean() <= rounding * BF16_EPSILON * scale, (name, error.mean(), scale)
        top2 = np.sort(reference, axis=-1)[..., -2:]
        clear = (top2[..., 1] - top2[..., 0]) > 2 * bound
        assert clear.sum() >= clear.size / 4
        np.testing.assert_array_equal(logits.argmax(-1)[clear], reference.argmax(-1)[clear])


def test_the_output_projection_multiplies_bf16_operands(tiny_config):
    """Under mixed_bfloat16 the tied projection's product is bf16 (not the float32 matrix)."""
    with policy_scope("mixed_bfloat16"):
        model = build_model(tiny_config)
    x = keras.ops.ones((2, 3, tiny_config.d_model), "float32")
    logits = model.target_embedding(x, reverse=True)
    assert keras.backend.standardize_dtype(logits.dtype) == "bfloat16"
    # And float32 after the model's `logits` layer / `project`.
    assert keras.backend.standardize_dtype(model.project(x).dtype) == "float32"


def test_with_dtype_copies_and_casts_the_weights(tiny_config):
    model = build_model(tiny_config)
    copy = with_dtype(model, "bfloat16")
    assert copy is not model and copy.config == model.config
    assert {keras.backend.standardize_dtype(w.dtype) for w in copy.weights} == {"bfloat16"}
    for mine, theirs in zip(copy.weights, model.weights):
        np.testing.assert_array_equal(
            keras.ops.convert_to_numpy(keras.ops.cast(mine, "float32")),
            keras.ops.convert_to_numpy(keras.ops.cast(keras.ops.cast(theirs, "bfloat16"),
                                                      "float32")))
    back = with_dtype(copy, "float32")
    assert {keras.backend.standardize_dtype(w.dtype) for w in back.weights} == {"float32"}
    assert keras.config.dtype_policy().name == "float32"
    with pytest.raises(ValueError, match="dtype must be one of float32, bfloat16"):
        with_dtype(model, "float16")
    with pytest.raises(ValueError, match=r"quantized \(int8\); cast the float model, then"):
        with_dtype(quantized(model, "int8"), "bfloat16")


# --- a run continues across policies ---------------------------------------------------


def _compiled(config, policy):
    from keras_transformer.training.optimization import compile_model

    with policy_scope(policy):
        model = build_model(config)
        compile_model(model)
    model.optimizer.build(model.trainable_variables)
    return model


@pytest.mark.parametrize("first, second", [("float32", "mixed_bfloat16"),
                                           ("mixed_bfloat16", "float32")])
def test_a_backup_loads_under_the_other_policy(tiny_config, tmp_path, first, second):
    """Weights and optimizer state are float32 under both: a backup moves across exactly."""
    config = tiny_config.replace(vocab_size=200)
    batch = _batch(config)
    one = _compiled(config, first)
    one.train_on_batch(batch, batch["target_ids"])
    one.save_weights(tmp_path / "state-1.weights.h5")
    other = _compiled(config, second)
    assert loading.load_state(other, tmp_path / "state-1.weights.h5", 1) == 1
    for mine, theirs in zip(other.weights + other.optimizer.variables,
                            one.weights + one.optimizer.variables):
        assert keras.backend.standardize_dtype(mine.dtype) == \
            keras.backend.standardize_dtype(theirs.dtype)
        np.testing.assert_array_equal(keras.ops.convert_to_numpy(mine),
                                      keras.ops.convert_to_numpy(theirs))
    loss = other.train_on_batch(batch, batch["target_ids"], return_dict=True)["loss"]
    assert math.isfinite(float(loss)) and int(other.optimizer.iterations) == 2


@pytest.mark.slow
def test_a_float32_run_continues_in_bf16_and_back(tmp_path):
    """`train` with another --mixed-precision continues the run folder at its update."""
    from conftest import multi30k_head

    corpus = multi30k_head(tmp_path / "corpus", (("train", "train", 400),
                                                 ("valid", "valid", 20), ("test", "test", 4)))
    run_dir = tmp_path / "run"

    def train(steps, policy):
        result = subprocess.run(
            tiny_train_command(corpus, run_dir, "--train-steps", str(steps),
                               "--mixed-precision", policy, "--validation-bleu-sentences",
                               "0"),
            env=subprocess_env(), capture_output=True, text=True, timeout=900,
            cwd=tmp_path)
        output = result.stdout + result.stderr
        assert result.returncode == 0, output[-4000:]
        return output, json.loads((run_dir / runs.RESULTS_FILE).read_text())

    output, results = train(10, "none")
    assert "Precision: float32 (--mixed-precision none)" in output
    assert (results["precision"], results["final_step"]) == ("float32", 10)
    # The minutes are the machine's: the log and results.json name it (a CPU
    # here, with the cores this process may use: the child inherits them).
    cores = len(os.sched_getaffinity(0))
    assert (results["machine"].startswith("GPU ")
            or results["machine"].endswith(f", {cores} core{'s' if cores > 1 else ''}"))
    assert f"Machine: {results['machine']}" in output
    output, results = train(20, "mixed_bfloat16")
    assert "Precision: mixed_bfloat16" in output and "at update 10 (of 20)" in output
    assert (results["precision"], results["final_step"], results["steps_this_run"]) == \
        ("mixed_bfloat16", 20, 10)
    output, results = train(30, "none")
    assert "at update 20 (of 30)" in output
    assert (results["final_step"], results["steps_this_run"]) == (30, 10)
    # The model file is float32 whatever the run trained in.
    model, _ = loading.load_run(run_dir)
    assert {keras.backend.standardize_dtype(w.dtype) for w in model.weights} == {"float32"}
    assert pathlib.Path(run_dir / "checkpoints" / "ckpt-20.weights.h5").is_file()
