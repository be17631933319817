"""examples/benchmark_training_job.py on a tiny config: every variant timed, the counts right."""

import os
import pathlib
import re
import subprocess
import sys

import pytest

REPO = pathlib.Path(__file__).resolve().parents[2]


@pytest.mark.slow
def test_prints_the_bare_step_and_the_job_on_the_same_batches(tmp_path):
    config = tmp_path / "tiny.toml"
    config.write_text('[run]\npreset = "tiny"\n[data]\ndata = "demo"\nmax_length = 32\n'
                      '[training]\ntokens_per_batch = 512\n')
    env = dict(os.environ, PYTHONPATH=str(REPO), KERAS_BACKEND="tensorflow")
    result = subprocess.run(
        [sys.executable, str(REPO / "examples" / "benchmark_training_job.py"), "--config",
         str(config), "--bucket-multiple", "2", "--mixed-precision", "mixed_bfloat16",
         "--updates", "3", "--rounds", "2"],
        capture_output=True, text=True, timeout=600, env=env, cwd=tmp_path, check=False)
    assert result.returncode == 0, result.stderr[-3000:]
    out = result.stdout
    rows = dict(re.findall(r"^\| ((?:bare step|job)(?:, [a-z0-9 _]+)?) \| (.*) \|$", out,
                           re.MULTILINE))
    assert set(rows) == {"bare step", "job", "job, bucket multiple 2",
                         "bare step, mixed_bfloat16", "job, mixed_bfloat16"}, out
    for row in rows.values():
        seconds, tokens, rate = (float(v.replace(",", "")) for v in row.split(" | "))
        assert seconds > 0 and tokens > 0
        assert rate == pytest.approx(tokens / seconds, rel=0.01, abs=1)
    assert len(re.findall(r"^round \d ", out, re.MULTILINE)) == 10
    # bf16 trains on the same batches: the same tokens per update.
    assert rows["job, mixed_bfloat16"].split(" | ")[1] == rows["job"].split(" | ")[1]
    for name in ("bare step", "job"):
        assert re.search(rf"^{name}: mixed_bfloat16 over float32 \d+\.\d\dx", out,
                         re.MULTILINE), out

    # The tokens per update are those of updates 2-4 of the job's pipeline,
    # counted here from the prepared corpus that the benchmark prepared.
    import keras
    import numpy as np

    from keras_transformer.data import corpora, prepared

    keras.utils.set_random_seed(0)  # the job's seed: tf.data's shuffles use it too
    corpus = prepared.PreparedCorpus(tmp_path / "runs" / "prepared" / "demo-seed0_v4000")
    train_ds, _, _ = corpora.training_datasets(corpus, tokens_per_batch=512, max_length=32,
                                               seed=0)
    labels = [np.asarray(y) for _, y in train_ds.take(4)][1:]
    expected = sum(int((y != 0).sum()) for y in labels) / 3
    assert float(rows["job"].split(" | ")[1].replace(",", "")) == pytest.approx(expected,
                                                                                 abs=1)
