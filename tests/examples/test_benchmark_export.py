"""Tests of examples/benchmark_export.py: medians and table, the graph figures, and a tiny
end-to-end run (export and serve, each in its own process)."""

import json
import os
import pathlib
import subprocess
import sys

import pytest
from conftest import load_example

SCRIPT = pathlib.Path(__file__).resolve().parents[2] / "examples" / "benchmark_export.py"
REPO = SCRIPT.parents[1]

pytestmark = pytest.mark.backend_independent  # the workers run under TensorFlow


@pytest.fixture(scope="module")
def bench():
    return load_example("benchmark_export")


def test_summary_medians_and_table(bench):
    rounds = [{"pb_mb": 1.0, "load_seconds": 3.0, "p50_ms": 40.0},
              {"pb_mb": 1.0, "load_seconds": 1.0, "p50_ms": 60.0},
              {"pb_mb": 1.0, "load_seconds": 2.0, "p50_ms": 50.0}]
    summary = bench.summarize(rounds)
    assert summary == {"pb_mb": 1.0, "load_seconds": 2.0, "p50_ms": 50.0, "rounds": 3}
    figures = {"systems": ["before", "after"], "runs": {"demo": {
        "training": {"train_peak_memory_mib": 2200}, "errors": {"before": "export failed"},
        "summary": {"before": {}, "after": summary}}}}
    lines = bench.format_table(figures).splitlines()
    after = next(line for line in lines if line.startswith("demo after"))
    cells = after.split()
    assert cells[2] == "1.00" and cells[-1] == "2200"  # pb MB, then the training peak
    assert cells[2 + [k for k, _, _ in bench.COLUMNS].index("p50_ms")] == "50"
    before = next(line for line in lines if line.startswith("demo before"))
    assert set(before.split()[2:-1]) == {"-"}
    assert "  before failed: export failed" in lines
    assert bench.percentile([5, 1, 4, 2, 3], 50) == 3


def test_bad_arguments(bench):
    with pytest.raises(SystemExit):
        bench.parse_args(["--system", "after", "."])  # no --run
    with pytest.raises(SystemExit):
        bench.parse_args(["--system", "a", ".", "--run", "r", "d", "s", "--rounds", "0"])


@pytest.mark.slow
def test_script_exports_and_serves_in_their_own_processes(tmp_path):
    from exported_model import _build

    _, run = _build(tmp_path)
    sentences = tmp_path / "sentences.en"
    sentences.write_text("The cat sat on the mat.\nHello world.\n", encoding="utf-8")
    path = tmp_path / "figures.json"
    completed = subprocess.run(
        [sys.executable, str(SCRIPT), "--system", "here", str(REPO),
         "--run", "tiny", str(run), str(sentences), "--rounds", "1", "--calls", "2",
         "--large-batch", "3", "--large-calls", "1", "--work-dir", str(tmp_path / "work"),
         "--json", str(path)],
        capture_output=True, text=True, timeout=600, env=dict(os.environ))
    assert completed.returncode == 0, completed.stdout[-3000:] + completed.stderr[-3000:]
    figures = json.loads(path.read_text())
    [result] = figures["runs"]["tiny"]["rounds"]["here"]
    exported = tmp_path / "work" / "tiny" / "here" / "model" / "1"
    assert result["path"] == str(exported)
    assert result["pb_mb"] * 1e6 == (exported / "saved_model.pb").stat().st_size
    assert result["functions"] > 0 and result["nodes"] > result["functions"]
    assert result["export_peak_mib"] > 100  # the export process, not this wrapper
    assert 0 < result["load_seconds"] < result["load_and_first_seconds"]
    assert result["p50_ms"] > 0 and result["sentences_per_second"] > 0
    assert "tiny here" in completed.stdout and "load+1st s" in completed.stdout
