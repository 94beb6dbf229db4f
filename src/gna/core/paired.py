"""Two conditions scored on the same items, compared as a pair.

A change (heads removed, a mask, layers pruned, a student instead of its teacher) is judged on the
items both conditions answered, item by item: the 2x2 table of (reference correct?, condition
correct?) gives

* the paired difference of accuracies (condition minus reference) with Newcombe's 95% interval
  for paired proportions (his method 10: Wilson intervals of the two margins, combined with the
  correlation of the pairs; Newcombe 1998, Stat Med 17:2635);
* the exact McNemar p-value (statsmodels), and Holm's correction (statsmodels) over each family
  of a comparisons table (the rows that answer one question, e.g. every top-k removal against
  the unmodified model), so that "falls" / "rises" is a finding of the family, not of one row;
* equivalence within a stated margin at 5% for every n: the exact one-sided 95% upper bounds on
  the share of items lost and on the share gained both lie inside the margin (`equivalent`).

Where both frames carry the answer's log-prob (logp_target), the row also counts the items on which
it is lower / higher under the condition, with the median change and the exact sign test (Holm within
the family too): near a ceiling, a removal can cost confidence that accuracy cannot show.

A comparisons table (COLUMNS) holds the counts, the difference, its interval and the p-values;
`decide` turns a row into the verb a sentence may use: "falls" / "rises" where McNemar rejects
after Holm (a change that is also within the margin says so), "holds" (within the margin) where
equivalence is shown, else "undecided", with the n of the test that would decide it first at 80%
power if the observed rates held.
"""

from __future__ import annotations

import functools
import math
import statistics
from dataclasses import dataclass

import polars as pl

from gna.core.stats import wilson_interval

ALPHA = 0.05
POWER = 0.8
DEFAULT_MARGIN = 0.05  # "no change" means within +-5 points unless the config says otherwise
# which groups besides "all" a table compares, per task: the multiple-choice facts on the items the
# model knows (the knowledge view's column); every other task on all of its items
COMPARED_GROUPS = {"facts_choice": ("known",)}
SUBSETS = " · by relation"  # the family suffix of the per-relation and not-copyable rows
NOT_COPYABLE = "not copyable"

COLUMNS = {
    "family": pl.String,  # the rows Holm's correction runs over (one question of a phase's table)
    "reference": pl.String,
    "condition": pl.String,
    "task": pl.String,
    "group": pl.String,
    "n": pl.Int64,
    "both_correct": pl.Int64,
    "reference_only": pl.Int64,  # correct under the reference, wrong under the condition: lost
    "condition_only": pl.Int64,  # gained
    "neither": pl.Int64,
    "acc_reference": pl.Float64,
    "acc_condition": pl.Float64,
    "diff": pl.Float64,  # acc_condition - acc_reference
    "ci_low": pl.Float64,
    "ci_high": pl.Float64,
    "p_mcnemar": pl.Float64,
    "p_holm": pl.Float64,
    # Holm's step-down multiplier of this row's raw p (m - rank + 1 in its family): the level its test
    # must pass is 5% / this, which is what a planned n or a detectable difference is planned at
    "holm_multiplier": pl.Int64,
    # the answer's log-prob item by item (null where a frame has none): on how many items it is
    # lower / higher under the condition, the median change (nats), the exact two-sided sign test
    # and its Holm-adjusted value within the family. A change in confidence that accuracy near its
    # ceiling cannot show; the verbs stay with accuracy. logp_n: the items with a finite log-prob under both
    "logp_n": pl.Int64,
    "logp_lower": pl.Int64,
    "logp_higher": pl.Int64,
    "logp_median_diff": pl.Float64,
    "p_logp": pl.Float64,
    "p_logp_holm": pl.Float64,
}


def _normal_quantile(p: float) -> float:
    from statistics import NormalDist

    return NormalDist().inv_cdf(p)


def paired_interval(
    both: int, reference_only: int, condition_only: int, neither: int, confidence: float = 0.95
) -> tuple[float, float]:
    """Newcombe's interval (method 10) for acc_condition - acc_reference on paired 0/1 outcomes:
    `both` items right under both, `reference_only` right under the reference only, and so on."""
    n = both + reference_only + condition_only + neither
    if n == 0:
        return -1.0, 1.0
    z = _normal_quantile(0.5 + confidence / 2)
    ref, cond = both + reference_only, both + condition_only
    p1, p2 = cond / n, ref / n  # difference p1 - p2 (condition minus reference)
    l1, u1 = wilson_interval(cond, n, z)
    l2, u2 = wilson_interval(ref, n, z)
    # phi: the correlation of the two outcomes, corrected for continuity as Newcombe does (0 where a
    # margin is empty: the outcomes are then independent by construction)
    margins = (cond) * (n - cond) * (ref) * (n - ref)
    phi = 0.0
    if margins > 0:
        b = both * neither - reference_only * condition_only
        c = b - n / 2 if b > n / 2 else (b if b < 0 else 0.0)
        phi = c / math.sqrt(margins)
    d = p1 - p2
    low = d - math.sqrt(max(0.0, (p1 - l1) ** 2 - 2 * phi * (p1 - l1) * (u2 - p2) + (u2 - p2) ** 2))
    high = d + math.sqrt(max(0.0, (u1 - p1) ** 2 - 2 * phi * (u1 - p1) * (p2 - l2) + (p2 - l2) ** 2))
    return max(-1.0, low), min(1.0, high)


def mcnemar_p(reference_only: int, condition_only: int) -> float:
    """Exact (binomial) McNemar p-value of the discordant counts, two-sided; 1 where none differ."""
    if reference_only + condition_only == 0:
        return 1.0
    from statsmodels.stats.contingency_tables import mcnemar  # ~0.8 s to import: only comparisons need it

    return float(mcnemar([[0, reference_only], [condition_only, 0]], exact=True).pvalue)


def holm(p_values: list[float]) -> list[float]:
    """Holm-adjusted p-values (statsmodels' multipletests), in the given order."""
    if not p_values:
        return []
    from statsmodels.stats.multitest import multipletests

    return [float(p) for p in multipletests(p_values, alpha=ALPHA, method="holm")[1]]


def holm_multipliers(p_values: list[float]) -> list[int]:
    """Holm's step-down multiplier of each raw p-value, in the given order: m for the smallest, m - 1
    for the next, ..., 1 for the largest; tied p-values share the largest of their ranks' (they are
    rejected together or not at all). The factor a row's test is held to before the adjusted values
    are made monotone (so not p_holm / p)."""
    ordered = sorted(p_values)
    first = {}
    for rank, p in enumerate(ordered):
        first.setdefault(p, rank)
    return [len(p_values) - first[p] for p in p_values]


def logp_change(lp_reference: list[float | None], lp_condition: list[float | None]) -> dict:
    """The paired change of the answer's log-prob over the items where both are finite (logp_n; a
    missing or infinite one is no evidence either way): how many items it is lower / higher under
    the condition (equal ones count for neither), the median change, and the exact sign test of
    lower against higher (the binomial test McNemar's is); None where no item has both."""
    diffs = [
        c - r
        for r, c in zip(lp_reference, lp_condition, strict=True)
        if r is not None and c is not None and math.isfinite(r) and math.isfinite(c)
    ]
    lower, higher = sum(d < 0 for d in diffs), sum(d > 0 for d in diffs)
    return {
        "logp_n": len(diffs),
        "logp_lower": lower,
        "logp_higher": higher,
        "logp_median_diff": statistics.median(diffs) if diffs else None,
        "p_logp": mcnemar_p(lower, higher) if diffs else None,
    }


def paired_row(reference: pl.DataFrame, condition: pl.DataFrame) -> dict:
    """Counts, accuracies, difference, 95% interval and McNemar p of two per-item frames (item_id,
    correct) joined on their shared items, and the paired change of the answer's log-prob
    (logp_change) where both carry logp_target; n = 0 where they share none."""
    logp = "logp_target" in reference.columns and "logp_target" in condition.columns
    extra = [pl.col("logp_target")] if logp else []
    joined = reference.select("item_id", pl.col("correct").alias("r"), *[e.alias("lr") for e in extra]).join(
        condition.select("item_id", pl.col("correct").alias("c"), *[e.alias("lc") for e in extra]),
        on="item_id",
        how="inner",
    )
    r, c = joined["r"].cast(pl.Boolean), joined["c"].cast(pl.Boolean)
    both, neither = int((r & c).sum()), int((~r & ~c).sum())
    reference_only, condition_only = int((r & ~c).sum()), int((~r & c).sum())
    n = len(joined)
    low, high = paired_interval(both, reference_only, condition_only, neither)
    return {
        "n": n,
        "both_correct": both,
        "reference_only": reference_only,
        "condition_only": condition_only,
        "neither": neither,
        "acc_reference": (both + reference_only) / n if n else None,
        "acc_condition": (both + condition_only) / n if n else None,
        "diff": (condition_only - reference_only) / n if n else None,
        "ci_low": low if n else None,
        "ci_high": high if n else None,
        "p_mcnemar": mcnemar_p(reference_only, condition_only) if n else None,
        **(logp_change(joined["lr"].to_list(), joined["lc"].to_list()) if logp and n else {}),
    }


def comparisons(per_item: dict[str, pl.DataFrame], pairs: list[tuple[str, str, str]]) -> pl.DataFrame:
    """The comparisons table (COLUMNS) of `pairs` (family, reference label, condition label) of
    conditions in `per_item` {label: per-item frame with task, item_id, group, correct}: per task
    both scored, on all shared items and on the COMPARED_GROUPS of that task; where the items
    carry a relation, also per relation and on the items whose answer is not copyable from the
    subject, in the family's own SUBSETS family (so they do not dilute its main rows); Holm's
    correction over the rows of each family. A pair whose labels are missing is left out."""
    rows = []
    for family, ref_label, cond_label in pairs:
        if ref_label not in per_item or cond_label not in per_item:
            continue
        ref, cond = per_item[ref_label], per_item[cond_label]
        for task in ref["task"].unique(maintain_order=True).to_list():
            if task not in set(cond["task"].to_list()):
                continue
            r, c = ref.filter(pl.col("task") == task), cond.filter(pl.col("task") == task)
            groups = [("all", r, c, family)] + [
                (g, r.filter(pl.col("group") == g), c, family)
                for g in COMPARED_GROUPS.get(task, ())
                if "group" in r.columns
            ]
            if "relation" in r.columns:
                for relation in sorted(r["relation"].drop_nulls().unique().to_list()):
                    groups.append((relation, r.filter(pl.col("relation") == relation), c, family + SUBSETS))
            if "copyable" in r.columns and r["copyable"].drop_nulls().len():
                groups.append((NOT_COPYABLE, r.filter(pl.col("copyable") == False), c, family + SUBSETS))  # noqa: E712
            for group, r_items, c_items, row_family in groups:
                row = paired_row(r_items, c_items)
                if row["n"]:
                    rows.append(
                        {
                            "family": row_family,
                            "reference": ref_label,
                            "condition": cond_label,
                            "task": task,
                            "group": group,
                            **row,
                        }
                    )
    if not rows:
        return empty()
    added = ("p_holm", "holm_multiplier", "p_logp_holm")
    frame = pl.DataFrame(rows, schema={k: v for k, v in COLUMNS.items() if k not in added}).with_row_index("_row")
    p_holm, multiplier, p_logp_holm = {}, {}, {}
    for part in frame.partition_by("family", maintain_order=True):
        ids, raw = part["_row"].to_list(), part["p_mcnemar"].to_list()
        p_holm |= dict(zip(ids, holm(raw)))
        multiplier |= dict(zip(ids, holm_multipliers(raw)))
        with_logp = part.filter(pl.col("p_logp").is_not_null())  # rows without log-probs are no test
        p_logp_holm |= dict(zip(with_logp["_row"].to_list(), holm(with_logp["p_logp"].to_list())))
    return frame.with_columns(
        pl.col("_row").replace_strict(p_holm, return_dtype=pl.Float64).alias("p_holm"),
        pl.col("_row").replace_strict(multiplier, return_dtype=pl.Int64).alias("holm_multiplier"),
        pl.col("_row").replace_strict(p_logp_holm, default=None, return_dtype=pl.Float64).alias("p_logp_holm"),
    ).select(list(COLUMNS))


def empty() -> pl.DataFrame:
    """A comparisons table with no rows (a phase that compared nothing still writes its table)."""
    return pl.DataFrame(schema=COLUMNS)


@dataclass(frozen=True)
class Decision:
    """What a comparison row shows: verb 'falls' | 'rises' | 'holds' | 'undecided'; `within`: a
    fall or rise that is also inside the margin (a change smaller than the margin, shown); for
    'undecided', about how many items would decide it (at 80% power, the observed rates holding)
    and by which test (`test`: 'change', McNemar; 'equivalence', the exact bounds)."""

    verb: str
    margin: float
    n_to_decide: int | None = None
    within: bool = False
    test: str | None = None

    @property
    def label(self) -> str:
        """The verdict in a table cell: the verb, 'by less than' the margin where `within`, 'not decided'."""
        if self.verb == "undecided":
            return "not decided"
        return f"{self.verb} by less than ±{100 * self.margin:g}" if self.within else self.verb


# The planning functions below are pure and a report asks them for the same rows again and again
# (thousands of exact binomial quantiles per comparisons table): each answer is kept.
@functools.cache
def share_upper_bound(count: int, n: int, confidence: float = 1 - ALPHA) -> float:
    """The exact (Clopper-Pearson) one-sided upper bound on a share of items from `count` of `n`."""
    if n <= 0 or count >= n:
        return 1.0
    from scipy.stats import beta

    return float(beta.ppf(confidence, count + 1, n - count))


def equivalent(lost: int, gained: int, n: int, margin: float) -> bool:
    """Equivalence within +-margin that keeps its 5% at every n: the exact one-sided 95% upper
    bounds on the share of items lost and on the share gained both lie under the margin. A true
    change of at least the margin either way moves at least that share of the items that way, and
    an exact bound falls below the share it bounds with probability 5% at most (Newcombe's 90%
    interval, the interval-inclusion rule, undercovers there: 7.7% at n = 50)."""
    return n > 0 and share_upper_bound(lost, n) < margin and share_upper_bound(gained, n) < margin


def fall_excluded(lost: int, n: int, fall: float) -> bool:
    """Whether a fall of at least `fall` (a share of items: e.g. the points down to chance) is
    excluded at 5%: the exact one-sided 95% upper bound on the share of items lost lies under it. A
    net fall of that size loses at least that share of the items, and an exact bound falls below the
    share it bounds with probability 5% at most (the bound `equivalent` uses, with the study's change
    as the margin)."""
    return n > 0 and fall > 0 and share_upper_bound(lost, n) < fall


MIN_DISCORDANT = 6  # the exact two-sided McNemar test cannot reject at 5% with fewer changed items (2 * 0.5**5 > 0.05)
EXACT_POWER_MAX_N = 5000  # above it, Connor's normal approximation is the plan


@functools.cache
def _mcnemar_power(n: int, psi: float, lost_share: float, alpha: float) -> float:
    """Exact power of the two-sided exact McNemar test at level `alpha` with n items, a share `psi`
    of them changing, `lost_share` of the changed ones lost (scipy's binomial)."""
    import numpy as np
    from scipy.stats import binom

    d = np.arange(n + 1)
    # the largest count a with 2 * P(X <= a) <= alpha, X ~ Bin(d, 1/2): the test rejects at L <= a or L >= d - a
    a = binom.ppf(alpha / 2, d, 0.5)
    a = np.where(2 * binom.cdf(a, d, 0.5) <= alpha, a, a - 1)
    reject = binom.cdf(a, d, lost_share) + binom.sf(d - a - 1, d, lost_share)
    reject = np.where(a >= 0, np.minimum(reject, 1.0), 0.0)
    return float((binom.pmf(d, n, psi) * reject).sum())


@functools.cache
def n_to_show_change(n: int, discordant: int, diff: float, multiplier: int = 1) -> int:
    """About how many items McNemar's test (at 5% / `multiplier`, the row's Holm multiplier) needs
    to show a change of `diff` at 80% power where `discordant` of `n` items change, if those rates
    held: Connor's (1987) approximation, then, where that is at most EXACT_POWER_MAX_N items, the
    smallest n whose exact power (scipy's binomial) reaches 80%, and never fewer than the items
    that hold MIN_DISCORDANT changed ones."""
    psi = min(max(discordant, 1) / max(n, 1), 1.0)  # the share of items that change (one at least)
    psi = max(psi, abs(diff))
    alpha = ALPHA / max(multiplier, 1.0)
    z_a2, z_b = _normal_quantile(1 - alpha / 2), _normal_quantile(POWER)
    connor = (z_a2 * math.sqrt(psi) + z_b * math.sqrt(max(psi - diff * diff, 0.0))) ** 2 / diff**2
    floor = math.ceil(MIN_DISCORDANT / psi)
    need = max(int(math.ceil(connor)), floor)
    if need > EXACT_POWER_MAX_N:
        return need
    lost_share = (psi - diff) / (2 * psi)  # diff = gained - lost shares; lost + gained = psi
    low, high = floor - 1, max(need, floor)
    while _mcnemar_power(high, psi, lost_share, alpha) < POWER:
        low, high = high, 2 * high
        if high > EXACT_POWER_MAX_N:
            return high
    while high - low > 1:  # the smallest n with 80% power (power grows with n, up to the binomial's steps)
        mid = (low + high) // 2
        low, high = (low, mid) if _mcnemar_power(mid, psi, lost_share, alpha) >= POWER else (mid, high)
    return high


@functools.cache
def _most_under(n: int, margin: float) -> int:
    """The largest count of n items whose exact upper bound (share_upper_bound) lies under
    `margin`, found by bisection; -1 where none does."""
    low, high = -1, n
    while high - low > 1:
        mid = (low + high) // 2
        low, high = (mid, high) if share_upper_bound(mid, n) < margin else (low, mid)
    return low


@functools.cache
def n_to_show_equivalence(lost_share: float, gained_share: float, margin: float) -> int | None:
    """About how many items `equivalent` needs at 80% power if a share `lost_share` of them were
    lost and `gained_share` gained (scipy's binomial); None where no n can (a share at the margin)."""
    if max(lost_share, gained_share) >= margin:
        return None
    from scipy.stats import binom

    def power(n: int) -> float:
        low = _most_under(n, margin)
        return 0.0 if low < 0 else float(binom.cdf(low, n, lost_share) * binom.cdf(low, n, gained_share))

    low, high = 1, 2
    while power(high) < POWER:
        low, high = high, 2 * high
        if high > 10**9:
            return None
    while high - low > 1:
        mid = (low + high) // 2
        low, high = (low, mid) if power(mid) >= POWER else (mid, high)
    return high


@functools.cache
def detectable_difference(n: int, discordant: int, multiplier: int = 1) -> float:
    """The smallest paired difference n items detect at 80% power (McNemar at 5% / `multiplier`,
    the row's Holm multiplier, two-sided; n_to_show_change) where `discordant` of them change, the
    share of changing items being at least the difference itself; 1.0 where none is detectable."""
    if n <= 0:
        return 1.0
    low, high = 1.0 / n, 1.0
    if n_to_show_change(n, max(discordant, 1), high, multiplier) > n:
        return 1.0
    for _ in range(30):  # bisection: the n a difference needs falls as the difference grows
        mid = (low + high) / 2
        need = n_to_show_change(n, max(discordant, round(mid * n)), mid, multiplier)
        low, high = (low, mid) if need <= n else (mid, high)
    return high


# the planning functions above that keep each answer, by name (benchmarks/verdict_speed.py and a test
# compare them with what they wrap: `__wrapped__`)
KEPT_PLANS = (
    "share_upper_bound",
    "_most_under",
    "_mcnemar_power",
    "n_to_show_change",
    "n_to_show_equivalence",
    "detectable_difference",
)


def decide(row: dict, margin: float = DEFAULT_MARGIN) -> Decision:
    """The verb one comparisons-table row allows: McNemar after Holm rejects -> 'falls' / 'rises'
    (by the sign of diff; `within` where it is also equivalent within the margin: a change smaller
    than the margin); else equivalent within +-margin -> 'holds'; else 'undecided', with the n of
    whichever test would decide it first (the change's, McNemar; the equivalence's)."""
    n, lost, gained = row["n"], row["reference_only"], row["condition_only"]
    within = equivalent(lost, gained, n, margin)
    if row["p_holm"] is not None and row["p_holm"] < ALPHA and row["diff"]:
        return Decision("falls" if row["diff"] < 0 else "rises", margin, within=within)
    if within:
        return Decision("holds", margin)
    plans = {}
    if row["diff"]:
        # planned at the level the row's test must pass (a hand-made row is a family of one)
        plans["change"] = n_to_show_change(n, lost + gained, row["diff"], row.get("holm_multiplier") or 1)
    equivalence = n_to_show_equivalence(lost / n, gained / n, margin) if n else None
    if equivalence is not None:
        plans["equivalence"] = equivalence
    if not plans:  # no change seen and the shares at the margin: the change's plan for a margin-sized difference
        plans["change"] = n_to_show_change(n, lost + gained, margin)
    test = min(plans, key=plans.get)
    return Decision("undecided", margin, max(plans[test], n + 1), test=test)


def shallowest_holding(decisions: dict) -> int | None:
    """The shallowest prefix shown within the margin of the full model by a fixed sequence: the
    prefixes tested from the deepest down, each at 5%, stopping at the first that is not shown to
    hold ({layers kept: Decision}; a fall smaller than the margin holds). Testing in an order fixed
    before the data keeps the family's error at 5% without a correction, where the smallest of all
    holding prefixes would be a minimum over uncorrected tests."""
    shallowest = None
    for k in sorted(decisions, reverse=True):
        if not (decisions[k].verb == "holds" or decisions[k].within):
            break
        shallowest = k
    return shallowest


PRACTICAL_N_FACTOR = 100  # a planned n over this many times the row's n is reported as impractical


def describe(row: dict, margin: float = DEFAULT_MARGIN) -> str:
    """A plain-text account of a row: the verb, the paired difference with its interval, the
    counts lost and gained, and the test that decided it."""
    d = decide(row, margin)
    change = (
        f"{100 * row['diff']:+.1f} points [{100 * row['ci_low']:+.1f}, {100 * row['ci_high']:+.1f}], "
        f"{row['reference_only']} lost and {row['condition_only']} gained of {row['n']} items"
    )
    bounds = (
        f"at most {100 * share_upper_bound(row['reference_only'], row['n']):.1f}% of items lost and "
        f"{100 * share_upper_bound(row['condition_only'], row['n']):.1f}% gained, exact one-sided 95% bounds"
    )
    if d.verb in ("falls", "rises"):
        by = f", by less than ±{100 * margin:g} points" if d.within else ""
        tail = f"; {bounds}" if d.within else ""
        return f"{d.verb}{by}: {change} (exact McNemar p = {row['p_mcnemar']:.2g}, Holm {row['p_holm']:.2g}{tail})"
    if d.verb == "holds":
        return f"holds within ±{100 * margin:g} points: {change} ({bounds})"
    what = "show the change (McNemar)" if d.test == "change" else f"show that it holds within ±{100 * margin:g}"
    # a difference near the margin can need millions of items: say so rather than plan them
    plan = (
        f"about n = {d.n_to_decide} would {what}"
        if d.n_to_decide <= PRACTICAL_N_FACTOR * row["n"]
        else f"no practical n would decide it (about {d.n_to_decide:,} items to {what})"
    )
    held = f"Holm p = {row['p_holm']:.2g}, not within ±{100 * margin:g}"
    return f"not decided at n = {row['n']}: {change} ({held}); {plan}"


def comparison_row(
    compared: pl.DataFrame, family: str, reference: str, condition: str, task: str, group: str = "all"
) -> dict | None:
    """The row of a comparisons table (comparisons) comparing `condition` with `reference` in
    `family` on `task` and `group`, or None where the two were not compared."""
    if compared.is_empty():
        return None
    rows = compared.filter(
        (pl.col("family") == family)
        & (pl.col("reference") == reference)
        & (pl.col("condition") == condition)
        & (pl.col("task") == task)
        & (pl.col("group") == group)
    )
    return rows.row(0, named=True) if len(rows) else None
