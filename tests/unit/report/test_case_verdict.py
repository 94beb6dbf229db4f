"""The case study's one verdict on the study's contrast, from scripted heads-kept tables: each of the
five states, each premise that fails named, and 'contradicts' only where the heads carry retrieval."""

import polars as pl
import pytest

from gna.core.paired import comparisons
from gna.phases.case_study import ALL_HEADS, KEPT, kept_pairs
from gna.report.contrast_verdict import CaseStudy, case_verdict

MINIMAL = {"applies": True, "reason": None}
CRITICAL = {"layers": [5, 7], "reason": None}
FOUND = {"heads": [{"layer": 5, "head": 2}, {"layer": 7, "head": 0}], "reason": None}
REMOVED = f"{KEPT} − L5H2"


def _items(task: str, correct: list[bool]) -> pl.DataFrame:
    return pl.DataFrame({"task": task, "item_id": range(len(correct)), "group": "x", "correct": correct})


def _kept(letter_lost: int, facts_lost: int = 0, kv_lost: int = 0, control_lost: int = 0) -> pl.DataFrame:
    """Heads-kept comparisons: 200 letter items (120 right under the kept configuration and all heads),
    200 facts items, 60 KV items of 10 keys; `*_lost` items turn wrong when L5H2 is removed (the control:
    when the random L5 head is removed from all heads)."""
    base = {"mmlu_letter": [True] * 120 + [False] * 80, "facts_cloze": [True] * 150 + [False] * 50,
            "kv_retrieval@10": [True] * 60}  # fmt: skip
    lost = {"mmlu_letter": letter_lost, "facts_cloze": facts_lost, "kv_retrieval@10": kv_lost}

    def frame(losses):
        return pl.concat([_items(t, [False] * losses.get(t, 0) + c[losses.get(t, 0) :]) for t, c in base.items()])

    per_item = {ALL_HEADS: frame({}), KEPT: frame({}), REMOVED: frame(lost),
                f"{ALL_HEADS} − random L5H1 #0": frame({"mmlu_letter": control_lost}),
                f"{KEPT}, L5H1 in place of H2 #0": frame({"mmlu_letter": letter_lost})}  # fmt: skip
    return comparisons(per_item, kept_pairs(list(per_item)))


@pytest.mark.parametrize(
    "kept, state",
    [
        (_kept(letter_lost=100), "reproduced"),  # 60% -> 10%: falls, its interval reaches chance
        (_kept(letter_lost=100, control_lost=100), "undecided"),  # the control falls too
        (_kept(letter_lost=0, kv_lost=30), "contradicted"),  # no letter item lost, retrieval falls
        (_kept(letter_lost=0), "not reproduced"),  # no letter item lost, retrieval not shown
        (_kept(letter_lost=12), "not reproduced"),  # a small fall: one to chance excluded
        (_kept(letter_lost=100, facts_lost=40), "undecided"),  # knowledge falls too
    ],
)
def test_each_state_of_the_case_verdict_is_reached_from_its_table(kept, state):
    got, reason = case_verdict(CaseStudy(MINIMAL, CRITICAL, FOUND, kept), chance=0.25, margin=0.05)
    assert got == state, reason
    assert reason.startswith("L5H2 removed from the kept configuration")
    assert ("contradict" in reason) == (state == "contradicted")
    # whether the head matters as itself: a random head of its layer kept in its place
    swapped = "falls" if kept.filter(pl.col("condition").str.contains("in place"))["reference_only"].max() else "holds"
    assert f"with L5H1 kept in its place instead, the letter format {swapped}" in reason


def test_a_case_study_that_stops_early_is_not_tested_with_its_reason():
    kept = _kept(letter_lost=100)
    for step in ("minimal", "critical", "found"):
        parts = {"minimal": MINIMAL, "critical": CRITICAL, "found": FOUND} | {step: {"reason": f"{step} says no"}}
        got, reason = case_verdict(CaseStudy(**parts, kept=kept), chance=0.25, margin=0.05)
        assert (got, reason) == ("not tested", f"{step} says no")
    # the kept configuration itself at chance on the letter format: no removal from it can show a fall
    low = _kept(letter_lost=0).with_columns(pl.lit(0.27).alias("acc_reference"))
    got, reason = case_verdict(CaseStudy(MINIMAL, CRITICAL, FOUND, low), chance=0.25, margin=0.05)
    assert got == "not tested" and "cannot be told from chance" in reason


def test_a_lower_kv_confidence_without_a_kv_fall_is_said_not_to_show_retrieval():
    kept = _kept(letter_lost=0)
    kv = {"family": "vs kept configuration", "condition": REMOVED, "task": "kv_retrieval@10", "group": "all"}
    lowered = kept.with_columns(
        pl.when(pl.all_horizontal([pl.col(k) == v for k, v in kv.items()]))
        .then(pl.lit(1e-6))
        .otherwise(pl.col("p_logp_holm"))
        .alias("p_logp_holm"),
        pl.lit(60).alias("logp_lower"),
        pl.lit(0).alias("logp_higher"),
    )
    state, reason = case_verdict(CaseStudy(MINIMAL, CRITICAL, FOUND, lowered), chance=0.25, margin=0.05)
    assert state == "not reproduced" and "KV accuracy does not fall, though the answer's log-prob is lower" in reason
    state, reason = case_verdict(CaseStudy(MINIMAL, CRITICAL, FOUND, kept), chance=0.25, margin=0.05)
    assert "log-prob" not in reason  # no sign test rejected: no clause
