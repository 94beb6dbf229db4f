"""Report section for the SSM / hybrid students: heads-kept and state-size tables, perplexity
figure, layer swap, inference memory, and the distillation curves."""

from __future__ import annotations

import html

import matplotlib.pyplot as plt
import polars as pl

from gna.core.chance import SKIPPED
from gna.core.paired import decide
from gna.report.htmlkit import (
    SectionContext,
    acc_text,
    accuracy_columns,
    accuracy_pivot,
    comparison_row,
    comparison_verdict,
    comparisons_note,
    comparisons_table,
    errorbar,
    pct,
    placeholder_figure,
    plural,
    save_figure,
    table,
)
from gna.report.student_training import training_part
from gna.students.spec import TEACHER_VARIANT

REFERENCE_HEADS = """
<p class='note'><b>Reference, not produced by this pipeline:</b> the study's Hybrid-Llama-1B (distilled from
Llama-3.2-1B, retrieval-guided heads kept), selected columns:</p>
<table class='ref'><thead><tr><th>attention heads kept</th><th>LAMBADA acc</th><th>MMLU</th><th>KV-Ret</th>
<th>PIQA (knowledge)</th></tr></thead><tbody>
<tr><td>0</td><td>50.7</td><td>39.2</td><td>13.2</td><td>74.2</td></tr>
<tr><td>10</td><td>54.2</td><td>42.1</td><td>99.0</td><td>74.6</td></tr>
<tr><td>20</td><td>55.0</td><td>43.0</td><td>99.3</td><td>74.5</td></tr>
<tr><td>40</td><td>54.0</td><td>44.0</td><td>99.4</td><td>73.7</td></tr>
<tr><td>512 (Llama-3.2-1B)</td><td>60.1</td><td>46.0</td><td>99.3</td><td>74.4</td></tr></tbody></table>
"""

REFERENCE_STATE = """
<p class='note'><b>Reference, not produced by this pipeline:</b> the study's state-size table (Hybrid-Llama-1B,
20 heads kept):</p>
<table class='ref'><thead><tr><th>state size</th><th>MMLU</th><th>KV-Ret</th><th>PIQA (knowledge)</th></tr></thead>
<tbody><tr><td>4</td><td>37.0</td><td>72.6</td><td>74.6</td></tr><tr><td>8</td><td>41.0</td><td>90.0</td><td>74.0</td></tr>
<tr><td>64</td><td>43.0</td><td>99.3</td><td>74.5</td></tr></tbody></table>
"""

REFERENCE_MEMORY = """
<p class='note'><b>Reference, not produced by this pipeline:</b> the study's inference memory (1B models):
Hybrid-Llamba 1.2 / 11.0 / 21.5 MB and Llama-3.2-1B 4.2 / 67.1 / 134.2 MB at L = 128 / 2048 / 4096.
Its layer swap: replacing layer 17 of the aligned Llamba by attention raised MMLU from 33% to 50%
(knowledge unchanged at 69%).</p>
"""


TASK_COLUMNS = {
    "mmlu_letter": "MMLU letter (retrieval-heavy)",
    "mmlu_cloze": "MMLU cloze (knowledge)",
    "facts_cloze": "facts cloze (knowledge)",
    "facts_choice": "facts choice (knowledge + options)",
}
PERPLEXITY = "held-out perplexity"
AGREEMENT = "KV answer kept when contexts are swapped"


def accuracy_rows(scores: pl.DataFrame) -> pl.DataFrame:
    """The acc rows a student table shows, each with its `column`: 'KV <size> keys' per
    dictionary size, 'KV all', then the MMLU formats; ordered by column. Rows recording a task a
    student was not scored on (no value) are left out: not_scored_note names them."""
    scored = (pl.col("metric") == "acc") & pl.col("value").is_not_null()
    return accuracy_columns(scores.filter(scored), "KV {} keys", TASK_COLUMNS)


def _metric_table(scores: pl.DataFrame, label_col: str) -> pl.DataFrame:
    """One row per variant: KV accuracy per dictionary size and overall, MMLU (each with its 95%
    interval, or flagged degenerate; headers with n), KV's context-swap agreement, perplexity."""
    labels = scores.select(label_col).unique(maintain_order=True)
    wide = labels.join(accuracy_pivot(accuracy_rows(scores), "column", [label_col]), on=label_col, how="left")
    agreement = scores.filter(
        (pl.col("metric") == "degeneracy_agreement") & (pl.col("group") == "all") & (pl.col("task") == "kv_retrieval")
    )
    if len(agreement):
        wide = wide.join(agreement.select(label_col, pl.col("value").alias(AGREEMENT)), on=label_col, how="left")
    ppl = scores.filter(pl.col("metric") == "perplexity").select(label_col, pl.col("value").alias(PERPLEXITY))
    return wide.join(ppl, on=label_col, how="left")


def _fmt(frame: pl.DataFrame) -> dict:
    return {AGREEMENT: pct, PERPLEXITY: lambda v: f"{v:.1f}"}


def _kv_at(scores: pl.DataFrame, size: int | None) -> pl.DataFrame:
    """KV acc rows at dictionary size `size` (None: all sizes) that were scored (a row recording
    why a student was not scored has no value)."""
    group = "all" if size is None else str(size)
    kv = (pl.col("task") == "kv_retrieval") & (pl.col("group") == group) & (pl.col("metric") == "acc")
    return scores.filter(kv & pl.col("value").is_not_null())


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
    teacher_kv = _kv_at(teacher, None)["value"]
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


def plot_align_heads(errors: pl.DataFrame, state_size: int, path) -> None:
    """Left: relative error of each SSM head after alignment (layer × head) at `state_size`;
    right: error against the teacher head's attention on the first token, every state size."""
    fig, (ax_map, ax_sink) = plt.subplots(1, 2, figsize=(11, 4))
    grid = errors.filter(pl.col("state_size") == state_size)
    if not grid.is_empty():
        n_layers, n_heads = grid["layer"].max() + 1, grid["head"].max() + 1
        values = [[float("nan")] * n_heads for _ in range(n_layers)]
        for row in grid.iter_rows(named=True):
            values[row["layer"]][row["head"]] = row["rel_error"]
        image = ax_map.imshow(values, aspect="auto", cmap="magma_r", vmin=0, vmax=max(1.0, grid["rel_error"].max()))
        fig.colorbar(image, ax=ax_map, label="relative error")
    ax_map.set(xlabel="head", ylabel="layer", title=f"SSM head error after alignment (N = {state_size})")
    for n in sorted(errors["state_size"].unique()) if not errors.is_empty() else []:
        sub = errors.filter(pl.col("state_size") == n)
        ax_sink.scatter(sub["teacher_first_token_attention"], sub["rel_error"], s=8, alpha=0.6, label=f"N = {n}")
    ax_sink.set(
        xlabel="teacher head's attention on the first token",
        ylabel="relative error",
        yscale="log",
        title="error vs the head's attention sink",
    )
    if not errors.is_empty():
        ax_sink.legend(fontsize=8)
    save_figure(fig, path)


def align_heads_part(errors: pl.DataFrame, ctx: SectionContext) -> str:
    """Per state size: the distribution of per-head errors after alignment and the worst heads."""
    if errors.is_empty():
        return ""
    stats = (
        errors.group_by("model", "state_size")
        .agg(
            pl.len().alias("SSM heads"),
            pl.col("rel_error").median().alias("median error"),
            pl.col("rel_error").quantile(0.9).alias("90th percentile"),
            pl.col("rel_error").max().alias("worst"),
            (pl.col("rel_error") > 0.5).mean().alias("share above 0.5"),
        )
        .sort("model", "state_size")
    )
    worst = (
        errors.sort("rel_error", descending=True)
        .group_by("model", "state_size", maintain_order=True)
        .head(5)
        .select(
            "model",
            "state_size",
            pl.format("L{}H{}", "layer", "head").alias("head"),
            "rel_error",
            "teacher_first_token_attention",
        )
        .sort("model", "state_size", "rel_error", descending=[False, False, True])
    )
    plot_align_heads(errors, ctx.config["hybrid"]["state_size"], ctx.figures["hybrid_align_heads"])
    return (
        "<h3>Per-head alignment error</h3><p>Relative error of each SSM head's contribution to the residual "
        "stream against its teacher head's, given the teacher's hidden state entering the layer (held windows), "
        "after stage 1.</p>"
        + table(stats, left=("model",), fmt={"share above 0.5": pct})
        + "<p>The five worst heads per state size:</p>"
        + table(worst, left=("model", "head"), fmt={"teacher_first_token_attention": pct})
        + ctx.figure("hybrid_align_heads")
    )


def _bytes(v) -> str:
    if v is None:
        return "–"
    return f"{v / 2**20:.2f} MB" if v >= 2**20 else f"{v / 2**10:.1f} KB"


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
    "size, shared by all heads-kept variants); stage 2 distills each variant end to end on the "
    "teacher's next-token distributions. Only SSM parameters are trained.</p>"
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
        f"(on the first {align_windows}), distillation {hy['kd']['steps']} steps × {hy['kd']['batch']} windows "
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
    shown = _metric_table(labelled, "heads kept")
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
        + table(shown, left=("heads kept",), fmt=_fmt(shown))
        + kv_note
        + not_scored_note(heads)
    )


def not_scored_note(scores: pl.DataFrame) -> str:
    """The tasks the students in `scores` were not scored on, each with its recorded reason."""
    if scores.is_empty() or SKIPPED not in scores.columns:
        return ""
    rows = scores.filter(pl.col(SKIPPED).is_not_null()).unique("task", keep="first").sort("task")
    if rows.is_empty():
        return ""
    listed = "".join(
        f"<li>{html.escape(TASK_COLUMNS.get(r['task'], r['task']))}: {html.escape(r[SKIPPED])}</li>"
        for r in rows.iter_rows(named=True)
    )
    return (
        "<p class='note'>Not scored for the students (blank above; "
        f"<code>chance.skip</code>):</p><ul class='note'>{listed}</ul>"
    )


def heads_kept_summary(
    teacher: pl.DataFrame, heads: pl.DataFrame, compared: pl.DataFrame, margin: float, goal_k: int = 10
) -> str:
    """KV accuracy at 10 keys (else over all sizes) of the teacher, the pure SSM and the student
    keeping `goal_k` heads (else the most heads), the two students compared item by item over all
    sizes (the comparisons table), and their perplexities against the teacher's."""
    size = 10 if len(_kv_at(teacher, 10)) else None
    where = "at 10 keys" if size else "over all dictionary sizes"
    t, students = _kv_at(teacher, size), _kv_at(heads, size).sort("heads_kept")
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
        st = _metric_table(state.with_columns(pl.col("state_size").alias("state size")), "state size")
        parts.append(
            f"<h3>{html.escape(model)}: state size ({k} attention heads kept)</h3>"
            f"<p class='note'>KV-retrieval at {size} keys, where every student of the state-size sweep "
            "is scored (the heads-kept table above has the other sizes), and held-out perplexity.</p>"
            + table(st, fmt=_fmt(st))
        )
    return "".join(parts)


def plot_budget(budget: pl.DataFrame, teacher: pl.DataFrame, size: int, path) -> None:
    """KV accuracy at `size` keys (95% intervals) and perplexity against the tokens seen by
    end-to-end distillation, one line per student."""
    fig, (ax_acc, ax_ppl) = plt.subplots(1, 2, figsize=(11, 4))
    for i, ((variant,), sub) in enumerate(budget.sort("kd_tokens").group_by("variant", maintain_order=True)):
        acc = _kv_at(sub, size)
        errorbar(ax_acc, acc["kd_tokens"], acc["value"], acc["ci_low"], acc["ci_high"], color=f"C{i}", label=variant)
        if "degenerate" in acc.columns:
            flagged = acc.filter(pl.col("degenerate").fill_null(False))
            ax_acc.scatter(flagged["kd_tokens"], flagged["value"], s=120, facecolors="none", edgecolors="red", zorder=5)
        ppl = sub.filter(pl.col("metric") == "perplexity")
        ax_ppl.plot(ppl["kd_tokens"], ppl["value"], "o-", color=f"C{i}", label=variant)
    t = _kv_at(teacher, size)["value"]
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
    """For each student with kept heads on the budget curve: the first budget whose KV accuracy
    at `size` keys reaches `share` of the teacher's, or that none does."""
    t = _kv_at(teacher, size)
    if t.is_empty() or budget.is_empty():
        return ""
    goal = share * t["value"][0]
    sentences = []
    for (variant, _k), sub in budget.filter(pl.col("heads_kept") > 0).group_by(
        "variant", "heads_kept", maintain_order=True
    ):
        kv = _kv_at(sub, size).sort("kd_tokens")
        if kv.is_empty():
            continue
        ok = kv.filter((pl.col("value") >= goal) & ~pl.col("degenerate").fill_null(False))
        if len(ok):
            first = ok.row(0, named=True)
            sentences.append(
                f"{variant} reaches {share:.0%} of the teacher's KV accuracy at {size} keys "
                f"({goal:.0%}) after {first['kd_tokens']:,} distillation tokens "
                f"({acc_text(first['value'], first['ci_low'], first['ci_high'])})."
            )
        else:
            last = kv.row(-1, named=True)
            sentences.append(
                f"{variant} does not reach {share:.0%} of the teacher's KV accuracy at {size} keys "
                f"({goal:.0%}) on this curve: {acc_text(last['value'], last['ci_low'], last['ci_high'])} "
                f"after {last['kd_tokens']:,} tokens, its largest budget here."
            )
    return f"<p><b>Goal of {share:.0%} of the teacher:</b> {' '.join(sentences)}</p>" if sentences else ""


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
    shown = _metric_table(labelled, "student, distillation tokens")
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
        + table(shown, left=("student, distillation tokens",), fmt=_fmt(shown))
        + figure
        + budget_goal(sub, teacher, size)
    )


RECIPE = (
    "<p>The recipe: SSM heads initialised from their attention heads; stage 1 starts them from the "
    "teacher heads' attention profiles (first-token share, local skip, decay) and aligns them layer by layer on the "
    "teacher's stream, then again on each student's own stream (realignment); stage "
    "2 distills end to end on all training windows with the positions "
    "that predict an answer token (KV values, MMLU letters) weighted. Each row below removes one "
    "ingredient and retrains the same student for the budget in the title, beside the full recipe at that "
    "budget; 'aligned, no KD' is the budget curve's first point.</p>"
)


def ablation_part(model: str, scores: pl.DataFrame, budget: pl.DataFrame, ablation: pl.DataFrame, hy: dict) -> str:
    """The distillation recipe's ablation table for one student: the full recipe, alignment
    only (from the budget curve) and each ablation, on the budget curve's task and perplexity."""
    sub = ablation.filter(pl.col("model") == model) if not ablation.is_empty() else ablation
    if sub.is_empty():
        return ""
    variant, size = hy["ablation"]["variant"], str(hy["dict_size"])
    label = "recipe"
    # the KV items of the budget curve's dictionary size only: the ablations were scored on those
    keep = (
        (
            ((pl.col("task") == "kv_retrieval") & (pl.col("group") == size))
            | (pl.col("task") == "heldout")
            | (pl.col("metric") == "degeneracy_agreement")
        )
        & (pl.col("variant") == variant)
        & (pl.col("model") == model)
    )
    steps = hy["ablation"].get("kd_steps")
    if steps is None:  # the ablations trained as long as the student: compare with the student
        full, at = scores.filter(keep), "all distillation steps"
    else:  # the ablations trained for one budget of the curve: compare with the recipe there
        full = budget.filter(keep & (pl.col("kd_steps") == steps)) if not budget.is_empty() else budget
        at = plural(steps, "distillation step") + (f", {full['kd_tokens'][0]:,} tokens" if len(full) else "")
    rows = [full.with_columns(pl.lit("full recipe").alias(label))]
    if not budget.is_empty():
        aligned = budget.filter(keep & (pl.col("kd_steps") == 0))
        rows.append(aligned.with_columns(pl.lit("aligned, no KD (0 distillation tokens)").alias(label)))
    rows.append(sub.filter(keep).with_columns(pl.col("description").alias(label)))
    shown = _metric_table(pl.concat(rows, how="diagonal_relaxed"), label)
    return (
        f"<h3>{html.escape(model)}: the distillation recipe, ingredient by ingredient ({html.escape(variant)}, "
        f"{html.escape(at)})</h3>" + RECIPE + table(shown, left=(label,), fmt=_fmt(shown))
    )


def swap_part(
    model: str, swap: pl.DataFrame, students: pl.DataFrame, teacher: pl.DataFrame, hy: dict, verdict: str
) -> str:
    """The pure SSM, the same with the critical layer as attention again, and the teacher, then
    `verdict` (swap_verdict's sentence)."""
    sw = swap.filter(pl.col("model") == model) if not swap.is_empty() else swap
    if sw.is_empty():
        return ""
    pure = students.filter((pl.col("heads_kept") == 0) & (pl.col("state_size") == hy["state_size"]))
    rows = _metric_table(pl.concat([pure, sw, teacher], how="diagonal_relaxed"), "variant")
    return (
        f"<h3>{html.escape(model)}: layer swap</h3>"
        f"<p>The pure SSM with the critical layer — layer {sw['swapped_layer'][0]}, home of the "
        "top-ranked head — run as the teacher's attention again (all its heads), nothing "
        "retrained.</p>" + table(rows, left=("variant",), fmt=_fmt(rows)) + verdict + not_scored_note(sw)
    )


def swap_verdict(row: dict | None, margin: float) -> str:
    """One sentence: what the swap does to KV-retrieval over all sizes, item by item (a
    comparisons-table row), set against the study's layer swap (MMLU 33% → 50%)."""
    if row is None:
        return ""
    verb = decide(row, margin).verb
    against = {
        "rises": "as in the study (its swap took MMLU from 33% to 50%)",
        "falls": "which <b>contradicts the study</b> (its swap took MMLU from 33% to 50%)",
        "holds": "no recovery, which <b>contradicts the study</b> (its swap took MMLU from 33% to 50%)",
        "undecided": "the study's swap took MMLU from 33% to 50%; this n cannot say whether it recovers here",
    }[verb]
    return (
        f"<p><b>KV-retrieval over all sizes</b>, the swapped model against the pure SSM item by item: "
        f"{comparison_verdict(row, margin)} — {against}.</p>"
    )


def model_part(
    model: str,
    scores: pl.DataFrame,
    swap: pl.DataFrame,
    budget: pl.DataFrame,
    ablation: pl.DataFrame,
    hy: dict,
    ctx: SectionContext | None,
    compared: pl.DataFrame,
    margin: float,
) -> str:
    """One teacher's students: heads-kept table (and, for `ctx`, the figures), summary, budget
    curve, state sizes, swap, and the students compared item by item (`compared`: the
    comparisons table of every teacher; `margin`: the equivalence margin)."""
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
        + ablation_part(model, sub, budget, ablation, hy)
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


def memory_table(sub: pl.DataFrame) -> str:
    """Bytes per variant and sequence length, and the ratio to the teacher at the longest."""
    wide = sub.select("variant", "seq_len", "total_bytes").pivot(on="seq_len", index="variant", values="total_bytes")
    lens = [c for c in wide.columns if c != "variant"]
    teacher_bytes = wide.filter(pl.col("variant") == TEACHER_VARIANT)
    out = wide.select("variant", *[pl.col(c).alias(f"L = {c}") for c in lens])
    if len(teacher_bytes):
        out = out.with_columns(
            [(pl.col(f"L = {c}") / teacher_bytes[c][0]).alias(f"× teacher (L = {c})") for c in lens[-1:]]
        )
    fmts = {f"L = {c}": _bytes for c in lens}
    fmts.update({c: (lambda v: f"{v:.2f}") for c in out.columns if c.startswith("×")})
    return table(out, left=("variant",), fmt=fmts)


def memory_part(memory: pl.DataFrame, hy: dict, reference: bool) -> str:
    """Per model: the inference-memory formula table and its measured check."""
    if memory.is_empty():
        return ""
    parts = []
    formula = memory.filter(pl.col("source") == "formula")
    for model in sorted(formula["model"].unique()):
        parts.append(
            f"<h3>{html.escape(model)}: inference memory (KV cache + SSM state)</h3>"
            f"<p>Computed from each configuration for one sequence at "
            f"{hy['memory']['bytes_per_value']} bytes per value: K/V of every group with a kept "
            "head, and per SSM head an N×P state, the first token's P-vector value and the last three "
            "tokens' values (the local skip).</p>"
        )
        parts.append(memory_table(formula.filter(pl.col("model") == model)))
        measured = memory.filter((pl.col("source") == "measured") & (pl.col("model") == model))
        for row in measured.iter_rows(named=True):
            parts.append(
                f"<p>Measured check: after a prefill of {row['seq_len']} tokens the recurrent cache of "
                f"<code>{html.escape(row['variant'])}</code> held {row['total_bytes']:,} bytes (fp32 "
                f"tensors); the formula gives {row['formula_bytes']:,}.</p>"
            )
    if reference:
        parts.append(REFERENCE_MEMORY)
    return "".join(parts)


def render_hybrid(ctx: SectionContext) -> str:
    """The students: heads kept, state size, layer swap, answer rows, memory and training curves
    (placeholder figures when the hybrid phase is off)."""
    skipped = [name for name, spec in ctx.config["models"].items() if "hybrid" in spec.get("skip", [])]
    skipped_note = (
        f"<p>No students of {', '.join(f'<code>{html.escape(m)}</code>' for m in skipped)}: "
        "<code>skip: [hybrid]</code> in the config (students replace attention with separate q/k/v/o "
        "projections and rotary positions head by head; the README's family table lists the families "
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
    compared = ctx.frame("hybrid_comparisons")
    parts += [
        model_part(model, scores, swap, budget, ablation, hy, ctx if model == models[0] else None, compared, ctx.margin)
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
