"""The package's layout: stage folders, imports that run one way, modules of one job.

Read from the source with `ast` (nothing is imported), so a move that breaks
the rule of docs/design.md fails here, not in a reader's head.
"""

import ast
import pathlib

import pytest

PACKAGE = pathlib.Path(__file__).resolve().parents[1] / "keras_transformer"
STAGES = ("model", "data", "training", "inference", "export", "commands")
TOP_LEVEL = ("names", "files", "runs", "run_vocabulary")
# What each stage may import besides itself and the top-level modules
# (docs/design.md, "Package layout").
ALLOWED = {
    "model": set(),
    "data": {"model"},
    "inference": {"model", "data"},
    "export": {"model", "data", "inference"},
    "training": {"model", "data", "inference", "export"},
    "commands": {"model", "data", "inference", "export", "training"},
}
MAX_LINES = 600
JOB_MAX_LINES = 400


def _modules():
    return sorted(p for p in PACKAGE.rglob("*.py"))


def _imported(path):
    """The keras_transformer modules that `path` imports, as dotted names."""
    package = ".".join(path.relative_to(PACKAGE.parent).with_suffix("").parts[:-1])
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")[:len(package.split(".")) - node.level + 1]
                module = ".".join(base + ([node.module] if node.module else []))
            else:
                module = node.module or ""
            if module.startswith("keras_transformer"):
                found.update(f"{module}.{alias.name}" for alias in node.names)
        elif isinstance(node, ast.Import):
            found.update(a.name for a in node.names if a.name.startswith("keras_transformer"))
    return found


def _part(dotted):
    """The stage folder or top-level module a dotted name is in (None: the package)."""
    parts = dotted.split(".")
    return parts[1] if len(parts) > 1 else None


def test_the_package_has_stage_folders_and_few_top_level_modules():
    top = sorted(p.stem for p in PACKAGE.glob("*.py") if p.stem not in ("__init__", "__main__"))
    assert top == sorted(TOP_LEVEL)
    folders = sorted(p.name for p in PACKAGE.iterdir()
                     if p.is_dir() and (p / "__init__.py").is_file())
    assert folders == sorted(STAGES)


@pytest.mark.parametrize("stage", STAGES)
def test_a_stage_imports_only_the_stages_below_it(stage):
    wrong = []
    for path in sorted((PACKAGE / stage).rglob("*.py")):
        for dotted in _imported(path):
            part = _part(dotted)
            if part in (stage, *TOP_LEVEL) or part in ALLOWED[stage]:
                continue
            if part is None and stage == "commands":  # `--version`: the package's own
                continue
            if part is None or part in STAGES:
                wrong.append(f"{path.relative_to(PACKAGE)} imports {dotted}")
    assert not wrong, "\n".join(wrong)


def test_the_top_level_modules_import_no_stage_that_uses_them():
    # names and files are under everything; runs and run_vocabulary read the
    # model's config and the tokenizer, and are read by inference, export and training.
    may = {"names": set(), "files": set(), "runs": {"model"}, "run_vocabulary": {"data"}}
    for name, allowed in may.items():
        parts = {_part(d) for d in _imported(PACKAGE / f"{name}.py")}
        assert parts <= set(TOP_LEVEL) | allowed, (name, parts)


def test_only_commands_import_the_job():
    importers = sorted(str(p.relative_to(PACKAGE)) for p in _modules()
                       if any(d.startswith("keras_transformer.training.job")
                              or d == "keras_transformer.training.job"
                              for d in _imported(p)))
    assert all(p.startswith("commands/") for p in importers), importers


def test_modules_stay_short():
    long = {str(p.relative_to(PACKAGE)): n for p in _modules()
            if (n := len(p.read_text().splitlines())) > MAX_LINES}
    assert not long
    assert len((PACKAGE / "training" / "job.py").read_text().splitlines()) < JOB_MAX_LINES
