"""What every figure of the package and its scripts shares: the Agg backend, a layout that keeps titles, labels and
legends inside the figure, titles wrapped to its width, legends in words, and one way to save (whole files, one
resolution, cropped to what is drawn so that no text is cut at an edge). `clipped_text` names any text that still
reaches past the figure's edges; the figure tests run it on every figure."""
from __future__ import annotations

import functools
import os
import re
import textwrap
from pathlib import Path

from longctx.train.run_files import open_new, temp_name

DPI = 120


def pyplot():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    return plt


def new_figure(figsize, **subplots):
    """(figure, axes) with constrained layout: the axes shrink so that every label and outside legend fits."""
    return pyplot().subplots(figsize=figsize, layout="constrained", **subplots)


def widen_for_legend(fig, legend) -> None:
    """Widen `fig` by the width of a legend placed right of its axes: the axes keep the width they were drawn for
    (constrained layout would otherwise shrink them to make room)."""
    width = legend.get_window_extent(fig.canvas.get_renderer()).width / fig.dpi
    fig.set_figwidth(fig.get_figwidth() + width + 0.1)


@functools.lru_cache(maxsize=4096)
def text_width(text: str, fontsize: float) -> float:
    """The width of one line of `text` in inches, as the default font draws it at `fontsize`."""
    from matplotlib.font_manager import FontProperties
    from matplotlib.textpath import text_to_path

    width, _, _ = text_to_path.get_text_width_height_descent(text, FontProperties(size=fontsize), ismath=False)
    return width / 72


def fill_title(text: str, width_inches: float, fontsize: float) -> str:
    """`text` wrapped at spaces into lines that fit `width_inches` at `fontsize` (each of its lines on its own; a
    word longer than the width broken)."""
    out = []
    for line in text.split("\n"):
        chars = max(1, min(len(line), int(width_inches * 72 / (0.45 * fontsize))))  # 0.45: narrower than any text
        while chars > 10 and any(text_width(piece, fontsize) > width_inches for piece in textwrap.wrap(line, chars)):
            chars -= 1
        out.append(textwrap.fill(line, chars))
    return "\n".join(out)


def attention_label(tag: str) -> str:
    """An attention's config tag in words: exp -> softmax, power_p2 -> power p=2, window1024 -> window 1024."""
    if tag == "exp":
        return "softmax"
    if match := re.fullmatch(r"power_p(\d+)", tag):
        return f"power p={match[1]}"
    if match := re.fullmatch(r"window(\d+)", tag):
        return f"window {match[1]}"
    return tag


def readable_label(label: str) -> str:
    """A report label with its attention's tag in words, less the parts those words already say:
    "power_p4, p=4, ctx=512 (3 seeds)" -> "power p=4, ctx=512 (3 seeds)", "window32, window=32" -> "window 32"."""
    body, seeds = re.fullmatch(r"(.*?)((?: \(\d+ seeds\))?)", label).groups()
    tag, *parts = body.split(", ")
    name = attention_label(tag)
    kept = [part for part in parts if part not in name.split(" ") and part.replace("=", " ") != name]
    return ", ".join([name, *kept]) + seeds


def _texts(fig, renderer):
    """(what, window extent) of every visible piece of text the figure draws."""
    for text in fig.texts:
        if text.get_visible() and text.get_text().strip():
            yield f"figure text {text.get_text()!r}", text.get_window_extent(renderer)
    for legend in fig.legends:
        yield "figure legend", legend.get_window_extent(renderer)
    for ax in fig.axes:
        if not ax.get_visible():
            continue
        for text in [ax.title, *ax.texts]:
            if text.get_visible() and text.get_text().strip():
                yield f"text {text.get_text()!r}", text.get_window_extent(renderer)
        for name, axis in (("x", ax.xaxis), ("y", ax.yaxis)):
            box = axis.get_tightbbox(renderer)  # the drawn tick labels and the axis label
            if axis.get_visible() and box is not None:
                yield f"{name}-axis {axis.label.get_text()!r}", box
        if ax.get_legend() is not None:
            yield "legend", ax.get_legend().get_window_extent(renderer)


def clipped_text(fig) -> list[str]:
    """The texts of `fig` (titles, labels, tick labels, legends, annotations) that reach past its edges when drawn
    at its own size: [] when every one is whole."""
    fig.canvas.draw()
    renderer = fig.canvas.get_renderer()
    frame = fig.bbox
    return [what for what, box in _texts(fig, renderer)
            if box.x0 < frame.x0 - 0.5 or box.x1 > frame.x1 + 0.5 or box.y0 < frame.y0 - 0.5
            or box.y1 > frame.y1 + 0.5]


def save_figure(fig, path: str | Path) -> Path:
    """Write `fig` to `path` as a PNG (a new temporary file renamed over it: never half a file, never through a
    link), cropped to what is drawn, and close it."""
    path = Path(path)
    tmp = temp_name(path)
    try:
        with open_new(tmp) as f:
            fig.savefig(f, dpi=DPI, format="png", bbox_inches="tight")
        os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)
        pyplot().close(fig)
    return path
