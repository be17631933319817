"""keras_transformer.names: the shared names are written once and every user follows.

The commands' flags, the model's quantization, the export modules and the
settings take their names and defaults from `names` and `DecodingOptions`;
no other module writes the file, folder or signature names again. (The
exported SavedModel's signature names are checked on the export of
test_export.py, `test_signatures_and_files_are_the_names_module_s`.)
"""

import argparse
import ast
import pathlib

import pytest

from keras_transformer import names
from keras_transformer.model.config import DecodingOptions

PACKAGE = pathlib.Path(__file__).resolve().parents[1] / "keras_transformer"
# Names that only names.py may write as a string literal.
SHARED_LITERALS = {names.TOKENIZER_FILE, names.CONFIG_FILE, names.EXPORT_ROOT,
                   names.BEAM_SIGNATURE, names.GREEDY_SIGNATURE}


def _subcommand(name):
    from keras_transformer.commands import build_parser

    parser = build_parser()
    subparsers = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    return subparsers.choices[name]


def _option(parser, flag):
    return next(a for a in parser._actions if flag in a.option_strings)


def test_names_module_imports_neither_keras_nor_tensorflow():
    import subprocess
    import sys

    code = ("import sys, keras_transformer.names, keras_transformer.model.config; "
            "print(sorted(m for m in ('keras', 'tensorflow', 'jax', 'torch') "
            "if m in sys.modules))")
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                            check=True, cwd=PACKAGE.parent)
    assert result.stdout.strip() == "[]"


def test_quantize_choices_of_the_commands_are_the_names_tuples(tmp_path):
    from keras_transformer.commands import export as export_command
    from keras_transformer.commands.common import CommandError

    assert tuple(_option(_subcommand("export"), "--quantize").choices) \
        == names.CTRANSLATE2_QUANTIZATIONS
    for command in ("evaluate", "translate"):
        assert tuple(_option(_subcommand(command), "--quantize").choices) \
            == names.KERAS_QUANTIZATIONS
    # A SavedModel's modes are among the flag's choices (one flag for both formats).
    assert set(names.KERAS_QUANTIZATIONS) <= set(names.CTRANSLATE2_QUANTIZATIONS)
    # A CTranslate2-only mode is refused for a SavedModel, before anything is loaded,
    # with the line the user reads.
    args = argparse.Namespace(run=str(tmp_path), format="saved_model", quantize="int8_float16")
    with pytest.raises(CommandError) as caught:
        export_command.run_export(args)
    assert str(caught.value) == ("--quantize int8_float16 applies to --format ctranslate2 "
                                 "only; a SavedModel takes --quantize int8")


def test_quantized_accepts_exactly_the_keras_modes():
    import keras
    from keras.src.dtype_policies.dtype_policy import QUANTIZATION_MODES as KERAS_MODES

    from keras_transformer.model.transformer import build_model, quantized

    keras.utils.set_random_seed(0)
    model = build_model(preset="tiny", vocab_size=64, num_layers=1, d_model=16, num_heads=2,
                        d_ff=32, dropout=0.0)
    for mode in names.KERAS_QUANTIZATIONS:
        assert quantized(model, mode).target_embedding.quantization_mode == mode
    others = (set(KERAS_MODES) | set(names.CTRANSLATE2_QUANTIZATIONS)) \
        - set(names.KERAS_QUANTIZATIONS)
    for mode in sorted(others):
        with pytest.raises(ValueError, match="quantization mode must be one of"):
            quantized(model, mode)


def _decoding_flags():
    """`{"<command> <flag>": (default, help)}` of the flags that say a default."""
    flags = {"export": ("--export-dir", "--beam-size", "--alpha", "--max-extra-length"),
             "evaluate": ("--beam-sizes", "--alpha"),
             "translate": ("--beam-size", "--alpha", "--max-extra-length")}
    found = {}
    for command, options in flags.items():
        parser = _subcommand(command)
        for flag in options:
            option = _option(parser, flag)
            found[f"{command} {flag}"] = (option.default, option.help)
    return found


def test_defaults_come_from_names_and_decoding_options(monkeypatch):
    """The flags say DecodingOptions' and names' defaults as the user reads them, and
    follow them when they change."""
    from keras_transformer.commands import evaluate as evaluate_command
    from keras_transformer.commands import export as export_command
    from keras_transformer.commands import translate as translate_command
    from keras_transformer.training.settings import Settings

    assert Settings.__dataclass_fields__["export_dir"].default == "saved_models"
    assert _decoding_flags() == {
        "export --export-dir": ("saved_models", "base folder (default saved_models): "
                                "<export-dir>/<model-name>/<version>/ for a SavedModel, "
                                "<export-dir>/<model-name>-ct2[-<quantize>]/ for CTranslate2"),
        "export --beam-size": (None, "saved_model: of serving_default (default the run's "
                                     "settings.json, else 4)"),
        "export --alpha": (None, "saved_model: length penalty (default the run's "
                                 "settings.json, else 0.6)"),
        "export --max-extra-length": (None, "saved_model: outputs have at most source length "
                                            "+ this many ids (default the run's "
                                            "settings.json, else 50)"),
        "evaluate --beam-sizes": (None, "1 = greedy (default the run's settings.json, else 4)"),
        "evaluate --alpha": (None, "length penalty (default the run's settings.json, else "
                                   "0.6); several values give a row each (tune it on a "
                                   "validation split, not on the test set)"),
        "translate --beam-size": (None, "default the run's, else 4; 1 = greedy"),
        "translate --alpha": (None, "length-penalty strength (default the run's, else 0.6)"),
        "translate --max-extra-length": (None, "outputs have at most source length + this "
                                               "many ids (default the run's, else 50)"),
    }
    # Other defaults in DecodingOptions and names: every flag says them.
    for module in (export_command, evaluate_command, translate_command):
        monkeypatch.setattr(module, "DecodingOptions", lambda: DecodingOptions(
            beam_size=7, alpha=0.25, max_extra_length=9))
    monkeypatch.setattr(names, "EXPORT_ROOT", "elsewhere")
    changed = _decoding_flags()
    assert changed["export --export-dir"][0] == "elsewhere"
    assert changed["export --export-dir"][1].startswith("base folder (default elsewhere): ")
    assert {flag: value for flag, value in changed.items() if flag != "export --export-dir"} == {
        "export --beam-size": (None, "saved_model: of serving_default (default the run's "
                                     "settings.json, else 7)"),
        "export --alpha": (None, "saved_model: length penalty (default the run's "
                                 "settings.json, else 0.25)"),
        "export --max-extra-length": (None, "saved_model: outputs have at most source length "
                                            "+ this many ids (default the run's "
                                            "settings.json, else 9)"),
        "evaluate --beam-sizes": (None, "1 = greedy (default the run's settings.json, else 7)"),
        "evaluate --alpha": (None, "length penalty (default the run's settings.json, else "
                                   "0.25); several values give a row each (tune it on a "
                                   "validation split, not on the test set)"),
        "translate --beam-size": (None, "default the run's, else 7; 1 = greedy"),
        "translate --alpha": (None, "length-penalty strength (default the run's, else 0.25)"),
        "translate --max-extra-length": (None, "outputs have at most source length + this "
                                               "many ids (default the run's, else 9)"),
    }


def test_translate_command_picks_the_signature_by_its_names(monkeypatch):
    from keras_transformer.commands import translate as translate_command

    picked = []
    monkeypatch.setattr(translate_command, "resolve_model_dir", lambda path: path)
    monkeypatch.setattr(translate_command, "load_signature",
                        lambda model_dir, name: picked.append(name) or object())
    monkeypatch.setattr(translate_command, "signature_translate_fn", lambda signature: None)
    for greedy, expected in ((False, names.BEAM_SIGNATURE), (True, names.GREEDY_SIGNATURE)):
        args = argparse.Namespace(model="m", signature=None, greedy=greedy, scores=False)
        translate_command._load_saved_model(args)
        assert picked.pop() == expected


def _string_literals(tree):
    """The string constants of a module, docstrings left out."""
    docstrings = set()
    for node in ast.walk(tree):
        if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)):
            body = node.body
            if body and isinstance(body[0], ast.Expr) and isinstance(body[0].value, ast.Constant):
                docstrings.add(id(body[0].value))
    for node in ast.walk(tree):
        if isinstance(node, ast.Constant) and isinstance(node.value, str) \
                and id(node) not in docstrings:
            yield node


def test_no_other_module_writes_the_shared_names():
    found = []
    for path in sorted(PACKAGE.rglob("*.py")):
        if path.name == "names.py" and path.parent == PACKAGE:
            continue
        tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
        found += [f"{path.relative_to(PACKAGE.parent)}:{node.lineno}: {node.value!r}"
                  for node in _string_literals(tree) if node.value in SHARED_LITERALS]
    assert found == [], "use keras_transformer.names instead of:\n" + "\n".join(found)
    assert len(list(PACKAGE.rglob("*.py"))) > 30  # the walk saw the package
