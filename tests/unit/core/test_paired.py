"""Paired comparisons (gna.core.paired) against published and independent values."""

import polars as pl
import pytest
from scipy.stats import binomtest

from gna.core.paired import (
    comparisons,
    decide,
    describe,
    equivalent,
    fall_excluded,
    holm,
    mcnemar_p,
    n_to_show_change,
    n_to_show_equivalence,
    paired_interval,
    share_upper_bound,
)
from gna.core.stats import wilson_interval


def _items(outcomes: list[tuple[bool, bool]], task: str = "kv_retrieval", start: int = 0):
    """Two per-item frames (reference, condition) from (reference correct, condition correct) pairs."""
    ids = list(range(start, start + len(outcomes)))
    ref = pl.DataFrame({"task": task, "item_id": ids, "group": "all", "correct": [r for r, _ in outcomes]})
    cond = pl.DataFrame({"task": task, "item_id": ids, "group": "all", "correct": [c for _, c in outcomes]})
    return ref, cond


def _table(both: int, reference_only: int, condition_only: int, neither: int):
    return _items(
        [(True, True)] * both
        + [(True, False)] * reference_only
        + [(False, True)] * condition_only
        + [(False, False)] * neither
    )


def test_newcombe_interval_matches_the_published_worked_example():
    # Fagerland, Lydersen & Laake, Statistical Analysis of Contingency Tables, ch. 8 (the
    # contingencytables package's test): table [[59, 6], [16, 80]], Newcombe's square-and-add
    # interval for the paired difference -0.0621 (95% CI -0.1186 to -0.0046)
    low, high = paired_interval(both=59, reference_only=16, condition_only=6, neither=80)
    assert (low, high) == (pytest.approx(-0.1186, abs=1e-4), pytest.approx(-0.0046, abs=1e-4))
    # the same table read the other way round gives the mirrored interval
    assert paired_interval(59, 6, 16, 80) == (pytest.approx(-high), pytest.approx(-low))


@pytest.mark.parametrize("lost,gained", [(16, 6), (21, 0), (3, 3), (0, 1), (40, 25), (1, 12)])
def test_mcnemar_is_the_exact_binomial_test_of_the_discordant_items(lost, gained):
    # statsmodels' exact McNemar against scipy's binomial test (another library's)
    assert mcnemar_p(lost, gained) == pytest.approx(binomtest(gained, lost + gained, 0.5).pvalue, rel=1e-9)
    assert mcnemar_p(0, 0) == 1.0


def test_holm_by_hand():
    assert holm([0.01, 0.04, 0.03]) == pytest.approx([0.03, 0.06, 0.06])
    assert holm([0.2]) == [0.2] and holm([]) == []


def test_a_fall_to_chance_that_the_intervals_overlap_on_is_a_fall():
    # the case an interval-overlap rule read as "holds": 81/240 -> 60/240 on the same items,
    # 21 items lost and none gained
    ref, cond = _table(both=60, reference_only=21, condition_only=0, neither=159)
    before, after = wilson_interval(81, 240), wilson_interval(60, 240)
    assert after[1] > before[0]  # the two Wilson intervals overlap
    row = comparisons({"a": ref, "b": cond}, [("f", "a", "b")]).row(0, named=True)
    assert (row["n"], row["reference_only"], row["condition_only"]) == (240, 21, 0)
    assert row["p_mcnemar"] == pytest.approx(2 * 0.5**21)
    assert decide(row).verb == "falls" and describe(row).startswith("falls: -8.8 points")


def test_equivalence_holds_only_within_the_margin():
    ref, cond = _table(both=300, reference_only=2, condition_only=3, neither=95)
    row = comparisons({"a": ref, "b": cond}, [("f", "a", "b")]).row(0, named=True)
    assert decide(row, margin=0.05).verb == "holds"
    assert decide(row, margin=0.005).verb == "undecided"  # the same data cannot show +-0.5 points
    assert "holds within ±5 points" in describe(row, 0.05)


def test_too_few_items_decide_nothing_and_say_how_many_would():
    ref, cond = _table(both=10, reference_only=3, condition_only=1, neither=6)
    row = comparisons({"a": ref, "b": cond}, [("f", "a", "b")]).row(0, named=True)
    d = decide(row)
    assert d.verb == "undecided" and d.n_to_decide > 20
    assert f"about n = {d.n_to_decide}" in describe(row)
    # a larger observed difference needs fewer items to show
    assert n_to_show_change(100, 20, -0.2) < n_to_show_change(100, 20, -0.1)


def test_a_difference_near_the_margin_is_planned_for_the_test_that_can_decide_it():
    """45 lost and 36 gained of 186 (-4.8 points, 44% of items changing): no n can show equivalence
    within 5 points (a quarter of the items are lost), so the plan is McNemar's (about 8 times n); a
    plan over 100 times n is said to be no practical n, with the number."""
    ref, cond = _table(both=30, reference_only=45, condition_only=36, neither=75)
    row = comparisons({"a": ref, "b": cond}, [("f", "a", "b")]).row(0, named=True)
    d = decide(row)
    assert d.verb == "undecided" and d.test == "change" and 5 * row["n"] < d.n_to_decide < 100 * row["n"], d
    assert f"about n = {d.n_to_decide} would show the change (McNemar)" in describe(row)
    busy = _row(30, 28, 200)  # -1 point with 29% of items changing: McNemar would need about 23,000
    assert "no practical n would decide it (about " in describe(busy) and decide(busy).n_to_decide > 100 * 200


def test_conditions_are_paired_on_their_shared_items_and_holm_runs_per_family():
    # the reference scored 200 items, the conditions 60 of them: each comparison uses those 60
    ref = pl.DataFrame({"task": "kv_retrieval", "item_id": range(200), "group": "all", "correct": [True] * 200})
    cut = pl.DataFrame({"task": "kv_retrieval", "item_id": range(0, 120, 2), "group": "all", "correct": [False] * 60})
    same = cut.with_columns(pl.lit(True).alias("correct"))
    other = pl.DataFrame({"task": "facts_cloze", "item_id": [0], "group": "x", "correct": [True]})
    table = comparisons(
        {"base": ref, "cut": cut, "same": same, "other": other},
        [("removal", "base", "cut"), ("removal", "base", "same"), ("control", "base", "cut"), ("x", "base", "missing")],
    )
    assert table["n"].to_list() == [60, 60, 60] and table["reference_only"].to_list() == [60, 0, 60]
    assert table["family"].to_list() == ["removal", "removal", "control"]
    p = mcnemar_p(60, 0)
    # Holm within "removal" (two rows: p and 1), alone in "control"
    assert table["p_holm"].to_list() == pytest.approx([2 * p, 1.0, p])
    # a task the condition did not score is not compared
    assert comparisons({"base": ref, "other": other}, [("f", "base", "other")]).is_empty()


def test_the_known_items_of_the_multiple_choice_facts_are_compared_too():
    ref = pl.DataFrame(
        {
            "task": "facts_choice",
            "item_id": range(4),
            "group": ["known", "known", "unknown", "unknown"],
            "correct": True,
        }
    )
    cond = ref.with_columns(pl.Series("correct", [False, True, True, True]))
    table = comparisons({"a": ref, "b": cond}, [("f", "a", "b")])
    assert table.select("group", "n", "reference_only").rows() == [("all", 4, 1), ("known", 2, 1)]


def test_the_detectable_difference_shrinks_with_n_and_is_what_n_to_decide_needs():
    from gna.core.paired import detectable_difference

    small, large = detectable_difference(60, 10), detectable_difference(240, 40)
    assert 0 < large < small < 1
    assert n_to_show_change(240, 40, large) <= 240 < n_to_show_change(240, 40, large - 0.01)
    assert detectable_difference(3, 0) == 1.0


def test_facts_are_compared_per_relation_and_on_the_not_copyable_items_in_a_family_of_their_own():
    ref = pl.DataFrame(
        {
            "task": "facts_cloze",
            "item_id": range(40),
            "group": ["capital", "symbol"] * 20,
            "relation": ["capital", "symbol"] * 20,
            "copyable": [False, True] * 20,
            "correct": True,
        }
    )
    cond = ref.with_columns(pl.Series("correct", [i % 2 == 1 or i >= 30 for i in range(40)]))  # 15 capitals lost
    table = comparisons({"a": ref, "b": cond}, [("f", "a", "b")])
    assert table.select("family", "group", "n", "reference_only").rows() == [
        ("f", "all", 40, 15),
        ("f · by relation", "capital", 20, 15),
        ("f · by relation", "symbol", 20, 0),
        ("f · by relation", "not copyable", 20, 15),
    ]
    # the main row's Holm value is its own p: the subsets do not dilute it
    plain = comparisons({"a": ref.drop("relation", "copyable"), "b": cond}, [("f", "a", "b")])
    assert table["p_holm"][0] == plain["p_holm"][0] == mcnemar_p(15, 0)
    assert table["p_holm"][1] == pytest.approx(min(1.0, 3 * mcnemar_p(15, 0)))


def _row(lost: int, gained: int, n: int) -> dict:
    both = (n - lost - gained) // 2
    ref, cond = _table(both=both, reference_only=lost, condition_only=gained, neither=n - lost - gained - both)
    return comparisons({"a": ref, "b": cond}, [("f", "a", "b")]).row(0, named=True)


def test_equivalence_at_small_n_needs_the_exact_bound_under_the_margin():
    """n = 100, 2 lost and none gained: Newcombe's 90% interval [-4.78, +0.80] lies inside +-5 (the
    old rule said "holds"), but the exact one-sided 95% bound on the share lost is 6.16 points."""
    row = _row(2, 0, 100)
    low, high = paired_interval(row["both_correct"], 2, 0, row["neither"], confidence=0.90)
    assert -0.05 < low and high < 0.05
    assert share_upper_bound(2, 100) == pytest.approx(0.0616, abs=1e-4)
    assert decide(row).verb == "undecided"
    assert decide(_row(2, 0, 200)).verb == "holds"  # 2 of 200: the bound is 3.1 points


@pytest.mark.parametrize("n", [50, 100, 200])
def test_holds_keeps_its_five_percent_at_a_true_change_of_the_margin(n):
    """Enumerated over every table (items lost, gained) of n items under a true change of exactly the
    margin either way, for several shares of items changing the other way: P("holds") <= 5%."""
    import numpy as np
    from scipy.stats import multinomial

    margin = 0.05
    counts = [(lost, gained) for lost in range(n + 1) for gained in range(n + 1 - lost)]
    holds = np.array([equivalent(lost, gained, n, margin) for lost, gained in counts])
    tables = np.array([(lost, gained, n - lost - gained) for lost, gained in counts])
    worst = 0.0
    for other in (0.0, 0.005, 0.02, 0.05, 0.1, 0.3):
        for lost_share, gained_share in ((margin + other, other), (other, margin + other)):
            pmf = multinomial.pmf(tables, n, [lost_share, gained_share, 1 - lost_share - gained_share])
            worst = max(worst, float(pmf[holds].sum()))
    assert worst <= 0.05, worst
    # the rule can say "holds" where an exact bound can get under the margin (a rule that never said it
    # would pass trivially); at n = 50 none can: no item lost still bounds the share at 5.8 points
    assert holds.any() == (n > 50)


@pytest.mark.parametrize("n", [50, 100, 200])
@pytest.mark.parametrize("fall", [0.05, 0.17])
def test_a_fall_is_excluded_with_at_most_five_percent_error_where_it_is_true(n, fall):
    """Enumerated over every count of items lost under a true fall of exactly `fall` (none gained: the
    fewest items lost such a fall allows): P("excluded") <= 5%; the rule can say it (no items lost)."""
    import numpy as np
    from scipy.stats import binom

    lost = np.arange(n + 1)
    excluded = np.array([fall_excluded(int(k), n, fall) for k in lost])
    assert float(binom.pmf(lost, n, fall)[excluded].sum()) <= 0.05
    assert excluded[0] == (share_upper_bound(0, n) < fall)
    # the knowledge model's letter form: 6 of 100 lost; chance 17 points below its 42%
    assert fall_excluded(6, 100, 0.17) and not fall_excluded(12, 100, 0.17) and not fall_excluded(0, 100, 0)


def test_the_planned_n_is_the_one_of_the_test_that_decides_first():
    """n = 200, 14 lost and 5 gained (-4.5 points): McNemar decides first (Connor: 366; its exact
    power reaches 80% at about 393), not the equivalence test (none: 7% of the items are lost)."""
    d = decide(_row(14, 5, 200))
    assert d.verb == "undecided" and d.test == "change" and 360 <= d.n_to_decide <= 420, d
    assert "would show the change (McNemar)" in describe(_row(14, 5, 200))
    assert n_to_show_equivalence(14 / 200, 5 / 200, 0.05) is None
    # no change seen, few items moving: the equivalence test decides first
    d = decide(_row(1, 1, 40))
    assert d.test == "equivalence" and "would show that it holds within ±5" in describe(_row(1, 1, 40))
    # one item of one lost: the exact test needs six changed items at least, not Connor's four
    assert n_to_show_change(1, 1, -1.0) >= 6


def test_a_fall_smaller_than_the_margin_says_both():
    """n = 240, 6 lost and none gained: McNemar rejects (p = 0.031) and the exact bounds (4.9 and 1.2
    points) lie inside +-5: one sentence, the fall and that it is smaller than the margin."""
    row = _row(6, 0, 240)
    d = decide(row)
    assert (d.verb, d.within) == ("falls", True)
    assert describe(row).startswith("falls, by less than ±5 points: -2.5 points")
    assert decide(_row(21, 0, 240)).within is False


def test_the_holm_multiplier_is_the_step_down_factor_not_the_ratio_of_adjusted_to_raw():
    """Raw p 0.011 and 0.010 in one family: Holm adjusts both to 0.02 (the larger made monotone), so
    the ratio p_holm / p of the first row is 1.8 where its test is held to 5% / 1; the second to 5% / 2."""
    from gna.core.paired import holm, holm_multipliers

    assert holm([0.011, 0.010]) == pytest.approx([0.02, 0.02])
    assert holm_multipliers([0.011, 0.010]) == [1, 2]
    # tied p-values are rejected together: both held to 5% / 4, whatever their order
    assert holm_multipliers([0.5, 0.01, 0.2, 0.01]) == [1, 4, 2, 4]


def test_a_comparisons_table_records_each_rows_holm_multiplier_and_the_plans_use_it():
    from gna.core.paired import comparisons, detectable_difference

    def frame(outcomes):
        return pl.DataFrame({"task": "t", "item_id": range(len(outcomes)), "group": "all", "correct": outcomes})

    ref = frame([True] * 100)
    per_item = {"ref": ref, "a": frame([False] * 3 + [True] * 97), "b": frame([False] * 30 + [True] * 70)}
    table = comparisons(per_item, [("f", "ref", "a"), ("f", "ref", "b")])
    assert table["holm_multiplier"].to_list() == [1, 2]  # b's p is the smaller
    assert detectable_difference(100, 10, 2) > detectable_difference(100, 10, 1)


def test_the_answers_log_prob_is_compared_item_by_item_where_both_frames_carry_it():
    # every answer right under both conditions: accuracy cannot move, the log-prob can
    ids = list(range(10))
    ref = pl.DataFrame({"task": "kv_retrieval", "item_id": ids, "group": "all", "correct": [True] * 10})
    ref = ref.with_columns(pl.Series("logp_target", [-0.1] * 10))
    drops = [-0.9, -0.5, -0.4, -0.3, -0.2, -0.2, -0.1, -0.1, 0.0, 0.3]  # 8 lower, 1 higher, 1 equal
    cut = ref.with_columns(pl.Series("logp_target", [-0.1 + d for d in drops]))
    half = ref.with_columns(pl.Series("logp_target", [-0.1 + d for d in drops[:5]] + [-0.2] * 5))
    plain = ref.drop("logp_target")
    table = comparisons(
        {"base": ref, "cut": cut, "half": half, "plain": plain},
        [("removal", "base", "cut"), ("removal", "base", "half"), ("removal", "base", "plain")],
    )
    assert table["reference_only"].to_list() == [0, 0, 0] and table["p_mcnemar"].to_list() == [1.0, 1.0, 1.0]
    row = table.row(0, named=True)
    assert (row["logp_lower"], row["logp_higher"]) == (8, 1)
    assert row["logp_median_diff"] == pytest.approx(-0.2)
    assert row["p_logp"] == pytest.approx(binomtest(1, 9).pvalue, rel=1e-12)  # the exact sign test
    assert (table["logp_lower"][1], table["logp_higher"][1]) == (10, 0)
    # Holm over the rows that have a log-prob test; a frame without log-probs gives nulls, no test
    p = [binomtest(1, 9).pvalue, binomtest(0, 10).pvalue]
    assert table["p_logp_holm"].to_list()[:2] == pytest.approx(holm(p))
    assert table.row(2, named=True)["p_logp"] is None and table["p_logp_holm"][2] is None
    # a missing or infinite log-prob is no evidence either way: those items are left out of the count
    gaps = cut.with_columns(pl.Series("logp_target", [None, float("-inf")] + cut["logp_target"].to_list()[2:]))
    row = comparisons({"base": ref, "gaps": gaps}, [("f", "base", "gaps")]).row(0, named=True)
    assert (row["n"], row["logp_n"], row["logp_lower"], row["logp_higher"]) == (10, 8, 6, 1)


def test_the_kept_plans_equal_the_plans_computed_at_every_call(monkeypatch):
    """The planning functions keep each answer (functools.cache): decide and detectable_difference
    give the same verdicts, planned n and detectable differences as the functions they wrap, called
    afresh (benchmarks/verdict_speed.py times the two)."""
    from gna.core import paired

    rows = [
        _row(lost, gained, n) | {"holm_multiplier": multiplier}
        for n, multiplier in ((12, 1), (60, 3))
        for lost, gained in ((0, 0), (1, 0), (n // 5, n // 20), (n // 10, n // 10))
    ]

    def plans():
        return [
            (paired.decide(row), paired.detectable_difference(row["n"], row["reference_only"] + row["condition_only"]))
            for row in rows
        ]

    for name in paired.KEPT_PLANS:
        getattr(paired, name).cache_clear()
    kept = plans()
    assert paired.share_upper_bound.cache_info().hits > 0  # asked again for the same counts
    for name in paired.KEPT_PLANS:
        monkeypatch.setattr(paired, name, getattr(paired, name).__wrapped__)
    assert plans() == kept
