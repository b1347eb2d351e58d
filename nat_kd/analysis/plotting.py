"""The report's figures: complexity versus faithfulness (the study's main figure) and the mode mix; the
dataset card draws its histograms with the same ``save_figure``."""
from __future__ import annotations

import logging
import math
import os

# matplotlib logs its set-up and every font it tries at DEBUG, which fills the generator's log once fairseq has
# loaded a checkpoint (loading leaves the root logger at DEBUG): quiet it before the import logs anything
logging.getLogger("matplotlib").setLevel(logging.WARNING)

import matplotlib  # noqa: E402

matplotlib.use("Agg")  # files only; no display on a training machine
import matplotlib.pyplot as plt  # noqa: E402

from nat_kd import atomic  # noqa: E402


def save_figure(fig, path: str | os.PathLike, tight: bool = True) -> None:
    """savefig to a temp file beside ``path``, then rename: never a half-written image. ``tight``: cropped to
    what is drawn (a legend outside the axes included), which draws the figure once more to measure it."""
    try:
        with atomic.replacing(path) as tmp:
            fig.savefig(tmp, dpi=150, bbox_inches="tight" if tight else None)
    finally:
        plt.close(fig)


MARKERS = "osD^vPX*<>h"


def set_style(i: int) -> dict:
    """The i-th data set's colour and marker, the same in every panel of a figure."""
    return {"color": f"C{i % 10}", "marker": MARKERS[i % len(MARKERS)]}


def scatter_sets(ax, points: list[tuple[str, float | None, float | None]]) -> None:
    """One point per (name, x, y), told apart by colour and marker and named by a legend: names written
    beside the points overlap where sets lie close together, as distilled sets of one teacher do."""
    for i, (name, x, y) in enumerate(points):
        if x is not None and y is not None:
            ax.scatter(x, y, s=45, zorder=3, label=name, **set_style(i))


def legend_outside(ax) -> None:
    """The legend right of the axes, where it covers no point."""
    ax.legend(fontsize=8, loc="center left", bbox_to_anchor=(1.02, 0.5))


def plot_complexity_faithfulness(rows: list[dict], path: str | os.PathLike, unit: str = "nats") -> None:
    """One point per data set: complexity C(d) on x, faithfulness F(d) on y."""
    fig, ax = plt.subplots(figsize=(6.5, 4))
    scatter_sets(ax, [(row["name"], row["complexity"], row["faithfulness"]) for row in rows])
    ax.set_xlabel(f"complexity C(d) [{unit}]")
    ax.set_ylabel(f"faithfulness F(d) = KL(real || d) [{unit}]")
    ax.set_title("Complexity vs faithfulness")
    ax.margins(0.1)
    ax.grid(alpha=0.3)
    legend_outside(ax)
    save_figure(fig, path)


def plot_mode_mix(rows: list[dict], languages: list[str], path: str | os.PathLike) -> None:
    """Stacked bars: each data set's mean language posterior p(l|y)."""
    fig, ax = plt.subplots(figsize=(max(4, 1.2 * len(rows) + 2), 4))
    names = [row["name"] for row in rows]
    bottom = [0.0] * len(rows)
    for lang in languages:
        share = [0.0 if math.isnan(row["mode_mix"][lang]) else row["mode_mix"][lang] for row in rows]
        ax.bar(names, share, bottom=bottom, label=lang)
        bottom = [b + s for b, s in zip(bottom, share)]
    for i, total in enumerate(bottom):
        if total == 0:  # no output token known to any language: no posterior (NaN), say so instead of a gap
            ax.text(i, 0.5, "no known\ntokens", ha="center", va="center", fontsize=8)
    ax.tick_params(axis="x", labelrotation=20)
    ax.set_ylabel("mean p(language | output)")
    ax.set_ylim(0, 1)
    ax.legend(title="mode", fontsize=8)
    ax.set_title("Mode mix of the outputs")
    save_figure(fig, path)
