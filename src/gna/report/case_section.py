"""Report section that leads the report: the study's MMLU case study on each model it ran on
(gna.phases.case_study) — the pruning curve and the minimal model, the layers whose removal breaks the
letter format, the head sweep of those layers, the heads-kept table beside the study's rows, and the one
verdict on the study's contrast it allows (gna.report.contrast_verdict.case_verdict)."""

from __future__ import annotations

import html

import matplotlib.pyplot as plt
import polars as pl

from gna.core.paired import decide
from gna.report.contrast_verdict import CaseStudy, case_verdict
from gna.report.gna_section import masking_part, plot_maps
from gna.report.htmlkit import (
    SectionContext,
    acc_text,
    accuracy_axis,
    comparison_verdict,
    comparisons_note,
    comparisons_table,
    errorbar,
    pct,
    placeholder_figure,
    save_figure,
    table,
)
from gna.report.study import KEPT_HEADS, reference_html

CHANCE = 0.25  # four options
FIGURES = ("case_gradual", "case_layers", "case_sweep", "case_maps")
TASKS = {"mmlu_letter": "MMLU letter", "mmlu_cloze": "MMLU cloze", "facts_cloze": "facts cloze"}


def _by_model(records: list[dict]) -> dict[str, dict]:
    return {r["model"]: r for r in records}


def _of(frame: pl.DataFrame, model: str) -> pl.DataFrame:
    """`model`'s rows of a report input (an input with no rows has no model column)."""
    return frame.filter(pl.col("model") == model) if len(frame) else frame


def plot_gradual(gradual: pl.DataFrame, minimal: dict[str, dict], path) -> None:
    """Accuracy against layers kept: the evaluation tasks, and the development letter items dashed; the
    minimal model marked."""
    if gradual.is_empty():
        placeholder_figure(path, "no case study ran")
        return
    models = sorted(gradual["model"].unique().to_list())
    fig, axes = plt.subplots(1, len(models), figsize=(8.2 * len(models), 3.9), squeeze=False)
    acc = gradual.filter((pl.col("group") == "all") & (pl.col("metric") == "acc"))
    for ax, model in zip(axes[0], models):
        rows = acc.filter(pl.col("model") == model)
        for i, (task, name) in enumerate(TASKS.items()):
            part = rows.filter((pl.col("task") == task) & (pl.col("split") == "evaluation")).sort("layers_kept")
            if not part.is_empty():
                errorbar(ax, part["layers_kept"], part["value"], part["ci_low"], part["ci_high"], label=name,
                         color=f"C{i}")  # fmt: skip
        dev = rows.filter((pl.col("task") == "mmlu_letter") & (pl.col("split") == "development")).sort("layers_kept")
        if not dev.is_empty():
            ax.plot(dev["layers_kept"], dev["value"], ls="--", color="C0", lw=1, label="MMLU letter (development)")
        ax.axhline(CHANCE, color="grey", lw=0.8, ls=":")
        kept = minimal.get(model, {}).get("layers_kept")
        if kept:
            ax.axvline(kept, color="black", lw=0.8, ls="-.", label=f"minimal model ({kept} layers)")
        accuracy_axis(ax, f"{model}: layers pruned from the end", "layers kept (0..k-1)")
        ax.legend(fontsize=8, loc="upper left", bbox_to_anchor=(1.02, 1.0))
    save_figure(fig, path)


def plot_layers(compared: pl.DataFrame, critical: dict[str, dict], path) -> None:
    """The paired change of the development letter accuracy when each of the minimal model's deepest layers
    is removed alone, with its 95% interval; the critical layers filled."""
    rows = (
        compared.filter((pl.col("task") == "mmlu_letter") & (pl.col("group") == "all")) if len(compared) else compared
    )
    if rows.is_empty():
        placeholder_figure(path, "no layer was removed (the case study did not reach this step)")
        return
    models = sorted(rows["model"].unique().to_list())
    fig, axes = plt.subplots(1, len(models), figsize=(8.2 * len(models), 3.6), squeeze=False)
    for ax, model in zip(axes[0], models):
        part = (
            rows.filter(pl.col("model") == model)
            .with_columns(pl.col("condition").str.strip_prefix("without L").cast(pl.Int64).alias("layer"))
            .sort("layer")
        )
        chosen = set(critical.get(model, {}).get("layers", []))
        x, diff = part["layer"].to_list(), [100 * d for d in part["diff"]]
        low = [100 * (d - c) for d, c in zip(part["diff"], part["ci_low"])]
        high = [100 * (c - d) for d, c in zip(part["diff"], part["ci_high"])]
        colors = ["C3" if layer in chosen else "C7" for layer in x]
        ax.bar(x, diff, color=colors, yerr=[low, high], capsize=3)
        ax.axhline(0, color="black", lw=0.8)
        ax.set_title(f"{model}: one layer removed from the minimal model (red: critical)")
        ax.set_xlabel("layer removed")
        ax.set_ylabel("MMLU letter change (points, development)")
        ax.set_xticks(x)
    save_figure(fig, path)


def plot_sweep(sweep: pl.DataFrame, path) -> None:
    """Per critical layer, the development letter accuracy lost when each of its query heads is ablated
    alone inside the minimal model; the top head filled."""
    if sweep.is_empty() or "acc_drop" not in sweep.columns:
        placeholder_figure(path, "no head was swept (the case study did not reach this step)")
        return
    panels = sweep.select("model", "layer").unique(maintain_order=True).rows()
    fig, axes = plt.subplots(1, len(panels), figsize=(5.2 * len(panels), 3.4), squeeze=False)
    for ax, (model, layer) in zip(axes[0], panels):
        part = sweep.filter((pl.col("model") == model) & (pl.col("layer") == layer)).sort("head")
        colors = ["C3" if r == 1 else "C7" for r in part["rank"]]
        ax.bar(part["head"], [100 * d for d in part["acc_drop"]], color=colors)
        ax.axhline(0, color="black", lw=0.8)
        ax.set_title(f"{model}: L{layer}, each head ablated alone")
        ax.set_xlabel("query head")
        ax.set_ylabel("letter accuracy lost (points)")
        ax.set_xticks(part["head"].to_list())
    save_figure(fig, path)


def kept_table(summary: pl.DataFrame, compared: pl.DataFrame, margin: float) -> pl.DataFrame:
    """One row per heads-kept variant: the accuracy [95%] of each knowledge task and MMLU letter's paired
    verdict against the kept configuration and against all heads."""
    rows = []
    acc = summary.filter((pl.col("group") == "all") & (pl.col("metric") == "acc"))
    for variant in acc["variant"].unique(maintain_order=True).to_list():
        row = {"configuration": variant}
        for task, name in TASKS.items():
            hit = acc.filter((pl.col("variant") == variant) & (pl.col("task") == task))
            if len(hit):
                r = hit.row(0, named=True)
                row[f"{name} (n={r['n']})"] = acc_text(r["value"], r["ci_low"], r["ci_high"])
        for family, column in (
            ("vs kept configuration", "letter vs kept"),
            ("vs all heads", "letter vs all heads"),
        ):
            hit = compared.filter(
                (pl.col("family") == family)
                & (pl.col("condition") == variant)
                & (pl.col("task") == "mmlu_letter")
                & (pl.col("group") == "all")
            )
            row[column] = (
                f"{decide(hit.row(0, named=True), margin).label} ({100 * hit['diff'][0]:+.1f})" if len(hit) else "–"
            )
        rows.append(row)
    return pl.DataFrame(rows)


def kv_table(summary: pl.DataFrame, compared: pl.DataFrame) -> pl.DataFrame:
    """KV retrieval by dictionary size under each heads-kept variant: accuracy, and for a variant derived from
    the kept configuration the answer's log-prob against it item by item (lower on how many, sign test Holm p)."""
    kv = summary.filter(pl.col("task").str.starts_with("kv_retrieval@") & (pl.col("group") == "all"))
    if kv.is_empty():
        return kv
    acc = kv.filter(pl.col("metric") == "acc")
    rows = []
    for variant in acc["variant"].unique(maintain_order=True).to_list():
        row = {"configuration": variant}
        sizes = acc.filter(pl.col("variant") == variant).sort(pl.col("task").str.split("@").list.get(1).cast(pl.Int64))
        for r in sizes.iter_rows(named=True):
            cell = pct(r["value"])
            hit = compared.filter(
                (pl.col("family") == "vs kept configuration")
                & (pl.col("condition") == variant)
                & (pl.col("task") == r["task"])
                & (pl.col("group") == "all")
            )
            if len(hit) and hit["p_logp_holm"][0] is not None:
                h = hit.row(0, named=True)
                cell += f"; log-prob lower on {h['logp_lower']}/{h['logp_n']}, Holm p {h['p_logp_holm']:.2g}"
            row[f"{r['task'].split('@')[1]} keys (n={r['n']})"] = cell
        rows.append(row)
    return pl.DataFrame(rows)


def _minimal_text(minimal: dict) -> str:
    """The minimal model: which prefix, by which rule, its letter interval, what one layer fewer does, and
    where the two-sided reading differs (a labelled departure)."""
    if not minimal["applies"]:
        return f"<p><b>The case study does not apply to this model:</b> {html.escape(minimal['reason'])}.</p>"
    letter, below, margin = minimal["letter"], minimal.get("shallower"), 100 * minimal["margin"]
    shallower = (
        f" One layer fewer ({below['layers_kept']} layers): {100 * below['diff']:+.1f} points "
        f"[{100 * below['ci_low']:+.1f}, {100 * below['ci_high']:+.1f}] on the development questions, "
        f"{below['verdict']} — the sequence stops there."
        if below and "ci_low" in below
        else ""
    )
    chosen = (
        f" (the shallowest prefix the sequence passed was {minimal['holding']} layers; the shallower ones that passed "
        "are at chance on the evaluation questions)"
        if minimal.get("holding") not in (None, minimal["layers_kept"])
        else ""
    )
    two_sided = minimal.get("two_sided", minimal["layers_kept"])
    departure = (
        "<p class='note'><b>A departure from the report's two-sided reading, labelled:</b> "
        + (
            "no prefix holds within the margin both ways"
            if two_sided is None
            else f"the shallowest prefix that holds within the margin both ways is {two_sided} layers"
        )
        + ", because removing the last layers makes the model answer more development questions right, not fewer "
        "(gains outside the margin). The study cuts until MMLU breaks, a fall; a gain does not break it, so the "
        "cut reads one side.</p>"
        if two_sided != minimal["layers_kept"]
        else ""
    )
    return (
        f"<p><b>Minimal model: layers 0–{minimal['layers_kept'] - 1} ({minimal['layers_kept']} of "
        f"{minimal['n_layers']})</b>{chosen}. Prefixes are tested from the deepest down on "
        f"{minimal['development_items']} development questions, each against the full model item by item, "
        f"stopping at the first not shown to lose less than {margin:g} points of its letter accuracy (the paired "
        f"difference's 95% lower bound above −{margin:g}, or within ±{margin:g} both ways). Its MMLU letter accuracy "
        f"on the {letter['n']} evaluation questions: {acc_text(letter['value'], letter['ci_low'], letter['ci_high'])}, "
        f"clear of chance.{shallower}</p>" + departure
    )


def _critical_text(critical: dict, compared: pl.DataFrame, margin: float) -> str:
    if not critical["removed"]:
        return ""
    removed = f"layers {critical['removed'][0]}–{critical['removed'][-1]}"
    if not critical["layers"]:
        return f"<p>Each of {removed} removed alone: {html.escape(critical['reason'])}.</p>"
    items = []
    for layer in critical["layers"]:
        hit = compared.filter(
            (pl.col("condition") == f"without L{layer}")
            & (pl.col("task") == "mmlu_letter")
            & (pl.col("group") == "all")
        )
        if len(hit):
            items.append(f"<li>without L{layer}: {comparison_verdict(hit.row(0, named=True), margin)}</li>")
    return (
        f"<p>Each of {removed} of the minimal model removed alone, on the development questions; the critical "
        f"layers are the (at most two) whose removal falls most, Holm-significant over the {len(critical['removed'])} "
        f"removals: <b>{', '.join(f'L{x}' for x in critical['layers'])}</b>.</p><ul>{''.join(items)}</ul>"
    )


def _found_text(found: dict) -> str:
    if not found["heads"]:
        return ""
    items = "".join(
        f"<li>L{h['layer']}: <b>H{h['head']}</b>, {100 * h['acc_drop']:.1f} points of letter accuracy lost when "
        f"ablated alone ({h['logp_drop']:+.3f} nats of the answer's log-prob); "
        + (
            "on top in both halves of the development questions"
            if h["stable"]
            else f"not stable: the top head is H{h['top_half1']} on the first half and H{h['top_half2']} on the second"
        )
        + "</li>"
        for h in found["heads"]
    )
    return (
        f"<p>Every query head of the critical layers ablated alone inside the minimal model, on the {found['n']} "
        f"development questions (exact sweep); the head found per layer:</p><ul>{items}</ul>"
    )


def roles_text(roles: pl.DataFrame, model: str) -> str:
    """The G&A role scores of the heads found inside the minimal model, on MMLU letter questions."""
    if roles.is_empty() or "found" not in roles.columns:
        return ""
    mine = roles.filter((pl.col("model") == model) & pl.col("found"))
    if mine.is_empty():
        return ""
    shown = mine.select(
        pl.format("L{}H{}", "layer", "head").alias("head"),
        "role",
        *[pl.col(c).round(3) for c in ("gather_strict", "aggregate", "selectivity", "sharpness")],
        "n",
    )
    return (
        "<p>Their Gather-and-Aggregate roles inside the minimal model, on MMLU letter questions (each answer "
        "option a segment; <i>aggregate</i>: the answer position's attention on the options, <i>selectivity</i>: "
        "its share on the correct one; <i>gather</i>: an option's last token's attention on its own option):</p>"
        + table(shown, left=("head", "role"))
    )


def render_case(ctx: SectionContext) -> str:
    """The case study per model: what was run, its verdict on the study's contrast, the pruning curve,
    the critical layers, the head sweep, the heads-kept table beside the study's, KV by size."""
    gradual = ctx.frame("case_gradual")
    minimal = _by_model(ctx.records("case_minimal"))
    critical = _by_model(ctx.records("case_critical"))
    plot_gradual(gradual, minimal, ctx.figures["case_gradual"])
    plot_layers(ctx.frame("case_layers_comparisons"), critical, ctx.figures["case_layers"])
    plot_sweep(ctx.frame("case_sweep"), ctx.figures["case_sweep"])
    plot_maps(ctx.frame("case_maps"), ctx.figures["case_maps"], task="mmlu_letter")
    if not minimal:  # every figure of the report is drawn: here, placeholders naming why
        return (
            "<h2>The study's MMLU case study</h2><p class='note'>The case study ran on no model "
            "(<code>case_study.models</code> is empty): it needs a model that answers MMLU in letter format.</p>"
            + "".join(ctx.figure(name) for name in FIGURES)
        )
    parts = [
        "<h2>The study's MMLU case study</h2>",
        "<p>The study's fall to chance comes from its case study on Llama-3.1-8B: layers pruned from the end until "
        "MMLU breaks, the layers whose removal matters in that pruned model, one head kept in each, and each of "
        "those heads removed. The same protocol runs here on each model that answers MMLU in letter format: every "
        "selection (how many layers, which layers, which heads) is made on development questions drawn apart from "
        "the evaluation questions, and every number below the selections is read on the evaluation questions, "
        "each change paired item by item with the configuration it changes.</p>",
    ]
    found = _by_model(ctx.records("case_found"))
    layers_compared, kept_compared = ctx.frame("case_layers_comparisons"), ctx.frame("case_kept_comparisons")
    kept_summary, roles = ctx.frame("case_kept"), ctx.frame("case_roles")
    masking, masked = ctx.frame("case_masking"), ctx.frame("case_masking_comparisons")
    kept_shown = False
    for model in sorted(minimal):
        case = CaseStudy(minimal[model], critical[model], found[model], _of(kept_compared, model))
        state, reason = case_verdict(case, CHANCE, ctx.margin)
        parts.append(f"<h3>{html.escape(model)}</h3>")
        parts.append(
            f"<p class='verdict'><b>The study's contrast on {html.escape(model)} (case study): {state}</b> — "
            f"{html.escape(reason)}.</p>"
        )
        parts.append(_minimal_text(case.minimal))
        parts.append(_critical_text(case.critical, _of(layers_compared, model), ctx.margin))
        parts.append(_found_text(case.found))
        parts.append(roles_text(roles, model))
        if case.found["heads"] and "heads" not in masking.columns:
            parts.append(
                "<p class='note'>The masking that keeps only the heads' G&A pattern was not run: it needs a Gather and "
                "an Aggregate head, and the single head found has neither role.</p>"
            )
        if "heads" in masking.columns:
            intro = (
                "<p><b>Their pattern alone.</b> The heads found as the study's Gather and Aggregate heads (their own "
                "roles where they have them, else the earlier layer's head gathering and the later's aggregating), "
                "inside the minimal model on MMLU letter questions, each answer option a segment: (a) unmodified; "
                "(b) both ablated; (c) both restricted to their G&A pattern. If (c) stays near (a) while (b) falls, "
                "their pattern alone carries the letter format.</p>"
            )
            parts.append(masking_part(_of(masking, model), _of(masked, model), ctx.margin, intro))
        summary = _of(kept_summary, model)
        if not summary.is_empty() and "variant" in summary.columns:
            kept_shown = True
            parts.append(
                "<p><b>Heads kept.</b> The minimal model with every head of its other layers and, in each critical "
                "layer, only the head found; then each head found removed, and both. The controls: a random other "
                "head of the same layer removed from all heads (beside the head found removed from all heads), and "
                f"kept in place of the head found (seed {ctx.config['case_study']['control']['seed']}, "
                f"{ctx.config['case_study']['control']['draws']} draw(s) per layer). Evaluation questions; the letter "
                "format's paired verdict against the kept configuration and against all heads:</p>"
            )
            parts.append(table(kept_table(summary, case.kept, ctx.margin), left=("configuration",)))
            if ctx.show_reference:
                parts.append(reference_html(KEPT_HEADS, KEPT_HEADS["what"]))
            kv = kv_table(summary, case.kept)
            if not kv.is_empty():
                parts.append(
                    "<p>KV retrieval by dictionary size in the same configurations: accuracy and, for each removal "
                    "from the kept configuration, the answer's log-prob against it item by item (where accuracy "
                    "sits at its ceiling, confidence can still fall). The study finds that one head's removal "
                    "costs a constant share and the other's grows with size.</p>"
                )
                parts.append(table(kv, left=("configuration",)))
            parts.append(comparisons_table(case.kept, ctx.margin))
    parts += [ctx.figure(name) for name in FIGURES]
    if kept_shown:
        parts.append(comparisons_note(ctx.margin))
    return "".join(parts)
