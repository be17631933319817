"""Tests of examples/benchmark_decoding.py: the round and table arithmetic, the worker
processes (a failing one is one line), and a tiny end-to-end run against HF MarianMT and
CTranslate2."""

import json
import os
import pathlib
import subprocess
import sys

import numpy as np
import pytest
from conftest import load_example

SCRIPT = pathlib.Path(__file__).resolve().parents[2] / "examples" / "benchmark_decoding.py"
# Small enough for seconds per worker; lengths forced to 6 from a 4-id source.
TINY = ["--preset", "tiny", "--vocab-size", "64", "--num-layers", "1", "--d-model", "32",
        "--d-ff", "64", "--batch-size", "2", "--source-length", "4", "--lengths", "6"]


@pytest.fixture(scope="module")
def bench():
    return load_example("benchmark_decoding")


def _settings(bench, *arguments):
    return bench.resolve_settings(bench.parse_args([*TINY, *arguments]))


def _round(seconds, first=1.0, length=6, search="greedy", beam_size=1):
    return {"measurements": [{
        "search": search, "beam_size": beam_size, "length": length, "cached": True,
        "first_call_seconds": first, "seconds": [seconds], "median_seconds": seconds,
        "output_length": length, "sample": [5, 6]}]}


@pytest.mark.backend_independent
def test_summary_is_the_median_of_rounds_with_the_spread(bench):
    settings = _settings(bench)
    rounds = [_round(0.4, first=9.0), _round(0.1, first=5.0), _round(0.2, first=7.0),
              {"error": "a failed round has no measurements"}]
    (row,) = bench.summarize(rounds, settings)
    assert row["rounds"] == 3 and row["round_seconds"] == [0.4, 0.1, 0.2]
    assert row["min_seconds"] == 0.1 <= row["median_seconds"] == 0.2 <= row["max_seconds"] == 0.4
    assert row["first_call_seconds"] == 7.0
    assert row["sentences_per_second"] == pytest.approx(2 / 0.2)  # batch 2
    assert row["tokens_per_second"] == pytest.approx(2 * 6 / 0.2)
    assert row["ms_per_token"] == pytest.approx(1000 * 0.2 / 12)


@pytest.mark.backend_independent
def test_ratios_and_table_with_failed_and_unsupported_systems(bench):
    settings = dict(_settings(bench), rounds=2)
    figures = {"settings": settings, "systems": {}}
    for name, seconds in (("jax", [0.1, 0.3]), ("hf-marian", [0.4, 0.8])):
        summary = bench.summarize([_round(s) for s in seconds], settings)
        figures["systems"][name] = {"summary": summary, "error": None, "not_supported": False}
    figures["systems"]["ct2-marian"] = {"summary": [], "error": "preparing ct2-marian: boom",
                                        "not_supported": False}
    figures["systems"]["torch-int8"] = {"summary": [], "error": "quantized no weight",
                                        "not_supported": True}
    bench.add_ratios(figures)
    jax_row = figures["systems"]["jax"]["summary"][0]
    assert jax_row["vs_reference"] == pytest.approx(0.6 / 0.2)  # medians of the rounds
    assert figures["systems"]["hf-marian"]["summary"][0]["vs_reference"] == pytest.approx(1)

    table = bench.format_tables(figures).splitlines()
    greedy = table[table.index(next(l for l in table if l.startswith("greedy, 6 tokens"))):]
    jax_line = next(l for l in greedy if l.startswith("jax "))
    assert "0.200" in jax_line and "0.100-0.300" in jax_line and jax_line.endswith("3.00x")
    failed = [l for l in table if l.startswith("ct2-marian ")]
    unsupported = [l for l in table if l.startswith("torch-int8 ")]
    # One line per table (greedy and beam-4), no traceback.
    assert len(failed) == len(unsupported) == 2
    assert failed[0].split(None, 1)[1] == "failed: preparing ct2-marian: boom"
    assert unsupported[0].split(None, 1)[1] == "not supported: quantized no weight"


@pytest.mark.backend_independent
def test_system_selection_and_rotation(bench):
    def names(*argv):
        return [s.name for s in bench.select_systems(bench.parse_args(list(argv)))]

    assert names() == list(bench.DEFAULT_SYSTEMS)
    assert names("--backend", "tensorflow", "--skip-hf") == [
        "tensorflow", "tensorflow+xla", "ct2-ours", "ct2-ours-int8"]
    assert names("--systems", "jax", "hf-marian", "--quantize", "int8") == [
        "jax", "jax-int8", "hf-marian"]
    quantized = bench.get_system("tensorflow+xla-int8")
    assert (quantized.quantize, quantized.backend, quantized.jit_compile) == (
        "int8", "tensorflow", True)
    assert names("--systems", "tensorflow", "ct2-ours", "--quantize", "int8", "--bf16") == [
        "tensorflow", "tensorflow-int8", "tensorflow-bf16", "ct2-ours"]
    bf16 = bench.get_system("jax-bf16")
    assert (bf16.dtype, bf16.quantize, bf16.backend) == ("bfloat16", None, "jax")
    with pytest.raises(SystemExit, match="unknown system 'hf-int8'; choose from"):
        names("--systems", "hf-int8")
    with pytest.raises(SystemExit, match="unknown system 'ct2-ours-bf16'; choose from"):
        names("--systems", "ct2-ours-bf16")
    with pytest.raises(SystemExit, match="leave out --backend"):
        names("--systems", "jax", "--backend", "jax")
    assert [bench.rotated(list("ABC"), r) for r in range(4)] == [
        list("ABC"), list("BCA"), list("CAB"), list("ABC")]


@pytest.mark.backend_independent
def test_the_busiest_round_is_named_above_the_threshold(bench):
    entries = {"jax": {"rounds": [{"other_cores": 0.1}, {"other_cores": 0.6}]},
               "torch": {"rounds": [{"other_cores": None}, {"error": "x"}]},
               "hf-marian": {"rounds": [{"other_cores": 0.3}]}}
    assert bench.busiest_round(entries) == (0.6, "jax")
    assert bench.busiest_round(entries, threshold=0.7) is None
    assert bench.busiest_round({}) is None


@pytest.mark.backend_independent
def test_settings_reject_bad_input_with_one_line(bench):
    settings = _settings(bench, "--threads", "1")
    assert settings["config"]["d_model"] == 32 and settings["config"]["dropout"] == 0.0
    assert settings["lengths"] == [6] and settings["threads"] == 1
    for argv, message in ((["--lengths", "3"], "--lengths must be at least --source-length"),
                          (["--beam-size", "1"], "--beam-size must be at least 2"),
                          (["--rounds", "0"], "--rounds must be at least 1"),
                          (["--preset", "huge"], "invalid model settings: Unknown preset")):
        with pytest.raises(SystemExit, match=message) as raised:
            _settings(bench, *argv)
        assert "\n" not in str(raised.value)


def test_quantize_model_reports_what_it_quantized(bench, tiny_config):
    import keras

    from keras_transformer import build_model

    # One layer: Keras' quantize runs a gc.collect() per layer, the test's cost.
    model = build_model(tiny_config.replace(num_layers=1))
    report = bench.quantize_model(model, "int8")
    assert report["quantized_tensors"] > 0 and report["quantized_parameters"] > 0
    int8 = sum(int(np.prod(v.shape)) for v in model.variables if "int" in str(v.dtype))
    assert report["quantized_parameters"] == int8
    # Nothing to quantize: "not supported", not a crash.
    plain = keras.Sequential([keras.Input((3,)), keras.layers.LayerNormalization()])
    with pytest.raises(bench.NotSupported, match=r"model.quantize\('int8'\)"):
        bench.quantize_model(plain, "int8")


@pytest.mark.backend_independent
def test_a_failing_worker_is_one_line(bench, tmp_path):
    settings = json.dumps(dict(_settings(bench, "--threads", "1"), rounds=1))
    env = bench.child_environment()
    # No converted model in the work folder: CTranslate2 raises in the worker.
    result = bench.run_child(["--worker", "ct2-marian", "--settings", settings,
                              "--workdir", str(tmp_path)], env, timeout=120)
    assert result["error"].startswith("ct2-marian worker: ")
    assert "\n" not in result["error"] and "Traceback" in result["stderr_tail"]
    assert result["wall_seconds"] > 0
    # Measured wherever /proc/stat is readable; None only where it is not.
    assert isinstance(result["other_cores"], float) == os.access("/proc/stat", os.R_OK)
    # A worker that dies before printing its result.
    result = bench.run_child(["--worker"], env, timeout=60)
    assert result["error"].startswith("worker exited with status 2 and no result; "
                                      "last stderr line: ")
    assert "expected one argument" in result["error"]


def _run(tmp_path, *arguments):
    completed = subprocess.run(
        [sys.executable, str(SCRIPT), *TINY, "--rounds", "1", "--threads", "1",
         "--json", str(tmp_path / "figures.json"), *arguments],
        capture_output=True, text=True, timeout=600, env=dict(os.environ))
    assert completed.returncode == 0, completed.stdout[-3000:] + completed.stderr[-3000:]
    assert "Traceback" not in completed.stdout + completed.stderr
    return completed.stdout, json.loads((tmp_path / "figures.json").read_text())


@pytest.mark.backend_independent
def test_a_failing_preparation_is_one_line_per_table(tmp_path):
    (tmp_path / "ct2-marian").write_text("a file where the model folder goes")
    printed, figures = _run(tmp_path, "--systems", "ct2-marian", "--workdir", str(tmp_path))
    entry = figures["systems"]["ct2-marian"]
    assert entry["summary"] == [] and entry["rounds"] == [] and figures["order"] == [[]]
    assert entry["error"].startswith("preparing ct2-marian: FileExistsError")
    lines = [l for l in printed.splitlines() if l.startswith("ct2-marian ")]
    assert len(lines) == 2 and all("failed: preparing ct2-marian" in l for l in lines)


@pytest.mark.slow
@pytest.mark.backend_independent  # every worker sets its own KERAS_BACKEND
def test_script_times_keras_hf_and_ctranslate2_in_their_own_processes(tmp_path):
    names = ["tensorflow", "hf-marian", "ct2-marian", "ct2-ours"]
    printed, figures = _run(tmp_path, "--systems", *names, "--repeats", "2")
    systems = figures["systems"]
    assert list(systems) == names and figures["order"] == [names]
    assert figures["prepared"]["ct2-marian"]["vocabulary_size"] == 63  # Marian's pad dropped
    assert figures["prepared"]["ct2-ours"]["vocabulary_size"] == 64
    for name, entry in systems.items():
        assert entry["error"] is None, (name, entry["error"])
        assert [(r["search"], r["length"]) for r in entry["summary"]] == [
            ("greedy", 6), ("beam-4", 6)]
        (result,) = entry["rounds"]
        assert result["info"]["threads"]  # every worker says which threads it used
        # Measured wherever /proc/stat is readable; None only where it is not.
        assert isinstance(result["other_cores"], float) == os.access("/proc/stat", os.R_OK)
        for row, measured in zip(entry["summary"], result["measurements"]):
            assert row["output_length"] == 6  # forced: every row has 6 tokens
            assert len(measured["seconds"]) == 2
            assert row["median_seconds"] == pytest.approx(np.median(measured["seconds"]))
            assert row["min_seconds"] <= row["median_seconds"] <= row["max_seconds"]
            assert row["first_call_seconds"] > 0
            reference = systems["hf-marian"]["summary"][entry["summary"].index(row)]
            assert row["vs_reference"] == pytest.approx(
                reference["median_seconds"] / row["median_seconds"])
    assert "torch 1 threads" in systems["hf-marian"]["info"]["threads"]
    assert "intra_threads=1" in systems["ct2-marian"]["info"]["threads"]
    # The converted models are HF's and ours: greedy decoding starts the same way.
    for model, converted in (("hf-marian", "ct2-marian"), ("tensorflow", "ct2-ours")):
        first, second = (systems[n]["summary"][0]["sample"] for n in (model, converted))
        assert first[:3] == second[:3], (model, first, converted, second)
    assert "greedy, 6 tokens (batch 2 x source 4)" in printed
    assert "vs hf-marian" in printed and "ct2-marian" in printed
