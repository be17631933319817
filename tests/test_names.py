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


def test_quantize_choices_of_the_commands_are_the_names_tuples():
    from keras_transformer.commands import export as export_command

    assert tuple(_option(_subcommand("export"), "--quantize").choices) \
        == names.CTRANSLATE2_QUANTIZATIONS
    assert export_command.SAVED_MODEL_QUANTIZATIONS == names.KERAS_QUANTIZATIONS
    for command in ("evaluate", "translate"):
        assert tuple(_option(_subcommand(command), "--quantize").choices) \
            == names.KERAS_QUANTIZATIONS
    # A SavedModel's modes are among the flag's choices (one flag for both formats).
    assert set(names.KERAS_QUANTIZATIONS) <= set(names.CTRANSLATE2_QUANTIZATIONS)


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


def test_defaults_come_from_names_and_decoding_options():
    from keras_transformer.training.settings import Settings

    decoding = DecodingOptions()
    export_parser = _subcommand("export")
    assert _option(export_parser, "--export-dir").default == names.EXPORT_ROOT
    assert Settings.__dataclass_fields__["export_dir"].default == names.EXPORT_ROOT
    assert f"(default {decoding.beam_size})" in _option(export_parser, "--beam-size").help
    assert f"(default {decoding.alpha:g})" in _option(export_parser, "--alpha").help
    assert str(decoding.max_extra_length) in _option(export_parser, "--max-extra-length").help
    evaluate_parser = _subcommand("evaluate")
    assert _option(evaluate_parser, "--beam-sizes").default == [decoding.beam_size]
    assert f"(default {decoding.alpha:g})" in _option(evaluate_parser, "--alpha").help
    translate_parser = _subcommand("translate")
    assert f"default {decoding.beam_size};" in _option(translate_parser, "--beam-size").help
    assert f"(default {decoding.alpha:g})" in _option(translate_parser, "--alpha").help
    assert f"(default {decoding.max_extra_length})" in _option(
        translate_parser, "--max-extra-length").help


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
