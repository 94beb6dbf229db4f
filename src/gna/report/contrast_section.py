"""Report section that leads the report: the study's central contrast, on each model that can show it.

The study (Bick et al., ICML 2025) is cited for one contrast: removing a few Gather-and-Aggregate heads
takes MMLU in letter format to chance while the knowledge the questions ask for stays (cloze scoring,
knowledge tasks). A model that cannot answer the letter format (its accuracy's 95% interval contains
chance) cannot show a fall, so the section tests the contrast only on models whose MMLU letter baseline
is clear of chance and says so for the others. Every sentence is a paired comparison of the same items
(the remove-top-k comparisons table, gna.core.paired), with the random-k control beside it.
"""

from __future__ import annotations

import html

import matplotlib.pyplot as plt
import polars as pl
from matplotlib.ticker import MaxNLocator

from gna.core.chance import above_chance
from gna.core.paired import ALPHA, decide, fall_excluded, share_upper_bound
from gna.report.contrast_verdict import removal_premise, removal_verdict
from gna.report.headline import knowledge_k
from gna.report.htmlkit import (
    SectionContext,
    acc_text,
    accuracy_axis,
    comparison_row,
    comparison_verdict,
    comparisons_note,
    comparisons_table,
    errorbar,
    pct,
    placeholder_figure,
    removed_units,
    save_figure,
    table,
)
from gna.report.knowledge_section import against_study
from gna.report.study import CONTRAST

# the tasks of the contrast, in the order a reader reads it: the letter format, then the same questions
# and the facts scored by their answer text (knowledge), then the sweep's own retrieval task
TASKS = {
    "mmlu_letter": "MMLU letter",
    "mmlu_cloze": "MMLU cloze",
    "facts_cloze": "facts cloze",
    "kv_retrieval": "KV retrieval",
}
# the study's fall is one to chance: where it is not seen, whether so large a fall is excluded
FALLS_TO_CHANCE = ("mmlu_letter",)


def letter_baseline(baseline: pl.DataFrame, model: str) -> dict | None:
    """The model's MMLU letter accuracy row (value, ci_low, ci_high, n, chance), None where not scored."""
    if baseline.is_empty():
        return None
    rows = baseline.filter(
        (pl.col("model") == model)
        & (pl.col("task") == "mmlu_letter")
        & (pl.col("group") == "all")
        & (pl.col("metric") == "acc")
        & (pl.col("engine") == "gna" if "engine" in baseline.columns else pl.lit(True))
    )
    return rows.row(0, named=True) if len(rows) else None


def contrast_k(compared: pl.DataFrame, model: str) -> int | None:
    """The k of the top-k removal the contrast reads for `model`: the knowledge view's (knowledge_k)."""
    rows = compared.filter((pl.col("model") == model) & (pl.col("family") == "top k vs unmodified"))
    return knowledge_k(rows["condition"].unique().to_list())


def verdict_rows(compared: pl.DataFrame, model: str, k: int) -> pl.DataFrame:
    """The contrast's comparisons for `model` at `k`: top k and the first random-k draw against the
    unmodified model, on the contrast's tasks (whole task only)."""
    return compared.filter(
        (pl.col("model") == model)
        & pl.col("condition").is_in([f"top {k}", f"random {k} #0"])
        & pl.col("family").is_in(["top k vs unmodified", "random k vs unmodified"])
        & pl.col("task").is_in(list(TASKS))
        & (pl.col("group") == "all")
    ).sort(pl.col("task").replace_strict({t: i for i, t in enumerate(TASKS)}, return_dtype=pl.Int64), "family")


def summary_table(
    compared: pl.DataFrame, model: str, k: int, margin: float, reference: bool, chance: float | None = None
) -> pl.DataFrame:
    """One row per task: the top-k and random-k verdicts side by side (the letter form's with whether a
    fall to `chance` is excluded, where it does not fall), and the study's reported change."""
    rows = []
    for task, name in TASKS.items():
        top = comparison_row(
            compared.filter(pl.col("model") == model), "top k vs unmodified", "unmodified", f"top {k}", task
        )
        rnd = comparison_row(
            compared.filter(pl.col("model") == model), "random k vs unmodified", "unmodified", f"random {k} #0", task
        )
        if top is None:
            continue
        row = {
            "task": name,
            "n": top["n"],
            "unmodified": pct(top["acc_reference"]),
            f"top {k} removed": pct(top["acc_condition"]),
            "difference [95%]": f"{100 * top['diff']:+.1f} [{100 * top['ci_low']:+.1f}, {100 * top['ci_high']:+.1f}]",
            "McNemar / Holm p": f"{top['p_mcnemar']:.2g} / {top['p_holm']:.2g}",
            "verdict": decide(top, margin).label
            + ("; a fall to chance excluded" if to_chance(top, task, chance, margin) else ""),
            f"{k} random removed": pct(rnd["acc_condition"]) if rnd else "–",
            "random verdict": decide(rnd, margin).label if rnd else "–",
        }
        if reference:
            row["study (Llama-3.1-8B, reference)"] = f"{CONTRAST[task][0]}: {CONTRAST[task][1]}"
        rows.append(row)
    return pl.DataFrame(rows)


def to_chance(row: dict, task: str, chance: float | None, margin: float) -> str | None:
    """Where a task the study reports falling to chance has a comparisons row that excludes that fall
    (gna.core.paired.fall_excluded: the exact bound on the share of items lost lies under the points
    from the unmodified accuracy down to `chance`): a clause saying so; else None. What that means
    for the study is contrast_state's to say: it depends on whether the units removed carry retrieval."""
    if (
        task not in FALLS_TO_CHANCE
        or chance is None
        or not fall_excluded(row["reference_only"], row["n"], row["acc_reference"] - chance)
    ):
        return None
    bound = share_upper_bound(row["reference_only"], row["n"])
    return (
        f" — a fall to chance, as the study reports ({100 * (row['acc_reference'] - chance):.0f} points here), is "
        f"excluded: at most {100 * bound:.1f}% of the items are lost (exact one-sided 95% bound)"
    )


def verdict_line(compared: pl.DataFrame, model: str, k: int, margin: float, chance: float) -> str:
    """The section's one verdict on the study's contrast for `model` (contrast_state), as a sentence."""
    verdict = removal_verdict(compared, model, k, chance, margin)
    if verdict is None:
        return ""
    state, reason = verdict
    return f"<p><b>The study's contrast on {html.escape(model)}: {state}</b> — {html.escape(reason)}.</p>"


def departure_note(model: str) -> str:
    """For a model the case study ran on: this table departs from the study, and the verdict is the case study's."""
    return (
        f"<p class='note'><b>A departure from the study, labelled:</b> the study's fall to chance comes from its "
        f"case study (a pruned model, one head kept per critical layer), not from removing top-ranked units of the "
        f"unpruned model. The one verdict on the study's contrast for {html.escape(model)} is its case study's, "
        "above; this table is what removing its top-ranked units from the whole model does.</p>"
    )


# the task whose answer's log-prob the contrast reads too: retrieval near its ceiling (the premise that the
# removed heads carry retrieval) can lose confidence that accuracy cannot show
LOGP_TASKS = ("kv_retrieval",)


def logp_text(row: dict) -> str:
    """'lower on 98, higher on 22 of 120 items, median change -0.12 nats; sign test, Holm p = 1e-10':
    the row's paired change of the answer's log-prob (gna.core.paired.logp_change)."""
    counted = row.get("logp_n") or row["n"]  # a table from before logp_n counted every pair
    return (
        f"lower on {row['logp_lower']}, higher on {row['logp_higher']} of {counted} items, median change "
        f"{row['logp_median_diff']:+.3g} nats; sign test, Holm p = {row['p_logp_holm']:.2g}"
    )


def logp_direction(row: dict) -> str | None:
    """'lower' / 'higher': the way the answer's log-prob moves on more items where the row's sign test
    rejects after Holm; None where it does not."""
    if row["p_logp_holm"] >= ALPHA:
        return None
    return "lower" if row["logp_lower"] > row["logp_higher"] else "higher"


def logp_clause(compared: pl.DataFrame, task: str, k: int) -> str:
    """For a LOGP_TASKS task: whether the top-k removal lowers the answer's log-prob on more items than it
    raises it (two-sided exact sign test, Holm within its family: its verb is the log-prob's, not the
    accuracy's), and whether it lowers it more often than the first random draw of k does (the top k
    against random k, item by item); '' where the rows carry no log-probs."""
    top = comparison_row(compared, "top k vs unmodified", "unmodified", f"top {k}", task)
    if task not in LOGP_TASKS or top is None or top.get("p_logp_holm") is None:
        return ""
    verb = {"lower": "falls", "higher": "rises", None: "is not shown to change"}[logp_direction(top)]
    out = f". The answer's log-prob {verb}: {logp_text(top)}"
    versus = comparison_row(compared, "top k vs random k", f"random {k} #0", f"top {k}", task)
    if versus is not None and versus.get("p_logp_holm") is not None:
        how = {
            "lower": "lower (the top-ranked ones carry more of it)",
            "higher": f"higher (the {k} drawn at random cost more of it)",
            None: "not shown to differ",
        }[logp_direction(versus)]
        out += f". Against {k} drawn at random it is {how}: {logp_text(versus)}"
    return out


def sentences(compared: pl.DataFrame, model: str, k: int, margin: float, chance: float | None = None) -> list[str]:
    """Per task: the top-k removal's paired verdict, and how it stands to what the study reports (only
    where the units removed are shown to carry retrieval: else what the study reports, without a
    judgement); for the letter form, whose fall the study reports as one to `chance`, whether that fall
    is excluded; for retrieval, the answer's log-prob too (logp_clause)."""
    out = []
    sub = compared.filter(pl.col("model") == model)
    premise_fails, _ = removal_premise(sub, model, k, margin)
    for task, name in TASKS.items():
        row = comparison_row(sub, "top k vs unmodified", "unmodified", f"top {k}", task)
        if row is None:
            continue
        verdict = decide(row, margin)
        if premise_fails:  # units not shown to be the study's: what it reports, not a judgement
            stand = f" — the study reports that it {CONTRAST[task][0]}"
        else:
            stand = against_study(verdict, CONTRAST[task][0])
        stand = (to_chance(row, task, chance, margin) or "") + stand
        out.append(
            f"{html.escape(name)}: {pct(row['acc_reference'])} → {pct(row['acc_condition'])} on the same {row['n']} "
            f"items: {comparison_verdict(row, margin)}{stand}{_control_too(sub, task, k, verdict.verb, margin)}"
            f"{logp_clause(sub, task, k)}"
        )
    return out


def _control_too(compared: pl.DataFrame, task: str, k: int, verb: str, margin: float) -> str:
    """Where the random-k control changes the same way as the top-k removal: a clause saying so (the change
    is then not specific to the ranking); else nothing."""
    row = comparison_row(compared, "random k vs unmodified", "unmodified", f"random {k} #0", task)
    if verb not in ("falls", "rises") or row is None or decide(row, margin).verb != verb:
        return ""
    return (
        f"; but {k} drawn at random {verb[:-1]} too ({pct(row['acc_reference'])} → {pct(row['acc_condition'])}, "
        f"Holm p = {row['p_holm']:.2g}), so the change is not specific to the top-ranked ones"
    )


def plot_contrast(topk: pl.DataFrame, models: list[str], path) -> None:
    """Accuracy against k (top-ranked heads removed together) per contrast task, random-k beside it."""
    if topk.is_empty() or not models:
        placeholder_figure(path, "no model answers MMLU in letter format above chance")
        return
    acc = topk.filter((pl.col("group") == "all") & (pl.col("metric") == "acc") & pl.col("value").is_not_null())
    fig, axes = plt.subplots(1, len(models), figsize=(8.2 * len(models), 3.9), squeeze=False)
    for ax, model in zip(axes[0], models):
        for i, (task, name) in enumerate(TASKS.items()):
            rows = acc.filter((pl.col("model") == model) & (pl.col("task") == task))
            top = rows.filter(pl.col("condition") == "top").sort("k")
            if top.is_empty():
                continue
            color = f"C{i}"
            errorbar(ax, top["k"], top["value"], top["ci_low"], top["ci_high"], label=name, color=color)
            rnd = rows.filter((pl.col("condition") == "random") & (pl.col("draw") == 0)).sort("k")
            if not rnd.is_empty():
                ax.plot(rnd["k"], rnd["value"], marker="s", ls="none", mfc="none", color=color)
        ax.axhline(0.25, color="grey", lw=0.8, ls=":")
        units = removed_units(topk, model)
        accuracy_axis(ax, f"{model}: top-ranked {units} removed", f"{units} removed together (k)")
        ax.xaxis.set_major_locator(MaxNLocator(integer=True))
        # beside the axes: inside, it hid the chance line and the points near it
        ax.legend(
            fontsize=8,
            title="● top k (95% interval)\n□ random k",
            title_fontsize=8,
            loc="upper left",
            bbox_to_anchor=(1.02, 1.0),
        )
    save_figure(fig, path)


def render_contrast(ctx: SectionContext) -> str:
    """The study's contrast on each model whose MMLU letter accuracy is clear of chance: the top-k
    removal's paired verdicts on MMLU letter, MMLU cloze, the facts and KV retrieval beside the
    random-k control's, a figure against k, and for the other models why they cannot show it."""
    baseline, compared, topk = ctx.frame("baseline"), ctx.frame("heads_topk_comparisons"), ctx.frame("heads_topk")
    sweep = ctx.frame("heads_sweep")
    if baseline.is_empty():
        placeholder_figure(ctx.figures["contrast_topk"], "no baseline scores")
        return ""
    shown, unable = [], []
    for model in sorted(baseline["model"].unique().to_list()):
        letter = letter_baseline(baseline, model)
        if letter is None:
            continue
        if above_chance(letter["ci_low"], letter["chance"]) and not compared.is_empty():
            k = contrast_k(compared, model)
            if k is not None:
                shown.append((model, k, letter))
                continue
        unable.append((model, letter))
    plot_contrast(topk, [m for m, _, _ in shown], ctx.figures["contrast_topk"])
    parts = [
        "<h2>The study's contrast: retrieval heads, the letter format and knowledge</h2>",
        "<p>The study's central claim: removing a few Gather-and-Aggregate heads takes MMLU in letter format to "
        "chance while knowledge does not move (the same questions scored by their answer text, knowledge tasks). "
        "It can only be tested on a model that answers the letter format; each such model's top-ranked heads are "
        "removed together and every task is compared with the unmodified model item by item, with the same number "
        "of heads drawn at random as the control.</p>",
    ]
    for model, k, letter in shown:
        rows = sweep.filter(pl.col("model") == model) if not sweep.is_empty() else sweep
        ranked_on = (
            {
                "mmlu_letter": "MMLU letter development questions (none of them reported)",
                "kv_retrieval": "KV retrieval"
                + (
                    f" ({rows['dict_size'][0]}-key prompts)"
                    if "dict_size" in rows.columns and rows["dict_size"][0]
                    else ""
                ),
            }.get(rows["task"][0], rows["task"][0])
            if "task" in rows.columns and len(rows)
            else "KV retrieval"
        )
        mode = rows["mode"][0] if "mode" in rows.columns and len(rows) else "exact"
        units = removed_units(rows, model)
        kv_sizes = (
            topk.filter((pl.col("model") == model) & (pl.col("task") == "kv_retrieval") & (pl.col("group") != "all"))[
                "group"
            ]
            .unique()
            .to_list()
            if not topk.is_empty()
            else []
        )
        grouped = (
            " (all query heads that share one key/value head, removed together: no single head's removal loses "
            "an item on this model)"
            if units != "heads"
            else ""
        )
        tested = (
            f"; KV retrieval scored on prompts of {' and '.join(sorted(kv_sizes, key=int))} keys" if kv_sizes else ""
        )
        parts.append(
            f"<h3>{html.escape(model)}</h3><p>MMLU letter baseline "
            f"{acc_text(letter['value'], letter['ci_low'], letter['ci_high'])} "
            f"(n = {letter['n']}, chance {pct(letter['chance'])}). "
            f"{units.capitalize()}{grouped} ranked by their ablation on {ranked_on} ({mode} sweep); the top {k} "
            f"removed together{tested}:</p><ul>"
            + "".join(f"<li>{s}</li>" for s in sentences(compared, model, k, ctx.margin, letter["chance"]))
            + "</ul>"
            + (
                departure_note(model)
                if model in ctx.config.get("case_study", {}).get("models", [])
                else verdict_line(compared, model, k, ctx.margin, letter["chance"])
            )
        )
        summary = summary_table(compared, model, k, ctx.margin, ctx.show_reference, letter["chance"])
        parts.append(table(summary, left=("task", "verdict")))
        parts.append(comparisons_table(verdict_rows(compared, model, k), ctx.margin))
    # always drawn (a placeholder naming why where no model can show it), as every figure of the report
    parts.append(ctx.figure("contrast_topk"))
    if shown:
        parts.append(comparisons_note(ctx.margin))
    for model, letter in unable:
        parts.append(
            f"<p class='note'><b>{html.escape(model)}</b> cannot show the contrast: its MMLU letter accuracy "
            f"{acc_text(letter['value'], letter['ci_low'], letter['ci_high'])} (n = {letter['n']}) cannot be told "
            f"from chance ({pct(letter['chance'])}), so the study's fall to chance could not be seen. Its "
            "retrieval heads and knowledge are in the sections "
            "below.</p>"
        )
    return "".join(parts)
