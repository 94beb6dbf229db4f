"""The students' report: accuracy against the distillation budget (budget-<student>.parquet)."""

from __future__ import annotations

import html

import matplotlib.pyplot as plt
import polars as pl

from gna.core.paired import decide
from gna.core.stats import wilson_interval
from gna.report.htmlkit import (
    SectionContext,
    acc_text,
    comparison_row,
    comparison_verdict,
    comparisons_note,
    comparisons_table,
    errorbar,
    pct,
    save_figure,
    table,
)
from gna.report.student_tables import PERPLEXITY, kv_at, metric_formats, metric_table
from gna.students.spec import (
    KD_VS_REALIGNED,
    STAGE_BY_STAGE,
    THROUGH_TRAINING,
    stage_label,
    stage_order,
)


def plot_budget(budget: pl.DataFrame, teacher: pl.DataFrame, size: int, path) -> None:
    """KV accuracy at `size` keys (95% intervals) and perplexity against the tokens seen by
    end-to-end distillation, one line per student."""
    fig, (ax_acc, ax_ppl) = plt.subplots(1, 2, figsize=(11, 4))
    for i, ((variant,), sub) in enumerate(budget.sort("kd_tokens").group_by("variant", maintain_order=True)):
        acc = kv_at(sub, size)
        errorbar(ax_acc, acc["kd_tokens"], acc["value"], acc["ci_low"], acc["ci_high"], color=f"C{i}", label=variant)
        if "degenerate" in acc.columns:
            flagged = acc.filter(pl.col("degenerate").fill_null(False))
            ax_acc.scatter(flagged["kd_tokens"], flagged["value"], s=120, facecolors="none", edgecolors="red", zorder=5)
        ppl = sub.filter(pl.col("metric") == "perplexity")
        ax_ppl.plot(ppl["kd_tokens"], ppl["value"], "o-", color=f"C{i}", label=variant)
    t = kv_at(teacher, size)["value"]
    if len(t):
        ax_acc.axhline(t[0], ls="--", color="gray", label="teacher")
    t_ppl = teacher.filter(pl.col("metric") == "perplexity")["value"]
    if len(t_ppl):
        ax_ppl.axhline(t_ppl[0], ls="--", color="gray", label="teacher")
        ax_ppl.axhline(1.5 * t_ppl[0], ls=":", color="gray", label="1.5 × teacher")
    ax_acc.set(
        xlabel="tokens seen by end-to-end distillation",
        ylabel="accuracy (95% interval)",
        ylim=(-0.02, 1.02),
        title=f"KV-retrieval at {size} keys vs distillation tokens",
    )
    ax_ppl.set(
        xlabel="tokens seen by end-to-end distillation",
        ylabel=PERPLEXITY,
        yscale="log",
        title="perplexity vs distillation tokens",
    )
    ax_acc.legend(fontsize=8)
    ax_ppl.legend(fontsize=8)
    save_figure(fig, path)


def budget_goal(budget: pl.DataFrame, teacher: pl.DataFrame, size: int, share: float = 0.8) -> str:
    """For each student with kept heads on the budget curve: from which budget on its KV accuracy
    at `size` keys is shown to reach `share` of the teacher's (the 95% interval's lower end at or
    above it), read as a fixed sequence from the largest budget down (so the answer keeps its 5%
    without a correction over the budgets); else the first budget whose point estimate alone
    passes it; else that none does. Degenerate points are not read."""
    t = kv_at(teacher, size)
    if t.is_empty() or budget.is_empty():
        return ""
    goal = share * t["value"][0]
    aim = f"{share:.0%} of the teacher's KV accuracy at {size} keys ({goal:.0%})"
    sentences = []
    for (variant, _k), sub in budget.filter(pl.col("heads_kept") > 0).group_by(
        "variant", "heads_kept", maintain_order=True
    ):
        kv = kv_at(sub, size).sort("kd_tokens")
        readable = kv.filter(~pl.col("degenerate").fill_null(False))
        if kv.is_empty():
            continue
        if readable.is_empty():
            sentences.append(f"{variant}: every point of its curve is degenerate, so the goal is not read.")
            continue
        shown = None
        for row in reversed(readable.rows(named=True)):  # from the largest budget down
            if row["ci_low"] < goal:
                break
            shown = row
        point = readable.filter(pl.col("value") >= goal)
        if shown is not None:
            sentences.append(
                f"{variant} is shown to reach {aim} from {shown['kd_tokens']:,} distillation tokens on "
                f"({acc_text(shown['value'], shown['ci_low'], shown['ci_high'])})."
            )
        elif len(point):
            first = point.row(0, named=True)
            sentences.append(
                f"{variant}'s point estimate passes {aim} after {first['kd_tokens']:,} distillation tokens "
                f"({acc_text(first['value'], first['ci_low'], first['ci_high'])}), but no budget's interval "
                "shows it."
            )
        else:
            last = readable.row(-1, named=True)
            sentences.append(
                f"{variant} does not reach {aim} on this curve: "
                f"{acc_text(last['value'], last['ci_low'], last['ci_high'])} "
                f"after {last['kd_tokens']:,} tokens, its largest readable budget here."
            )
    return f"<p><b>Goal of {share:.0%} of the teacher:</b> {' '.join(sentences)}</p>" if sentences else ""


def kd_effect(model: str, steps: pl.DataFrame, budget: pl.DataFrame, size: int, margin: float) -> str:
    """Does KD improve the realigned student: hybrid_budget's comparisons of every KD checkpoint
    with the realigned student (step 0) on the curve's KV items (`steps`), for `model`'s students
    one sentence each on the checkpoint selection chose (`budget`'s chosen column), and the table."""
    if steps.is_empty() or budget.is_empty():
        return ""
    steps = steps.filter((pl.col("model") == model) & (pl.col("group") == "all"))
    budget = budget.filter(pl.col("model") == model)
    if steps.is_empty():
        return ""
    sentences = []
    for (variant,), rows in steps.group_by("variant", maintain_order=True):
        chosen = budget.filter((pl.col("variant") == variant) & pl.col("chosen"))["kd_steps"]
        if chosen.is_empty():
            continue
        step = int(chosen[0])
        if step == 0:
            verbs = ", ".join(
                f"{r['condition']} {decide(r, margin).label} "
                f"({r['reference_only']} lost / {r['condition_only']} gained)"
                for r in rows.iter_rows(named=True)
            )
            sentences.append(
                f"<li><b>{html.escape(variant)}</b>: checkpoint selection kept the realigned student (KD step 0); "
                f"against it on these items: {html.escape(verbs)}.</li>"
            )
            continue
        r = comparison_row(rows, KD_VS_REALIGNED, stage_label(0), stage_label(step), "kv_retrieval")
        if r is None:
            continue
        sentences.append(
            f"<li><b>{html.escape(variant)}</b>: the chosen checkpoint (KD step {step}) against the realigned student, "
            f"{pct(r['acc_reference'])} → {pct(r['acc_condition'])}: {comparison_verdict(r, margin)}.</li>"
        )
    labelled = steps.with_columns(
        pl.format("{} {}", "variant", "condition").alias("condition"),
        pl.format("{} {}", "variant", "reference").alias("reference"),
    )
    return (
        f"<p><b>Does KD improve the realigned student?</b> Each KD checkpoint against the realigned student "
        f"(KD step 0) item by item on the same {size}-key KV items (Holm over each student's checkpoints); the "
        "checkpoint was chosen on the validation prompts, never on these items.</p>"
        f"<ul>{''.join(sentences)}</ul>" + comparisons_table(labelled, margin)
    )


def budget_part(model: str, budget: pl.DataFrame, teacher: pl.DataFrame, size: int, ctx: SectionContext | None) -> str:
    """The budget curve: a table per student and budget, the goal sentence and (for `ctx`) the figure."""
    sub = budget.filter(pl.col("model") == model) if not budget.is_empty() else budget
    if sub.is_empty():
        return ""
    # every KV item here has `size` keys, so the 'all' accuracy repeats that column
    labelled = (
        sub.filter(~((pl.col("metric") == "acc") & (pl.col("group") == "all")))
        .sort("variant", "kd_tokens")
        .with_columns(pl.format("{}, {} tokens", "variant", "kd_tokens").alias("student, distillation tokens"))
    )
    shown = metric_table(labelled, "student, distillation tokens")
    figure = ""
    if ctx is not None:
        plot_budget(sub, teacher, size, ctx.figures["hybrid_budget"])
        figure = ctx.figure("hybrid_budget")
    return (
        f"<h3>{html.escape(model)}: accuracy vs distillation budget</h3>"
        f"<p>Each student scored on the KV items of {size} keys after 0 (aligned: layer alignment, then "
        "realignment on its own stream where hybrid.realign is on; no KD), then "
        "increasing numbers of end-to-end distillation tokens, from checkpoints of its own distillation "
        "run.</p>"
        + table(shown, left=("student, distillation tokens",), fmt=metric_formats(shown))
        + figure
        + budget_goal(sub, teacher, size)
    )


def knowledge_part(model: str, knowledge: pl.DataFrame, margin: float) -> str:
    """Facts cloze through training (hybrid_budget's training-facts-<student>.comparisons.parquet): each
    budget-curve student after alignment, after realignment and at each KD checkpoint, against the
    teacher and against the stage before, as a comparisons table, and a sentence per student
    naming the stages shown to lose facts."""
    sub = knowledge.filter(pl.col("model") == model) if not knowledge.is_empty() else knowledge
    sub = (
        sub.filter(pl.col("family").is_in([THROUGH_TRAINING, STAGE_BY_STAGE]) & (pl.col("group") == "all"))
        if not sub.is_empty()
        else sub
    )
    if sub.is_empty():
        return ""
    sub = sub.with_columns(pl.col("condition").map_elements(stage_order, return_dtype=pl.Int64).alias("_order")).sort(
        "variant", "family", "_order", descending=[False, True, False]
    )
    sentences, compact = [], []
    for (variant,), rows in sub.group_by("variant", maintain_order=True):
        steps = list(rows.filter(pl.col("family") == STAGE_BY_STAGE).iter_rows(named=True))
        vs_teacher = list(rows.filter(pl.col("family") == THROUGH_TRAINING).iter_rows(named=True))
        falls = [
            f"{r['reference']} → {r['condition']} ({r['reference_only']} lost / {r['condition_only']} gained, "
            f"Holm p = {r['p_holm']:.2g})"
            for r in steps
            if decide(r, margin).verb == "falls"
        ]
        first = next((r for r in vs_teacher if decide(r, margin).verb == "falls"), None)
        where = (
            f"falls from one stage to the next at {'; '.join(falls)}"
            if falls
            else "is not shown to fall between any two stages at this n"
        )
        against = (
            f"below the teacher's from <i>{first['condition']}</i> on ({100 * first['acc_condition']:.1f}% against "
            f"{100 * first['acc_reference']:.1f}%, n = {first['n']})"
            if first
            else "not shown below the teacher's at any stage"
        )
        sentences.append(f"<li><b>{html.escape(variant)}</b>: facts cloze {html.escape(where)}; {against}.</li>")
        before = {r["condition"]: r for r in steps}
        for r in vs_teacher:
            low, high = wilson_interval(round(r["acc_condition"] * r["n"]), r["n"])
            step = before.get(r["condition"])
            compact.append(
                {
                    "student": variant,
                    "stage": r["condition"],
                    "facts cloze [95%]": acc_text(r["acc_condition"], low, high),
                    "n": r["n"],
                    "vs teacher: lost / gained": f"{r['reference_only']} / {r['condition_only']}",
                    "vs teacher": decide(r, margin).label,
                    "vs stage before: lost / gained": f"{step['reference_only']} / {step['condition_only']}"
                    if step
                    else "–",
                    "vs stage before": decide(step, margin).label if step else "–",
                }
            )
    first = sub.row(0, named=True)
    t_low, t_high = wilson_interval(round(first["acc_reference"] * first["n"]), first["n"])
    teacher_text = f"the teacher: {acc_text(first['acc_reference'], t_low, t_high)} (n = {first['n']})"
    labelled = sub.drop("_order").with_columns(
        pl.format("{} {}", "variant", "condition").alias("condition"),
        pl.when(pl.col("reference") == "teacher")
        .then(pl.col("reference"))
        .otherwise(pl.format("{} {}", "variant", "reference"))
        .alias("reference"),
    )
    return (
        f"<h3>{html.escape(model)}: facts cloze through training</h3>"
        "<p>Where a student loses knowledge: each budget-curve student scored on every facts cloze item after "
        "layer alignment (<i>aligned</i>), after realignment on its own stream (<i>realigned</i>, KD step 0) and at "
        "each KD checkpoint, compared item by item with the teacher and with the stage before (the MLPs and embeddings "
        f"are the teacher's throughout: only the SSM heads change); {teacher_text}.</p>"
        f"<ul>{''.join(sentences)}</ul>"
        + table(pl.DataFrame(compact), left=("student", "stage", "vs teacher", "vs stage before"))
        + comparisons_table(labelled, margin)
        + comparisons_note(margin)
    )
