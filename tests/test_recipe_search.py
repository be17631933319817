"""Tests of examples/recipe_search.py: the ranking table read from run folders, and
the `eval_split` setting the search relies on (a candidate never sees the test set)."""

import csv
import json
import pathlib

import pytest
from conftest import load_example

from keras_transformer import settings as settings_lib

REPO = pathlib.Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def search():
    return load_example("recipe_search")


def _run(root, name, bleu, split="valid", model=None, curve=((200, 5.0, 3.0), (400, 4.5, 9.0)),
         final_step=400, final_weights="the average of 2 checkpoints"):
    folder = root / name
    folder.mkdir(parents=True)
    s = settings_lib.Settings(preset="small", data="x", model=model or {}).to_dict()
    folder.joinpath("results.json").write_text(json.dumps(dict(
        eval_split=split, bleu=bleu, chrf=bleu + 20, final_step=final_step, train_seconds=600.0,
        train_target_tokens_per_second=3000.0, final_weights=final_weights, settings=s)))
    with open(folder / "training_log.csv", "w", newline="") as handle:
        writer = csv.writer(handle)
        writer.writerow(["step", "loss", "val_loss", "val_bleu"])
        writer.writerow([100, 6.0, "", ""])
        for update, loss, bleu_ in curve:
            writer.writerow([update, loss + 0.5, loss, bleu_])
    return folder


def test_table_ranks_by_validation_bleu_and_leaves_out_test_scored_runs(search, tmp_path):
    _run(tmp_path, "small", 20.0)
    _run(tmp_path, "drop03", 25.5, model={"dropout": 0.3})
    _run(tmp_path, "peeked", 99.0, split="test", model={"dropout": 0.2})
    (tmp_path / "unfinished").mkdir()
    rows = [r for r in map(search.read_run, sorted(tmp_path.iterdir())) if r]
    assert [r["name"] for r in rows] == ["drop03", "peeked", "small"]
    table = search.markdown_table(rows, baseline="small").splitlines()
    assert len(table) == 4  # header, rule, two validation-scored runs
    assert table[2].startswith("| 1 | `drop03` | dropout=0.3 | 400 | 10.0 | 3,000 | **25.50** | 45.50")
    assert table[3].startswith("| 2 | `small` | (baseline) |")
    assert "200:3.0 400:9.0" in table[2] and "200:5.000 400:4.500" in table[2]
    assert table[2].endswith("| the average of 2 checkpoints |")
    assert "peeked" not in "\n".join(table)


def test_a_candidate_stopped_earlier_ranks_after_those_trained_further(search, tmp_path):
    _run(tmp_path, "small", 30.0, final_step=3600, final_weights=(
        "the average of 3 checkpoints (ckpt-3200.weights.h5, ckpt-3400.weights.h5, "
        "ckpt-3600.weights.h5)"))
    _run(tmp_path, "stopped", 35.0, final_step=1400, model={"dropout": 0.3})
    _run(tmp_path, "better", 31.0, final_step=3600, model={"norm_first": True})
    rows = [search.read_run(p) for p in sorted(tmp_path.iterdir())]
    table = search.markdown_table(rows, baseline="small").splitlines()[2:]
    assert [line.split(" | ")[1] for line in table] == ["`better`", "`small`", "`stopped`"]
    assert table[1].endswith("| the average of 3 checkpoints (ckpt-3200 to ckpt-3600) |")


def test_table_without_a_validation_scored_run_says_so(search, tmp_path):
    _run(tmp_path, "small", 30.0, split="test")
    rows = [search.read_run(tmp_path / "small")]
    with pytest.raises(SystemExit, match="no run folder scored on the validation split"):
        search.markdown_table(rows)


def test_run_refuses_a_missing_config_before_training(search, tmp_path):
    with pytest.raises(SystemExit, match="no config file"):
        search.run_candidates([tmp_path / "absent.toml"], tmp_path, 10)


def test_candidate_configs_resolve_and_differ_only_as_they_say():
    configs = sorted((REPO / "configs" / "multi30k_search").glob("*.toml"))
    assert {c.stem for c in configs} >= {"small", "drop03"}
    for config in configs:
        resolved = settings_lib.resolve(config_file=str(config))
        assert resolved.preset == "small"
        assert resolved.eval_split == "test"  # the search passes --eval-split valid


def test_the_multi30k_config_is_the_search_winner_with_its_validation_tuning():
    """configs/multi30k.toml = the winning candidate + the budget and the tuned settings."""
    final = settings_lib.resolve(config_file=str(REPO / "configs" / "multi30k.toml")).to_dict()
    winner = settings_lib.resolve(
        config_file=str(REPO / "configs" / "multi30k_search" / "small.toml")).to_dict()
    chosen = dict(train_steps=3600, average_last=10, alpha=1.0, output_dir="runs/multi30k")
    assert {k: final[k] for k in chosen} == chosen
    assert final["eval_split"] == "test" and final["final_weights"] == "averaged"
    rest = lambda d: {k: v for k, v in d.items() if k not in chosen}  # noqa: E731
    assert rest(final) == rest(winner)
    # The paper's presets stay the paper's: the recipe changes no model field.
    assert final["model"] == {} and final["preset"] == "small"


def test_eval_split_is_checked():
    with pytest.raises(settings_lib.SettingsError, match="eval-split must be one of"):
        settings_lib.Settings(eval_split="train")
