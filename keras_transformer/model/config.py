"""One configuration object for the whole model, with the paper's presets.

`TransformerConfig` holds every hyper-parameter of Vaswani et al. (2017) that
the model, the loss and the learning-rate schedule need, so that the example
script, the tests and the benchmarks share one source of truth, and
`DecodingOptions` does the same for decoding (beam size, length penalty,
length limit), with `length_penalty`, the one definition of GNMT's length
normalisation. It imports no Keras: data and export code can read it without
building anything.
"""

import dataclasses
from typing import Optional

POSITION_KINDS = ("sinusoidal", "learned")


@dataclasses.dataclass(frozen=True)
class TransformerConfig:
    """Hyper-parameters of an encoder-decoder Transformer.

    Field names follow the paper where it names them: `num_layers` is N,
    `d_model`, `num_heads` is h, `key_dim` is d_k, `value_dim` is d_v, `d_ff`,
    `dropout` is P_drop, `label_smoothing` is epsilon_ls.

    Args:
        vocab_size: size of the shared source-target subword vocabulary.
        num_layers: N, the number of layers in the encoder and in the decoder.
        d_model: width of every sub-layer output and of the embeddings.
        num_heads: h, the number of attention heads.
        key_dim: d_k, per-head query/key size. `None` means d_model // h.
        value_dim: d_v, per-head value size. `None` means `key_dim`.
        d_ff: inner size of the position-wise feed-forward networks.
        dropout: P_drop, applied to each sub-layer output before the residual
            addition and to the sums of embeddings and positional encodings.
        attention_dropout: dropout on attention weights (0 in the paper).
        activation_dropout: dropout after the feed-forward ReLU (0 in the paper).
        label_smoothing: epsilon_ls of the training loss.
        warmup_steps: warm-up of the learning-rate schedule, equation (3).
        max_length: longest sequence (in subword tokens, BOS/EOS included)
            the model is meant for; the size of the learned position table.
        share_embeddings: one embedding matrix for source and target tokens.
        tie_output_embeddings: the pre-softmax projection is the transposed
            target embedding matrix (section 3.4).
        position_embedding: `"sinusoidal"` (the paper) or `"learned"`
            (Table 3, row E).
        norm_first: `False` is the paper's post-norm,
            LayerNorm(x + Dropout(Sublayer(x))); `True` is pre-norm,
            x + Dropout(Sublayer(LayerNorm(x))) with a final LayerNorm.
        layer_norm_epsilon: epsilon of every LayerNormalization.
        pad_id: the padding id, shared with the tokenizer; it must be 0.
        bos_id: the begin-of-sentence id, shared with the tokenizer.
        eos_id: the end-of-sentence id, shared with the tokenizer.
        unk_id: the unknown-piece id, shared with the tokenizer.

    Example:

    >>> config = TransformerConfig.preset("base", vocab_size=37000)
    >>> config.key_dim
    64
    >>> TransformerConfig.preset("base", num_heads=1, key_dim=512).value_dim
    512
    """

    vocab_size: int = 37000
    num_layers: int = 6
    d_model: int = 512
    num_heads: int = 8
    key_dim: Optional[int] = None
    value_dim: Optional[int] = None
    d_ff: int = 2048
    dropout: float = 0.1
    attention_dropout: float = 0.0
    activation_dropout: float = 0.0
    label_smoothing: float = 0.1
    warmup_steps: int = 4000
    max_length: int = 256
    share_embeddings: bool = True
    tie_output_embeddings: bool = True
    position_embedding: str = "sinusoidal"
    norm_first: bool = False
    layer_norm_epsilon: float = 1e-6
    pad_id: int = 0
    bos_id: int = 1
    eos_id: int = 2
    unk_id: int = 3

    def __post_init__(self):
        for name in ("vocab_size", "num_layers", "d_model", "num_heads", "d_ff",
                     "warmup_steps", "max_length"):
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or value < 1:
                raise ValueError(
                    f"TransformerConfig.{name} must be a positive integer, "
                    f"received {name}={value!r}"
                )
        # Which of key_dim/value_dim were derived (passed as None) rather than
        # given: `replace` re-derives only these. A plain private attribute, not
        # a dataclass field, so that it stays out of __init__, equality, hashing,
        # repr, `to_dict`, `dataclasses.asdict` and `dataclasses.fields` (which
        # other code turns into settings and command-line flags).
        object.__setattr__(self, "_derived", frozenset(
            name for name in ("key_dim", "value_dim") if getattr(self, name) is None
        ))
        if self.key_dim is None:
            if self.d_model % self.num_heads:
                raise ValueError(
                    "d_model must be divisible by num_heads when key_dim is not "
                    f"given; received d_model={self.d_model}, "
                    f"num_heads={self.num_heads}"
                )
            object.__setattr__(self, "key_dim", self.d_model // self.num_heads)
        if self.value_dim is None:
            object.__setattr__(self, "value_dim", self.key_dim)
        for name in ("key_dim", "value_dim"):
            value = getattr(self, name)
            if not isinstance(value, int) or value < 1:
                raise ValueError(
                    f"TransformerConfig.{name} must be a positive integer, "
                    f"received {name}={value!r}"
                )
        for name in ("dropout", "attention_dropout", "activation_dropout",
                     "label_smoothing"):
            value = getattr(self, name)
            if not 0.0 <= value < 1.0:
                raise ValueError(
                    f"TransformerConfig.{name} must be in [0, 1), "
                    f"received {name}={value!r}"
                )
        if self.position_embedding not in POSITION_KINDS:
            raise ValueError(
                f"position_embedding must be one of {POSITION_KINDS}, "
                f"received {self.position_embedding!r}"
            )
        if self.pad_id != 0:
            raise ValueError(
                f"pad_id must be 0 (the model's masks assume it), "
                f"received pad_id={self.pad_id}"
            )
        ids = {"pad_id": self.pad_id, "bos_id": self.bos_id,
               "eos_id": self.eos_id, "unk_id": self.unk_id}
        if len(set(ids.values())) != len(ids):
            raise ValueError(f"special token ids must be distinct, received {ids}")
        for name, value in ids.items():
            if not 0 <= value < self.vocab_size:
                raise ValueError(
                    f"{name}={value} is outside the vocabulary "
                    f"(vocab_size={self.vocab_size})"
                )

    # --- presets -------------------------------------------------------------

    @classmethod
    def preset(cls, name: str, **overrides) -> "TransformerConfig":
        """Returns a preset, with any field overridden by keyword.

        `"base"` and `"big"` are the two models of Table 3. `"tiny"` and
        `"small"` are CPU-sized models with the base model's recipe. Any row of
        Table 3 is the base preset with overrides, e.g. row (A)
        `preset("base", num_heads=16, key_dim=32)`, row (E)
        `preset("base", position_embedding="learned")`.

        Args:
            name: a key of `PRESETS`: `"base"`, `"big"`, `"small"` or `"tiny"`.
            **overrides: fields to change.
        """
        if name not in PRESETS:
            raise ValueError(
                f"Unknown preset {name!r}; available presets: {sorted(PRESETS)}"
            )
        cls._check_field_names(overrides)
        values = dict(PRESETS[name])
        values.update(overrides)
        return cls(**values)

    def replace(self, **changes) -> "TransformerConfig":
        """Returns a copy with `changes` applied.

        A key_dim/value_dim that was derived (left `None` at construction) is
        derived again from the new d_model/num_heads/key_dim; one that was
        given explicitly keeps its value unless `changes` names it.
        """
        self._check_field_names(changes)
        values = self.to_dict()
        for name in self._derived:
            if name not in changes:
                values[name] = None
        values.update(changes)
        return type(self)(**values)

    def to_dict(self) -> dict:
        """The init fields with their resolved values (key_dim/value_dim ints)."""
        return {
            f.name: getattr(self, f.name) for f in dataclasses.fields(self) if f.init
        }

    @classmethod
    def _init_field_names(cls) -> set:
        return {f.name for f in dataclasses.fields(cls) if f.init}

    @classmethod
    def _check_field_names(cls, names):
        fields = cls._init_field_names()
        unknown = sorted(set(names) - fields)
        if unknown:
            raise ValueError(
                f"Unknown TransformerConfig field(s) {unknown}; "
                f"valid fields: {sorted(fields)}"
            )

    @classmethod
    def from_dict(cls, values: dict) -> "TransformerConfig":
        fields = cls._init_field_names()
        unknown = sorted(set(values) - fields)
        if unknown:
            raise ValueError(f"Unknown TransformerConfig field(s) {unknown}")
        return cls(**values)

    # --- derived quantities --------------------------------------------------

    def num_parameters(self) -> int:
        """Trainable parameters of `build_model(self)`, counted analytically."""
        d, dff, V = self.d_model, self.d_ff, self.vocab_size
        h, dk, dv = self.num_heads, self.key_dim, self.value_dim
        attention = 2 * (d * h * dk + h * dk) + (d * h * dv + h * dv) + (h * dv * d + d)
        ffn = (d * dff + dff) + (dff * d + d)
        norm = 2 * d
        encoder_layer = attention + ffn + 2 * norm
        decoder_layer = 2 * attention + ffn + 3 * norm
        n_embeddings = 1 if self.share_embeddings else 2
        embeddings = n_embeddings * V * d
        output = 0 if self.tie_output_embeddings else V * d + V
        positions = 0
        if self.position_embedding == "learned":
            positions = 2 * self.max_length * d
        final_norms = 2 * norm if self.norm_first else 0
        return (
            embeddings + positions + output + final_norms
            + self.num_layers * (encoder_layer + decoder_layer)
        )


# Table 3 of the paper. Both models use warm-up 4000, epsilon_ls 0.1, Adam
# (0.9, 0.98, 1e-9). The big model's P_drop is 0.3 for English-German.
PRESETS = {
    "base": dict(num_layers=6, d_model=512, num_heads=8, d_ff=2048, dropout=0.1,
                 label_smoothing=0.1, warmup_steps=4000),
    "big": dict(num_layers=6, d_model=1024, num_heads=16, d_ff=4096, dropout=0.3,
                label_smoothing=0.1, warmup_steps=4000),
    # CPU-sized models (parameter counts: docs/training.md). Shorter warm-up since
    # they train for thousands, not hundreds of thousands, of steps.
    "small": dict(num_layers=3, d_model=256, num_heads=4, d_ff=1024, dropout=0.1,
                  label_smoothing=0.1, warmup_steps=1000, vocab_size=8000),
    "tiny": dict(num_layers=2, d_model=128, num_heads=4, d_ff=512, dropout=0.1,
                 label_smoothing=0.1, warmup_steps=400, vocab_size=4000),
}


# The smallest value of each decoding argument (`DecodingOptions.check`):
# alpha is a number, the others are integers.
_DECODING_MINIMUMS = {"beam_size": 1, "alpha": 0, "max_extra_length": 0, "min_length": 0}


@dataclasses.dataclass(frozen=True)
class DecodingOptions:
    """How to decode: the one place the decoding defaults live.

    `Translator`, the exported SavedModel, the CTranslate2 export and every
    command take their beam size, length penalty and length limit from an
    instance of this class; its defaults are the paper's (section 6.1).

    Args:
        beam_size: K, hypotheses kept per sentence; 1 is greedy decoding.
        alpha: strength of the length penalty `((5 + |Y|) / 6) ** alpha`;
            0 ranks by plain log-probability.
        max_extra_length: a translation has at most its source length (ids,
            EOS included) plus this many tokens.
        min_length: EOS is forbidden below this output length. For benchmarks
            that force a fixed output length; translation uses 0.

    Example:

    >>> DecodingOptions()
    DecodingOptions(beam_size=4, alpha=0.6, max_extra_length=50, min_length=0)
    >>> DecodingOptions().replace(beam_size=1).greedy
    True
    """

    beam_size: int = 4
    alpha: float = 0.6
    max_extra_length: int = 50
    min_length: int = 0

    def __post_init__(self):
        for name in _DECODING_MINIMUMS:
            self.check(name, getattr(self, name))
        object.__setattr__(self, "alpha", float(self.alpha))

    @staticmethod
    def check(name, value, label=None):
        """Raises `ValueError` unless `value` can be the decoding argument `name`.

        The one check of the decoding arguments: `DecodingOptions` runs it on
        each field, and the searches, `train`'s settings and the commands run
        it on the values they are given, each naming the value as its caller
        knows it. `beam_size` is an integer >= 1, `max_extra_length` and
        `min_length` integers >= 0, `alpha` a number >= 0.

        Args:
            name: `"beam_size"`, `"alpha"`, `"max_extra_length"` or
                `"min_length"`.
            value: the value to check.
            label: how the message names the value (default `name`); the
                commands and `train`'s settings pass their flag, e.g.
                `"--beam-size"`.

        Returns:
            `value`, unchanged.

        Raises:
            ValueError: one line naming `label` and the value, e.g.
                `--beam-size must be >= 1, received 0`.

        Example:

        >>> DecodingOptions.check("alpha", -1.0, label="--alpha")
        Traceback (most recent call last):
        ...
        ValueError: --alpha must be >= 0, received -1
        """
        label = label or name
        smallest = _DECODING_MINIMUMS[name]
        kind, types = ("a number", (int, float)) if name == "alpha" else ("an integer", int)
        if isinstance(value, bool) or not isinstance(value, types):
            raise ValueError(f"{label} must be {kind}, received {value!r}")
        if not value >= smallest:  # NaN too
            shown = f"{value:g}" if isinstance(value, float) else repr(value)
            raise ValueError(f"{label} must be >= {smallest}, received {shown}")
        return value

    @property
    def greedy(self):
        """Whether this is greedy decoding (`beam_size == 1`)."""
        return self.beam_size == 1

    def replace(self, **changes):
        """A copy with some fields changed; `None` values keep the current ones."""
        changes = {k: v for k, v in changes.items() if v is not None}
        return dataclasses.replace(self, **changes) if changes else self


def length_penalty(length, alpha):
    """GNMT's length normalisation lp(Y) = ((5 + |Y|) / 6) ** alpha.

    Beam search divides a hypothesis' summed log-probability by `lp(Y)`
    before comparing it with others (Wu et al., 2016, section 7). `|Y|` is
    the number of generated tokens, EOS included. The one definition of the
    formula: `keras_transformer.inference.decoding` calls it on tensors, the
    CTranslate2 translator on Python numbers. Plain arithmetic, so it takes
    Python numbers, NumPy arrays and float tensors of any backend alike
    (cast integer tensors to a float type first: `decoding` uses float32).

    Args:
        length: `|Y|`, a number, a NumPy array or a float tensor.
        alpha: the strength, a number; 0 disables normalisation, the paper
            uses 0.6.

    Returns:
        `lp(Y)`: a float for a number, otherwise of the type (and float
        dtype) of `length`.

    Example:

    >>> length_penalty(1, 0.6)
    1.0
    >>> length_penalty(7, 0.6) == 2.0 ** 0.6
    True
    """
    return ((5.0 + length) / 6.0) ** alpha
