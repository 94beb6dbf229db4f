"""The facts' format comparison: which multiple-choice form the model can answer, chosen on data
the report does not judge the study on.

On the development split (its own facts and solved examples, gna.tasks.facts.split_items) every
form of `tasks.facts.compare` (letter or text answer, shots, option marker, plain text or the
model's chat template with or without "The answer is") is scored beside the cloze form, each
under the four rotations of its options: the circular check counts an item only where the answer
follows the content in all four (asked of the task's own form and of any form above chance: one
at chance follows no content to check). On the evaluation split, the task's own form
(`tasks.facts.choice`) is scored again over `tasks.facts.draws` draws of its solved examples, and
under the circular check, so the report gives the spread that the draw of examples alone makes.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, replace

import polars as pl

from gna.core.chance import above_chance, chance_accuracy
from gna.core.io import read_parquet, write_parquet
from gna.core.settings import Evaluation, Files, RuleSettings
from gna.core.stats import wilson_interval
from gna.engine.scoring import Scorer, known_items, score_as_tree, starts_with_bos
from gna.models.prepare import load_model
from gna.tasks.facts import LETTERS, ChoiceForm, FactSelection, build_facts, repeats_solved_answer

log = logging.getLogger("gna.phases.knowledge")

PROMPT = ["item_id", "context", "choices", "target"]


def chat_renderer(tok):
    """messages → the prompt text of the tokenizer's chat template with the assistant's turn
    opened, without a leading BOS where the scorer puts one itself; None without a template."""
    if not getattr(tok, "chat_template", None):
        return None
    bos = tok.bos_token if starts_with_bos(tok) else None

    def render(messages: list[dict]) -> str:
        text = tok.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
        return text[len(bos) :] if bos and text.startswith(bos) else text

    return render


def scores_of(
    scorer: Scorer, tables: list[pl.DataFrame], earlier: list[tuple[pl.DataFrame, pl.DataFrame]]
) -> list[pl.DataFrame]:
    """The scorer's model's per-item scores on each of `tables` (one form's rotations): read from
    `earlier` [(task table, its per-item scores)] where one holds the same prompts (the task's own
    formats, scored by the baseline), the others scored together (score_as_tree: a fact's rotations
    share their prompt's start; no progress bar)."""

    def known(table):
        held = [items for task_table, items in earlier if task_table.select(PROMPT).equals(table.select(PROMPT))]
        return known_items(table, held[0]) if held else None

    found = [known(t) for t in tables]
    scored = iter(score_as_tree(replace(scorer, progress=False), [t for t, f in zip(tables, found) if f is None]))
    return [f if f is not None else next(scored) for f in found]


def form_row(tables: list[pl.DataFrame], scored: list[pl.DataFrame], tok) -> dict:
    """One form's accuracy with its n and Wilson 95% interval (rotation 0: `tables[0]`), its
    circular accuracy where `tables` holds all four rotations (items right under every one),
    chance, how many distinct options it predicts (1: the same answer for every item), the
    largest share of answers on one option position, the share repeating a solved example's
    answer, and the prompt length in tokens."""
    table, items = tables[0], scored[0]
    n, correct = len(items), int(items["correct"].sum())
    low, high = wilson_interval(correct, n)
    row = {"n": n, "acc": correct / n, "ci_low": low, "ci_high": high, "chance": chance_accuracy(table)}
    if len(scored) == len(LETTERS):
        circ = int(circular_items(scored)["correct"].sum())
        c_low, c_high = wilson_interval(circ, n)
        row |= {"circular_acc": circ / n, "circular_ci_low": c_low, "circular_ci_high": c_high}
    else:
        row |= {"circular_acc": None, "circular_ci_low": None, "circular_ci_high": None}
    shares = [float((items["pred"] == i).mean()) for i in range(len(table["choices"][0]))]
    return row | {
        "distinct_predictions": items["pred"].n_unique(),
        "largest_share": max(shares),
        "repeats_example": repeats_example(table, items),
        "prompt_tokens": sum(len(tok(c)["input_ids"]) for c in table["context"]) / n,
    }


def circular_items(scored: list[pl.DataFrame]) -> pl.DataFrame:
    """Per item (item_id, correct): right under every rotation of `scored` (the circular check)."""
    return pl.concat([s.select("item_id", "correct") for s in scored]).group_by("item_id").agg(pl.col("correct").all())


def against_chosen(circular: dict[str, pl.DataFrame], chosen: str) -> dict[str, tuple[int, int]]:
    """{form: (items only the chosen form passes, items only `form` passes)} under the circular
    check, on the same facts, for every form of `circular` {form: circular_items} but the chosen;
    {} where the chosen form has no circular check. What the report pairs the forms on."""
    if chosen not in circular:
        return {}
    own = circular[chosen].rename({"correct": "own"})
    out = {}
    for form, items in circular.items():
        if form == chosen:
            continue
        joined = own.join(items, on="item_id", how="inner")
        out[form] = (
            int((joined["own"] & ~joined["correct"]).sum()),
            int((~joined["own"] & joined["correct"]).sum()),
        )
    return out


def repeats_example(table: pl.DataFrame, items: pl.DataFrame) -> float | None:
    """The share of a text-answer form's predictions that repeat a solved example's answer (None
    for other forms: a letter or a cloze completion is no example's answer)."""
    if not str(table["format"][0]).endswith("(text)"):
        return None
    joined = items.select("item_id", "pred").join(table.select("item_id", "choices", "solved_answers"), on="item_id")
    columns = [joined[c].to_list() for c in ("pred", "choices", "solved_answers")]
    repeats = [repeats_solved_answer(*item) for item in zip(*columns)]
    return sum(repeats) / len(repeats)


@dataclass(frozen=True)
class FormatComparison:
    """What the format comparison asks (config section tasks.facts): the facts of `selection`
    (relations, n, seed, and dev.n as dev_n), the task's own multiple-choice form `choice`, the
    forms `compare` scored beside it on the development split, and the `draws` of solved examples
    the own form is scored under on the evaluation split."""

    selection: FactSelection = FactSelection()
    choice: ChoiceForm = ChoiceForm()
    compare: tuple[ChoiceForm, ...] = ()
    draws: int = 3


def compare_formats(
    scorer: Scorer,
    facts: pl.DataFrame,
    comparison: FormatComparison,
    earlier: list[tuple[pl.DataFrame, pl.DataFrame]] = (),
) -> pl.DataFrame:
    """One row per (split, form): on the development split the cloze form and every form of
    comparison.compare, with its circular check where its accuracy is above chance or it is the
    task's own form; on the evaluation split the task's own form (comparison.choice) at each of
    comparison.draws draws of solved examples, draw 0 with its circular check. `chosen` marks
    the task's own form; on the development split, circular_chosen_only / circular_form_only count
    the facts only the chosen form / only this form passes under the circular check (against_chosen);
    chat forms are left out (a row with n = 0 and a note) where the tokenizer
    has no chat template. `earlier`: the task tables with
    their baseline scores, read instead of scoring them again."""
    tok = scorer.tok
    chat = chat_renderer(tok)

    def build(fmt, form=None, split="dev"):
        form = form or ChoiceForm()
        return build_facts(facts, comparison.selection, fmt, form, split=split, chat=chat)

    own = comparison.choice
    rows, passed = [], {}  # {dev form: its circular_items}, to pair the forms on

    def add(split, form, circular, note=None):
        """Score `form` on `split` (None: the cloze form); under its other three rotations too where
        `circular` says so (True: always; None: where its accuracy is above chance, since a form at
        chance follows no content to check; False: never)."""
        row = {"split": split, "form": form.label if form else "cloze", "answer": form and form.answer}
        row |= {"shots": form and form.shots, "marker": form and form.marker, "chat": form and form.chat}
        row |= {"prefix": form and form.prefix, "draw": form.draw if form else 0, "note": note}
        if note:
            rows.append(row | {"n": 0})
            return

        def rotated():
            return [build("choice", replace(form, rotation=r), split) for r in range(1, len(LETTERS))]

        tables = [build("choice", form, split) if form else build("cloze")]
        if form and circular:  # the four rotations asked at once
            tables += rotated()
        scored = scores_of(scorer, tables, earlier)
        low = wilson_interval(int(scored[0]["correct"].sum()), len(scored[0]))[0]
        if form and circular is None and above_chance(low, chance_accuracy(tables[0])):
            tables += rotated()
            scored += scores_of(scorer, tables[1:], earlier)
        if len(tables) > 1 and split == "dev":
            passed[row["form"]] = circular_items(scored)
        rows.append(row | form_row(tables, scored, tok))
        log.info(
            "%s, %s: acc %.3f [%.3f, %.3f], circular %s",
            split,
            row["form"],
            rows[-1]["acc"],
            rows[-1]["ci_low"],
            rows[-1]["ci_high"],
            "–" if rows[-1]["circular_acc"] is None else f"{rows[-1]['circular_acc']:.3f}",
        )

    add("dev", None, False)
    for form in comparison.compare:
        no_chat = form.chat and chat is None
        add("dev", form, True if form == own else None, note="the tokenizer has no chat template" if no_chat else None)
    for draw in range(comparison.draws):  # the task's own draw checked, the others for their spread only
        add("eval", replace(own, draw=draw), draw == 0)
    paired = against_chosen(passed, own.label)
    for row in rows:
        counts = paired.get(row["form"]) if row["split"] == "dev" else None
        row["circular_chosen_only"], row["circular_form_only"] = counts or (None, None)
    keys = ("answer", "shots", "marker", "chat", "prefix")
    return pl.DataFrame(rows, infer_schema_length=None).with_columns(
        pl.all_horizontal([pl.col(k) == getattr(own, k) for k in keys]).fill_null(False).alias("chosen"),
        pl.col("circular_chosen_only", "circular_form_only").cast(pl.Int64),
    )


@dataclass(frozen=True)
class FactsFormats(RuleSettings):
    """Rule facts_formats: the model's name (wildcard model), what the comparison asks and how
    the model is loaded and scored."""

    model: str
    facts: FormatComparison = FormatComparison()
    evaluation: Evaluation = Evaluation()


def run_facts_formats(inputs: Files, outputs: Files, settings: FactsFormats) -> pl.DataFrame:
    """Rule facts_formats: compare_formats of the prepared model of the inputs' `model` on the
    facts table of the inputs' `facts`, written to the outputs' `formats` with a model column;
    the task tables of the inputs' `tasks` are read with the model's per-item baseline scores of
    the inputs' `baseline` (same order)."""
    evaluation = settings.evaluation
    model, tok = load_model(inputs.model, evaluation.dtype, compute_dtype=evaluation.compute_dtype)
    task_paths, baseline_paths = (inputs.get(role, []) for role in ("tasks", "baseline"))
    task_paths, baseline_paths = ([p] if isinstance(p, str) else p for p in (task_paths, baseline_paths))
    earlier = [(read_parquet(t), read_parquet(b)) for t, b in zip(task_paths, baseline_paths, strict=True)]
    scorer = Scorer(model, tok, evaluation.batch_size)
    result = compare_formats(scorer, read_parquet(inputs.facts), settings.facts, earlier).with_columns(
        pl.lit(settings.model).alias("model")
    )
    write_parquet(result, outputs.formats)
    return result
