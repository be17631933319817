"""Draws docs/images/pipeline.svg, the picture of docs/design.md.

The pipeline from text files to a served model, one box per stage, each
named by the package folder that holds it, with `commands/` (which drives
every stage) above and the shared top-level modules below. Plain Python
writing SVG text, so the picture renders offline (no Mermaid script from a
CDN) and on GitHub, and the same code always writes the same bytes:
tests/test_readme.py checks that the committed file is what `svg()` returns.

After changing the picture: `python docs/draw_pipeline.py`.
"""

import dataclasses
import pathlib
from xml.sax.saxutils import escape

OUTPUT = pathlib.Path(__file__).resolve().parent / "images" / "pipeline.svg"

WIDTH = 1080
MARGIN = 16
GAP = 36            # between the boxes of the pipeline row, room for an arrow
LINE = 17           # one line of text
TITLE = 22          # the title line of a box
FONT = "-apple-system, 'Segoe UI', Roboto, 'Helvetica Neue', Arial, sans-serif"
MONO = "'SFMono-Regular', Menlo, Consolas, 'DejaVu Sans Mono', monospace"
INK = "#1f2933"
ARROW = "#3e4c59"
CONNECTOR = "#8a96a3"
# fill, stroke: the input, a stage folder, commands/ and the top-level modules
INPUT = ("#f5f7fa", "#7b8794")
STAGE = ("#e8f0fe", "#3b6fd8")
DRIVER = ("#fff4e0", "#c08a2b")
SHARED = ("#eaf7ee", "#3f9a5b")


@dataclasses.dataclass(frozen=True)
class Box:
    """A rectangle with a title (a folder name in monospace) and lines under it."""

    x: int
    y: int
    w: int
    h: int
    title: str
    lines: tuple
    colors: tuple
    mono: bool = True

    @property
    def right(self):
        return self.x + self.w

    @property
    def bottom(self):
        return self.y + self.h

    @property
    def middle(self):
        return self.y + self.h // 2


def _text(x, y, text, *, anchor="middle", mono=False, bold=False, size=13):
    family = MONO if mono else FONT
    weight = ' font-weight="bold"' if bold else ""
    return (f'<text x="{x}" y="{y}" text-anchor="{anchor}" font-family="{family}" '
            f'font-size="{size}"{weight} fill="{INK}">{escape(text)}</text>')


def _box(box):
    """The rectangle, its title and its lines, the block centred vertically."""
    fill, stroke = box.colors
    parts = [f'<rect x="{box.x}" y="{box.y}" width="{box.w}" height="{box.h}" rx="8" '
             f'fill="{fill}" stroke="{stroke}" stroke-width="1.5"/>']
    # The block's top; a baseline sits about one font size below its line's top.
    top = box.y + (box.h - TITLE - LINE * len(box.lines)) // 2
    centre = box.x + box.w // 2
    parts.append(_text(centre, top + 15, box.title, mono=box.mono, bold=True, size=14))
    for i, line in enumerate(box.lines):
        parts.append(_text(centre, top + TITLE + 13 + i * LINE, line))
    return parts


def _bar(box, caption):
    """A full-width band: the title at the left, its caption after it, one line each."""
    fill, stroke = box.colors
    left = box.x + 16
    lines = [caption] if isinstance(caption, str) else list(caption)
    first = box.y + (box.h - LINE * (len(lines) + 1)) // 2 + 13
    parts = [f'<rect x="{box.x}" y="{box.y}" width="{box.w}" height="{box.h}" rx="8" '
             f'fill="{fill}" stroke="{stroke}" stroke-width="1.5"/>',
             _text(left, first, box.title, anchor="start", mono=True, bold=True, size=14)]
    for i, line in enumerate(lines, start=1):
        parts.append(_text(left, first + i * LINE, line, anchor="start"))
    return parts


def _arrow(x1, y1, x2, y2):
    return (f'<line x1="{x1}" y1="{y1}" x2="{x2}" y2="{y2}" stroke="{ARROW}" '
            f'stroke-width="1.8" marker-end="url(#flow)"/>')


def _connector(points):
    """A dashed line through `points` (an elbow where more than two), ending in a head."""
    path = " ".join(f"{'M' if i == 0 else 'L'}{x},{y}" for i, (x, y) in enumerate(points))
    return (f'<path d="{path}" fill="none" stroke="{CONNECTOR}" stroke-width="1.3" '
            f'stroke-dasharray="5 4" marker-end="url(#drive)"/>')


def svg():
    """The picture as SVG text (the same text on every call)."""
    top = Box(MARGIN, MARGIN, WIDTH - 2 * MARGIN, 58, "commands/", (), DRIVER)
    row_top = top.bottom + 44
    # The last column holds inference/ above export/; the pipeline row is
    # centred on it.
    side_h, side_gap = 104, 24
    row_mid = row_top + side_h + side_gap // 2
    main_h = 150
    main_y = row_mid - main_h // 2
    widths = (110, 196, 150, 190)
    x = MARGIN
    row = []
    specs = (
        ("text files", ("train, valid, test", ".en and .de"), INPUT, False),
        ("data/", ("prepare: a shared", "SentencePiece vocabulary,",
                   "token-id shards, manifest;", "a tf.data stream bucketed",
                   "by length, batches by", "token count"), STAGE, True),
        ("model/", ("the Transformer", "(layers, config),", "the loss,",
                    "the learning-rate", "schedule"), STAGE, True),
        ("training/", ("model.fit with the", "job's guard:", "checkpoints, backups,",
                       "averaging of the last K"), STAGE, True),
    )
    for width, (title, lines, colors, mono) in zip(widths, specs):
        row.append(Box(x, main_y, width, main_h, title, lines, colors, mono))
        x += width + GAP
    side_x, side_w = x + 16, WIDTH - MARGIN - 30 - (x + 16)
    inference = Box(side_x, row_top, side_w, side_h, "inference/",
                    ("cached greedy and", "beam search, Translator,", "sacreBLEU scores"),
                    STAGE)
    export = Box(side_x, row_top + side_h + side_gap, side_w, side_h, "export/",
                 ("SavedModel for", "TF Serving;", "CTranslate2"), STAGE)
    shared = Box(MARGIN, export.bottom + 36, WIDTH - 2 * MARGIN, 74,
                 "names.py, files.py, runs.py, run_vocabulary.py", (), SHARED)
    height = shared.bottom + MARGIN

    parts = [
        f'<svg xmlns="http://www.w3.org/2000/svg" width="{WIDTH}" height="{height}" '
        f'viewBox="0 0 {WIDTH} {height}" role="img" aria-labelledby="title desc">',
        '<title id="title">From text to a served model</title>',
        '<desc id="desc">text files, then data/ (prepare, tf.data), model/ (the '
        'Transformer, loss, schedule), training/ (model.fit, checkpoints, backups, '
        'averaging), then inference/ (decoding, Translator, sacreBLEU) and export/ '
        '(SavedModel, CTranslate2); commands/ drives every stage; names.py, files.py, '
        'runs.py and run_vocabulary.py at the top level are shared by all.</desc>',
        '<defs>',
        f'<marker id="flow" viewBox="0 0 10 10" refX="10" refY="5" markerWidth="7" '
        f'markerHeight="7" orient="auto"><path d="M0,0 L10,5 L0,10 z" fill="{ARROW}"/></marker>',
        f'<marker id="drive" viewBox="0 0 10 10" refX="10" refY="5" markerWidth="6" '
        f'markerHeight="6" orient="auto"><path d="M0,0 L10,5 L0,10 z" fill="{CONNECTOR}"/></marker>',
        '</defs>',
        f'<rect width="{WIDTH}" height="{height}" fill="#ffffff"/>',
    ]
    parts += _bar(top, "keras-transformer prepare | train | evaluate | average | translate"
                       " | export: one module per sub-command, drives every stage below")
    parts += _bar(shared, ("keras_transformer/ top level, shared by every stage: file names"
                           " and signatures, safe writes (atomic, locked, staged),",
                           "the run folder (layout, checkpoints, backups, fall-back) and"
                           " the run's spm.model"))
    # commands/ -> every stage folder; export/ by an elbow down the right edge.
    for box in (*row[1:], inference):
        centre = box.x + box.w // 2
        parts.append(_connector([(centre, top.bottom), (centre, box.y - 2)]))
    edge = WIDTH - MARGIN - 14
    parts.append(_connector([(edge, top.bottom), (edge, export.middle),
                             (export.right + 2, export.middle)]))
    # The data flow.
    for left, right in zip(row, row[1:]):
        parts.append(_arrow(left.right, left.middle, right.x - 2, right.middle))
    last = row[-1]
    for target in (inference, export):
        parts.append(_arrow(last.right, last.middle, target.x - 2, target.middle))
    for box in (*row, inference, export):
        parts += _box(box)
    parts.append("</svg>")
    return "\n".join(parts) + "\n"


def main():
    OUTPUT.parent.mkdir(parents=True, exist_ok=True)
    OUTPUT.write_text(svg(), encoding="utf-8")
    print(OUTPUT)


if __name__ == "__main__":
    main()
