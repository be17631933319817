"""The documentation's commands against the real command line, its Python API block run.

The documentation is README.md, the pages of docs/ (the MkDocs site,
mkdocs.yml), CHANGELOG.md and saved_models/README.md:

- every `--flag` a page passes to a command is an option of that
  sub-command (`keras-transformer <cmd>`, `python -m keras_transformer <cmd>`,
  `python examples/wmt_ende.py` = train, `python examples/evaluate_run.py` =
  evaluate), in fenced code blocks (continuation lines ending in `\\`
  included) and in inline code spans; so is every flag of the settings table;
- every other `python examples/<script>.py [sub-command]` a page runs exists
  and takes the flags it passes (as that script's `--help` lists them);
- no option of any sub-command is missing from the documentation;
- the settings table between its markers (docs/training.md) is
  `settings.markdown_table()`;
- README.md stays a front page (at most 250 lines), and the API reference
  (docs/api.md) lists every name of `keras_transformer.__all__`;
- the README's "Python API" block, which docs/api.md includes, runs as it is
  (slow: it trains).
- the picture of docs/design.md, docs/images/pipeline.svg, is what
  docs/draw_pipeline.py draws now, and no page has a Mermaid fence (the site
  renders its pictures offline, without a script from a CDN).

`command_problems(text)`, `omitted_options(texts)` and `table_problems(text)`
return the problems as sentences naming the flag and the command; the tests
run them on the real pages and on doctored copies. CI builds the site with
`mkdocs build --strict` (broken links, anchors and references fail it).
"""

import argparse
import copy
import functools
import pathlib
import re
import types

import pytest

from keras_transformer.training import settings
from keras_transformer.commands import PROG, build_parser

REPO = pathlib.Path(__file__).resolve().parents[1]
README = REPO / "README.md"
SETTINGS_PAGE = REPO / "docs" / "training.md"
# Every page of the documentation, README.md first.
PAGES = [README, *sorted((REPO / "docs").rglob("*.md")), REPO / "CHANGELOG.md",
         REPO / "saved_models" / "README.md"]
README_MAX_LINES = 250
DESIGN_PAGE = REPO / "docs" / "design.md"
PIPELINE_SCRIPT = REPO / "docs" / "draw_pipeline.py"
PIPELINE_PICTURE = REPO / "docs" / "images" / "pipeline.svg"
TABLE_START = "<!-- settings-table:start -->"
TABLE_END = "<!-- settings-table:end -->"

# How a command is invoked -> the sub-command it runs (None: the next word).
_INVOCATIONS = (
    (r"(?<![\w/.-])keras-transformer(?=\s|$)", None),
    (r"python3? -m keras_transformer(?=\s|$)", None),
    (r"python3? (?:\./)?examples/wmt_ende\.py(?=\s|$)", "train"),
    (r"python3? (?:\./)?examples/evaluate_run\.py(?=\s|$)", "evaluate"),
)
_INVOCATION = re.compile("|".join(f"({pattern})" for pattern, _ in _INVOCATIONS))
# Where a shell command ends: a pipe, a list operator or a comment.
_COMMAND_END = re.compile(r"\|\|?|&&|;|(?:^|\s)#")
# What may come before a program for it to be a command, not a word of prose
# in a code block: nothing, or a command separator (or prompt), then
# environment assignments (`KERAS_BACKEND=jax`, `TF_CONFIG='{...}'`).
_COMMAND_START = re.compile(
    r"(?:.*(?:\|\|?|&&|;|\$|\())?\s*(?:[A-Za-z_]\w*=(?:'[^']*'|\"[^\"]*\"|\S*)\s+)*")
_FLAG = re.compile(r"(?<![\w-])--[A-Za-z0-9][A-Za-z0-9-]*")
_FENCE = re.compile(r"^(```|~~~)[^\n]*\n(.*?)^\1[ \t]*$", re.MULTILINE | re.DOTALL)
_INLINE_CODE = re.compile(r"(`+)(.+?)\1", re.DOTALL)


def command_options(parser=None):
    """`{sub-command: set of its option strings starting with --}`.

    `--help` and hidden options (an old flag name still read, with a
    warning) are left out: the documentation uses the current names.
    """
    parser = parser or build_parser()
    subparsers = [a for a in parser._actions if isinstance(a, argparse._SubParsersAction)]
    assert len(subparsers) == 1, "expected one set of sub-commands"
    return {name: {option for action in sub._actions for option in action.option_strings
                   if option.startswith("--") and option != "--help"
                   and action.help != argparse.SUPPRESS}
            for name, sub in subparsers[0].choices.items()}


def settings_table(text):
    """The text between the settings-table markers, or None without both markers."""
    start, end = text.find(TABLE_START), text.find(TABLE_END)
    if start < 0 or end < start:
        return None
    return text[start + len(TABLE_START):end].strip("\n")


def _code_snippets(text):
    """Shell text of fenced code blocks (one logical line each) and inline code spans."""
    snippets = []
    for match in _FENCE.finditer(text):
        snippets.extend(re.sub(r"\\[ \t]*\n", " ", match.group(2)).splitlines())
    prose = _FENCE.sub("", text)
    for match in _INLINE_CODE.finditer(prose):
        snippets.append(" ".join(match.group(2).split()))
    return snippets


def invocations(text):
    """`(sub-command, flags, snippet)` of every command invocation in code.

    `sub-command` is the word after `keras-transformer` (or
    `python -m keras_transformer`), or the one a wrapper script runs; it is
    None when no word follows (a mention of the program, not a command).
    """
    found = []
    for snippet, match, words in _programs(text, _INVOCATION):
        fixed = next(command for (_, command), group in zip(_INVOCATIONS, match.groups())
                     if group is not None)
        if fixed is None:
            command = words[0] if words and not words[0].startswith("-") else None
            words = words[1:] if command else words
        else:
            command = fixed
        found.append((command, _flags(words), snippet.strip()))
    return found


def _programs(text, program):
    """`(snippet, match, words)` of each run of `program` (a regex) in the text's code.

    `words` are the command's words after the program, up to a pipe, a list
    operator or a comment; a match preceded by prose is not a command.
    """
    for snippet in _code_snippets(text):
        for match in program.finditer(snippet):
            if not _COMMAND_START.fullmatch(snippet[:match.start()]):
                continue
            rest = snippet[match.end():]
            end = _COMMAND_END.search(rest)
            yield snippet, match, (rest[:end.start()] if end else rest).split()


def _flags(words):
    """The `--flags` among a command's words (a `--flag=value` gives its flag)."""
    return [flag for word in words if word.startswith("--")
            for flag in _FLAG.findall(word.split("=")[0])]


# `python examples/<script>.py ...`, other than the two wrappers of sub-commands above.
_SCRIPT = re.compile(r"python3? (?:\./)?examples/(\w+)\.py(?=\s|$)")
_WRAPPERS = ("wmt_ende", "evaluate_run")


@functools.lru_cache(maxsize=None)
def script_options(script, subcommand=None):
    """`(options, subcommands)` that `python examples/SCRIPT.py [SUBCOMMAND] --help` prints.

    `options` is the set of `--flags` the help names; `subcommands` the
    choices of its usage line's `{a,b}` (empty without sub-commands). `None`
    when the script does not exist or its `--help` fails.
    """
    import subprocess
    import sys

    path = REPO / "examples" / f"{script}.py"
    if not path.is_file():
        return None
    result = subprocess.run([sys.executable, str(path), *([subcommand] if subcommand else []),
                             "--help"], capture_output=True, text=True, timeout=120,
                            cwd=REPO)
    if result.returncode != 0:
        return None
    # Sub-commands are the first positional argument: "positional arguments:\n  {a,b}".
    choices = re.search(r"^positional arguments:\n\s+\{([\w,-]+)\}", result.stdout,
                        re.MULTILINE)
    subcommands = frozenset(choices.group(1).split(",")) if choices and not subcommand else (
        frozenset())
    return frozenset(_FLAG.findall(result.stdout)), subcommands


def script_problems(text):
    """The `python examples/<script>.py` commands of a page with an unknown script or flag."""
    problems = []
    for snippet, match, words in _programs(text, _SCRIPT):
        script = match.group(1)
        if script in _WRAPPERS:
            continue
        known = script_options(script)
        if known is None:
            problems.append(f"examples/{script}.py does not exist or its --help fails: "
                            f"{snippet!r}")
            continue
        flags, subcommands = known
        name = f"examples/{script}.py"
        if subcommands:
            if not words or words[0] not in subcommands:
                problems.append(f"{name} needs one of {sorted(subcommands)}: {snippet!r}")
                continue
            flags, _ = script_options(script, words[0])
            name, words = f"{name} {words[0]}", words[1:]
        problems.extend(f"{flag} is not an option of {name}: {snippet!r}"
                        for flag in _flags(words) if flag != "--help" and flag not in flags)
    return problems


def command_problems(text, options=None):
    """The commands of one page that are not commands or pass unknown flags.

    Args:
        text: the page's Markdown.
        options: `command_options()`, computed when None.

    Returns:
        A list of problems as sentences; empty when every command is right.
    """
    options = command_options() if options is None else options
    problems = []
    for command, flags, snippet in invocations(text):
        if command is None or command.startswith("<"):  # no command, or a placeholder
            continue
        if command not in options:
            problems.append(f"`{PROG} {command}` is not a command ({', '.join(options)}): "
                            f"{snippet!r}")
            continue
        for flag in flags:
            if flag != "--help" and flag not in options[command]:
                problems.append(f"{flag} is not an option of `{PROG} {command}`: {snippet!r}")
    return problems


def table_problems(text, options=None, table=None):
    """What is wrong with the settings table of a page (its markers, flags, content).

    Args:
        text: the page's Markdown.
        options: `command_options()`, computed when None.
        table: the expected table, `settings.markdown_table()` when None.
    """
    options = command_options() if options is None else options
    table = settings.markdown_table() if table is None else table
    pasted = settings_table(text)
    if pasted is None:
        return [f"the settings table markers {TABLE_START} / {TABLE_END} are missing"]
    problems = [f"{flag} (settings table) is not an option of `{PROG} train`"
                for flag in sorted(set(_FLAG.findall(pasted)))
                if flag not in options.get("train", ())]
    if pasted != table:
        problems.append("the settings table differs from settings.markdown_table(); "
                        "paste the output of python -c \"from keras_transformer.training.settings "
                        "import markdown_table; print(markdown_table())\"")
    return problems


def omitted_options(texts, options=None):
    """The options of any sub-command that no text mentions."""
    options = command_options() if options is None else options
    text = "\n".join(texts)
    return [f"the documentation omits {flag} of `{PROG} {command}`"
            for command, names in sorted(options.items()) for flag in sorted(names)
            if not re.search(re.escape(flag) + r"(?![\w-])", text)]


@pytest.fixture(scope="module")
def readme():
    return README.read_text(encoding="utf-8")


@pytest.fixture(scope="module")
def options():
    return command_options()


@pytest.mark.parametrize("path", [str(p.relative_to(REPO)) for p in PAGES])
def test_every_page_uses_existing_commands_and_flags(path, options):
    problems = command_problems((REPO / path).read_text(encoding="utf-8"), options)
    assert not problems, f"{path}:\n" + "\n".join(problems)


@pytest.mark.parametrize("path", [str(p.relative_to(REPO)) for p in PAGES])
def test_every_page_runs_example_scripts_with_their_flags(path):
    problems = script_problems((REPO / path).read_text(encoding="utf-8"))
    assert not problems, f"{path}:\n" + "\n".join(problems)


def test_a_bogus_script_flag_or_subcommand_is_reported():
    text = ("```bash\npython examples/benchmark_training.py --preset small \\\n"
            "    --no-such-flag\n```\n"
            "`python examples/recipe_search.py curves --reference a --nope` and "
            "`python examples/recipe_search.py fly` and `python examples/no_script.py`\n")
    problems = script_problems(text)
    assert len(problems) == 4, problems
    assert problems[0].startswith("--no-such-flag is not an option of "
                                  "examples/benchmark_training.py")
    assert problems[1].startswith("--nope is not an option of examples/recipe_search.py curves")
    assert problems[2].startswith("examples/recipe_search.py needs one of")
    assert problems[3].startswith("examples/no_script.py does not exist")


def test_no_option_is_left_out_of_the_documentation(options):
    problems = omitted_options([p.read_text(encoding="utf-8") for p in PAGES], options)
    assert not problems, "\n".join(problems)


def test_prepare_and_train_name_the_prepared_folder_with_one_flag(options, capsys):
    from keras_transformer.commands import main

    assert "--prepared-dir" in options["prepare"] and "--prepared-dir" in options["train"]
    assert "--output" not in options["prepare"]  # the old name: hidden, still read
    # Both names at once: one line, before any work.
    assert main(["prepare", "--data", "demo", "--output", "a", "--prepared-dir", "b"]) == 1
    assert capsys.readouterr().err == ("keras-transformer prepare: error: --output is the old "
                                       "name of --prepared-dir; give one of them\n")


def test_the_settings_table_is_current(options):
    problems = table_problems(SETTINGS_PAGE.read_text(encoding="utf-8"), options)
    assert not problems, f"{SETTINGS_PAGE.relative_to(REPO)}:\n" + "\n".join(problems)


def test_the_readme_is_a_front_page_that_links_every_page(readme):
    assert len(readme.splitlines()) <= README_MAX_LINES
    linked = set(re.findall(r"\]\((docs/[^)#]+\.md)", readme))
    site = (REPO / "mkdocs.yml").read_text(encoding="utf-8")
    in_nav = set(re.findall(r"^\s+- (?:[^:\n]+: )?([\w./-]+\.md)\s*$", site, re.MULTILINE))
    assert in_nav and {f"docs/{page}" for page in in_nav} - {"docs/index.md"} <= linked | {
        "docs/multi30k_recipe_search.md", "docs/multi30k_recipe_search_round1.md"}
    assert all((REPO / page).is_file() for page in linked)


def test_readme_invokes_every_command(readme, options):
    used = {command for command, _, _ in invocations(readme)}
    assert set(options) <= used, f"commands never shown: {sorted(set(options) - used)}"


def test_quick_start_is_the_two_commands(readme):
    assert "pip install -e . && keras-transformer train --data demo --preset tiny" in readme
    assert 'pip install -e ".[test]" && bash tests/run_all_backends.sh' in readme


def test_the_api_reference_lists_every_public_name_and_the_readme_block():
    import keras_transformer

    api = (REPO / "docs" / "api.md").read_text(encoding="utf-8")
    missing = [name for name in keras_transformer.__all__
               if f"::: {keras_transformer._MODULE_OF[name]}.{name}\n" not in api]
    assert not missing, f"docs/api.md lacks {missing}"
    # The page includes the README's block (pymdownx.snippets) between these markers.
    assert '--8<-- "README.md:python-api"' in api
    readme = README.read_text(encoding="utf-8")
    start = readme.index("--8<-- [start:python-api]")
    assert start < readme.index("<!-- python-api:start -->") < readme.index(
        "<!-- python-api:end -->") < readme.index("--8<-- [end:python-api]")


def test_every_command_prints_its_help():
    """`--help` of each sub-command prints each of its options (an old name is hidden)."""
    parser = build_parser()
    (sub,) = [a for a in parser._actions if isinstance(a, argparse._SubParsersAction)]
    for name, command in sub.choices.items():
        text = command.format_help()
        for action in command._actions:
            shown = [option in text for option in action.option_strings]
            assert all(shown) if action.help != argparse.SUPPRESS else not any(shown), (
                name, action)


def test_the_version_is_pyprojects_and_the_command_prints_it(capsys):
    import tomllib

    import keras_transformer

    pyproject = tomllib.loads((REPO / "pyproject.toml").read_text())
    assert keras_transformer.__version__ == pyproject["project"]["version"]
    with pytest.raises(SystemExit) as exit_info:
        build_parser().parse_args(["--version"])
    assert exit_info.value.code == 0
    assert capsys.readouterr().out == f"{PROG} {pyproject['project']['version']}\n"


def test_a_literal_percent_in_a_settings_help_is_shown_as_written(monkeypatch):
    """argparse %-formats help texts: a setting's "%" must not break `--help`."""
    fields = settings.job_fields()
    doctored = copy.copy(fields[0])
    doctored.metadata = types.MappingProxyType(
        dict(fields[0].metadata, help="keeps 91% of the slots (not %(default)s)"))
    monkeypatch.setattr(settings, "job_fields", lambda: [doctored, *fields[1:]])
    parser = argparse.ArgumentParser()
    settings.add_arguments(parser)
    assert "keeps 91% of the slots (not %(default)s)" in " ".join(parser.format_help().split())


def test_a_bogus_flag_is_reported_with_its_command(readme, options):
    doctored = readme.replace("keras-transformer export --run runs/demo_tiny",
                              "keras-transformer export --run runs/demo_tiny --no-such-flag", 1)
    assert doctored != readme
    problems = command_problems(doctored, options)
    assert len(problems) == 1, problems
    assert "--no-such-flag" in problems[0] and f"`{PROG} export`" in problems[0]


def test_a_flag_on_a_continuation_line_or_inline_is_checked(options):
    text = (f"{TABLE_START}\n{settings.markdown_table()}\n{TABLE_END}\n"
            "```bash\nkeras-transformer evaluate --run r --data d \\\n"
            "    --beam-sizes 4 1 --bogus-one\n```\n"
            "and inline `python examples/wmt_ende.py --data demo --bogus-two` or "
            "`python -m keras_transformer average --run r\n--bogus-three`.\n")
    problems = command_problems(text, options) + table_problems(text, options)
    assert len(problems) == 3, problems
    assert "--bogus-one is not an option of `keras-transformer evaluate`" in problems[0]
    assert "--bogus-two is not an option of `keras-transformer train`" in problems[1]
    assert "--bogus-three is not an option of `keras-transformer average`" in problems[2]


def test_an_omitted_flag_is_reported(options):
    texts = [re.sub(r"--max-source-length(?![\w-])", "", p.read_text(encoding="utf-8"))
             for p in PAGES]
    problems = omitted_options(texts, options)
    assert problems == [f"the documentation omits --max-source-length of `{PROG} export`"]


def test_a_drifted_settings_table_is_reported(options):
    page = SETTINGS_PAGE.read_text(encoding="utf-8")
    doctored = page.replace("| `--seed` | `[run] seed` | 0 |", "| `--seed` | `[run] seed` | 1 |")
    assert doctored != page
    problems = table_problems(doctored, options)
    assert len(problems) == 1 and "settings table differs" in problems[0], problems
    no_markers = page.replace(TABLE_START, "")
    assert any("markers" in p for p in table_problems(no_markers, options))


def test_the_pipeline_picture_is_what_its_script_draws():
    import importlib.util

    spec = importlib.util.spec_from_file_location("draw_pipeline", PIPELINE_SCRIPT)
    script = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(script)
    assert script.OUTPUT == PIPELINE_PICTURE
    assert script.svg() == script.svg(), "the picture's script is not deterministic"
    assert PIPELINE_PICTURE.read_text(encoding="utf-8") == script.svg(), (
        "docs/images/pipeline.svg is stale: run `python docs/draw_pipeline.py`")
    assert "](images/pipeline.svg)" in DESIGN_PAGE.read_text(encoding="utf-8")


@pytest.mark.parametrize("path", [str(p.relative_to(REPO)) for p in PAGES])
def test_no_page_has_a_mermaid_fence(path):
    # The site has no Mermaid script (it would come from a CDN when the page
    # is viewed): a picture is an SVG drawn by a script, as docs/images/pipeline.svg.
    text = (REPO / path).read_text(encoding="utf-8")
    assert not re.search(r"^\s*(```|~~~)\s*mermaid", text, re.MULTILINE), (
        f"{path} has a Mermaid fence, which renders as code offline")


@pytest.mark.slow
def test_the_python_api_block_runs_as_it_is(tmp_path):
    import subprocess
    import sys

    from conftest import subprocess_env

    text = README.read_text(encoding="utf-8")
    start, end = "<!-- python-api:start -->", "<!-- python-api:end -->"
    assert text.count(start) == text.count(end) == 1
    block = text[text.index(start):text.index(end)]
    code = re.search(r"```python\n(.*?)```", block, re.DOTALL).group(1)
    # Under TensorFlow: the export runs there anyway (under JAX or PyTorch in a
    # TensorFlow subprocess), and the rest is tested under every backend elsewhere.
    result = subprocess.run([sys.executable, "-c", code], cwd=tmp_path, capture_output=True,
                            text=True, timeout=900,
                            env=subprocess_env(KERAS_BACKEND="tensorflow"))
    assert result.returncode == 0, result.stderr[-3000:]
    translations, path = result.stdout.strip().splitlines()[-2:]
    assert translations.startswith("['") and translations.endswith("']")
    assert path == str(pathlib.Path("saved_models") / "my_model" / "1")
    assert (tmp_path / path / "saved_model.pb").is_file()
    assert (tmp_path / "runs" / "prepared" / "my_corpus_v1000" / "manifest.json").is_file()
    # The loss fell: the fit trained (100 updates from ln V, about 6.9).
    loss = [float(x) for x in re.findall(r"loss: ([0-9.]+)", result.stdout)]
    assert loss and loss[-1] < 6.0, result.stdout[-2000:]
