"""Report section for the SSM / hybrid students: heads-kept and state-size tables, perplexity
figure, layer swap, inference memory, and the distillation curves."""

from __future__ import annotations

import html

import matplotlib.pyplot as plt
import polars as pl

from gna.core.chance import SKIPPED
from gna.report.htmlkit import (
    SectionContext,
    acc_text,
    accuracy_pivot,
    comparison_row,
    comparison_verdict,
    comparisons_note,
    comparisons_table,
    errorbar,
    placeholder_figure,
    save_figure,
    table,
)
from gna.report.student_alignment import align_heads_part
from gna.report.student_budget import budget_part, kd_effect, knowledge_part
from gna.report.student_memory import memory_part
from gna.report.student_recipe import ablation_part
from gna.report.student_swap import swap_part, swap_verdict
from gna.report.student_tables import (
    PERPLEXITY,
    TASK_COLUMNS,
    accuracy_rows,
    kv_at,
    metric_formats,
    metric_table,
    not_scored_note,
)
from gna.report.student_training import training_part
from gna.report.study import HYBRID_HEADS, STATE_SIZE, reference_html
from gna.students.spec import TEACHER_VARIANT

REFERENCE_HEADS = reference_html(HYBRID_HEADS, f"the study's {HYBRID_HEADS['what']}")
REFERENCE_STATE = reference_html(STATE_SIZE, f"the study's {STATE_SIZE['what']}")


def plot_heads(students: pl.DataFrame, teacher: pl.DataFrame, path) -> None:
    """Perplexity and accuracy (with 95% intervals; degenerate students hollow red) vs heads kept."""
    fig, (ax_ppl, ax_kv) = plt.subplots(1, 2, figsize=(11, 4))
    ppl = students.filter(pl.col("metric") == "perplexity").sort("heads_kept")
    ax_ppl.plot(ppl["heads_kept"], ppl["value"], "o-", color="tab:purple", label="student")
    teacher_ppl = teacher.filter(pl.col("metric") == "perplexity")["value"]
    if len(teacher_ppl):
        ax_ppl.axhline(teacher_ppl[0], ls="--", color="gray", label="teacher")
    ax_ppl.set(
        xlabel="attention heads kept (top of the ranking)",
        ylabel=PERPLEXITY,
        yscale="log",
        title="perplexity vs heads kept",
    )
    ax_ppl.legend()
    rows = accuracy_rows(students).sort("heads_kept")
    for column in rows["column"].unique(maintain_order=True):
        line = rows.filter(pl.col("column") == column)
        errorbar(
            ax_kv,
            line["heads_kept"],
            line["value"],
            line["ci_low"],
            line["ci_high"],
            label=column.replace("KV ", ""),
            lw=2.5 if column == "KV all" else 1,
            ls=":" if column.startswith("MMLU") else "-",
        )
        if "degenerate" in line.columns:
            flagged = line.filter(pl.col("degenerate").fill_null(False))
            ax_kv.scatter(flagged["heads_kept"], flagged["value"], s=120, facecolors="none", edgecolors="red", zorder=5)
    teacher_kv = kv_at(teacher, None)["value"]
    if len(teacher_kv):
        ax_kv.axhline(teacher_kv[0], ls="--", color="gray", label="teacher, KV all")
    ax_kv.set(
        xlabel="attention heads kept (top of the ranking)",
        ylabel="accuracy (95% interval)",
        ylim=(-0.02, 1.02),
        title="accuracy vs heads kept (red ring: degenerate)",
    )
    ax_kv.legend(fontsize=7)
    save_figure(fig, path)


DESIGN = (
    "<h2>SSM and hybrid students</h2>"
    "<p>No SSM weights are reachable offline, so the pipeline distills its own from each model. "
    "<b>Design: head-wise replacement.</b> Every attention head of the teacher is either kept (its own "
    "q/k/v/o weights) or replaced by an SSM head — a discrete Mamba-2 style selective scan with state "
    "size N, initialised from the head (C←Q, B←K, x←V of its K/V group), whose output enters the "
    "teacher's shared o_proj in the head's place. Each SSM head also mixes in the first token's value "
    "through a fitted share (teacher heads park much of their attention on the first token, a sink that a "
    "decaying scan cannot hold) and outputs exactly that value at the first position, as attention does; "
    "and it reads the values of its last four tokens directly (the <i>local skip</i>: D and three weights, a "
    "short causal convolution beside the scan, as Mamba's conv1d), which a scan alone can only smear. "
    "Stage 1 starts each head from its teacher head's attention profile: the first-token share, the "
    "local weights and the decay (from the mean distance of the rest of its attention) are read off the "
    "teacher's maps. The top-k heads of the per-head ablation ranking are "
    "kept; k = 0 is a pure SSM with the teacher's MLPs. We chose head-wise replacement over a full SSM "
    "beside the kept heads because it keeps every head's identity: the same ranking, ablation and "
    "Gather-and-Aggregate tools apply to teacher and student head by head, and the KV cache shrinks "
    "exactly with the heads removed. Stage 1 aligns every SSM head, given the teacher's hidden state "
    "entering its layer, to its attention head's contribution to the residual stream (once per state "
    "size, shared by all heads-kept variants), then, per student, again on the stream the student itself "
    "makes entering each layer (realignment); stage 2 distills each variant end to end on the "
    "teacher's next-token distributions. Only SSM parameters are trained.</p>"
)


def realignment(realign: dict, align_windows: int) -> str:
    """The realignment budget in words (per student, before KD)."""
    if not realign.get("steps"):
        return "no realignment"
    windows = min(realign.get("windows") or align_windows, align_windows)
    return (
        f"realignment {realign['steps']} steps per layer × {realign.get('batch', 4)} windows (on the first {windows})"
    )


def budget_note(hy: dict) -> str:
    """The training and evaluation budget of this run's students."""
    corpus = hy["corpus"]
    items = (
        "all task items (the teacher's baseline items)"
        if hy["eval_items"] is None
        else f"{hy['eval_items']} items per task"
    )
    align_windows = min(corpus["align_windows"], corpus["train_windows"])
    return (
        f"<p class='note'>Budget of this run: {corpus['train_windows']} training windows of "
        f"{corpus['seq_len']} tokens (answered MMLU questions outside the evaluation subset and "
        f"synthetic KV prompts), alignment {hy['align']['steps']} steps × {hy['align']['batch']} windows "
        f"(on the first {align_windows}), {realignment(hy['realign'], align_windows)}, "
        f"distillation {hy['kd']['steps']} steps × {hy['kd']['batch']} windows "
        f"({hy['kd']['steps'] * hy['kd']['batch'] * corpus['seq_len']:,} tokens; answer positions weighted "
        f"{hy['kd']['answer_weight']:g}×). Scored on {items}; "
        f"{hy['degeneracy_items']} items per task (KV retrieval: of {hy['dict_size']} keys) "
        "scored again with another item's context (a model "
        "that keeps its answer on most of them does not read the context and is flagged "
        f"<i>degenerate</i> instead of scored); perplexity on {corpus['heldout_windows']} held-out windows. "
        "Accuracies carry their 95% Wilson interval in brackets; the column header gives n.</p>"
    )


def heads_kept_part(model: str, teacher: pl.DataFrame, heads: pl.DataFrame, hy: dict) -> str:
    """The teacher beside the heads-kept sweep at the configured state size."""
    labelled = pl.concat(
        [
            teacher.with_columns(pl.lit("all (teacher)").alias("heads kept")),
            heads.with_columns(pl.col("heads_kept").cast(pl.String).alias("heads kept")),
        ],
        how="diagonal_relaxed",
    )
    shown = metric_table(labelled, "heads kept")
    knowledge = hy.get("knowledge_heads_kept")
    only_kv = sorted(set(hy["heads_kept"]) - set(knowledge)) if knowledge is not None else []
    kv_note = (
        f"<p class='note'>The students with k = {', '.join(map(str, only_kv))} are scored on KV retrieval "
        "only (blank for the other tasks); the knowledge tasks on k = "
        f"{', '.join(map(str, sorted(knowledge)))} (<code>hybrid.knowledge_heads_kept</code>).</p>"
        if only_kv
        else ""
    )
    return (
        f"<h3>{html.escape(model)}: attention heads kept vs knowledge / retrieval-heavy "
        f"(state size {hy['state_size']})</h3>"
        + table(shown, left=("heads kept",), fmt=metric_formats(shown))
        + kv_note
        + not_scored_note(heads)
    )


def heads_kept_summary(
    teacher: pl.DataFrame, heads: pl.DataFrame, compared: pl.DataFrame, margin: float, goal_k: int = 10
) -> str:
    """KV accuracy at 10 keys (else over all sizes) of the teacher, the pure SSM and the student
    keeping `goal_k` heads (else the most heads), the two students compared item by item over all
    sizes (the comparisons table), and their perplexities against the teacher's."""
    size = 10 if len(kv_at(teacher, 10)) else None
    where = "at 10 keys" if size else "over all dictionary sizes"
    t, students = kv_at(teacher, size), kv_at(heads, size).sort("heads_kept")
    k0 = students.filter(pl.col("heads_kept") == 0)
    if not (len(t) and len(k0) and len(students) > 1):
        return ""
    goal = students.filter(pl.col("heads_kept") == goal_k)
    t, k0, kept = t.row(0, named=True), k0.row(0, named=True), (goal if len(goal) else students).row(-1, named=True)

    def cell(row):
        return acc_text(row["value"], row["ci_low"], row["ci_high"], row.get("degenerate"))

    row = comparison_row(compared, "hybrids vs pure SSM", k0["variant"], kept["variant"], "kv_retrieval")
    verdict = (
        f"k = {kept['heads_kept']} against the pure SSM, item by item over all sizes: {comparison_verdict(row, margin)}"
        if row
        else "the two students were not compared item by item"
    )
    readable = t["value"] and not (t.get("degenerate") or kept.get("degenerate"))
    ratio = f" ({kept['value'] / t['value']:.0%} of the teacher's)" if readable else ""
    ppl = dict(heads.filter(pl.col("metric") == "perplexity").select("heads_kept", "value").iter_rows())
    teacher_ppl = teacher.filter(pl.col("metric") == "perplexity")["value"]
    ppl_text = ""
    if len(teacher_ppl):
        parts = [f"k = {k} {ppl[k]:.1f} ({ppl[k] / teacher_ppl[0]:.2f}×)" for k in (0, kept["heads_kept"]) if k in ppl]
        ppl_text = f" Held-out perplexity: teacher {teacher_ppl[0]:.1f}, {', '.join(parts)}."
    return (
        f"<p><b>KV-retrieval {where}</b> (n = {t['n']}): teacher {cell(t)}, pure SSM (k = 0) {cell(k0)}, "
        f"k = {kept['heads_kept']} {cell(kept)}{ratio}; {verdict}.{ppl_text}</p>"
    )


def state_size_part(model: str, students: pl.DataFrame, hy: dict) -> str:
    """Per entry of state_sweep_heads_kept, its students at each state size: KV accuracy at the
    one dictionary size all of them are scored at (hybrid.dict_size) and perplexity."""
    size = hy["dict_size"]
    parts = []
    for k in sorted(set(hy["state_sweep_heads_kept"])):
        state = students.filter(pl.col("heads_kept") == k).sort("state_size")
        if state["state_size"].n_unique() <= 1:
            continue
        state = state.filter(
            ((pl.col("task") == "kv_retrieval") & (pl.col("group") == str(size)) & (pl.col("metric") == "acc"))
            | (pl.col("metric") == "perplexity")
        )
        st = metric_table(state.with_columns(pl.col("state_size").alias("state size")), "state size")
        parts.append(
            f"<h3>{html.escape(model)}: state size ({k} attention heads kept)</h3>"
            f"<p class='note'>KV-retrieval at {size} keys, where every student of the state-size sweep "
            "is scored (the heads-kept table above has the other sizes), and held-out perplexity.</p>"
            + table(st, fmt=metric_formats(st))
        )
    return "".join(parts)


def _model_part(
    model: str,
    scores: pl.DataFrame,
    swap: pl.DataFrame,
    budget: pl.DataFrame,
    ablation: pl.DataFrame,
    hy: dict,
    ctx: SectionContext | None,
    compared: pl.DataFrame,
    margin: float,
    validation: pl.DataFrame,
    knowledge: pl.DataFrame,
    budget_steps: pl.DataFrame,
) -> str:
    """One teacher's students: heads-kept table (and, for `ctx`, the figures), summary, budget
    curve (`budget_steps`: its KD checkpoints against the realigned student), facts through
    training (`knowledge`), the recipe's ablations (`validation`: the
    checkpoint selection points), state sizes,
    swap, and the students compared item by item (`compared`: the comparisons table of every
    teacher; `margin`: the equivalence margin)."""
    sub = scores.filter(pl.col("model") == model)
    compared = compared.filter(pl.col("model") == model) if not compared.is_empty() else compared
    teacher = sub.filter(pl.col("variant") == TEACHER_VARIANT)
    students = sub.filter(pl.col("variant") != TEACHER_VARIANT)
    heads = students.filter(pl.col("state_size") == hy["state_size"]).sort("heads_kept")
    figure = ""
    if ctx is not None:
        plot_heads(heads, teacher, ctx.figures["hybrid_heads"])
        figure = ctx.figure("hybrid_heads")
    swap_row = None
    if not compared.is_empty():
        swaps = compared.filter((pl.col("family") == "layer swap vs pure SSM") & (pl.col("task") == "kv_retrieval"))
        swap_row = swaps.filter(pl.col("group") == "all").row(0, named=True) if len(swaps) else None
    return (
        heads_kept_part(model, teacher, heads, hy)
        + figure
        + heads_kept_summary(teacher, heads, compared, margin)
        + budget_part(model, budget, teacher, hy["dict_size"], ctx)
        + kd_effect(model, budget_steps, budget, hy["dict_size"], margin)
        + knowledge_part(model, knowledge, margin)
        + ablation_part(model, sub, budget, ablation, hy, validation)
        + state_size_part(model, students, hy)
        + swap_part(model, swap, students, teacher, hy, swap_verdict(swap_row, margin))
        + (
            f"<h3>{html.escape(model)}: the students compared item by item</h3>"
            "<p>Every student against its teacher, the hybrids against the pure SSM, each student against the one "
            "keeping the next fewer heads (same state) and the one with the next smaller state (same k), and the "
            "layer swap against the pure SSM, on the items both answered.</p>"
            + comparisons_table(compared, margin)
            + comparisons_note(margin)
            if not compared.is_empty()
            else ""
        )
    )


def answer_rows_part(answer_rows: pl.DataFrame) -> str:
    if answer_rows.is_empty():
        return ""
    skipped = (
        answer_rows.filter(pl.col(SKIPPED).is_not_null()) if SKIPPED in answer_rows.columns else answer_rows.clear()
    )
    cells = (
        answer_rows.filter(pl.col("condition").is_not_null())
        .rename({"acc": "value"})
        .sort("model", "attention_heads", "task")
    )
    wide = accuracy_pivot(cells, "condition", ["model", "variant", "attention_heads", "task"]) if len(cells) else cells
    note = "".join(
        f"<li>{html.escape(r['model'])} {html.escape(r['variant'])}, "
        f"{html.escape(TASK_COLUMNS.get(r['task'], r['task']))}: {html.escape(r[SKIPPED])}</li>"
        for r in skipped.sort("model", "variant", "task").iter_rows(named=True)
    )
    note = f"<p class='note'>Not run:</p><ul class='note'>{note}</ul>" if note else ""
    return (
        "<h3>Aggregation lives in attention: answer rows of the attention heads masked</h3>"
        "<p>In each hybrid, every attention head's answer rows (the last context token and the choice "
        "tokens) are masked to see only themselves; SSM heads are untouched. The study (Zamba2): "
        "retrieval-heavy tasks drop sharply, knowledge tasks stay. Accuracy with its 95% interval.</p>"
        + (table(wide, left=("model", "variant", "task")) if len(wide) else "")
        + note
    )


def render_hybrid(ctx: SectionContext) -> str:
    """The students: heads kept, state size, layer swap, answer rows, memory and training curves
    (placeholder figures when the hybrid phase is off)."""
    skipped = [name for name, spec in ctx.config["models"].items() if "hybrid" in spec.get("skip", [])]
    skipped_note = (
        f"<p>No students of {', '.join(f'<code>{html.escape(m)}</code>' for m in skipped)}: "
        "<code>skip: [hybrid]</code> in the config (students replace attention with separate q/k/v/o "
        "projections and rotary positions head by head; the family table of docs/usage.md lists the families "
        "they are built for).</p>"
        if skipped
        else ""
    )
    if not ctx.paths("hybrid_scores"):
        why = (
            "hybrid.enabled: false"
            if not ctx.config["hybrid"].get("enabled", True)
            else "every model has skip: [hybrid]"
        )
        for name in ("hybrid_heads", "hybrid_budget", "hybrid_training", "hybrid_align_heads"):
            placeholder_figure(ctx.figures[name], f"hybrid phase not run ({why})")
        # under its own heading, so the note does not read as part of the section before it
        return "<h2>SSM and hybrid students</h2>" + skipped_note if skipped_note else ""
    hy, scores, swap = ctx.config["hybrid"], ctx.frame("hybrid_scores"), ctx.frame("hybrid_swap")
    parts = [DESIGN, budget_note(hy), skipped_note]
    if scores.is_empty():
        return "".join(parts)
    models = sorted(scores["model"].unique())
    budget = ctx.frame("hybrid_budget")
    if budget.is_empty():
        placeholder_figure(ctx.figures["hybrid_budget"], "no budget curve (hybrid.budget_curve.variants: [])")
    ablation = ctx.frame("hybrid_ablation")
    compared, validation = ctx.frame("hybrid_comparisons"), ctx.frame("hybrid_validation")
    parts += [
        _model_part(
            model,
            scores,
            swap,
            budget,
            ablation,
            hy,
            ctx if model == models[0] else None,
            compared,
            ctx.margin,
            validation,
            ctx.frame("hybrid_knowledge"),
            ctx.frame("hybrid_budget_steps"),
        )
        for model in models
    ]
    parts.append(answer_rows_part(ctx.frame("hybrid_answer_rows")))
    if ctx.show_reference:
        parts += [REFERENCE_HEADS, REFERENCE_STATE]
    parts.append(memory_part(ctx.frame("hybrid_memory"), hy, ctx.show_reference))
    parts.append(training_part(ctx, hy))
    align_heads = ctx.frame("hybrid_align_heads")
    if align_heads.is_empty():
        placeholder_figure(ctx.figures["hybrid_align_heads"], "no per-head alignment errors")
    parts.append(align_heads_part(align_heads, ctx))
    return "".join(parts)
