"""Tests of examples/benchmark_serving.py: shapes, percentiles and round arithmetic, and a
tiny end-to-end run of the SavedModel and the Translator, each in its own process."""

import json
import os
import pathlib
import subprocess
import sys

import pytest
from conftest import load_example

SCRIPT = pathlib.Path(__file__).resolve().parents[2] / "examples" / "benchmark_serving.py"

pytestmark = pytest.mark.backend_independent  # workers set KERAS_BACKEND themselves


@pytest.fixture(scope="module")
def bench():
    return load_example("benchmark_serving")


def test_batches_and_percentiles(bench):
    sentences = list("abcdefg")
    batches = bench.request_batches(sentences, 3, 4)
    # Request 3 would be the short ["g"]: the first sentences instead.
    assert batches == [list("abc"), list("def"), list("abc"), list("cde")]
    values = [5, 1, 4, 2, 3]
    assert (bench.percentile(values, 50), bench.percentile(values, 95)) == (3, 5)


def test_measure_reports_the_first_request_of_each_shape(bench):
    calls = []

    def translate(batch):
        calls.append(batch)
        return [text.upper() for text, _ in batch]

    def shape_of(batch):
        return (len(batch), max(n for _, n in batch) // 10)

    batches = [[("a", 3)], [("b", 12)], [("c", 5)], [("d", 15)]]
    result = bench.measure(translate, shape_of, batches)
    assert calls == batches + batches  # a warm-up pass, then the timed pass
    assert [r["shape"] for r in result["first_requests"]] == [[1, 0], [1, 1]]
    assert result["calls"] == 4 and len(result["latencies"]) == 4
    assert 0 < result["p50_seconds"] <= result["p95_seconds"]
    assert result["sentences_per_second"] == pytest.approx(4 / sum(result["latencies"]))
    assert result["sample"] == "A"


def _worker_result(p50, rate, first):
    return {"batches": {"1": {"p50_seconds": p50, "p95_seconds": 2 * p50,
                              "sentences_per_second": rate, "warmup_seconds": first,
                              "first_requests": [{"shape": [1, 16], "seconds": first}]}}}


def test_summary_medians_spread_and_table(bench):
    settings = {"batch_sizes": [1], "rounds": 3}
    rounds = [_worker_result(0.3, 3.0, 9.0), _worker_result(0.1, 10.0, 5.0),
              _worker_result(0.2, 5.0, 6.0)]
    row = bench.summarize(rounds, settings)["1"]
    assert row["rounds"] == 3
    assert row["p50_seconds_min"] == 0.1 <= row["p50_seconds"] == 0.2 <= row["p50_seconds_max"]
    assert row["p95_seconds"] == 0.4
    assert (row["sentences_per_second_min"], row["sentences_per_second"],
            row["sentences_per_second_max"]) == (3.0, 5.0, 10.0)
    assert row["first_requests"] == [{"shape": [1, 16], "seconds": 6.0}]
    faster = bench.summarize([_worker_result(0.05, 20.0, 2.0)], settings)
    figures = {"settings": settings, "paths": {
        "saved_model": {"summary": {"1": row}, "error": None},
        "translator-jax": {"summary": faster, "error": None},
        "translator-torch": {"summary": {}, "error": "translator-torch worker: OSError: x"}}}
    table = bench.format_table(figures).splitlines()
    jax_line = next(l for l in table if l.startswith("translator-jax "))
    assert "50.0" in jax_line and jax_line.endswith("4.00x")  # 0.2 s / 0.05 s
    failed = [l for l in table if l.startswith("translator-torch")]
    assert len(failed) == 1 and failed[0].split(None, 1)[1] == (
        "failed: translator-torch worker: OSError: x")
    firsts = table[table.index(next(l for l in table if l.startswith("first request"))) + 1:]
    assert [l.split() for l in firsts] == [["saved_model", "1x16:", "6.00", "s"],
                                           ["translator-jax", "1x16:", "2.00", "s"]]


def test_bad_input_is_one_line(bench):
    for argv, message in ((["--beam-size", "1"], "--beam-size must be at least 2"),
                          (["--calls", "0"], "--calls must be at least 1"),
                          (["--preset", "huge"], "invalid model settings: Unknown preset")):
        with pytest.raises(SystemExit, match=message):
            bench.resolve_settings(bench.parse_args(argv))


@pytest.mark.slow
def test_script_serves_both_paths_in_their_own_processes(tmp_path):
    path = tmp_path / "figures.json"
    completed = subprocess.run(
        [sys.executable, str(SCRIPT), "--preset", "tiny", "--num-layers", "1", "--d-model",
         "32", "--d-ff", "64", "--vocab-size", "400", "--max-length", "32",
         "--max-extra-length", "4", "--batch-sizes", "1", "4", "--calls", "3", "--rounds", "1",
         "--backends", "tensorflow", "--output-dir", str(tmp_path / "work"),
         "--json", str(path)],
        capture_output=True, text=True, timeout=600, env=dict(os.environ))
    assert completed.returncode == 0, completed.stdout[-3000:] + completed.stderr[-3000:]
    printed = completed.stdout
    assert "Traceback" not in printed + completed.stderr
    figures = json.loads(path.read_text())
    paths = figures["paths"]
    assert list(paths) == ["saved_model", "translator-tensorflow"]
    assert figures["order"] == [["saved_model", "translator-tensorflow"]]
    assert (tmp_path / "work" / "model.weights.h5").exists()
    for name, entry in paths.items():
        assert entry["error"] is None, (name, entry["error"])
        assert set(entry["summary"]) == {"1", "4"}
        for batch_size, row in entry["summary"].items():
            assert row["rounds"] == 1
            assert row["p50_seconds_min"] <= row["p50_seconds"] <= row["p50_seconds_max"]
            assert row["p50_seconds"] <= row["p95_seconds"] and row["sentences_per_second"] > 0
            # Every first request was one of the warm-up pass's.
            assert row["first_requests"] and all(
                r["seconds"] <= row["warmup_seconds"] for r in row["first_requests"])
            assert all(r["shape"][0] >= int(batch_size) for r in row["first_requests"])
    saved, translator = (paths[n]["rounds"][0] for n in ("saved_model", "translator-tensorflow"))
    # The model server's process runs no Python of ours.
    assert saved["info"]["foreign_modules"] == []
    assert "keras_transformer" in translator["info"]["foreign_modules"]
    # Same weights, same search: the same translation of the first request.
    assert saved["batches"]["1"]["sample"] == translator["batches"]["1"]["sample"]
    assert "first request of each shape" in printed and "p50 vs saved_model" in printed
