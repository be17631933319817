"""The settings of a training run: one object, its flags, its config files.

`Settings` is the one place where a setting of the job is declared: its
default, its type, its section in a config file and its help text. The
`keras-transformer train` flags and the TOML sections are derived from it,
and so are the model flags (`--num-heads`, `--dropout`, ... one per field of
`TransformerConfig`).

Precedence, lowest first: the preset's defaults < the settings saved in the
run folder (re-running a folder continues it) < `--config FILE` < flags. A
setting that was given is never re-derived; the run folder keeps the
resolved values (`settings.json`) and refuses changes that cannot happen in
the middle of a run (preset, vocabulary, architecture), naming both values.

A config file (TOML, read with the standard library) for Table 3, row (A):

    [model]
    num_heads = 16
    key_dim = 32
    value_dim = 32

    [training]
    train_steps = 100000
"""

import argparse
import dataclasses
import pathlib
import tomllib
from typing import Optional

from keras_transformer import names
from keras_transformer.model.config import DecodingOptions, TransformerConfig

SECTIONS = ("run", "data", "model", "training", "decoding", "export")

# Job settings that depend on the preset when not given. The paper's presets
# reproduce the paper (WMT14, 100k updates of 25,000 tokens for base, 300k
# for big); the CPU presets are sized for the offline demo and for Multi30k
# on 2 cores.
PRESET_DEFAULTS = {
    "base": dict(train_steps=100_000, tokens_per_batch=25_000, vocab_size=37_000,
                 max_length=256, checkpoint_every=1000, average_last=5, log_every=100),
    "big": dict(train_steps=300_000, tokens_per_batch=25_000, vocab_size=37_000,
                max_length=256, checkpoint_every=1000, average_last=20, log_every=100),
    # small: sized for Multi30k on a CPU (its training speed: docs/results.md).
    "small": dict(train_steps=2_400, tokens_per_batch=4096, vocab_size=8000,
                  max_length=128, checkpoint_every=200, average_last=5, log_every=25),
    "tiny": dict(train_steps=500, tokens_per_batch=3072, vocab_size=4000,
                 max_length=96, checkpoint_every=100, average_last=3, log_every=20),
}

# Model fields that change the shapes of the weights (or the vocabulary):
# they cannot change in the middle of a run.
ARCHITECTURE_FIELDS = ("num_layers", "d_model", "num_heads", "key_dim", "value_dim", "d_ff",
                       "share_embeddings", "tie_output_embeddings", "position_embedding",
                       "norm_first")
# TransformerConfig fields the job owns (from the tokenizer and the data
# settings); not settable as model overrides.
_JOB_OWNED_MODEL_FIELDS = ("vocab_size", "max_length", "pad_id", "bos_id", "eos_id", "unk_id")
FIXED_SETTINGS = ("preset", "vocab_size", "max_length")


class SettingsError(ValueError):
    """A setting, flag or config file that cannot be used; the message names it."""


def _field(default, section, help, choices=None, flag=True):
    return dataclasses.field(default=default, metadata=dict(
        section=section, help=help, choices=choices, flag=flag))


@dataclasses.dataclass
class Settings:
    """Everything `keras-transformer train` needs. See the module docstring."""

    # [run]
    output_dir: Optional[str] = _field(
        None, "run", "the run folder (default: runs/<data>_<preset>); re-running a "
        "folder continues it")
    preset: str = _field("base", "run", "model and job preset",
                         choices=tuple(sorted(PRESET_DEFAULTS)))
    init_from: Optional[str] = _field(
        None, "run", "fine-tune: start from the weights of this run folder or "
        ".weights.h5 file, with a fresh optimizer and schedule")
    seed: int = _field(0, "run", "random seed (weights, data order, demo corpus)")
    verbose: int = _field(1, "run", "0: warnings only, 1: progress lines, 2: also "
                          "TensorFlow's own log", choices=(0, 1, 2))
    distribute: str = _field("auto", "run", "auto: all local GPUs; mirrored, "
                             "multiworker (TF_CONFIG) or none",
                             choices=("auto", "none", "mirrored", "multiworker"))
    mixed_precision: str = _field(
        "auto", "run", "dtype policy of training: none (float32), mixed_bfloat16, "
        "mixed_float16, or auto: mixed_bfloat16 where the CPU (avx512_bf16, amx_bf16) or GPU "
        "has bf16 units the backend uses, else float32 (keras_transformer.model.precision)",
        choices=("auto", "none", "mixed_bfloat16", "mixed_float16"))
    jit_compile: str = _field("auto", "run", "XLA for the train step",
                              choices=("auto", "true", "false"))
    # [data]
    data: str = _field("wmt14", "data", "wmt14 (tensorflow-datasets), demo (generated "
                       "offline), or a folder with {train,valid,test}.{en,de}")
    vocab_size: Optional[int] = _field(None, "data", "shared SentencePiece vocabulary "
                                       "(preset default)")
    max_length: Optional[int] = _field(None, "data", "longest sequence in tokens, "
                                       "BOS/EOS included (preset default)")
    prepared_dir: Optional[str] = _field(
        None, "data", "where --data is prepared (vocabulary, token-id shards, manifest) "
        "and reused; default runs/prepared/<corpus>_v<vocab-size> in the working directory, "
        "whatever --output-dir is; `prepare --prepared-dir` names the same folder")
    subword_sampling: float = _field(
        0.0, "data", "train on sampled segmentations (BPE-dropout: each merge skipped "
        "with this probability, 0.1 is usual), a different one each epoch; validation, "
        "test and export keep the best one. 0: off (keras_transformer.data.sampling)")
    sampling_sides: str = _field(
        "both", "data", "the sides --subword-sampling samples: both, or source (the "
        "target keeps the best segmentation, the one the decoder must produce)",
        choices=("both", "source"))
    sampling_views: int = _field(
        32, "data", "sampled segmentations written (epoch e reads number e mod this); "
        "each takes the training shards' space")
    # [training]
    train_steps: Optional[int] = _field(None, "training", "optimizer updates in total; "
                                        "raise it to continue a finished run")
    tokens_per_batch: Optional[int] = _field(
        None, "training", "tokens per optimizer update (padding included, per side), "
        "whatever the device count and --grad-accum-steps; the paper: 25000")
    bucket_multiple: int = _field(
        8, "training", "batch lengths (the length buckets' bounds) are multiples of this: "
        "8 suits accelerators; 2 pads less on a CPU (more of each batch's slots hold tokens; "
        "figures in docs/results.md), with more batch shapes to trace or compile")
    grad_accum_steps: int = _field(1, "training", "micro-batches per update (the "
                                   "micro-batch is tokens-per-batch / this)")
    learning_rate_factor: float = _field(1.0, "training", "multiplies the paper's "
                                         "learning-rate schedule")
    lr_decay: str = _field(
        "inverse_sqrt", "training", "after the warm-up: inverse_sqrt (the paper's "
        "equation 3) or linear, from the same peak to zero at --train-steps (a fixed "
        "budget, so a run continues only to its own --train-steps)",
        choices=("inverse_sqrt", "linear"))
    checkpoint_every: Optional[int] = _field(None, "training", "updates between "
                                             "checkpoints (kept for averaging)")
    average_last: Optional[int] = _field(None, "training", "checkpoints kept and "
                                         "averaged at the end")
    final_weights: str = _field("averaged", "training", "the weights of model.keras: "
                                "averaged (last K checkpoints, the paper), best "
                                "(validation BLEU) or last", choices=("averaged", "best",
                                                                     "last"))
    backup_minutes: float = _field(10.0, "training", "wall-clock minutes between "
                                   "backups (also one at every checkpoint); 0: only "
                                   "at checkpoints")
    divergence_check: bool = _field(
        True, "training", "stop when the loss diverges: 3 log rows in a row above "
        "2 x ln(vocabulary size); a non-finite loss always stops")
    log_every: Optional[int] = _field(None, "training", "updates between log lines and "
                                      "log rows (preset default)")
    validate_every: Optional[int] = _field(None, "training", "updates between validation "
                                           "loss and BLEU (default: checkpoint-every)")
    validation_bleu_sentences: int = _field(
        200, "training", "validation sentences translated greedily for the BLEU "
        "measured during training (0: none)")
    # [decoding]
    beam_size: int = _field(DecodingOptions.beam_size, "decoding",
                            "beam size of the final test (1: greedy)")
    alpha: float = _field(DecodingOptions.alpha, "decoding", "length penalty of beam search")
    max_extra_length: int = _field(DecodingOptions.max_extra_length, "decoding",
                                   "a translation has at most source length + this many "
                                   "tokens")
    eval_sentences: Optional[int] = _field(None, "decoding", "score only the first N "
                                           "test sentences")
    eval_split: str = _field("test", "decoding", "the split the finished run is scored "
                             "on: test, or valid for a recipe search that must not "
                             "see the test set", choices=("test", "valid"))
    # [export]
    export_dir: str = _field(names.EXPORT_ROOT, "export", "TF Serving base folder "
                             "(<dir>/<model-name>/<version>); '' to skip the export")
    model_name: Optional[str] = _field(None, "export", "name of the served model "
                                       "(default: the run folder's name)")
    # [model]: TransformerConfig overrides, e.g. {"num_heads": 16, "key_dim": 32}.
    model: dict = dataclasses.field(default_factory=dict, metadata=dict(
        section="model", help="TransformerConfig overrides", flag=False))

    def __post_init__(self):
        self.check()

    # --- checks ----------------------------------------------------------------

    def check(self):
        """Raises `SettingsError` naming the first bad value."""
        for f in dataclasses.fields(self):
            choices = f.metadata.get("choices")
            value = getattr(self, f.name)
            if choices and value not in choices:
                raise SettingsError(f"{flag(f.name)} must be one of {', '.join(map(str, choices))}, "
                                    f"received {value!r}")
        for name in ("train_steps", "tokens_per_batch", "vocab_size", "max_length",
                     "checkpoint_every", "average_last", "grad_accum_steps", "log_every",
                     "bucket_multiple", "sampling_views",
                     "validate_every", "eval_sentences"):
            value = getattr(self, name)
            if value is not None and (not isinstance(value, int) or isinstance(value, bool)
                                      or value < 1):
                raise SettingsError(f"{flag(name)} must be a positive integer, "
                                    f"received {value!r}")
        for name in ("beam_size", "alpha", "max_extra_length"):
            try:
                DecodingOptions.check(name, getattr(self, name), label=flag(name))
            except ValueError as error:
                raise SettingsError(str(error)) from None
        for name in ("learning_rate_factor", "backup_minutes"):
            value = getattr(self, name)
            if not isinstance(value, (int, float)) or isinstance(value, bool) or value < 0 \
                    or (name == "learning_rate_factor" and value == 0):
                raise SettingsError(f"{flag(name)} must be a {'positive' if name == 'learning_rate_factor' else 'non-negative'} "
                                    f"number, received {value!r}")
        value = self.subword_sampling
        if isinstance(value, bool) or not isinstance(value, (int, float)) \
                or not 0 <= value < 1:
            raise SettingsError("--subword-sampling must be a number from 0 (off) to below "
                                f"1 (0.1 is usual), received {value!r}")
        if not isinstance(self.divergence_check, bool):
            raise SettingsError("--divergence-check must be true or false, received "
                                f"{self.divergence_check!r}")
        if self.validation_bleu_sentences < 0:
            raise SettingsError("--validation-bleu-sentences must be >= 0, received "
                                f"{self.validation_bleu_sentences}")
        model_fields = {f.name for f in dataclasses.fields(TransformerConfig)}
        for name in self.model:
            if name in _JOB_OWNED_MODEL_FIELDS:
                raise SettingsError(
                    f"model setting {name!r} is set by the job ({flag(name)} or the "
                    "tokenizer), not as a model override")
            if name not in model_fields:
                raise SettingsError(
                    f"unknown model setting {name!r}; valid: "
                    f"{', '.join(sorted(model_fields - set(_JOB_OWNED_MODEL_FIELDS)))}")
        return self

    # --- derived values --------------------------------------------------------

    def with_preset_defaults(self):
        """A copy whose unset settings take the preset's values."""
        values = {}
        for name, value in PRESET_DEFAULTS[self.preset].items():
            if getattr(self, name) is None:
                values[name] = value
        if self.validate_every is None:
            values["validate_every"] = values.get("checkpoint_every", self.checkpoint_every)
        if self.output_dir is None:
            values["output_dir"] = default_run_dir(self.data, self.preset)
        return dataclasses.replace(self, **values)

    def model_config(self, vocab_size=None):
        """The run's `TransformerConfig`: the preset, the overrides, the job's sizes."""
        try:
            return TransformerConfig.preset(
                self.preset, vocab_size=vocab_size or self.vocab_size,
                max_length=self.max_length, **self.model)
        except (ValueError, TypeError) as error:
            raise SettingsError(f"model settings {self.model}: {error}") from None

    def decoding_options(self):
        """The run's `DecodingOptions` (the `[decoding]` section)."""
        return DecodingOptions(beam_size=self.beam_size, alpha=self.alpha,
                               max_extra_length=self.max_extra_length)

    def to_dict(self):
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, values, source="settings"):
        known = {f.name for f in dataclasses.fields(cls)}
        unknown = sorted(set(values) - known)
        if unknown:
            raise SettingsError(f"{source}: unknown setting(s) {unknown}")
        return cls(**values)


def default_run_dir(data, preset):
    """`runs/<corpus name>_<preset>` (`names.RUNS_ROOT`)."""
    name = data if data in ("wmt14", "demo") else str(data).rstrip("/").split("/")[-1]
    return f"{names.RUNS_ROOT}/{name}_{preset}"


def flag(name):
    """The command-line flag of a setting or option name: `beam_size` -> `--beam-size`."""
    return "--" + name.replace("_", "-")


def job_fields():
    """The `Settings` fields that have a flag."""
    return [f for f in dataclasses.fields(Settings) if f.metadata.get("flag", True)]


def model_fields():
    """The `TransformerConfig` fields settable as model overrides."""
    return [f for f in dataclasses.fields(TransformerConfig)
            if f.name not in _JOB_OWNED_MODEL_FIELDS]


def _parse_bool(text):
    lowered = str(text).lower()
    if lowered in ("true", "1", "yes"):
        return True
    if lowered in ("false", "0", "no"):
        return False
    raise argparse.ArgumentTypeError(f"expected true or false, received {text!r}")


def _type_of(annotation, default):
    text = str(annotation)
    if annotation is bool or "bool" in text:
        return _parse_bool
    if annotation is int or "int" in text:
        return int
    if annotation is float or "float" in text:
        return float
    return str


# --- flags -------------------------------------------------------------------------


def add_arguments(parser):
    """Adds one flag per setting and per model field, plus `--config`.

    Every flag defaults to "not given" (`argparse.SUPPRESS`), so that
    `settings_from_args` can tell a given value from a default.
    """
    parser.add_argument("--config", metavar="FILE", default=argparse.SUPPRESS,
                        help="a TOML file of settings ([run], [data], [model], "
                             "[training], [decoding], [export]); flags override it")
    groups = {}
    for f in job_fields():
        section = f.metadata["section"]
        if section not in groups:
            groups[section] = parser.add_argument_group(f"{section} settings")
        default = f.default
        shown = f" (default {default})" if default not in (None, "") else ""
        groups[section].add_argument(
            flag(f.name), dest=f.name, default=argparse.SUPPRESS,
            type=_type_of(f.type, default), choices=f.metadata.get("choices"),
            # argparse %-formats help texts: a literal "%" is written "%%".
            help=(f.metadata["help"] + shown).replace("%", "%%"))
        if _type_of(f.type, default) is _parse_bool:
            groups[section].add_argument(
                "--no-" + flag(f.name)[2:], dest=f.name, action="store_const", const=False,
                default=argparse.SUPPRESS, help=f"the same as {flag(f.name)} false")
    group = parser.add_argument_group(
        "model settings", "override any TransformerConfig field of the preset "
        "(Table 3 rows: --num-heads 16 --key-dim 32 --value-dim 32)")
    for f in model_fields():
        group.add_argument(flag(f.name), dest=f"model.{f.name}", default=argparse.SUPPRESS,
                           type=_type_of(f.type, f.default),
                           help=f"TransformerConfig.{f.name}")
    return parser


def given_from_args(args):
    """`(job_values, model_values, config_file)` given on the command line."""
    given = dict(vars(args))
    config_file = given.pop("config", None)
    model = {k[len("model."):]: v for k, v in given.items() if k.startswith("model.")}
    job_names = {f.name for f in job_fields()}
    job = {k: v for k, v in given.items() if k in job_names}
    return job, model, config_file


def read_config_file(path):
    """`(job_values, model_values)` of a TOML config file; raises `SettingsError`."""
    path = pathlib.Path(path)
    if not path.is_file():
        raise SettingsError(f"--config {path} does not exist")
    try:
        document = tomllib.loads(path.read_text())
    except (tomllib.TOMLDecodeError, UnicodeDecodeError) as error:
        raise SettingsError(f"--config {path} is not valid TOML: {error}") from None
    sections = {f.name: f.metadata["section"] for f in job_fields()}
    model_names = {f.name for f in model_fields()}
    job, model = {}, {}
    for section, values in document.items():
        if section not in SECTIONS or not isinstance(values, dict):
            raise SettingsError(f"{path}: unknown section [{section}]; sections are "
                                f"{', '.join(f'[{s}]' for s in SECTIONS)}")
        for name, value in values.items():
            if section == "model":
                if name not in model_names:
                    raise SettingsError(
                        f"{path}: [model] {name} is not a TransformerConfig field one can "
                        f"set; valid: {', '.join(sorted(model_names))}")
                model[name] = value
                continue
            if name not in sections:
                hint = " (a [model] field)" if name in model_names else ""
                raise SettingsError(f"{path}: unknown setting {name!r} in [{section}]{hint}")
            if sections[name] != section:
                raise SettingsError(f"{path}: {name} belongs in [{sections[name]}], "
                                    f"not [{section}]")
            job[name] = value
    return job, model


def merge_settings(given=None, given_model=None, config_file=None, saved=None):
    """The run's settings from the command line, a config file and a saved run.

    Args:
        given: job settings given as flags (`{name: value}`).
        given_model: model overrides given as flags.
        config_file: a TOML file path, or None.
        saved: the `Settings.to_dict()` a run folder holds, or None. It replaces
            the dataclass defaults, so re-running a folder continues it with
            the same settings.

    Returns:
        `Settings` with the preset's defaults filled in.

    Raises:
        SettingsError: a bad value, or a change a run cannot take midway.
    """
    given, given_model = dict(given or {}), dict(given_model or {})
    file_job, file_model = read_config_file(config_file) if config_file else ({}, {})
    values = dict(saved) if saved else {}
    model = dict(values.pop("model", {}) or {})
    values.update(file_job)
    values.update(given)
    model.update(file_model)
    model.update(given_model)
    try:
        settings = Settings.from_dict(dict(values, model=model))
    except TypeError as error:
        raise SettingsError(str(error)) from None
    settings = settings.with_preset_defaults()
    if saved:
        check_unchanged(Settings.from_dict(saved), settings)
    return settings


def load_settings(given=None, given_model=None, config_file=None):
    """The settings of a `train` invocation, continuing the run folder's saved ones.

    The run folder is `output_dir` as given (flag or config file), else
    `runs/<data>_<preset>`; when it holds `settings.json`, those values
    are the defaults that the config file and the flags override.
    """
    from keras_transformer import runs
    from keras_transformer.data import prepared

    given = dict(given or {})
    file_job = read_config_file(config_file)[0] if config_file else {}
    merged = {**file_job, **given}
    output_dir = merged.get("output_dir")
    if output_dir is None:
        defaults = Settings.__dataclass_fields__
        output_dir = default_run_dir(merged.get("data", defaults["data"].default),
                                        merged.get("preset", defaults["preset"].default))
        given["output_dir"] = output_dir
    run = runs.RunFolder(output_dir)
    saved = run.read_json(runs.SETTINGS_FILE)
    if saved is not None:
        try:
            merge_settings(saved=saved)
        except (SettingsError, TypeError, ValueError) as error:
            raise runs.RunError(f"{run.settings_file} is damaged: {error}; restore it, or "
                                "start a new --output-dir") from None
    data = merged.get("data") or (saved or {}).get("data")
    if data and "vocab_size" not in merged and prepared.is_prepared(data):
        # A prepared corpus brings its vocabulary.
        given["vocab_size"] = prepared.PreparedCorpus(data).vocab_size
    return merge_settings(given, given_model, config_file, saved=saved)


def check_unchanged(saved, new):
    """Raises `SettingsError` when `new` changes what a run cannot change midway."""
    old_config, new_config = saved.model_config(), new.model_config()
    changes = [(flag(name), getattr(saved, name), getattr(new, name))
               for name in FIXED_SETTINGS]
    changes += [(f"model setting {name}", getattr(old_config, name), getattr(new_config, name))
                for name in ARCHITECTURE_FIELDS]
    for label, old_value, new_value in changes:
        if old_value != new_value:
            raise SettingsError(
                f"{label} cannot change in the middle of a run: {saved.output_dir} was "
                f"trained with {old_value!r}, this command asks for {new_value!r}. Use "
                "another --output-dir (with --init-from to start from this run's weights)")


def markdown_table():
    """The table of `train` settings (docs/training.md): flag, config section, default, meaning."""
    lines = ["| flag | config file | default | meaning |", "|---|---|---|---|"]
    for f in job_fields():
        default = f.default
        if f.name in PRESET_DEFAULTS["base"]:
            default = "preset"
        elif default is None:
            default = "-"
        elif default == "":
            default = "''"
        meaning = f.metadata["help"].replace("<", "&lt;").replace(">", "&gt;")
        lines.append(f"| `{flag(f.name)}` | `[{f.metadata['section']}] {f.name}` | "
                     f"{default} | {meaning} |")
    lines.append("| `--<model field>` | `[model] <field>` | preset | any TransformerConfig "
                 f"field: {', '.join(f'`{flag(m.name)}`' for m in model_fields())} |")
    lines.append("| `--config FILE` | | | a TOML file of the settings above |")
    return "\n".join(lines)

