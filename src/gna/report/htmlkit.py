"""HTML and figure helpers shared by the report sections."""

from __future__ import annotations

import base64
import html
import re
from dataclasses import dataclass
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import polars as pl  # noqa: E402

from gna.core.chance import SKIPPED
from gna.core.io import atomic_path, read_json, read_parquet  # noqa: E402
from gna.core.paired import DEFAULT_MARGIN, comparison_row, decide, describe, detectable_difference  # noqa: E402, F401

CSS = """
body{font-family:system-ui,-apple-system,Segoe UI,sans-serif;max-width:1100px;margin:2em auto;padding:0 1em;color:#222}
h1{font-size:1.6em} h2{border-bottom:1px solid #ddd;padding-bottom:.2em;margin-top:2em}
table{border-collapse:collapse;margin:.8em 0;font-size:.9em}
th,td{border:1px solid #ccc;padding:.25em .6em;text-align:right}
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


def plural(count: int, noun: str) -> str:
    """'1 solved example', '3 solved examples'."""
    return f"{count} {noun}{'' if count == 1 else 's'}"


def removed_units(frame: pl.DataFrame, model: str) -> str:
    """What a model's ranking ranks and its remove-top-k table removes, in the plural: 'heads', or
    'key/value groups' (heads.sweep_unit: the query heads sharing a key/value head, together)."""
    if frame.is_empty() or "unit" not in frame.columns:
        return "heads"
    units = frame.filter(pl.col("model") == model)["unit"].drop_nulls()
    return "key/value groups" if len(units) and units[0] == "group" else "heads"


def pct(value: float) -> str:
    return f"{100 * value:.1f}%"


def acc_text(
    value: float | None, low: float | None = None, high: float | None = None, degenerate: bool | None = None
) -> str:
    """An accuracy as the report writes it: '62.5% [47–76]' (the 95% interval in brackets); a
    degenerate model's (one that answers the same whatever the context) is flagged instead."""
    if value is None:
        return "–"
    text = pct(value) if low is None or high is None else f"{pct(value)} [{100 * low:.0f}–{100 * high:.0f}]"
    return f"degenerate (acc {pct(value)})" if degenerate else text


def with_acc_cell(frame: pl.DataFrame, name: str = "cell") -> pl.DataFrame:
    """`frame` (value, ci_low, ci_high, optional degenerate) with its acc_text column `name`."""
    cols = ["value", "ci_low", "ci_high"] + (["degenerate"] if "degenerate" in frame.columns else [])
    missing = [c for c in cols if c not in frame.columns]
    if missing:
        raise ValueError(f"accuracy rows lack columns {missing}: results predate intervals; rerun their rule")
    return frame.with_columns(
        pl.struct(cols).map_elements(lambda r: acc_text(*r.values()), return_dtype=pl.String).alias(name)
    )


def accuracy_pivot(frame: pl.DataFrame, on: str, index: list[str]) -> pl.DataFrame:
    """Tidy accuracy rows (value, ci_low, ci_high, n) pivoted to one acc_text cell per `on`
    value; each column header says its n ('KV 10 (n=50)') when it is one number."""
    cells = with_acc_cell(frame)
    n_of = cells.group_by(on).agg(pl.col("n").unique())
    names = {
        str(row[on]): f"{row[on]} (n={row['n'][0]})" if len(row["n"]) == 1 else str(row[on])
        for row in n_of.iter_rows(named=True)
    }
    wide = cells.pivot(on=on, index=index, values="cell", maintain_order=True)
    return wide.rename({c: names[c] for c in wide.columns if c in names and c not in index})


def accuracy_columns(rows: pl.DataFrame, kv_label: str = "KV {}", task_names: dict | None = None) -> pl.DataFrame:
    """Tidy accuracy rows, each named by its table `column` and ordered for a table: KV-retrieval
    per dictionary size (`kv_label` formatted with the size), 'KV all', then the other tasks by
    name (`task_names` maps task → name; with it, tasks it does not name are dropped) over all
    their items, and over the known items where a task has them ('<name>, known'); a task's other
    groups (the facts' relations) are left to the tables that show them."""
    group = pl.col("group")
    rows = rows.filter((pl.col("task") == "kv_retrieval") | group.is_in(["all", "known"]))
    kv_name = pl.when(group == "all").then(pl.lit("KV all")).otherwise(pl.format(kv_label, group))
    other = pl.col("task") if task_names is None else pl.col("task").replace_strict(task_names, default=None)
    other = pl.when(group == "known").then(pl.format("{}, known", other)).otherwise(other)
    rank = (
        pl.when(pl.col("task") != "kv_retrieval")
        .then(10**7)
        .when(group == "all")
        .then(10**6)
        .otherwise(group.cast(pl.Int64, strict=False))
    )
    named = rows.with_columns(
        pl.when(pl.col("task") == "kv_retrieval").then(kv_name).otherwise(other).alias("column"), rank.alias("_rank")
    )
    return named.filter(pl.col("column").is_not_null()).sort("_rank", "column", maintain_order=True).drop("_rank")


def interval_errors(value, low, high) -> list[list[float]]:
    """Matplotlib's yerr ([below], [above]) of values and their 95% intervals (a null end: no bar)."""
    value = [0.0 if v is None else v for v in value]
    low = [v if lo is None else lo for v, lo in zip(value, low)]
    high = [v if hi is None else hi for v, hi in zip(value, high)]
    # max(0, ·): an interval end equals the value up to rounding at 0% and 100%
    return [[max(0.0, v - lo) for v, lo in zip(value, low)], [max(0.0, hi - v) for v, hi in zip(value, high)]]


def errorbar(ax, x, value, low, high, **style) -> None:
    """A line with its 95% intervals as error bars (low/high may be None: no bar)."""
    ax.errorbar(list(x), list(value), yerr=interval_errors(value, low, high), capsize=3, **{"marker": "o", **style})


def embed(png_path: str | Path, caption: str) -> str:
    data = base64.b64encode(Path(png_path).read_bytes()).decode()
    return (
        f"<figure><img src='data:image/png;base64,{data}' style='max-width:100%'>"
        f"<figcaption>{caption}</figcaption></figure>"
    )


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


INLINE_RST = (
    (re.compile(r"``(.+?)``"), r"<code>\1</code>"),
    (re.compile(r"\*\*(.+?)\*\*"), r"<b>\1</b>"),
    (re.compile(r"\*(.+?)\*"), r"<i>\1</i>"),
)


def rst_to_html(text: str) -> str:
    """A caption's reStructuredText as HTML: paragraphs, *emphasis*, **strong** and ``literal``
    (all the markup the captions use; Snakemake renders the same files in its own report)."""
    paragraphs = [" ".join(block.split()) for block in re.split(r"\n\s*\n", text.strip())]
    out = []
    for paragraph in paragraphs:
        paragraph = html.escape(paragraph, quote=False)
        for pattern, replacement in INLINE_RST:
            paragraph = pattern.sub(replacement, paragraph)
        out.append(paragraph)
    return out[0] if len(out) == 1 else "".join(f"<p>{p}</p>" for p in out)


def read_caption(path: str | Path) -> str:
    """The caption file of a figure as HTML."""
    return rst_to_html(Path(path).read_text())


DEFAULT_TITLE = "Gather-and-Aggregate: reproduction report"


@dataclass(frozen=True)
class ReportOptions:
    """The report's options (config section report): its `title`, whether the study's published
    numbers show beside ours (`show_reference`), and the equivalence margin of the paired
    comparisons (`equivalence_margin`, gna.core.paired)."""

    title: str = DEFAULT_TITLE
    show_reference: bool = True
    equivalence_margin: float = DEFAULT_MARGIN


@dataclass(frozen=True)
class SectionContext:
    """What a section's render function gets: its input paths (by key: a dict of path or paths,
    or the rule's gna.core.settings.Files; read with .get), figure paths and HTML captions
    ({figure name: ...}), the report options and the run's validated config."""

    inputs: dict
    figures: dict
    captions: dict
    options: ReportOptions
    config: dict

    def paths(self, key: str) -> list[str]:
        paths = self.inputs.get(key, [])
        return [paths] if isinstance(paths, (str, Path)) else list(paths)

    def frame(self, key: str) -> pl.DataFrame:
        """The input's Parquet files, concatenated (columns unified); empty when it has none."""
        frames = [read_parquet(p) for p in self.paths(key)]
        return pl.concat(frames, how="diagonal_relaxed") if frames else pl.DataFrame()

    def records(self, key: str) -> list[dict]:
        """The input's JSON files, one dict each."""
        return [read_json(p) for p in self.paths(key)]

    def figure(self, name: str) -> str:
        """The figure embedded with its caption."""
        return embed(self.figures[name], self.captions[name])

    @property
    def show_reference(self) -> bool:
        return self.options.show_reference

    @property
    def margin(self) -> float:
        """The equivalence margin of the paired comparisons (report.equivalence_margin)."""
        return self.options.equivalence_margin


def comparison_verdict(row: dict, margin: float) -> str:
    """A comparison row's verdict as the report prints it: the verb in bold where a test decided
    it, with the paired difference, counts and p-values (gna.core.paired.describe)."""
    text = html.escape(describe(row, margin))
    verb = decide(row, margin).verb
    return f"<b>{text.split(':', 1)[0]}</b>:{text.split(':', 1)[1]}" if verb != "undecided" else text


FOLD_ROWS = 12  # a longer comparisons table is folded under a line that counts its verdicts
VERBS = ("falls", "rises", "holds", "undecided")


def comparisons_table(frame: pl.DataFrame, margin: float) -> str:
    """A comparisons table (gna.core.paired.COLUMNS, with a model column) as the report shows it:
    one row per comparison, the accuracies before and after, the paired difference with its 95%
    interval, items lost / gained, the p-values and the verdict the tests allow; folded where it
    has more than FOLD_ROWS rows."""
    if frame.is_empty():
        return ""
    rows = []
    for row in frame.iter_rows(named=True):
        d, discordant = decide(row, margin), row["reference_only"] + row["condition_only"]
        detectable = detectable_difference(row["n"], discordant, row.get("holm_multiplier") or 1)
        rows.append(
            {
                "model": row.get("model", ""),
                "comparison": f"{row['condition']} vs {row['reference']}",
                "task": row["task"] + ("" if row["group"] == "all" else f" ({row['group']})"),
                "n": row["n"],
                "before": pct(row["acc_reference"]),
                "after": pct(row["acc_condition"]),
                "difference [95%]": (
                    f"{100 * row['diff']:+.1f} [{100 * row['ci_low']:+.1f}, {100 * row['ci_high']:+.1f}]"
                ),
                "lost / gained": f"{row['reference_only']} / {row['condition_only']}",
                "McNemar p": f"{row['p_mcnemar']:.2g}",
                "Holm p": f"{row['p_holm']:.2g}",
                "detectable (80% power)": f"±{100 * detectable:.0f}",
                "verdict": d.label if d.verb != "undecided" else f"not decided (about n = {d.n_to_decide})",
            }
        )
    shown = table(pl.DataFrame(rows), left=("model", "comparison", "task", "verdict"))
    if len(rows) <= FOLD_ROWS:
        return shown
    counts = {verb: sum(decide(r, margin).verb == verb for r in frame.iter_rows(named=True)) for verb in VERBS}
    summary = ", ".join(f"{n} {verb.replace('undecided', 'not decided')}" for verb, n in counts.items() if n)
    return f"<details><summary>{len(rows)} comparisons: {summary} (the table)</summary>{shown}</details>"


def comparisons_note(margin: float) -> str:
    """How the verdicts of a comparisons table are decided, in one paragraph."""
    return (
        "<p class='note'>Each comparison pairs the two conditions item by item on the items both answered: the "
        "difference (after minus before, points) with Newcombe's 95% interval for paired proportions, the exact "
        "McNemar test, and Holm's correction within each family of comparisons. <b>falls</b> / <b>rises</b>: Holm p "
        f"&lt; 0.05 (<i>by less than ±{100 * margin:g}</i> where it also holds); <b>holds</b>: the exact one-sided "
        f"95% upper bounds on the share of items lost and on the share gained both lie under ±{100 * margin:g} "
        "points (<code>report.equivalence_margin</code>; this keeps its 5% at every n, and no n under 59 can show "
        "±5); otherwise <i>not decided</i>, with about the n of the test that would decide it first at 80% power if "
        "the observed rates held. The printed 95% intervals are not adjusted for the family; the verdicts are. "
        "<i>detectable</i>: the smallest paired difference (points) the row's n detects with 80% power at its "
        "share of changing items and at the level Holm holds it to (exact McNemar power).</p>"
    )


def skipped_tasks_note(frame: pl.DataFrame, scored_on: str, left_out: str) -> str:
    """The tasks of `frame` (rows with model, task, skipped_reason) scored on `scored_on` only
    (`left_out` says what was not scored; the chance policy, config chance.skip, chose it), each
    with its recorded reason; empty where none was skipped."""
    if SKIPPED not in frame.columns:
        return ""
    skipped = frame.filter(pl.col(SKIPPED).is_not_null()).unique(["model", "task"]).sort(["model", "task"])
    if skipped.is_empty():
        return ""
    return (
        f"<p>Scored on {scored_on} only ({left_out}; <code>chance.skip</code>):</p><ul>"
        + "".join(
            f"<li><b>{html.escape(r['model'])}</b>, {r['task']}: {html.escape(r[SKIPPED])}</li>"
            for r in skipped.iter_rows(named=True)
        )
        + "</ul>"
    )
