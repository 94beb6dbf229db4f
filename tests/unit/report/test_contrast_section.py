"""The report's lead: the study's contrast, tested only on models that answer MMLU's letter format; its
sentences and table follow the paired tests of the remove-top-k comparisons, the random-k control beside."""

import polars as pl
import pytest
from test_knowledge_section import acc_rows, paired

from gna.core.paired import comparisons
from gna.report.contrast_section import TASKS, render_contrast, sentences, summary_table, verdict_line
from gna.report.contrast_verdict import STATES, ContrastRows, contrast_state, removal_premise
from gna.report.htmlkit import ReportOptions, SectionContext, comparison_row


def _baseline(model: str, letter: tuple[int, int]) -> pl.DataFrame:
    return acc_rows("mmlu_letter", {"all": letter}).with_columns(
        pl.lit(model).alias("model"), pl.lit("gna").alias("engine"), pl.lit(0.25).alias("chance")
    )


def _compared(counts: dict[str, dict[str, tuple[int, int, int, int]]], model: str) -> pl.DataFrame:
    """Comparisons of `model`: {condition label: {task: (lost, gained, both, neither)}} against the unmodified model."""
    frames = []
    for label, per_task in counts.items():
        family = "top k vs unmodified" if label.startswith("top") else "random k vs unmodified"
        pairs = {task: paired(task, *c) for task, c in per_task.items()}
        ref, cond = pl.concat([r for r, _ in pairs.values()]), pl.concat([c for _, c in pairs.values()])
        frames.append(comparisons({"unmodified": ref, label: cond}, [(family, "unmodified", label)]))
    return pl.concat(frames).with_columns(pl.lit(model).alias("model"))


CONTRAST = {
    "top 5": {
        "mmlu_letter": (40, 2, 45, 113),  # 42.5% -> 23.5%: falls
        "mmlu_cloze": (2, 3, 70, 125),  # within +-5: holds
        "facts_cloze": (30, 0, 190, 20),  # knowledge lost: contradicts
        "kv_retrieval": (3, 1, 90, 6),  # not decided at n = 100
    },
    "random 5 #0": {"mmlu_letter": (3, 4, 82, 111)},
}


def test_the_contrast_is_judged_task_by_task_against_the_study(tmp_path):
    # the units carry retrieval (KV falls): each task is judged against what the study reports
    carried = {**CONTRAST, "top 5": {**CONTRAST["top 5"], "kv_retrieval": (45, 1, 50, 4)}}
    letter, cloze, facts, kv = sentences(_compared(carried, "big"), "big", 5, 0.05)
    assert letter.startswith("MMLU letter: 42.5% → 23.5% on the same 200 items") and "as the study reports" in letter
    assert "<b>holds within ±5 points</b>" in cloze and "as the study reports" in cloze
    assert "<b>falls</b>" in facts and "<b>contradicts the study</b>, which reports that it stays" in facts
    assert "<b>falls</b>" in kv and "as the study reports" in kv
    # not shown to carry retrieval (KV not decided): what the study reports, never a judgement of it
    compared = _compared(CONTRAST, "big")
    neutral = sentences(compared, "big", 5, 0.05)
    assert all("the study reports that it" in s and "contradict" not in s for s in neutral)
    assert "as the study reports" not in " ".join(neutral)
    table = summary_table(compared, "big", 5, 0.05, reference=True)
    assert table["verdict"].to_list() == ["falls", "holds", "falls", "not decided"]
    assert table["5 random removed"].to_list()[0] == "43.0%" and table["random verdict"][1] == "–"
    assert table["study (Llama-3.1-8B, reference)"][0] == "falls: 66% → 25% (chance)"
    assert "study (Llama-3.1-8B, reference)" not in summary_table(compared, "big", 5, 0.05, reference=False).columns


def test_only_a_model_that_answers_the_letter_format_is_tested(tmp_path):
    baseline = pl.concat([_baseline("big", (85, 200)), _baseline("small", (47, 200))])
    compared = pl.concat([_compared(CONTRAST, "big"), _compared(CONTRAST, "small")])
    topk = pl.DataFrame(
        {
            "model": ["big", "big", "big"],
            "task": ["mmlu_letter"] * 3,
            "group": ["all"] * 3,
            "metric": ["acc"] * 3,
            "condition": ["top", "top", "random"],
            "k": [0, 5, 5],
            "draw": [0, 0, 0],
            "value": [0.425, 0.235, 0.43],
            "ci_low": [0.36, 0.18, 0.36],
            "ci_high": [0.49, 0.30, 0.50],
        }
    )
    inputs = {}
    for key, frame in (("baseline", baseline), ("heads_topk_comparisons", compared), ("heads_topk", topk)):
        frame.write_parquet(tmp_path / f"{key}.parquet")
        inputs[key] = [str(tmp_path / f"{key}.parquet")]
    figure = tmp_path / "contrast.png"
    ctx = SectionContext(
        inputs=inputs,
        figures={"contrast_topk": str(figure)},
        captions={"contrast_topk": "caption"},
        options=ReportOptions(),
        config={},
    )
    page = render_contrast(ctx)
    assert "<h3>big</h3>" in page and "42.5% [" in page
    # 47/200 = 23.5% [18.2-29.8]: its interval holds chance, so no fall could be seen there
    assert "<b>small</b> cannot show the contrast" in page and "<h3>small</h3>" not in page
    assert figure.stat().st_size > 1000


def test_a_model_ranked_by_key_value_group_is_described_by_its_groups_and_its_kv_setting(tmp_path):
    baseline = _baseline("big", (85, 200))
    compared = _compared({"top 4": CONTRAST["top 5"], "random 4 #0": CONTRAST["random 5 #0"]}, "big")
    topk = pl.DataFrame(
        {
            "model": ["big"] * 2,
            "task": ["kv_retrieval"] * 2,
            "group": ["all", "90"],
            "metric": ["acc"] * 2,
            "condition": ["top"] * 2,
            "k": [4, 4],
            "draw": [0, 0],
            "value": [0.8, 0.8],
            "ci_low": [0.7, 0.7],
            "ci_high": [0.9, 0.9],
            "unit": ["group"] * 2,
        }
    )
    sweep = pl.DataFrame(
        {"model": ["big"], "layer": [-1], "head": [-1], "task": ["kv_retrieval"], "mode": ["verified"]}
    ).with_columns(pl.lit(20).alias("dict_size"), pl.lit("group").alias("unit"))
    inputs = {}
    for key, frame in (
        ("baseline", baseline),
        ("heads_topk_comparisons", compared),
        ("heads_topk", topk),
        ("heads_sweep", sweep),
    ):
        frame.write_parquet(tmp_path / f"{key}.parquet")
        inputs[key] = [str(tmp_path / f"{key}.parquet")]
    ctx = SectionContext(
        inputs=inputs,
        figures={"contrast_topk": str(tmp_path / "contrast.png")},
        captions={"contrast_topk": "caption"},
        options=ReportOptions(),
        config={},
    )
    page = render_contrast(ctx)
    assert "Key/value groups (all query heads that share one key/value head, removed together" in page
    assert "KV retrieval (20-key prompts) (verified sweep); the top 4 removed together" in page
    assert "KV retrieval scored on prompts of 90 keys" in page


def test_a_fall_the_random_control_shares_is_said_not_to_be_specific_to_the_ranking():
    counts = {"top 5": CONTRAST["top 5"], "random 5 #0": {**CONTRAST["random 5 #0"], "facts_cloze": (28, 1, 190, 21)}}
    _, _, facts, _ = sentences(_compared(counts, "big"), "big", 5, 0.05)
    assert "<b>falls</b>" in facts and "but 5 drawn at random fall too (90.8% → 79.6%" in facts
    assert "not specific to the top-ranked ones" in facts
    # the letter falls and its random control does not: no such clause
    letter, *_ = sentences(_compared(counts, "big"), "big", 5, 0.05)
    assert "drawn at random" not in letter


def test_a_letter_form_that_does_not_fall_says_where_a_fall_to_chance_is_excluded():
    # 42% -> 41% on 100 items, 6 lost / 5 gained: not decided within +-5, yet a fall of 17 points to
    # chance would lose at least 17 of them; at most 11.5% are lost (exact one-sided 95% bound)
    counts = {"top 4": {"mmlu_letter": (6, 5, 36, 53)}}
    letter, *_ = sentences(_compared(counts, "big"), "big", 4, 0.05, chance=0.25)
    assert "not decided at n = 100" in letter and "this n cannot decide it" not in letter
    assert "a fall to chance, as the study reports (17 points here), is excluded: at most 11.5% of the items" in letter
    assert "contradict" not in letter  # what it means for the study is the verdict's to say (contrast_state)
    # 12 lost: the bound (18.7%) no longer excludes 17 points; without chance nothing is claimed
    counts = {"top 4": {"mmlu_letter": (12, 11, 30, 47)}}
    letter, *_ = sentences(_compared(counts, "big"), "big", 4, 0.05, chance=0.25)
    # no KV scored: the units are not shown to carry retrieval, so no judgement of the study either
    assert "fall to chance" not in letter and letter.endswith("— the study reports that it falls")
    assert "fall to chance" not in sentences(_compared(counts, "big"), "big", 4, 0.05)[0]
    # the table says it beside the verdict
    excluded = {"top 4": {"mmlu_letter": (6, 5, 36, 53)}}
    table = summary_table(_compared(excluded, "big"), "big", 4, 0.05, reference=False, chance=0.25)
    assert table["verdict"][0] == "not decided; a fall to chance excluded"
    assert summary_table(_compared(counts, "big"), "big", 4, 0.05, reference=False, chance=0.25)["verdict"][0] == (
        "not decided"
    )


def test_retrieval_reads_the_answers_log_prob_against_the_unmodified_model_and_random_k():
    # every KV answer right in all three conditions (accuracy cannot fall); the log-prob of the answer is
    # lower on 18 of 20 prompts without the top 4, on 10 of 20 without 4 drawn at random
    ids = list(range(20))

    def kv(logp):
        return pl.DataFrame(
            {"task": "kv_retrieval", "item_id": ids, "group": "all", "correct": [True] * 20}
        ).with_columns(pl.Series("logp_target", logp))

    base = kv([-0.1] * 20)
    top = kv([-0.5] * 18 + [-0.05] * 2)
    rnd = kv([-0.2] * 10 + [-0.05] * 10)
    per_item = {"unmodified": base, "top 4": top, "random 4 #0": rnd}
    pairs = [
        ("top k vs unmodified", "unmodified", "top 4"),
        ("random k vs unmodified", "unmodified", "random 4 #0"),
        ("top k vs random k", "random 4 #0", "top 4"),
    ]
    compared = comparisons(per_item, pairs).with_columns(pl.lit("big").alias("model"))
    (kv_sentence,) = sentences(compared, "big", 4, 0.05)
    assert "The answer's log-prob falls: lower on 18, higher on 2 of 20 items, median change -0.4 nats" in kv_sentence
    assert "Against 4 drawn at random it is lower (the top-ranked ones carry more of it)" in kv_sentence
    # a draw that lowers it on every prompt, and by more: the top 4 cost less of it than chance groups
    per_item["random 4 #0"] = kv([-0.9] * 20)
    (kv_sentence,) = sentences(comparisons(per_item, pairs).with_columns(pl.lit("big").alias("model")), "big", 4, 0.05)
    assert "Against 4 drawn at random it is higher (the 4 drawn at random cost more of it)" in kv_sentence
    # a draw that lowers it as often as the top 4: not shown to differ; no log-probs: no clause
    per_item["random 4 #0"] = top.with_columns(pl.col("logp_target") - 1e-3 * pl.Series([1, -1] * 10))
    (kv_sentence,) = sentences(comparisons(per_item, pairs).with_columns(pl.lit("big").alias("model")), "big", 4, 0.05)
    assert "Against 4 drawn at random it is not shown to differ" in kv_sentence
    plain = {label: frame.drop("logp_target") for label, frame in per_item.items()}
    (kv_sentence,) = sentences(comparisons(plain, pairs).with_columns(pl.lit("big").alias("model")), "big", 4, 0.05)
    assert "log-prob" not in kv_sentence


def _rows(counts: dict, k: int = 4) -> dict:
    """The contrast's rows of a scripted removal: {task: comparisons row} of top k, and the letter's random control."""
    compared = _compared(counts, "big")
    out = {task: comparison_row(compared, "top k vs unmodified", "unmodified", f"top {k}", task) for task in TASKS}
    out["control"] = comparison_row(compared, "random k vs unmodified", "unmodified", f"random {k} #0", "mmlu_letter")
    return out


@pytest.mark.parametrize(
    "letter, kv, state",
    [
        ((60, 0, 26, 114), (50, 0, 50, 0), "reproduced"),  # 43% -> 13% (interval reaches 25%), KV falls
        ((6, 5, 36, 53), (50, 0, 50, 0), "contradicted"),  # a fall to chance excluded, the units carry KV
        ((6, 5, 36, 53), (2, 0, 28, 0), "not tested"),  # the units are not shown to carry retrieval
        ((12, 11, 30, 47), (50, 0, 50, 0), "undecided"),  # 12 lost of 100: neither shown nor excluded
    ],
)
def test_the_contrast_has_one_verdict_never_stronger_than_its_premise(letter, kv, state):
    n = sum(letter)
    counts = {
        "top 4": {
            "mmlu_letter": letter,
            "kv_retrieval": kv,
            "facts_cloze": (1, 1, 200, 38),
            "mmlu_cloze": (2, 2, 40, 56),
        },
        "random 4 #0": {"mmlu_letter": (2, 2, sum(letter[::2]), n - 4 - sum(letter[::2]))},
    }
    rows = _rows(counts)
    premise, carries = removal_premise(_compared(counts, "big"), "big", 4, 0.05)
    scripted = ContrastRows(rows["mmlu_letter"], rows["facts_cloze"], rows["mmlu_cloze"], rows["control"])
    got, reason = contrast_state(scripted, premise_fails=premise, carries_retrieval=carries, chance=0.25, margin=0.05)
    assert got == state, reason
    if state == "undecided":  # what stands in the way of "reproduced", named
        assert reason.startswith("not reproduced as the study reports it (the letter format is not shown to fall;")
    line = verdict_line(_compared(counts, "big"), "big", 4, 0.05, 0.25)
    assert f"<b>The study's contrast on big: {state}</b>" in line
    assert ("contradict" in line) == (state == "contradicted")


def test_the_contrast_is_not_reproduced_where_a_fall_is_excluded_without_a_shown_premise():
    """Where the premise holds but retrieval is not shown (a case study's heads not tested on KV), an
    excluded fall is 'not reproduced', never 'contradicted'."""
    rows = _rows({"top 4": {"mmlu_letter": (6, 5, 36, 53)}})
    letter = ContrastRows(rows["mmlu_letter"])
    state, reason = contrast_state(letter, premise_fails=None, carries_retrieval=False, chance=0.25, margin=0.05)
    assert state == "not reproduced" and "at most 11.5% of 100 letter items lost" in reason
    at_chance = "the letter format is at chance"
    state, reason = contrast_state(letter, premise_fails=at_chance, carries_retrieval=True, chance=0.25, margin=0.05)
    assert (state, reason) == ("not tested", at_chance)
    assert STATES == ("not tested", "reproduced", "contradicted", "not reproduced", "undecided")
