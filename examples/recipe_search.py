"""A recipe search on validation only: short runs of candidate configs, ranked.

Each candidate is a config file (`configs/multi30k_search/*.toml`). `run`
trains every candidate for the same number of updates in its own process
(`keras-transformer train --config C --train-steps N --eval-split valid
--export-dir ''`), into `<root>/<config stem>`; the finished run is scored with
beam search on the validation split, never on the test set. Re-running the
command continues an interrupted candidate and skips finished ones (the run
folder's own resume); a larger `--train-steps` continues finished ones, so
the best candidates of a screening go on to the full budget without
starting again.

The paper's learning-rate schedule (equation 3) does not depend on the total
number of updates, so a short run is the first part of the long run with the
same config: the ranking compares the candidates at the same update. It
favours faster starters (less regularisation) over what pays off later; the
table shows the validation curve so that can be seen. A linear decay
(`lr_decay = "linear"`) reaches zero at its budget: such a candidate runs at
its own `--train-steps` and is not continued to another. `table --budget N`
names the full budget: the candidates trained to it or beyond (a linear decay
at a larger budget of its own, say) rank by validation BLEU, before those
stopped earlier (by default the full budget is the most updates of any).

`table` writes the ranking table from the run folders (`results.json`,
`settings.json`, `training_log.csv`), not by hand; a candidate's training
minutes are the log's, which count on across continuations, and the machine
column names the hardware they were measured on (`results.json`'s `machine`,
the last part's for a continued run; "-" for runs that predate it). `save` copies those small
files of each finished candidate to another folder (committed under docs/),
so that the table can be written again on a machine where the run folders
(weights, checkpoints: hundreds of MB) are gone:

    python examples/recipe_search.py run configs/multi30k_search/*.toml \\
        --root runs/multi30k_search --train-steps 600
    python examples/recipe_search.py save --root runs/multi30k_search \\
        --to docs/multi30k_search_runs
    python examples/recipe_search.py table --root docs/multi30k_search_runs \\
        --budget 4500 --output docs/multi30k_recipe_search.md

`curves` sets validation curves side by side: runs that differ only by seed
(the references: their spread is the noise) and a run to judge against them
(another precision, say), from update `--from` on:

    python examples/recipe_search.py curves \\
        --reference docs/multi30k_search_runs/small_bucket2_drop02 \\
        docs/multi30k_recipe_seeds/seed1 --compare docs/multi30k_recipe_bf16 --from 600
"""

import argparse
import csv
import json
import pathlib
import re
import shutil
import subprocess
import sys
import time

# What `save` keeps of a finished candidate: what `read_run` reads.
KEPT_FILES = ("settings.json", "results.json", "training_log.csv")

# Settings shown as a candidate's differences; the rest is the same for all.
_IGNORED = {"output_dir", "export_dir", "eval_split", "train_steps", "verbose",
            "prepared_dir", "model_name"}


def run_candidates(configs, root, train_steps):
    """Trains each config for `train_steps` updates, one process each."""
    root = pathlib.Path(root)
    for config in map(pathlib.Path, configs):
        if not config.is_file():
            raise SystemExit(f"recipe_search.py: no config file {config}")
    for config in map(pathlib.Path, configs):
        out = root / config.stem
        command = [sys.executable, "-m", "keras_transformer", "train", "--config", str(config),
                   "--train-steps", str(train_steps), "--eval-split", "valid",
                   "--export-dir", "", "--output-dir", str(out)]
        print(f"[{time.strftime('%H:%M:%S')}] {config.stem}: {' '.join(command)}", flush=True)
        started = time.time()
        code = subprocess.call(command)
        print(f"[{time.strftime('%H:%M:%S')}] {config.stem}: exit {code} after "
              f"{time.time() - started:.0f} s", flush=True)
        if code:
            return code
    return 0


def save_runs(root, to):
    """Copies each finished candidate's `KEPT_FILES` from `root/<name>` to `to/<name>`.

    Returns:
        The names of the candidates saved (those with a `results.json`).
    """
    root, to = pathlib.Path(root), pathlib.Path(to)
    saved = []
    for folder in sorted(p for p in root.iterdir() if p.is_dir()):
        if not (folder / "results.json").is_file():
            continue
        (to / folder.name).mkdir(parents=True, exist_ok=True)
        for name in KEPT_FILES:
            if (folder / name).is_file():
                shutil.copyfile(folder / name, to / folder.name / name)
        saved.append(folder.name)
    return saved


def _read_log(log_file):
    """The training log's validation curve and its last `elapsed_seconds`.

    Returns:
        `([(update, val_loss, val_bleu)], seconds)`: the rows where validation
        ran, and the log's wall-clock seconds of training, which count on
        across continuations (None without a log or the column).
    """
    if not log_file.is_file():
        return [], None
    with open(log_file, newline="") as handle:
        rows = list(csv.DictReader(handle))
    curve = [(int(float(r["step"])), float(r["val_loss"]),
              float(r["val_bleu"]) if r.get("val_bleu") else None)
             for r in rows if r.get("val_loss")]
    elapsed = [float(r["elapsed_seconds"]) for r in rows if r.get("elapsed_seconds")]
    return curve, (elapsed[-1] if elapsed else None)


def read_run(folder):
    """One candidate's row: its settings, results and validation curve, or None."""
    folder = pathlib.Path(folder)
    results_file = folder / "results.json"
    if not results_file.is_file():
        return None
    results = json.loads(results_file.read_text())
    settings = results.get("settings") or json.loads((folder / "settings.json").read_text())
    curve, log_seconds = _read_log(folder / "training_log.csv")
    return dict(name=folder.name, results=results, settings=settings, curve=curve,
                log_seconds=log_seconds)


# What a run saved before a setting existed did: the setting's value then.
_BEFORE = {"mixed_precision": "none", "subword_sampling": 0.0, "sampling_views": 32,
           "sampling_sides": "both", "lr_decay": "inverse_sqrt"}


def differences(settings, reference):
    """`name=value` for every setting (and model override) that differs from `reference`.

    A setting one of the two runs predates counts as its `_BEFORE` value.
    """
    out = []
    for key in sorted(set(settings) | set(reference)):
        if key in _IGNORED or key == "model":
            continue
        value = settings.get(key, _BEFORE.get(key))
        if value != reference.get(key, _BEFORE.get(key)):
            out.append(f"{key}={value}")
    model, ref_model = settings.get("model") or {}, reference.get("model") or {}
    for key in sorted(set(model) | set(ref_model)):
        if model.get(key) != ref_model.get(key):
            out.append(f"{key}={model.get(key, '-')}")
    return out


def ranking(rows, budget=None):
    """Rows scored on validation, best first.

    Candidates trained to the full budget or beyond (`budget` updates; the
    most any candidate had, by default) rank by validation BLEU: each is a
    recipe the hour holds, finished as its config says. One stopped earlier
    (successive halving: its validation curve already lost to another's at the
    same update) comes after all of them, whatever its BLEU; those rank by
    updates, then BLEU.
    """
    scored = [r for r in rows if r["results"].get("eval_split") == "valid"]
    steps = lambda r: r["results"].get("final_step") or 0  # noqa: E731
    if budget is None:
        budget = max((steps(r) for r in scored), default=0)
    return sorted(scored, key=lambda r: (steps(r) < budget, -min(steps(r), budget),
                                         -r["results"]["bleu"]))


def _short_weights(text):
    """`final_weights` with a list of checkpoint files shortened to its first and last."""
    return re.sub(r"\((ckpt-\d+)\.weights\.h5, (?:[^()]*, )?(ckpt-\d+)\.weights\.h5\)",
                  r"(\1 to \2)", text)


def markdown_table(rows, baseline=None, budget=None):
    """The ranking as a Markdown table (see `ranking`)."""
    ranked = ranking(rows, budget)
    if not ranked:
        raise SystemExit("recipe_search.py: no run folder scored on the validation split "
                         "(results.json with eval_split valid)")
    reference = next((r["settings"] for r in ranked if r["name"] == baseline),
                     ranked[-1]["settings"])
    lines = ["| rank | candidate | differs from the baseline | updates | train min | "
             "target tok/s | machine | valid BLEU (beam) | valid chrF | greedy valid BLEU "
             "(200 sent.) by update | valid loss by update | scored weights |",
             "|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for rank, row in enumerate(ranked, 1):
        res = row["results"]
        diff = ", ".join(differences(row["settings"], reference)) or "(baseline)"
        bleu_curve = " ".join(f"{u}:{b:.1f}" for u, _, b in row["curve"] if b is not None)
        loss_curve = " ".join(f"{u}:{l:.3f}" for u, l, _ in row["curve"])
        tok_s = res.get("train_target_tokens_per_second")
        # A continued candidate's results.json times its last part only; the
        # log's elapsed seconds count from update 0.
        # (A candidate finished where a stop left it trained nothing in its
        # last part: its log still has the minutes, not the tokens/s.)
        seconds = row.get("log_seconds") or res.get("train_seconds", 0)
        minutes = f"{seconds / 60:.1f}" if seconds else "-"
        speed = "-" if tok_s is None else f"{tok_s:,.0f}"
        # Minutes and tokens/s are the machine's: runs that predate the
        # `machine` field say "-".
        machine = res.get("machine") or "-"
        lines.append(
            f"| {rank} | `{row['name']}` | {diff} | {res.get('final_step')} | {minutes} | "
            f"{speed} | {machine} | **{res['bleu']:.2f}** | {res['chrf']:.2f} | {bleu_curve or '-'} | "
            f"{loss_curve or '-'} | {_short_weights(res.get('final_weights', '-'))} |")
    return "\n".join(lines)


def curves_table(references, compared, start=0):
    """Validation loss per update of runs side by side, and how far `compared` strays.

    Args:
        references: run folders (or saved small files) that differ by seed only.
        compared: the run folder judged against them.
        start: the first update shown and counted.

    Returns:
        `(lines, summary)`: a Markdown table (update, each reference, their
        spread, the compared run, its distance outside the references'
        range) and a dict: `reference_spread` (the largest spread),
        `outside` (the compared run's largest distance outside the range,
        0 if always inside), `largest_difference` (its largest distance to
        the references' mean) and `updates` (the updates compared).
    """
    runs = [pathlib.Path(p) for p in (*references, compared)]
    curves = []
    for folder in runs:
        curve, _ = _read_log(folder / "training_log.csv")
        if not curve:
            raise SystemExit(f"recipe_search.py: no validation curve in {folder}")
        curves.append({update: loss for update, loss, _ in curve})
    updates = sorted(u for u in set.intersection(*(set(c) for c in curves)) if u >= start)
    if not updates:
        raise SystemExit("recipe_search.py: the runs share no validation update from "
                         f"{start} on")
    names = [p.name for p in runs]
    lines = ["| update | " + " | ".join(names[:-1]) + " | spread | " + names[-1]
             + " | outside the range |", "|---" * (len(names) + 3) + "|"]
    spread = outside = difference = 0.0
    for update in updates:
        refs = [c[update] for c in curves[:-1]]
        value = curves[-1][update]
        low, high = min(refs), max(refs)
        away = max(low - value, value - high, 0.0)
        spread, outside = max(spread, high - low), max(outside, away)
        difference = max(difference, abs(value - sum(refs) / len(refs)))
        lines.append(f"| {update} | " + " | ".join(f"{r:.3f}" for r in refs)
                     + f" | {high - low:.3f} | {value:.3f} | {away:.3f} |")
    summary = dict(reference_spread=spread, outside=outside, largest_difference=difference,
                   updates=updates)
    return lines, summary


def main(argv=None):
    parser = argparse.ArgumentParser(prog="recipe_search.py", description=__doc__.split("\n")[0])
    sub = parser.add_subparsers(dest="command", required=True)
    p_run = sub.add_parser("run", help="train the candidates (validation only)")
    p_run.add_argument("configs", nargs="+", help="candidate config files")
    p_run.add_argument("--root", default="runs/multi30k_search")
    p_run.add_argument("--train-steps", type=int, default=600)
    p_save = sub.add_parser("save", help="copy the finished candidates' small files")
    p_save.add_argument("--root", default="runs/multi30k_search")
    p_save.add_argument("--to", required=True, help="e.g. docs/multi30k_search_runs")
    p_table = sub.add_parser("table", help="the ranking table from the run folders")
    p_table.add_argument("--root", default="runs/multi30k_search")
    p_table.add_argument("--baseline", default="small_bucket2",
                         help="the candidate the differences are named against")
    p_table.add_argument("--budget", type=int,
                         help="the full budget in updates: candidates trained to it or "
                              "beyond rank by validation BLEU, before those stopped "
                              "earlier (default: the most updates of any candidate)")
    p_table.add_argument("--output", help="write here (default: print)")
    p_curves = sub.add_parser("curves", help="validation curves side by side: references "
                                             "(seeds) and a run judged against them")
    p_curves.add_argument("--reference", nargs="+", required=True,
                          help="run folders that differ by seed only")
    p_curves.add_argument("--compare", required=True, help="the run folder to judge")
    p_curves.add_argument("--from", dest="start", type=int, default=0,
                          help="the first update counted (default 0)")
    args = parser.parse_args(argv)
    if args.command == "curves":
        lines, summary = curves_table(args.reference, args.compare, args.start)
        print("\n".join(lines))
        print(f"validation loss from update {summary['updates'][0]} to "
              f"{summary['updates'][-1]}: the references' largest spread "
              f"{summary['reference_spread']:.3f}; {pathlib.Path(args.compare).name} at most "
              f"{summary['outside']:.3f} outside their range, at most "
              f"{summary['largest_difference']:.3f} from their mean")
        return 0
    if args.command == "run":
        if args.train_steps < 1:
            parser.error("--train-steps must be a positive integer")
        return run_candidates(args.configs, args.root, args.train_steps)
    root = pathlib.Path(args.root)
    if not root.is_dir():
        raise SystemExit(f"recipe_search.py: no folder {root}")
    if args.command == "save":
        saved = save_runs(root, args.to)
        print(f"saved {', '.join(saved) or 'nothing (no finished candidate)'} -> {args.to}")
        return 0
    rows = [r for r in map(read_run, sorted(p for p in root.iterdir() if p.is_dir())) if r]
    if args.budget is not None and args.budget < 1:
        parser.error("--budget must be a positive integer")
    table = markdown_table(rows, baseline=args.baseline, budget=args.budget)
    if args.output:
        pathlib.Path(args.output).write_text(table + "\n")
        print(f"wrote {args.output}")
    else:
        print(table)
    return 0


if __name__ == "__main__":
    sys.exit(main())
