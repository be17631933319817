"""Tests of examples/recipe_search.py: the ranking table read from run folders, the
training commands it builds from the candidate config files, and the `eval_split`
setting the search relies on (a candidate never sees the test set).

The config files (configs/multi30k_search/*.toml, configs/multi30k.toml) are read
here with `tomllib` and compared with what the search and the settings make of
them, so that a file misread fails; no value of theirs is copied here.
"""

import csv
import json
import pathlib
import re
import sys
import tomllib

import pytest
from conftest import load_example

from keras_transformer.training import settings as settings_lib
from keras_transformer.commands import build_parser

pytestmark = pytest.mark.backend_independent  # settings, CSV and JSON: no model runs

REPO = pathlib.Path(__file__).resolve().parents[2]
SEARCH_CONFIGS = REPO / "configs" / "multi30k_search"
FINAL_CONFIG = REPO / "configs" / "multi30k.toml"
SEARCH_TABLE = REPO / "docs" / "multi30k_recipe_search.md"
SAVED_RUNS = REPO / "docs" / "multi30k_search_runs"


@pytest.fixture(scope="module")
def search():
    return load_example("recipe_search")


def _run(root, name, bleu, split="valid", model=None, curve=((200, 5.0, 3.0), (400, 4.5, 9.0)),
         final_step=400, final_weights="the average of 2 checkpoints", machine=None):
    folder = root / name
    folder.mkdir(parents=True)
    s = settings_lib.Settings(preset="small", data="x", model=model or {}).to_dict()
    results = dict(
        eval_split=split, bleu=bleu, chrf=bleu + 20, final_step=final_step, train_seconds=600.0,
        train_target_tokens_per_second=3000.0, final_weights=final_weights, settings=s)
    if machine:  # runs before the field existed have none
        results["machine"] = machine
    folder.joinpath("results.json").write_text(json.dumps(results))
    with open(folder / "training_log.csv", "w", newline="") as handle:
        writer = csv.writer(handle)
        writer.writerow(["step", "loss", "val_loss", "val_bleu"])
        writer.writerow([100, 6.0, "", ""])
        for update, loss, bleu_ in curve:
            writer.writerow([update, loss + 0.5, loss, bleu_])
    return folder


def test_table_ranks_by_validation_bleu_and_leaves_out_test_scored_runs(search, tmp_path):
    _run(tmp_path, "small", 20.0)
    _run(tmp_path, "drop03", 25.5, model={"dropout": 0.3}, machine="Intel Xeon, 2 cores")
    _run(tmp_path, "peeked", 99.0, split="test", model={"dropout": 0.2})
    (tmp_path / "unfinished").mkdir()
    rows = [r for r in map(search.read_run, sorted(tmp_path.iterdir())) if r]
    assert [r["name"] for r in rows] == ["drop03", "peeked", "small"]
    table = search.markdown_table(rows, baseline="small").splitlines()
    assert len(table) == 4  # header, rule, two validation-scored runs
    assert all(line.count("|") == table[0].count("|") for line in table)
    assert table[2].startswith("| 1 | `drop03` | dropout=0.3 | 400 | 10.0 | 3,000 | "
                               "Intel Xeon, 2 cores | **25.50** | 45.50")
    # The minutes of a run that predates the machine field are on a machine unnamed.
    assert table[3].startswith("| 2 | `small` | (baseline) | 400 | 10.0 | 3,000 | - | **20.00**")
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


def test_candidates_at_the_full_budget_or_beyond_rank_by_bleu(search, tmp_path, capsys):
    """A linear decay finished at a larger budget of its own is not ranked first for it."""
    _run(tmp_path, "small", 30.0, final_step=4500)
    _run(tmp_path, "longer", 29.0, final_step=6500, model={"dropout": 0.2})
    _run(tmp_path, "stopped", 35.0, final_step=3000, model={"dropout": 0.3})
    rows = [search.read_run(p) for p in sorted(tmp_path.iterdir())]
    names = lambda budget: [r["name"] for r in search.ranking(rows, budget)]  # noqa: E731
    assert names(4500) == ["small", "longer", "stopped"]
    assert names(None) == ["longer", "small", "stopped"]  # the most updates: 6,500
    assert names(3000) == ["stopped", "small", "longer"]
    assert search.main(["table", "--root", str(tmp_path), "--baseline", "small",
                        "--budget", "4500"]) == 0
    printed = [line.split(" | ")[1] for line in capsys.readouterr().out.splitlines()[2:]]
    assert printed == ["`small`", "`longer`", "`stopped`"]
    with pytest.raises(SystemExit):
        search.main(["table", "--root", str(tmp_path), "--budget", "0"])


def test_a_continued_candidate_shows_its_minutes_from_update_0(search, tmp_path):
    """results.json of a continued run times its last part; the log counts on."""
    folder = _run(tmp_path, "small", 30.0, final_step=600)
    results = json.loads((folder / "results.json").read_text())
    results["train_seconds"] = 300.0  # updates 400-600 only
    (folder / "results.json").write_text(json.dumps(results))
    with open(folder / "training_log.csv", "w", newline="") as handle:
        writer = csv.writer(handle)
        writer.writerow(["step", "loss", "elapsed_seconds", "val_loss", "val_bleu"])
        writer.writerows([[200, 5.0, 400.0, 4.0, 3.0], [400, 4.0, 800.0, 3.5, 9.0],
                          [500, 3.8, 1000.0, "", ""], [600, 3.6, 1200.0, 3.2, 12.0]])
    table = search.markdown_table([search.read_run(folder)], baseline="small").splitlines()
    assert table[2].startswith("| 1 | `small` | (baseline) | 600 | 20.0 | 3,000 | - | **30.00** |")
    assert "200:4.000 400:3.500 600:3.200" in table[2]


def test_saved_small_files_give_the_same_table(search, tmp_path):
    runs_root, saved = tmp_path / "runs", tmp_path / "docs"
    _run(runs_root, "small", 20.0)
    _run(runs_root, "drop03", 25.5, model={"dropout": 0.3})
    (runs_root / "small" / "settings.json").write_text("{}")
    (runs_root / "small" / "ckpt-400.weights.h5").write_bytes(b"weights")
    (runs_root / "unfinished").mkdir()
    assert search.main(["save", "--root", str(runs_root), "--to", str(saved)]) == 0
    assert sorted(p.name for p in saved.iterdir()) == ["drop03", "small"]
    assert sorted(p.name for p in (saved / "small").iterdir()) == [
        "results.json", "settings.json", "training_log.csv"]

    def table(root):
        rows = [r for r in map(search.read_run, sorted(root.iterdir())) if r]
        return search.markdown_table(rows, baseline="small")

    assert table(saved) == table(runs_root)


def test_each_saved_candidate_is_its_config_file_trained_on_validation(search):
    """docs/multi30k_search_runs: each folder is a candidate of configs/multi30k_search,
    trained with what its file says (read with tomllib) and scored on validation."""
    saved = sorted(p for p in SAVED_RUNS.iterdir() if p.is_dir())
    assert saved
    for folder in saved:
        assert sorted(p.name for p in folder.iterdir()) == sorted(search.KEPT_FILES)
        job, model = _file_settings(SEARCH_CONFIGS / f"{folder.name}.toml")
        trained = json.loads((folder / "settings.json").read_text())
        results = json.loads((folder / "results.json").read_text())
        assert {name: trained[name] for name in job} == job
        assert trained["model"] == model
        assert trained["eval_split"] == results["eval_split"] == "valid"
        assert trained["train_steps"] == results["final_step"]
    rows = [search.read_run(p) for p in saved]
    assert all(row["curve"] for row in rows)
    assert len(search.markdown_table(rows).splitlines()) == 2 + len(saved)


def test_curves_put_a_run_beside_the_seeds_spread(search, tmp_path, capsys):
    seed0 = _run(tmp_path, "seed0", 20.0, curve=((200, 5.0, 1), (600, 3.80, 20),
                                                  (800, 3.50, 25)))
    seed1 = _run(tmp_path, "seed1", 20.0, curve=((200, 5.1, 1), (600, 3.90, 20),
                                                  (800, 3.45, 25)))
    other = _run(tmp_path, "bf16", 20.0, curve=((200, 9.0, 1), (600, 3.85, 20),
                                                 (800, 3.60, 25), (1000, 3.0, 30)))
    lines, summary = search.curves_table([seed0, seed1], other, start=600)
    # Update 200 is before --from, 1000 is not in every run.
    assert summary["updates"] == [600, 800]
    assert summary["reference_spread"] == pytest.approx(0.10)  # 3.90 - 3.80 at 600
    assert summary["outside"] == pytest.approx(0.10)  # 3.60 above 3.50 at 800
    assert summary["largest_difference"] == pytest.approx(3.60 - 3.475)
    assert lines[2] == "| 600 | 3.800 | 3.900 | 0.100 | 3.850 | 0.000 |"
    assert lines[3] == "| 800 | 3.500 | 3.450 | 0.050 | 3.600 | 0.100 |"
    assert search.main(["curves", "--reference", str(seed0), str(seed1), "--compare",
                        str(other), "--from", "600"]) == 0
    printed = capsys.readouterr().out
    assert "the references' largest spread 0.100; bf16 at most 0.100 outside" in printed
    with pytest.raises(SystemExit, match="share no validation update from 2000"):
        search.curves_table([seed0, seed1], other, start=2000)


def test_table_without_a_validation_scored_run_says_so(search, tmp_path):
    _run(tmp_path, "small", 30.0, split="test")
    rows = [search.read_run(tmp_path / "small")]
    with pytest.raises(SystemExit, match="no run folder scored on the validation split"):
        search.markdown_table(rows)


def test_run_refuses_a_missing_config_before_training(search, tmp_path):
    with pytest.raises(SystemExit, match="no config file"):
        search.run_candidates([tmp_path / "absent.toml"], tmp_path, 10)


def _file_settings(path):
    """`(job, model)` of a config file as `tomllib` reads it: `{name: value}` of its
    job settings (all sections but [model]) and of its [model] section."""
    document = tomllib.loads(pathlib.Path(path).read_text())
    job = {name: value for section, values in document.items() if section != "model"
           for name, value in values.items()}
    return job, document.get("model", {})


def _candidates():
    configs = sorted(SEARCH_CONFIGS.glob("*.toml"))
    assert len(configs) >= 2
    return configs


def _default_baseline(search, monkeypatch, tmp_path):
    """The candidate `table` names the differences against when not told (its default)."""
    seen = []
    monkeypatch.setattr(search, "markdown_table",
                        lambda rows, baseline=None, budget=None: seen.append(baseline) or "")
    search.main(["table", "--root", str(tmp_path)])
    (baseline,) = seen
    return baseline


def test_run_trains_each_candidate_as_its_config_file_says_on_validation_only(
        search, tmp_path, monkeypatch):
    configs = _candidates()
    commands = []
    monkeypatch.setattr(search.subprocess, "call",
                        lambda command: commands.append(command) or 0)
    root = tmp_path / "search"
    assert search.run_candidates(configs, root, 123) == 0
    assert len(commands) == len(configs)
    parser = build_parser()
    for config, command in zip(configs, commands):
        assert command[:4] == [sys.executable, "-m", "keras_transformer", "train"]
        # The settings `train` resolves from this command line...
        args = parser.parse_args(command[3:])
        assert args.func.__module__ == "keras_transformer.commands.train"
        resolved = settings_lib.merge_settings(*settings_lib.given_from_args(args)).to_dict()
        # ...are the search's own (its budget, validation only, no export, one
        # folder per candidate)...
        by_search = {"train_steps": 123, "eval_split": "valid", "export_dir": "",
                     "output_dir": str(root / config.stem)}
        assert {name: resolved[name] for name in by_search} == by_search
        # ...and the file's, nothing else: every other setting is the preset's default.
        job, model = _file_settings(config)
        assert {name: resolved[name] for name in job if name not in by_search} == {
            name: value for name, value in job.items() if name not in by_search}
        assert resolved["model"] == model
        defaults = settings_lib.Settings(preset=resolved["preset"]).with_preset_defaults()
        changed = {name for name, value in defaults.to_dict().items()
                   if resolved[name] != value}
        assert changed <= set(job) | set(by_search) | ({"model"} if model else set())


def test_the_table_names_the_differences_the_config_files_have(search, tmp_path, monkeypatch):
    """`differences` against the baseline = what the files differ in, read with tomllib;
    and the committed table (docs/multi30k_recipe_search.md) says the same."""
    baseline = SEARCH_CONFIGS / f"{_default_baseline(search, monkeypatch, tmp_path)}.toml"
    assert baseline.is_file()
    base_job, base_model = _file_settings(baseline)
    base = settings_lib.merge_settings(config_file=str(baseline)).to_dict()
    documented = {row["candidate"]: row["differs from the baseline"]
                  for row in _table_rows()}
    for config in _candidates():
        job, model = _file_settings(config)
        # The table hides these settings (the search sets them): no file may set one.
        assert not set(job) & search._IGNORED, config
        resolved = settings_lib.merge_settings(config_file=str(config)).to_dict()
        # Candidates compare recipes: same preset, same corpus.
        assert (resolved["preset"], resolved["data"]) == (base["preset"], base["data"])

        def value(name, file, settings):  # as the file says, else as resolved
            return file.get(name, settings[name])

        expected = [f"{name}={value(name, job, resolved)}"
                    for name in sorted(set(job) | set(base_job))
                    if value(name, job, resolved) != value(name, base_job, base)]
        expected += [f"{name}={model.get(name, '-')}"
                     for name in sorted(set(model) | set(base_model))
                     if model.get(name) != base_model.get(name)]
        assert search.differences(resolved, base) == expected, config
        if config.stem in documented:
            # The table compares saved runs: one of a version before
            # --mixed-precision trained in float32 (`_BEFORE`), which no file says.
            shown = [d for d in documented[config.stem].split(", ")
                     if not d.startswith("mixed_precision=")
                     or any(e.startswith("mixed_precision=") for e in expected)]
            assert ", ".join(shown) == (", ".join(expected) or "(baseline)")
    assert set(documented) <= {config.stem for config in _candidates()}


def _table_rows():
    """The rows of the committed ranking table, `{column header: cell}`, best first."""
    lines = [line for line in SEARCH_TABLE.read_text().splitlines() if line.startswith("|")]
    header = [cell.strip() for cell in lines[0].strip("|").split("|")]
    rows = [dict(zip(header, (cell.strip() for cell in line.strip("|").split("|"))))
            for line in lines[2:]]
    for row in rows:
        row["candidate"] = row["candidate"].strip("`")
    assert [row["rank"] for row in rows] == [str(i) for i in range(1, len(rows) + 1)]
    return rows


def test_the_multi30k_config_is_the_search_candidate_it_names_with_its_validation_tuning():
    """configs/multi30k.toml = the search candidate it names + its budget and the tuned
    settings.

    The table ranks single runs, and a lead on validation smaller than the
    spread between seeds decides nothing (round 3: docs/recipes.md), so a
    candidate replaces the config only after it also wins over seeds; the
    config names the candidate it is. That candidate must be in the table,
    trained to the budget the config trains for, with nothing but the
    config's own tuning changed: model, schedule and corpus are the candidate's.
    """
    named = re.search(r"the search candidate\s+(?:#\s*)?`(\w+)`", FINAL_CONFIG.read_text())
    assert named, "configs/multi30k.toml names no search candidate (`the search candidate `X``)"
    rows = {row["candidate"]: row for row in _table_rows()}
    assert named[1] in rows, f"{named[1]} is not in {SEARCH_TABLE.name}"
    winner = rows[named[1]]
    winner_file = SEARCH_CONFIGS / f"{winner['candidate']}.toml"
    final_job, final_model = _file_settings(FINAL_CONFIG)
    winner_job, winner_model = _file_settings(winner_file)
    final = settings_lib.merge_settings(config_file=str(FINAL_CONFIG)).to_dict()
    chosen = settings_lib.merge_settings(config_file=str(winner_file)).to_dict()
    # Each file is read as it is written...
    assert {name: final[name] for name in final_job} == final_job
    assert {name: chosen[name] for name in winner_job} == winner_job
    # ...and they differ only where the files do: the winner's recipe (model,
    # preset, corpus) is kept; the paper's presets stay the paper's.
    differing = {name for name in final if final[name] != chosen[name]}
    assert differing <= {name for name in set(final_job) | set(winner_job)
                         if final_job.get(name) != winner_job.get(name)}
    # What the config may set beyond the candidate: where the job writes, the
    # precision the machine picks, the budget and the decoding tuned on
    # validation; the schedule (lr_decay) and everything else is the candidate's.
    assert differing <= {"output_dir", "mixed_precision", "train_steps", "alpha"}
    assert final_model == winner_model and final["model"] == final_model
    # The budget is the one the winner was trained with in the search, and the
    # weights are averaged over as many checkpoints as its scored weights.
    assert final["train_steps"] == int(winner["updates"])
    averaged = re.match(r"the average of (\d+) checkpoints", winner["scored weights"])
    assert averaged and final["final_weights"] == "averaged"
    assert final["average_last"] == int(averaged[1])
    # The search scored on validation; the final config scores on the test set.
    assert "eval_split" not in final_job and final["eval_split"] == "test"


def test_eval_split_is_checked():
    with pytest.raises(settings_lib.SettingsError, match="eval-split must be one of"):
        settings_lib.Settings(eval_split="train")
