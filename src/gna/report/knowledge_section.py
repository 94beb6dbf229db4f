"""Report section: knowledge vs retrieval, on the facts (cloze and multiple choice) beside KV.

Every sentence comes from a paired comparison of the two conditions on the same items (the
phases' comparisons tables, gna.core.paired): "falls" / "rises" only where the exact McNemar
test rejects after Holm's correction, "holds" only within the equivalence margin, otherwise
"not decided" with the n that would decide it.
"""

from __future__ import annotations

import html

import matplotlib.pyplot as plt
import polars as pl

from gna.core.chance import above_chance, answered
from gna.core.paired import (
    ALPHA,
    NOT_COPYABLE,
    SUBSETS,
    Decision,
    decide,
    detectable_difference,
    holm,
    mcnemar_p,
)
from gna.core.stats import wilson_interval
from gna.report.headline import knowledge_k
from gna.report.htmlkit import (
    SectionContext,
    acc_text,
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
from gna.report.study import VERBS
from gna.students.spec import TEACHER_VARIANT, variant_name
from gna.tasks.facts import LETTERS, repeats_solved_answer

# (task, group) of each column of the view, and its name
COLUMNS = {
    ("kv_retrieval", "all"): "KV retrieval",
    ("facts_cloze", "all"): "facts cloze (knowledge)",
    ("facts_choice", "all"): "facts choice",
    ("facts_choice", "known"): "facts choice, known items",
}


def _acc(frame: pl.DataFrame, task: str, group: str) -> dict | None:
    """The acc row (value, ci_low, ci_high, n) of `task` and `group` in a tidy results frame; None
    where it was not scored (no row, or a row recording why, with no value)."""
    if frame.is_empty():
        return None
    acc = (pl.col("task") == task) & (pl.col("group") == group) & (pl.col("metric") == "acc")
    rows = frame.filter(acc & pl.col("value").is_not_null())
    return rows.row(0, named=True) if len(rows) else None


def conditions(model: str, ctx: SectionContext) -> list[tuple[str, pl.DataFrame]]:
    """(label, tidy results) of each condition the view compares, for `model`: the unmodified
    model, the top-k heads removed (k = 5, or the largest k of heads.top_k below it) and its
    first random-k control, the pure SSM and the k = 10 (or largest) hybrid student, and the
    pure SSM with its critical layer swapped back to attention."""
    out = []
    baseline = ctx.frame("baseline")
    if not baseline.is_empty():
        out.append(("unmodified", baseline.filter((pl.col("model") == model) & (pl.col("engine") == "gna"))))
    topk = ctx.frame("heads_topk")
    if not topk.is_empty():
        topk = topk.filter(pl.col("model") == model)
        ks = sorted(k for k in topk["k"].unique().to_list() if 0 < k <= 5)
        if ks:
            k = ks[-1]
            out.append((f"top {k} heads removed", topk.filter((pl.col("condition") == "top") & (pl.col("k") == k))))
            random = topk.filter((pl.col("condition") == "random") & (pl.col("k") == k) & (pl.col("draw") == 0))
            if len(random):
                out.append((f"{k} random heads removed", random))
    hybrid = ctx.config.get("hybrid", {})
    scores = ctx.frame("hybrid_scores")
    if hybrid.get("enabled") and not scores.is_empty():
        scores = scores.filter(pl.col("model") == model)
        kept = sorted(hybrid.get("knowledge_heads_kept") or hybrid["heads_kept"])  # the students scored on knowledge
        for k in dict.fromkeys([0, 10 if 10 in kept else kept[-1]]):
            variant = variant_name(k, hybrid["state_size"])
            rows = scores.filter(pl.col("variant") == variant)
            if len(rows):
                out.append((f"student {variant}" + (" (pure SSM)" if k == 0 else ""), rows))
        swap = ctx.frame("hybrid_swap")
        swap = swap.filter(pl.col("model") == model) if not swap.is_empty() else swap
        if not swap.is_empty():  # a model without students (skip: [hybrid]) has no swap of its own
            out.append((str(swap["variant"][0]), swap))
    return out


def view_table(conds: list[tuple[str, pl.DataFrame]]) -> pl.DataFrame:
    """One row per condition, one acc_text cell (with its 95% interval) per COLUMNS entry."""
    rows = []
    for label, frame in conds:
        row = {"condition": label}
        for (task, group), name in COLUMNS.items():
            acc = _acc(frame, task, group)
            row[name] = (acc_text(acc["value"], acc["ci_low"], acc["ci_high"]) + f" n={acc['n']}") if acc else "–"
        rows.append(row)
    return pl.DataFrame(rows)


KIND = {"kv_retrieval": "kv", "facts_cloze": "cloze", "facts_choice": "choice"}


def against_study(measured: Decision, reported: str | None) -> str:
    """How a measured decision (gna.core.paired.decide) stands to the study's verb: a change shown to
    be smaller than the margin is the study's "holds" at that margin."""
    if reported is None:
        return ""
    verb = "holds" if measured.within and reported == "holds" else measured.verb
    if verb == reported:
        return " — as the study reports" + (" (a change smaller than the margin)" if measured.within else "")
    if verb == "undecided":
        return f" — the study reports that it {reported}; this n cannot decide it"
    return f" — <b>contradicts the study</b>, which reports that it {'stays' if reported == 'holds' else reported}"


def change_sentence(name: str, row: dict | None, what: str, margin: float, reported: str | None = None) -> str | None:
    """'<name>: a → b on the same n items' under <what>, with the verdict the paired tests allow
    (a comparisons-table row, gna.core.paired) and how it stands to what the study reports
    (`reported`: falls, rises or holds)."""
    if row is None:
        return None
    cells = (
        f"{html.escape(name)}: {pct(row['acc_reference'])} → {pct(row['acc_condition'])} on the same {row['n']} items"
    )
    return f"{cells} with {what}: {comparison_verdict(row, margin)}{against_study(decide(row, margin), reported)}"


def comparison_pairs(model: str, ctx: SectionContext) -> list[tuple[pl.DataFrame, str, str, str, str, str]]:
    """(comparisons table, family, reference, condition, what, study kind) of each change the view
    judges for `model`: the top-k removal (k = 5, or the largest k below it) against the
    unmodified model, the pure SSM against its teacher, the k = 10 (or largest) hybrid against the
    pure SSM, and the layer swap against the pure SSM."""
    out = []
    topk = ctx.frame("heads_topk_comparisons")
    if not topk.is_empty():
        topk = topk.filter((pl.col("model") == model) & (pl.col("family") == "top k vs unmodified"))
        k = knowledge_k(topk["condition"].unique().to_list())
        if k is not None:
            out.append(
                (topk, "top k vs unmodified", "unmodified", f"top {k}", f"the top {k} of the ranking removed", "topk")
            )
    hybrid = ctx.config.get("hybrid", {})
    students = ctx.frame("hybrid_comparisons")
    if hybrid.get("enabled") and not students.is_empty():
        students = students.filter(pl.col("model") == model)
        kept = sorted(hybrid.get("knowledge_heads_kept") or hybrid["heads_kept"])
        pure = variant_name(0, hybrid["state_size"])
        out.append(
            (
                students,
                "students vs teacher",
                TEACHER_VARIANT,
                pure,
                "the teacher distilled into its pure SSM student",
                "ssm",
            )
        )
        goal = 10 if 10 in kept else kept[-1]
        if goal:
            variant = variant_name(goal, hybrid["state_size"])
            out.append(
                (students, "hybrids vs pure SSM", pure, variant, f"the pure SSM replaced by {variant}", "hybrid")
            )
        swaps = students.filter(pl.col("family") == "layer swap vs pure SSM")
        if len(swaps):
            label = swaps["condition"][0]
            what = f"the pure SSM's layer {label.rsplit(' ', 1)[-1]} back as attention"
            out.append((students, "layer swap vs pure SSM", pure, label, what, "swap"))
    return out


def findings(model: str, ctx: SectionContext) -> list[str]:
    """Sentences judging each change of comparison_pairs task by task, from the paired tests of
    its comparisons table, each beside what the study reports."""
    out = []
    for compared, family, reference, condition, what, kind in comparison_pairs(model, ctx):
        for (task, group), name in COLUMNS.items():
            row = comparison_row(compared, family, reference, condition, task, group)
            sentence = change_sentence(name, row, what, ctx.margin, VERBS[kind][KIND[task]])
            if sentence:
                out.append(sentence)
            if (task, group) == ("facts_cloze", "all"):  # knowledge where copying the subject cannot help
                row = comparison_row(compared, family + SUBSETS, reference, condition, task, NOT_COPYABLE)
                sentence = change_sentence(f"{name}, answers not copyable", row, what, ctx.margin, VERBS[kind]["cloze"])
                if sentence:
                    out.append(sentence)
    return out


def subsets_part(model: str, ctx: SectionContext) -> str:
    """The comparisons of comparison_pairs on each relation and on the items whose answer is not
    copyable from the subject (the SUBSETS families: Holm within them), as one table."""
    parts = []
    for compared, family, reference, condition, _, _ in comparison_pairs(model, ctx):
        rows = compared.filter(
            (pl.col("family") == family + SUBSETS)
            & (pl.col("reference") == reference)
            & (pl.col("condition") == condition)
        )
        if len(rows):
            parts.append(rows)
    if not parts:
        return ""
    return (
        "<p>The same comparisons relation by relation, and on the facts whose answer cannot be copied from the "
        "subject's letters (<i>not copyable</i>: not German ← Germany, not Mg ← Magnesium), each a family of its "
        "own for Holm's correction:</p>"
        + comparisons_table(
            pl.concat(parts, how="diagonal_relaxed").with_columns(pl.lit(model).alias("model")), ctx.margin
        )
    )


ONE_POSITION = 0.5  # a model putting more than this share of its answers on one option is flagged


def answer_rows(tasks: pl.DataFrame, items: pl.DataFrame) -> pl.DataFrame:
    """Per model, task and relation (and 'all', and the items whose answer is not copyable from
    the subject): n, accuracy, and for the multiple-choice form the share of answers on each option
    position, the largest share, and the share whose chosen option is a solved example's answer;
    from the baseline's per-item answers joined with the task tables (relation, copyable, choices,
    solved_answers) on task and item."""
    joined = items.select("model", "task", "item_id", "pred", "target", "correct").join(
        tasks.select("task", "item_id", "relation", "copyable", "choices", "solved_answers"), on=["task", "item_id"]
    )
    columns = [joined[c].to_list() for c in ("task", "pred", "choices", "solved_answers")]
    repeats = [
        task == "facts_choice" and repeats_solved_answer(pred, choices, solved)
        for task, pred, choices, solved in zip(*columns)
    ]
    joined = joined.with_columns(pl.Series("repeats_example", repeats))
    subsets = [("all", joined)]
    subsets += [(r, joined.filter(pl.col("relation") == r)) for r in sorted(joined["relation"].unique())]
    subsets.append((NOT_COPYABLE, joined.filter(~pl.col("copyable"))))
    out = []
    for relation, part in subsets:
        for (model, task), rows in part.group_by(["model", "task"], maintain_order=True):
            n, correct = len(rows), int(rows["correct"].sum())
            low, high = wilson_interval(correct, n)
            entry = {"model": model, "task": task, "relation": relation, "n": n}
            entry |= {"value": correct / n, "ci_low": low, "ci_high": high}
            if task == "facts_choice":
                shares = [float((rows["pred"] == i).mean()) for i in range(len(LETTERS))]
                top = max(range(len(LETTERS)), key=shares.__getitem__)
                entry |= {f"answer {letter}": share for letter, share in zip(LETTERS, shares)}
                entry |= {"largest share": shares[top], "correct there": float((rows["target"] == top).mean())}
                entry |= {"repeats an example": float(rows["repeats_example"].mean())}
            out.append(entry)
    return pl.DataFrame(out).sort(["model", "task", "relation"])


def answers_part(ctx: SectionContext) -> str:
    """Per model: each relation's cloze and multiple-choice accuracy, where the multiple-choice
    answers go (option positions, the first solved example's answer), flagged where one position
    takes more than half of them."""
    tasks, items = ctx.frame("facts_tasks"), ctx.frame("facts_items")
    if tasks.is_empty() or items.is_empty():
        return ""
    rows = answer_rows(tasks, items)
    shown = rows.with_columns(
        pl.struct("value", "ci_low", "ci_high")
        .map_elements(lambda r: acc_text(r["value"], r["ci_low"], r["ci_high"]), return_dtype=pl.String)
        .alias("accuracy")
    )
    choice_cols = [c for c in rows.columns if c.startswith("answer ")] + ["repeats an example"]
    keep = ["model", "task", "relation", "n", "accuracy"] + [c for c in choice_cols if c in rows.columns]
    flagged = rows.filter(pl.col("largest share") > ONE_POSITION) if "largest share" in rows.columns else rows.clear()
    flags = "".join(
        f"<li><b>{html.escape(r['model'])}, {html.escape(r['relation'])}</b>: one option position takes "
        f"{pct(r['largest share'])} of the multiple-choice answers, where the correct answer is for "
        f"{pct(r['correct there'])} of the items: read its accuracy with that preference in mind</li>"
        for r in flagged.iter_rows(named=True)
    )
    return (
        "<h3>Where the answers go, relation by relation</h3>"
        "<p>The unmodified model's answers per relation and on the facts whose answer cannot be copied from the "
        "subject's letters (<i>not copyable</i>), cloze and multiple choice; the share of multiple-choice answers on "
        "each option position (chance puts 25% on each), and the share that picks a solved example's answer. A "
        "position taking more than half of the answers is flagged.</p>"
        + table(shown.select(keep), left=("model", "task", "relation"), fmt={c: pct for c in choice_cols})
        + (
            f"<ul>{flags}</ul>"
            if flags
            else "<p>No relation has one option position taking more than half of the answers.</p>"
        )
    )


# the comparisons tables the report reads, and their names in the power table
COMPARED = {
    "heads_topk_comparisons": "remove top-k / random-k",
    "heads_kept_comparisons": "heads kept",
    "gna_masking_comparisons": "G&A masking",
    "prune_gradual_comparisons": "gradual pruning",
    "hybrid_comparisons": "students",
}
FALL = 0.10  # the fall each table should be able to show


def power_part(ctx: SectionContext) -> str:
    """Per comparisons table: its rows, their n, and the smallest paired difference a row detects
    at 80% power at its own share of changing items (median over the rows, and the share of rows
    that could show a 10-point fall), so a reader knows which "not decided" is a question of n."""
    rows = []
    for key, name in COMPARED.items():
        frame = ctx.frame(key)
        if frame.is_empty():
            continue
        detectable = [
            detectable_difference(r["n"], r["reference_only"] + r["condition_only"], r.get("holm_multiplier") or 1)
            for r in frame.iter_rows(named=True)
        ]
        rows.append(
            {
                "comparisons": name,
                "rows": len(frame),
                "n": f"{frame['n'].min()}–{frame['n'].max()}"
                if frame["n"].min() != frame["n"].max()
                else str(frame["n"][0]),
                "detectable at 80% power (median)": f"±{100 * sorted(detectable)[len(detectable) // 2]:.0f} points",
                f"rows that can show a {100 * FALL:.0f}-point fall": pct(
                    sum(d <= FALL for d in detectable) / len(detectable)
                ),
            }
        )
    if not rows:
        return ""
    return (
        "<h3>What the comparisons can detect</h3>"
        "<p>For each table of paired comparisons, the smallest difference its rows detect with 80% power (McNemar, "
        "5% two-sided divided by the row's Holm multiplier within its family) given their n and the share of "
        "items that changed between the two conditions. Where a "
        f"{100 * FALL:.0f}-point fall is beyond a row's reach, its <i>not decided</i> is a question of n, not of the "
        "model.</p>" + table(pl.DataFrame(rows), left=("comparisons",))
    )


def plot_view(per_model: dict[str, list[tuple[str, pl.DataFrame]]], path) -> None:
    """Accuracy (95% interval) per condition, one line per column of the view, per model."""
    models = list(per_model) or ["–"]
    fig, axes = plt.subplots(1, len(models), figsize=(7 * len(models), 4.2), squeeze=False)
    for ax, model in zip(axes[0], models):
        conds = per_model.get(model, [])
        for i, ((task, group), name) in enumerate(COLUMNS.items()):
            xs, vals, lows, highs = [], [], [], []
            for x, (_, frame) in enumerate(conds):
                acc = _acc(frame, task, group)
                if acc:
                    xs.append(x + (i - 1.5) * 0.08)
                    vals.append(acc["value"]), lows.append(acc["ci_low"]), highs.append(acc["ci_high"])
            if xs:  # conditions are categories: markers, no connecting lines
                errorbar(ax, xs, vals, lows, highs, label=name, ls="none", marker="o")
        students = [x for x, (label, _) in enumerate(conds) if label.startswith("student ")]
        if students and students[0] > 0:
            ax.axvline(students[0] - 0.5, color="gray", lw=0.8)  # the teacher's conditions | the students'
        ax.set_xticks(range(len(conds)), [label for label, _ in conds], rotation=25, ha="right", fontsize=8)
        ax.axhline(0.25, color="gray", lw=0.8, ls="--", label="chance of the facts (4 options)")
        ax.set(ylim=(-0.02, 1.02), ylabel="accuracy (95% interval)", title=f"{model}: knowledge vs retrieval")
        ax.legend(fontsize=7)
    save_figure(fig, path)


def _acc_cell(row: dict, prefix: str = "") -> str | None:
    value = row.get(f"{prefix}acc")
    return acc_text(value, row[f"{prefix}ci_low"], row[f"{prefix}ci_high"]) if value is not None else None


def formats_sentences(model: str, formats: pl.DataFrame) -> list[str]:
    """What the format comparison of `model` shows: how many forms are above chance on the
    development split, plainly and by the circular check; the best letter form (MMLU's answer,
    the study's) and whether any is above chance; the chosen form against the best; its spread
    over draws of solved examples on the evaluation split."""
    rows = formats.filter((pl.col("model") == model) & pl.col("answer").is_not_null() & (pl.col("n") > 0))
    dev, evaluation = rows.filter(pl.col("split") == "dev"), rows.filter(pl.col("split") == "eval")
    if dev.is_empty():
        return []
    chance = dev["chance"][0]
    above = [row for row in dev.iter_rows(named=True) if above_chance(row["ci_low"], row["chance"])]
    circular = [row for row in above if answered(row)]
    out = [
        f"Development split (n = {dev['n'][0]} facts, its own solved examples): {len(above)} of {len(dev)} "
        f"multiple-choice forms are above chance ({pct(chance)}) by their 95% interval; {len(circular)} of those "
        "also pass the circular check, which counts an item only where the answer follows its content under all "
        f"four orders of the options (a uniform guess passes it {pct(chance**4)} of the time; a form at chance is "
        "not rotated)."
    ]
    ranked = ["circular_acc", "acc"]
    letters = dev.filter(pl.col("answer") == "letter").sort(ranked, descending=True, nulls_last=True)
    if len(letters):
        best = letters.row(0, named=True)
        shown = f"{html.escape(best['form'])}: {_acc_cell(best)}, circular {_acc_cell(best, 'circular_') or '–'}"
        if answered(best):
            out.append(f"The letter format (MMLU's answer, the study's form) is answered: best {shown}.")
        else:
            out.append(
                f"<b>No letter form is above chance on this model</b> (best {shown}): the study's letter result "
                "cannot be decided here; every multiple-choice comparison below reads the form of "
                "<code>tasks.facts.choice</code>, which the model may answer from memory as it answers cloze."
            )
    own = dev.filter(pl.col("chosen"))
    if len(own):
        run = own.row(0, named=True)
        text = (
            f"The form every experiment runs (<code>tasks.facts.choice</code>: {html.escape(run['form'])}): "
            f"{_acc_cell(run)}, circular {_acc_cell(run, 'circular_')} on the development split"
        )
        out.append(text + against_best(dev, run) + ".")
    if len(evaluation):
        accs = evaluation.sort("draw")["acc"].to_list()
        first = evaluation.sort("draw").row(0, named=True)
        out.append(
            f"On the evaluation split (n = {first['n']}) it gives {', '.join(pct(a) for a in accs)} over "
            f"{len(accs)} draws of solved examples (spread {100 * (max(accs) - min(accs)):.1f} points, to read "
            f"beside each interval), circular {_acc_cell(first, 'circular_') or '–'} on the task's own draw."
        )
    return out


def against_best(dev: pl.DataFrame, run: dict) -> str:
    """The clause comparing the chosen form `run` with the other forms of the development split by
    the circular check, paired on the same facts: exact McNemar on the facts only one of the two
    passes, Holm over every form compared with the chosen one (the best is a maximum over them).
    The chosen form trails the best of the forms the corrected test shows better; else the best by
    the circular check cannot be told apart from it. Empty where nothing was paired or the chosen
    form is the best."""
    compared = dev.filter(pl.col("circular_form_only").is_not_null() & ~pl.col("chosen"))
    if compared.is_empty():
        return ""
    compared = compared.with_columns(
        pl.struct("circular_chosen_only", "circular_form_only")
        .map_elements(lambda r: mcnemar_p(r["circular_chosen_only"], r["circular_form_only"]), return_dtype=pl.Float64)
        .alias("p")
    )
    compared = compared.with_columns(pl.Series("p_holm", holm(compared["p"].to_list())))
    ranked = ["circular_acc", "acc"]
    better = compared.filter(
        (pl.col("p_holm") < ALPHA) & (pl.col("circular_form_only") > pl.col("circular_chosen_only"))
    ).sort(ranked, descending=True, nulls_last=True)
    best = (better if len(better) else compared.sort(ranked, descending=True, nulls_last=True)).row(0, named=True)
    if not len(better) and (best["circular_acc"] or 0) <= (run["circular_acc"] or 0):
        return ""
    paired = (
        f"on the same facts it passes {best['circular_form_only']} the configured form fails and "
        f"fails {best['circular_chosen_only']} it passes (exact McNemar p = {best['p']:.2g}, Holm over the "
        f"{len(compared)} forms compared {best['p_holm']:.2g})"
    )
    which = "the best the paired test shows better" if len(better) else "the best by the circular check"
    verdict = (
        "<b>the configured form trails it</b>: choose that one in <code>tasks.facts.choice</code>"
        if len(better)
        else "the two cannot be told apart at this n"
    )
    return f"; {which} is {html.escape(best['form'])}, circular {_acc_cell(best, 'circular_')}: {paired}, so {verdict}"


def formats_part(formats: pl.DataFrame) -> str:
    """The format comparison (rule facts_formats): the development split's forms with their circular
    check and answer positions, the chosen form's draws on the evaluation split, and what they show."""
    if formats.is_empty():
        return ""
    shown = formats.with_columns(
        pl.struct(formats.columns)
        .map_elements(lambda r: _acc_cell(r) or r["note"], return_dtype=pl.String)
        .alias("accuracy"),
        pl.struct(formats.columns)
        .map_elements(lambda r: _acc_cell(r, "circular_"), return_dtype=pl.String)
        .alias("circular check"),
        pl.when(pl.col("distinct_predictions") == 1)
        .then(pl.lit("one answer for every item"))
        .when(pl.col("largest_share") > ONE_POSITION)
        .then(pl.format("{}% on one position", (100 * pl.col("largest_share")).round(0).cast(pl.Int64)))
        .otherwise(pl.lit(""))
        .alias("flag"),
        pl.when(pl.col("chosen")).then(pl.lit("✓")).otherwise(pl.lit("")).alias("chosen"),
    ).rename({"repeats_example": "picks an example's answer"})
    dev = shown.filter(pl.col("split") == "dev").select(
        "model",
        "form",
        "n",
        "accuracy",
        "circular check",
        "chance",
        "flag",
        "picks an example's answer",
        "prompt_tokens",
        "chosen",
    )
    evaluation = shown.filter(pl.col("split") == "eval").select(
        "model", "form", "draw", "n", "accuracy", "circular check"
    )
    sentences = [s for model in formats["model"].unique(maintain_order=True) for s in formats_sentences(model, formats)]
    return (
        "<h3>Which multiple-choice form the model can answer</h3>"
        "<p>Chosen on a development split the report judges nothing else on (its own facts and solved examples): "
        "every form of <code>tasks.facts.compare</code> (or a model's own, <code>overrides.facts</code>) — the "
        "answer as the option's letter (MMLU's) or its text; "
        "0–5 solved examples; options marked <i>A.</i> or <i>(A)</i>; plain text or the model's own chat template, "
        "with or without the reply opened by <i>The answer is</i> — beside the cloze form, each also under the "
        "four rotations of its options (<b>circular check</b>: an item counts only where the answer follows its "
        "content in all four). <i>flag</i>: one answer for every item, or more than half of the answers on one "
        "position. ✓: the form every experiment runs (<code>tasks.facts.choice</code>).</p>"
        + table(
            dev,
            left=("model", "form", "flag"),
            fmt={"chance": pct, "prompt_tokens": lambda v: f"{v:.0f}", "picks an example's answer": pct},
        )
        + "<p>The chosen form on the evaluation split, under other draws of its solved examples:</p>"
        + table(evaluation, left=("model", "form"))
        + "<ul>"
        + "".join(f"<li>{s}</li>" for s in sentences)
        + "</ul>"
    )


def render_knowledge(ctx: SectionContext) -> str:
    """Knowledge vs retrieval: the format comparison, then per model the facts (cloze, multiple
    choice on all and on known items) beside KV under each condition, with computed findings."""
    formats = ctx.frame("facts_formats")
    facts = ctx.config["tasks"]["facts"]
    if not facts["formats"]:  # the figure is a declared output of the report rule all the same
        placeholder_figure(ctx.figures["knowledge_view"], "no facts task in this config (tasks.facts.formats: [])")
        return ""
    per_model = {}
    baseline = ctx.frame("baseline")
    models = baseline["model"].unique(maintain_order=True).to_list() if not baseline.is_empty() else []
    parts = [
        "<h2>Knowledge vs retrieval</h2>",
        "<p>The study's contrast on facts the model can know: the same fact asked in <b>cloze</b> form "
        f"(knowledge only) and as <b>multiple choice</b> with its four options listed (knowledge plus picking "
        f"the option in context; answer as the option's {html.escape(facts['choice']['answer'])}, "
        f"{plural(facts['choice']['shots'], 'solved example')}). <b>Known items</b>: those whose cloze answer "
        "the model gets right by "
        f"at least {facts['known_margin']:g} nats over the best wrong option (a student: its teacher's), so the "
        "multiple-choice score there measures the in-context step on knowledge the model has.</p>",
        formats_part(formats),
    ]
    for model in models:
        if model.endswith(f"-{TEACHER_VARIANT}"):
            continue
        conds = conditions(model, ctx)
        if not conds:
            continue
        per_model[model] = conds
        parts.append(f"<h3>{html.escape(model)}</h3>" + table(view_table(conds), left=("condition",)))
        sentences = findings(model, ctx)
        if sentences:
            parts.append("<ul>" + "".join(f"<li>{s}</li>" for s in sentences) + "</ul>" + comparisons_note(ctx.margin))
        parts.append(subsets_part(model, ctx))
    plot_view(per_model, ctx.figures["knowledge_view"])
    parts.append(ctx.figure("knowledge_view"))
    parts.append(answers_part(ctx))
    parts.append(power_part(ctx))
    return "\n".join(parts)
