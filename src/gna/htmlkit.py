"""HTML and figure helpers shared by the report sections."""

from __future__ import annotations

import base64
import html
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import polars as pl  # noqa: E402

from gna.io import atomic_path  # noqa: E402

CSS = """
body{font-family:system-ui,-apple-system,Segoe UI,sans-serif;max-width:1100px;margin:2em auto;padding:0 1em;color:#222}
h1{font-size:1.6em} h2{border-bottom:1px solid #ddd;padding-bottom:.2em;margin-top:2em}
table{border-collapse:collapse;margin:.8em 0;font-size:.9em} th,td{border:1px solid #ccc;padding:.25em .6em;text-align:right}
th{background:#f4f4f4} td.l,th.l{text-align:left} .ref{background:#fff8e1}
figure{margin:1em 0} figcaption{font-size:.9em;color:#444;max-width:900px}
.note{background:#f6f8fa;border-left:4px solid #8aa;padding:.5em 1em} code{font-size:.9em}
details pre{background:#f6f8fa;padding:1em;overflow:auto;font-size:.85em}
"""


def table(frame: pl.DataFrame, left: tuple[str, ...] = (), fmt: dict | None = None) -> str:
    fmt = fmt or {}
    head = "".join(f"<th class='{'l' if c in left else ''}'>{html.escape(c)}</th>" for c in frame.columns)
    rows = []
    for row in frame.iter_rows(named=True):
        cells = []
        for col, val in row.items():
            if val is None:
                text = "–"
            elif col in fmt:
                text = fmt[col](val)
            elif isinstance(val, float):
                text = f"{val:.3f}"
            else:
                text = str(val)
            cells.append(f"<td class='{'l' if col in left else ''}'>{html.escape(text)}</td>")
        rows.append("<tr>" + "".join(cells) + "</tr>")
    return f"<table><thead><tr>{head}</tr></thead><tbody>{''.join(rows)}</tbody></table>"


def pct(value: float) -> str:
    return f"{100 * value:.1f}%"


def embed(png_path: str | Path, caption: str) -> str:
    data = base64.b64encode(Path(png_path).read_bytes()).decode()
    return (f"<figure><img src='data:image/png;base64,{data}' style='max-width:100%'>"
            f"<figcaption>{caption}</figcaption></figure>")


def placeholder_figure(path: str | Path, text: str) -> None:
    """A small figure saying why a section has nothing to draw (the rule's output must exist)."""
    fig, ax = plt.subplots(figsize=(4, 1))
    ax.axis("off")
    ax.text(0.5, 0.5, text, ha="center", va="center")
    save_figure(fig, path)


def save_figure(fig, path: str | Path) -> None:
    with atomic_path(path) as tmp:
        fig.savefig(tmp, format="png", dpi=120, bbox_inches="tight")
    plt.close(fig)




def accuracy_axis(ax, title: str, xlabel: str, ylabel: str = "accuracy") -> None:
    ax.set_title(title)
    ax.set_xlabel(xlabel)
    ax.set_ylabel(ylabel)
    ax.set_ylim(-0.02, 1.02)
    if ax.get_legend_handles_labels()[0]:
        ax.legend(fontsize=8)


def dict_size_axis(ax, sizes: list[int]) -> None:
    """Log-2 x axis over dictionary sizes with the 1/size chance line."""
    ax.plot(sizes, [1 / s for s in sizes], ls="--", color="grey", label="chance")
    ax.set_xscale("log", base=2)
    ax.set_xticks(sizes, [str(s) for s in sizes])
