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
* equivalence within a stated margin by two one-sided tests at 5% each, decided by the
  interval-inclusion principle: the 90% paired interval lies inside (-margin, +margin).

A comparisons table (COLUMNS) holds the counts, the difference, its interval and the p-values;
`decide` turns a row into the verb a sentence may use: "falls" / "rises" where McNemar rejects
after Holm, "holds" (within the margin) where equivalence is shown, else "undecided", with the n
that would decide it at 80% power if the observed rates held.
"""

from __future__ import annotations

import math
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


def paired_row(reference: pl.DataFrame, condition: pl.DataFrame) -> dict:
    """Counts, accuracies, difference, 95% interval and McNemar p of two per-item frames (item_id,
    correct) joined on their shared items; n = 0 where they share none."""
    joined = reference.select("item_id", pl.col("correct").alias("r")).join(
        condition.select("item_id", pl.col("correct").alias("c")), on="item_id", how="inner"
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
    frame = pl.DataFrame(rows, schema={k: v for k, v in COLUMNS.items() if k != "p_holm"}).with_row_index("_row")
    adjusted = [
        (row, p)
        for part in frame.partition_by("family", maintain_order=True)
        for row, p in zip(part["_row"].to_list(), holm(part["p_mcnemar"].to_list()))
    ]
    p_holm = dict(adjusted)
    return frame.with_columns(pl.col("_row").replace_strict(p_holm, return_dtype=pl.Float64).alias("p_holm")).select(
        list(COLUMNS)
    )


def empty() -> pl.DataFrame:
    """A comparisons table with no rows (a phase that compared nothing still writes its table)."""
    return pl.DataFrame(schema=COLUMNS)


@dataclass(frozen=True)
class Decision:
    """What a comparison row shows: verb 'falls' | 'rises' | 'holds' | 'undecided'; for
    'undecided', about how many items would decide it (at 80% power, the observed rates holding)."""

    verb: str
    margin: float
    n_to_decide: int | None = None


def n_to_decide(n: int, discordant: int, diff: float, margin: float, multiplier: float = 1.0) -> int:
    """About how many items would decide a comparison with `discordant` of `n` items changing and
    observed difference `diff`, if those rates held: McNemar's power at 80% (Connor 1987) at the
    level 5% / `multiplier` (the row's Holm multiplier: its test must pass that level) where |diff|
    is at least the margin, else the equivalence test's (two one-sided tests at 5%, planned for a
    true difference of `diff`: z of 1 - beta/2, as for a true difference of 0)."""
    psi = max(discordant, 1) / max(n, 1)  # the share of items that change (one at least)
    alpha = ALPHA / max(multiplier, 1.0)
    z_a2, z_a, z_b = _normal_quantile(1 - alpha / 2), _normal_quantile(1 - ALPHA), _normal_quantile(POWER)
    if abs(diff) >= margin and diff:
        need = (z_a2 * math.sqrt(psi) + z_b * math.sqrt(max(psi - diff * diff, 0.0))) ** 2 / diff**2
    else:
        z_b2 = _normal_quantile(1 - (1 - POWER) / 2)
        need = (z_a + z_b2) ** 2 * psi / max(margin - abs(diff), 1e-3) ** 2
    return int(math.ceil(need))


def detectable_difference(n: int, discordant: int) -> float:
    """The smallest paired difference n items detect at 80% power (McNemar, 5% two-sided; Connor
    1987) where `discordant` of them change, the share of changing items being at least the
    difference itself; 1.0 where no difference is detectable."""
    if n <= 0:
        return 1.0
    low, high = 1.0 / n, 1.0
    if n_to_decide(n, max(discordant, 1), high, 0.0) > n:
        return 1.0
    for _ in range(40):  # bisection: the n a difference needs falls as the difference grows
        mid = (low + high) / 2
        need = n_to_decide(n, max(discordant, round(mid * n)), mid, 0.0)
        low, high = (low, mid) if need <= n else (mid, high)
    return high


def decide(row: dict, margin: float = DEFAULT_MARGIN) -> Decision:
    """The verb one comparisons-table row allows: McNemar after Holm rejects -> 'falls' / 'rises'
    (by the sign of diff); else the 90% paired interval inside +-margin -> 'holds'; else 'undecided'."""
    if row["p_holm"] is not None and row["p_holm"] < ALPHA and row["diff"]:
        return Decision("falls" if row["diff"] < 0 else "rises", margin)
    low, high = paired_interval(
        row["both_correct"], row["reference_only"], row["condition_only"], row["neither"], confidence=1 - 2 * ALPHA
    )
    if -margin < low and high < margin:
        return Decision("holds", margin)
    discordant = row["reference_only"] + row["condition_only"]
    # Holm's multiplier for this row (its adjusted over its raw p), so the n is planned at the
    # level the row's test must pass; an n at or below this one cannot be what decides it
    multiplier = row["p_holm"] / row["p_mcnemar"] if row["p_mcnemar"] else 1.0
    need = n_to_decide(row["n"], discordant, row["diff"], margin, multiplier)
    return Decision("undecided", margin, max(need, row["n"] + 1))


PRACTICAL_N_FACTOR = 100  # a planned n over this many times the row's n is reported as impractical


def describe(row: dict, margin: float = DEFAULT_MARGIN) -> str:
    """A plain-text account of a row: the verb, the paired difference with its interval, the
    counts lost and gained, and the test that decided it."""
    d = decide(row, margin)
    change = (
        f"{100 * row['diff']:+.1f} points [{100 * row['ci_low']:+.1f}, {100 * row['ci_high']:+.1f}], "
        f"{row['reference_only']} lost and {row['condition_only']} gained of {row['n']} items"
    )
    if d.verb in ("falls", "rises"):
        return f"{d.verb}: {change} (exact McNemar p = {row['p_mcnemar']:.2g}, Holm {row['p_holm']:.2g})"
    if d.verb == "holds":
        return f"holds within ±{100 * margin:g} points: {change} (90% interval inside the margin)"
    # which test the n is planned for: the change where it is at least the margin, else equivalence
    what = "show the change" if abs(row["diff"]) >= margin else f"show whether it holds within ±{100 * margin:g}"
    # a difference near the margin can need millions of items: say so rather than plan them
    plan = (
        f"about n = {d.n_to_decide} would {what}"
        if d.n_to_decide <= PRACTICAL_N_FACTOR * row["n"]
        else f"at this difference no practical n would {what} (about {d.n_to_decide:,} items)"
    )
    held = f"Holm p = {row['p_holm']:.2g}, not within ±{100 * margin:g}"
    return f"not decided at n = {row['n']}: {change} ({held}); {plan}"
