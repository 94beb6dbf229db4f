"""Report sections for the models and the baseline: every model scored on every task."""

from __future__ import annotations

import html
from pathlib import Path

import matplotlib.pyplot as plt
import polars as pl

from gna.core.paired import comparisons, decide
from gna.models.folders import read_provenance
from gna.report.htmlkit import (
    SectionContext,
    acc_text,
    accuracy_axis,
    accuracy_pivot,
    comparison_verdict,
    dict_size_axis,
    errorbar,
    interval_errors,
    pct,
    save_figure,
    table,
    with_acc_cell,
)
from gna.tasks.lmeval_bridge import CROSSCHECK_TASK


def pypi_source(spec: dict) -> str:
    """A pypi-file source as the models table names it: the wheel and its member, or a file in parts
    by its first and last wheel (a 22-part model would fill the table with every part's name)."""
    if "parts" not in spec:
        return f"PyPI {spec['package']}=={spec['version']} : {spec['member']}"
    names = [f"{p['package']}=={p['version']}" for p in spec["parts"]]
    if len(names) <= 2:
        return "PyPI " + " + ".join(names)
    return f"PyPI {names[0]} … {names[-1]} ({len(names)} parts joined in order)"


SOURCES = {
    "pypi-file": pypi_source,
    "hf": lambda s: f"HF {s['id']}" + (f"@{s['revision']}" if s.get("revision") else ""),
    "local": lambda s: f"local {s['path']}",
    "tiny-random": lambda s: f"tiny random {s.get('arch', 'llama')} (seed {s.get('seed', 0)})",
}


def model_rows(model_dirs: list[str]) -> pl.DataFrame:
    """One row per prepared model: name, source, raw file hash, architecture, size."""
    rows = []
    for folder in model_dirs:
        info = read_provenance(folder)
        spec = info.get("spec", {})
        source = SOURCES.get(spec.get("source"), lambda s: "?")(spec)
        rows.append(
            {
                "model": info.get("name", Path(folder).name),
                "source": source,
                "sha256": (info.get("raw_file_sha256") or "–"),
                "architecture": info.get("architecture"),
                "layers": info.get("n_layers"),
                "params (M)": round(info.get("n_params", 0) / 1e6, 1),
            }
        )
    return pl.DataFrame(rows)


def render_models(ctx: SectionContext) -> str:
    """The table of models this run prepared."""
    return "<h2>Models</h2>" + table(
        model_rows(ctx.paths("models")), left=("model", "source", "sha256", "architecture")
    )


def plot_kv(baseline: pl.DataFrame, path: str | Path) -> None:
    kv = baseline.filter((pl.col("task") == "kv_retrieval") & (pl.col("metric") == "acc") & (pl.col("group") != "all"))
    kv = kv.with_columns(pl.col("group").cast(pl.Int64).alias("dict_size")).sort("dict_size")
    fig, ax = plt.subplots(figsize=(6, 3.8))
    for model in kv["model"].unique(maintain_order=True):
        line = kv.filter(pl.col("model") == model)
        errorbar(ax, line["dict_size"], line["value"], line["ci_low"], line["ci_high"], label=model)
    if not kv.is_empty():
        dict_size_axis(ax, kv["dict_size"].unique().sort().to_list())
    title = f"KV-retrieval ({kv['format'][0]} template)" if not kv.is_empty() else "KV-retrieval"
    accuracy_axis(ax, title, "dictionary size (keys)")
    save_figure(fig, path)


def plot_mmlu(baseline: pl.DataFrame, path: str | Path) -> None:
    mm = baseline.filter(
        pl.col("task").str.starts_with("mmlu_") & (pl.col("metric") == "acc") & (pl.col("group") == "all")
    )
    fig, ax = plt.subplots(figsize=(6, 3.8))
    if not mm.is_empty():
        models, formats = mm["model"].unique(maintain_order=True).to_list(), mm["format"].unique().sort().to_list()
        width = 0.8 / len(formats)
        for i, fmt in enumerate(formats):
            bars = pl.DataFrame({"model": models}).join(mm.filter(pl.col("format") == fmt), on="model", how="left")
            xs = [m + (i - (len(formats) - 1) / 2) * width for m in range(len(models))]
            ax.bar(
                xs,
                bars["value"].fill_null(0),
                width,
                yerr=interval_errors(bars["value"], bars["ci_low"], bars["ci_high"]),
                capsize=3,
                label=fmt,
            )
        ax.set_xticks(range(len(models)), models)
        ax.axhline(0.25, ls="--", color="grey", label="chance")
    ax.set_ylabel("accuracy")
    ax.set_ylim(0, 1)
    ax.set_title("MMLU: letter vs cloze on the same questions")
    ax.legend(fontsize=8)
    save_figure(fig, path)


def overall_table(ours: pl.DataFrame) -> str:
    """Every model on every task, one column per metric."""
    rows = ours.filter(pl.col("group") == "all")
    overall = rows.pivot(on="metric", index=["model", "task", "format", "n", "chance"], values="value").sort(
        ["model", "task"]
    )
    acc = with_acc_cell(rows.filter(pl.col("metric") == "acc"), "acc (95% interval)")
    overall = overall.join(acc.select("model", "task", "acc (95% interval)"), on=["model", "task"], how="left")
    cols = [
        c
        for c in ["model", "task", "format", "n", "acc (95% interval)", "acc_norm", "greedy_exact_match", "chance"]
        if c in overall.columns
    ]
    return (
        "<h2>Baseline</h2>"
        "<p>Every model scored on every task by the gna engine (log-likelihood of each choice; "
        "<i>acc</i> = argmax of the summed log-prob, <i>acc_norm</i> = normalised by the choice's bytes, "
        "<i>greedy_exact_match</i> = greedy decoding reproduces the target).</p>"
        + table(
            overall.select(cols),
            left=("model", "task", "format"),
            fmt={c: pct for c in ("acc", "acc_norm", "greedy_exact_match", "chance")},
        )
    )


def kv_part(ours: pl.DataFrame, kv_task: pl.DataFrame, ctx: SectionContext) -> str:
    """KV-retrieval accuracy per dictionary size, the template and an example prompt."""
    kv = ours.filter((pl.col("task") == "kv_retrieval") & (pl.col("group") != "all") & (pl.col("metric") == "acc"))
    kv_wide = accuracy_pivot(
        kv.with_columns(pl.col("group").cast(pl.Int64).alias("dict size")).sort("dict size"),
        "model",
        ["dict size", "n", "chance"],
    )
    example = html.escape(kv_task.filter(pl.col("dict_size") == kv_task["dict_size"].min())["context"][0])
    return (
        "<h3>KV-retrieval by dictionary size</h3>"
        f"<p class='note'>Template: <b>{kv_task['template'][0]}</b>. Example prompt (smallest dictionary):</p>"
        f"<pre>{example}</pre>" + table(kv_wide, fmt={"chance": pct}) + ctx.figure("baseline_kv")
    )


def format_finding(model: str, by_format: dict[str, dict], paired: dict | None, margin: float) -> str:
    """One model's letter vs cloze accuracy with intervals, and the study's reading only where
    the tests say so: letter's interval holds chance, and cloze beats letter on the same
    questions by the paired test (`paired`: the comparisons row, letter the reference; None
    where the per-item answers are not at hand)."""
    letter = by_format["letter"]
    chance = letter["chance"]
    at_chance = letter["ci_low"] <= chance <= letter["ci_high"]
    verb = decide(paired, margin).verb if paired else None
    if at_chance and verb == "rises":
        reading = (
            "Letter accuracy cannot be told from chance while cloze beats it on the same questions (paired "
            "test): the model "
            "has some of the knowledge but cannot retrieve the option letter in context."
        )
    else:
        reading = "The tests do not separate the two formats in the study's way at this n."
    compared = f" Cloze against letter, item by item: {comparison_verdict(paired, margin)}." if paired else ""
    cell = {k: acc_text(v["value"], v["ci_low"], v["ci_high"]) for k, v in by_format.items()}
    return (
        f"<li><b>{html.escape(model)}</b>: letter format {cell['letter']} vs cloze {cell['cloze']} on the "
        f"same {letter['n']} questions (chance {pct(chance)}).{compared} {reading}</li>"
    )


def letter_vs_cloze(items: pl.DataFrame) -> dict[str, dict]:
    """{model: the comparisons row of cloze against letter on the same MMLU questions} from the
    baseline's per-item answers (both formats' items files, with a model column); {} where
    they are not at hand (a config scoring one format only)."""
    out = {}
    if items.is_empty() or not {"model", "task", "item_id", "correct"} <= set(items.columns):
        return out
    for (model,), part in items.partition_by("model", as_dict=True).items():
        # one task name for both formats: the questions (item ids) are the same
        per_item = {
            task.removeprefix("mmlu_"): rows.with_columns(pl.lit("mmlu").alias("task"))
            for (task,), rows in part.partition_by("task", as_dict=True).items()
        }
        table = comparisons(per_item, [("formats", "letter", "cloze")])
        if len(table):
            out[model] = table.row(0, named=True)
    return out


def mmlu_part(mm: pl.DataFrame, ctx: SectionContext) -> str:
    """MMLU letter vs cloze per model."""
    if mm.is_empty():
        return ""
    paired = letter_vs_cloze(ctx.frame("baseline_mmlu_items"))
    findings = []
    for model in mm["model"].unique().sort():
        by_format = {r["format"]: r for r in mm.filter(pl.col("model") == model).iter_rows(named=True)}
        if {"letter", "cloze"} <= by_format.keys():
            findings.append(format_finding(model, by_format, paired.get(model), ctx.margin))
    return "<h3>MMLU: letter vs cloze</h3><ul>" + "".join(findings) + "</ul>" + ctx.figure("baseline_mmlu")


def lm_eval_part(lm: pl.DataFrame, mm: pl.DataFrame) -> str:
    """The lm-evaluation-harness cross-check of MMLU letter, then any other lm-eval task."""
    parts = []
    cross = lm.filter((pl.col("task") == CROSSCHECK_TASK) & (pl.col("metric") == "acc"))
    if not cross.is_empty():
        ours_letter = mm.filter(pl.col("format") == "letter").select(
            "model", pl.col("value").alias("gna engine"), pl.col("n").alias("n (gna)")
        )
        check = cross.select("model", pl.col("value").alias("lm-eval"), pl.col("n").alias("n (lm-eval)")).join(
            ours_letter, on="model", how="left"
        )
        parts.append("<h3>Cross-check with lm-evaluation-harness</h3>")
        parts.append(
            "<p>The same MMLU letter items, 0-shot, scored by lm-eval's HFLM on the same model: the two "
            "engines should agree exactly (they differ only if the config asks for few-shot prompts, "
            "which lm-eval samples differently).</p>"
        )
        parts.append(table(check, left=("model",), fmt={"lm-eval": pct, "gna engine": pct}))
        lm = lm.filter(pl.col("task") != CROSSCHECK_TASK)
    if not lm.is_empty():
        parts.append("<h3>lm-evaluation-harness tasks</h3>")
        keep = [c for c in ["model", "task", "metric", "value", "stderr", "n"] if c in lm.columns]
        parts.append(table(lm.select(keep).sort(["model", "task", "metric"]), left=("model", "task", "metric")))
    return "\n".join(parts)


def render_baseline(ctx: SectionContext) -> str:
    """Baseline tables, KV-retrieval by dictionary size, MMLU letter vs cloze, lm-eval tasks."""
    baseline = ctx.frame("baseline")
    plot_kv(baseline, ctx.figures["baseline_kv"])
    plot_mmlu(baseline, ctx.figures["baseline_mmlu"])
    ours = baseline.filter(pl.col("engine") == "gna")
    mm = ours.filter(pl.col("task").str.starts_with("mmlu_") & (pl.col("group") == "all") & (pl.col("metric") == "acc"))
    return "\n".join(
        part
        for part in (
            overall_table(ours),
            kv_part(ours, ctx.frame("kv_task"), ctx),
            mmlu_part(mm, ctx),
            lm_eval_part(baseline.filter(pl.col("engine") == "lm-eval"), mm),
        )
        if part
    )
