"""Figures as PNG files: attention heat-maps per head, a run's training curves.

`plot_attention` draws figures 3-5 of the paper from a translation's
attention; `plot_training` draws a run's `training_log.csv` (the job writes
it to `training.png`). Both draw on their own matplotlib `Figure` (no
pyplot state) and write the PNG through `keras_transformer.files`.
"""

import csv
import io
import math
import pathlib

import numpy as np

from keras_transformer.files import write_bytes

_KINDS = {
    "cross": ("cross_attention", "target_tokens", "source_tokens",
              "encoder-decoder attention"),
    "encoder": ("encoder_self_attention", "source_tokens", "source_tokens",
                "encoder self-attention"),
    "decoder": ("decoder_self_attention", "target_tokens", "target_tokens",
                "decoder self-attention"),
}


def plot_attention(attention, path, *, kind="cross", layer=-1, heads=None,
                   query_tokens=None, key_tokens=None, columns=4, title=None,
                   cell_size=0.32, dpi=100):
    """Writes a PNG with one attention heat-map per head, tokens on the axes.

    Rows are queries, columns keys, and a cell's darkness is the weight a
    query gives a key. For encoder-decoder attention the rows are target
    tokens and the columns source tokens.

    Args:
        attention: one sentence's record from
            `Translator.translate(..., return_attention=True)` (a dict), or
            an array of weights `(num_heads, T_q, T_k)` or `(T_q, T_k)`.
        path: where to write the PNG (parent folders are created).
        kind: with a record, which attention: `"cross"` (encoder-decoder),
            `"encoder"` (encoder self-attention) or `"decoder"` (decoder
            self-attention).
        layer: with a record, the layer index (default the last one).
        heads: head indices to draw (default all).
        query_tokens: the query axis' labels (taken from the record when
            not given; a list of the right length for an array).
        key_tokens: the key axis' labels, likewise.
        columns: heads per row of the figure.
        title: figure title (default: the kind and layer).
        cell_size: inches per token on each axis.
        dpi: resolution.

    Returns:
        The `pathlib.Path` of the written PNG.

    Example:

    >>> translations, attention = translator.translate(["The cat sat."],
    ...                                                 return_attention=True)
    >>> plot_attention(attention[0], "cross.png", kind="cross", layer=-1)
    >>> plot_attention(attention[0], "encoder.png", kind="encoder", heads=[0, 1])
    """
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    if isinstance(attention, dict):
        if kind not in _KINDS:
            raise ValueError(f"kind must be one of {sorted(_KINDS)}, received {kind!r}")
        key, query_key, key_key, label = _KINDS[kind]
        weights = np.asarray(attention[key])
        if weights.ndim != 4:
            raise ValueError(
                f"attention[{key!r}] must have shape (num_layers, num_heads, T_q, T_k), "
                f"received shape {weights.shape}"
            )
        if not -weights.shape[0] <= layer < weights.shape[0]:
            raise ValueError(
                f"layer={layer} is out of range for {weights.shape[0]} layers"
            )
        num_layers = weights.shape[0]
        weights = weights[layer]
        query_tokens = attention[query_key] if query_tokens is None else query_tokens
        key_tokens = attention[key_key] if key_tokens is None else key_tokens
        title = title or f"{label}, layer {layer % num_layers + 1}"
    else:
        weights = np.asarray(attention)
        if weights.ndim == 2:
            weights = weights[None]
        if weights.ndim != 3:
            raise ValueError(
                "attention must be a record dict or weights of shape "
                f"(num_heads, T_q, T_k) or (T_q, T_k), received shape {weights.shape}"
            )
    weights = weights.astype("float32")
    num_heads, num_queries, num_keys = weights.shape
    query_tokens = (list(query_tokens) if query_tokens is not None
                    else [str(i) for i in range(num_queries)])
    key_tokens = (list(key_tokens) if key_tokens is not None
                  else [str(i) for i in range(num_keys)])
    if len(query_tokens) != num_queries or len(key_tokens) != num_keys:
        raise ValueError(
            f"weights of shape {weights.shape} need {num_queries} query tokens and "
            f"{num_keys} key tokens, received {len(query_tokens)} and {len(key_tokens)}"
        )
    heads = list(range(num_heads)) if heads is None else list(heads)
    for head in heads:
        if not 0 <= head < num_heads:
            raise ValueError(f"head {head} is out of range for {num_heads} heads")
    if not heads or num_queries == 0 or num_keys == 0:
        raise ValueError("nothing to plot: no heads or an empty sentence")

    columns = max(1, min(columns, len(heads)))
    rows = -(-len(heads) // columns)
    panel_width = max(2.0, cell_size * num_keys + 1.2)
    panel_height = max(2.0, cell_size * num_queries + 1.2)
    figure = Figure(figsize=(panel_width * columns, panel_height * rows + 0.6), dpi=dpi)
    FigureCanvasAgg(figure)
    axes = figure.subplots(rows, columns, squeeze=False)
    image = None
    for n, axis in enumerate(axes.flat):
        if n >= len(heads):
            axis.set_axis_off()
            continue
        image = axis.imshow(weights[heads[n]], cmap="viridis", vmin=0.0, vmax=1.0,
                            aspect="auto", interpolation="nearest")
        axis.set_title(f"head {heads[n] + 1}", fontsize=9)
        axis.set_xticks(range(num_keys))
        axis.set_xticklabels(key_tokens, rotation=90, fontsize=7)
        axis.set_yticks(range(num_queries))
        axis.set_yticklabels(query_tokens, fontsize=7)
    if title:
        figure.suptitle(title)
    figure.colorbar(image, ax=axes.ravel().tolist(), shrink=0.8)
    return _write_png(figure, pathlib.Path(path), "the attention plot", bbox_inches="tight")


def plot_training(log_csv, output_png):
    """Writes a PNG of the loss, the validation BLEU and the learning rate against updates.

    Args:
        log_csv: a run's `training_log.csv` (`keras_transformer.training.log
            .TrainingLog`: `step`, `loss`, `learning_rate` on every row;
            `val_loss`, `val_bleu` on the rows where validation ran). Logs
            of `keras.callbacks.CSVLogger` with `step` and `learning_rate`
            columns work too.
        output_png: the figure's path.

    Returns:
        `output_png`, or `None` when the log has no rows.

    Raises:
        files.WriteError: the PNG could not be written.
    """
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    with open(log_csv, newline="") as handle:
        rows = list(csv.DictReader(handle))
    if not rows:
        return None

    steps = [float(r["step"]) if r.get("step") else float(i + 1) for i, r in enumerate(rows)]

    def series(name):
        """(steps, values) of the rows that have a value in column `name`."""
        points = [(x, float(r[name])) for x, r in zip(steps, rows)
                  if r.get(name) not in (None, "") and math.isfinite(float(r[name]))]
        return [x for x, _ in points], [y for _, y in points]

    has_bleu = bool(series("val_bleu")[0])
    figure = Figure(figsize=(16 if has_bleu else 11, 4), dpi=100)
    FigureCanvasAgg(figure)
    axes = figure.subplots(1, 3 if has_bleu else 2)
    loss_axis, lr_axis = axes[0], axes[-1]
    loss_axis.plot(*series("loss"), label="training loss")
    if series("val_loss")[0]:
        loss_axis.plot(*series("val_loss"), marker="o", label="validation loss")
    loss_axis.set_xlabel("update")
    loss_axis.set_ylabel("label-smoothed cross-entropy per token")
    loss_axis.grid(alpha=0.3)
    loss_axis.legend()
    if has_bleu:
        axes[1].plot(*series("val_bleu"), marker="o", color="tab:red")
        axes[1].set_xlabel("update")
        axes[1].set_ylabel("validation BLEU (greedy, sample)")
        axes[1].grid(alpha=0.3)
    if series("learning_rate")[0]:
        lr_axis.plot(*series("learning_rate"), color="tab:green")
    lr_axis.set_xlabel("update")
    lr_axis.set_ylabel("learning rate")
    lr_axis.grid(alpha=0.3)
    figure.tight_layout()
    _write_png(figure, output_png, "the training plot", dpi=100)
    return output_png


def _write_png(figure, path, what, **options):
    """Renders `figure` as PNG in memory and writes it atomically (`files.write_bytes`)."""
    buffer = io.BytesIO()
    figure.savefig(buffer, format="png", **options)
    return write_bytes(path, buffer.getvalue(), what=f"writing {what} ({path})")
