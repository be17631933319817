"""examples/make_wmt_size_corpus.py and examples/benchmark_data.py, on a small corpus."""

import json
import os
import pathlib
import subprocess
import sys

import pytest

REPO = pathlib.Path(__file__).resolve().parents[2]


def test_the_wmt_size_corpus_is_real_aligned_pairs(shared_data, tmp_path):
    sys.path.insert(0, str(REPO / "examples"))
    import make_wmt_size_corpus

    pool = make_wmt_size_corpus.source_pairs(shared_data)
    assert len(pool) > 40_000
    written = make_wmt_size_corpus.write_corpus(tmp_path, 100_000, shared=shared_data)
    english = (tmp_path / "train.en").read_text(encoding="utf-8").split("\n")[:-1]
    german = (tmp_path / "train.de").read_text(encoding="utf-8").split("\n")[:-1]
    assert written == len(english) == len(german) == 100_000
    pairs = set(pool)
    assert all(pair in pairs for pair in zip(english[::997], german[::997]))
    assert len(set(english[:len(pool)])) > 0.9 * len(set(e for e, _ in pool))
    for split in ("valid", "test"):
        assert (tmp_path / f"{split}.en").stat().st_size > 100_000


@pytest.mark.slow
def test_benchmark_data_prints_every_figure(shared_data, tmp_path):
    env = dict(os.environ, PYTHONPATH=str(REPO), KT_SHARED_DATA=str(shared_data))
    result = subprocess.run(
        [sys.executable, str(REPO / "examples" / "benchmark_data.py"), "--workdir",
         str(tmp_path), "--pairs", "4000", "--tokens-per-batch", "2048", "--max-length",
         "128", "--subword-sampling", "0.1", "--sampling-views", "2", "--json",
         str(tmp_path / "figures.json")],
        capture_output=True, text=True, timeout=900, env=env)
    assert result.returncode == 0, result.stderr[-3000:]
    for row in ("prepare: peak RSS", "pipeline epoch 2: target tokens/s",
                "sampling: 2 views written", "pipeline, sampled: pairs/s",
                "start-up: launch to first update"):
        assert row in result.stdout, result.stdout
    figures = json.loads((tmp_path / "figures.json").read_text())
    assert figures["pairs"] == 4000 and figures["prepare"]["bytes"] > 100_000
    assert 0 < figures["prepare"]["peak_rss_mib"] < 8192
    first, second = figures["pipeline"]["epochs"]
    # Each epoch streams every kept pair once: the same target tokens, which
    # the manifest's histograms predict.
    manifest = json.loads(next(tmp_path.glob("prepared_*/manifest.json")).read_text())
    kept = sum(tokens for length, tokens in
               manifest["splits"]["train"]["lengths"]["pair_target_tokens"].items()
               if int(length) <= 128)
    assert first["target_tokens"] == second["target_tokens"] == kept
    assert first["tokens_per_second"] > 0 and 0 < figures["startup_seconds"] < 600
    # BPE-dropout 0.1 skips merges: more subwords per sentence (the ratio on
    # the real corpora is in docs/results.md), so as many pairs hold more
    # target tokens.
    assert 1.1 < figures["sampling"]["tokens_ratio"] < 2.0
    sampled, plain = figures["sampled_pipeline"], figures["pipeline"]
    assert sampled["pairs_per_second"] > 0
    assert sampled["target_tokens"] / sampled["pairs"] > 1.1 * (
        plain["target_tokens"] / plain["pairs"])
