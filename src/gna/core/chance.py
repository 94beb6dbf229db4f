"""One policy for a task a change cannot be judged on (config block `chance`).

A change (removing layers or heads, masking, distilling a student) can show a loss only where the
model it changes answers above chance and reads the context. Where the reference model's accuracy
cannot be told from chance (its Wilson 95% interval contains chance: `at_chance`), or a teacher is
degenerate (it keeps its answer when another item's context is swapped in: `degenerate_reason`),
the changed conditions are not run and the row that was scored records why.

One result shape, in every phase: a String column SKIPPED ("skipped_reason"), null on the rows of
tasks where every condition ran; on a task where conditions were left out, the reason, on the rows
that were scored (the reference condition) or, where nothing was (a student kept off a task by its
teacher), on one row whose value is null.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

import polars as pl

from gna.core.stats import wilson_interval

SKIPPED = "skipped_reason"
# A model that keeps its prediction on this share of items when the context is swapped for
# another item's does not read the context: its accuracy measures its prior, not the task.
DEGENERATE_AGREEMENT = 0.8
DEGENERACY_METRIC = "degeneracy_agreement"


def chance_accuracy(table: pl.DataFrame) -> float:
    """Expected accuracy of a uniform guess over each item's choices."""
    return float(sum(1 / len(c) for c in table["choices"]) / max(len(table), 1))


def above_chance(ci_low: float | None, chance: float) -> bool:
    """The one rule for "above chance": the 95% interval's lower end is above the chance accuracy."""
    return ci_low is not None and ci_low > chance


def answered(form: dict) -> bool:
    """A multiple-choice form the model answers (a row of the format comparison): above chance,
    and under the circular check (each item under the four orders of its options) above a uniform
    guess's chance of passing all four (chance to the fourth)."""
    chance = form["chance"]
    return above_chance(form["ci_low"], chance) and above_chance(form.get("circular_ci_low"), chance**4)


def chance_reason(
    accuracy: tuple[float, float, float, int], chance: float, consequence: str, who: str = ""
) -> str | None:
    """Why an `accuracy` (value, 95% interval low, high, n) cannot show anything (`consequence`),
    or None: its interval contains `chance`. `who` opens the sentence ("the teacher's accuracy is ")."""
    value, low, high, n = accuracy
    if not n or value is None or low is None or not low <= chance <= high:
        return None
    return (
        f"{who}not distinguishable from chance at n={n}: accuracy {value:.1%} [{low:.1%}, {high:.1%}] "
        f"contains chance {chance:.1%}, so {consequence}"
    )


def at_chance(per_item: pl.DataFrame, table: pl.DataFrame, change: str = "removing layers") -> str | None:
    """Why `change` is not judged on `table` for this model, or None: its Wilson 95% interval
    (per_item: score_table's frame) contains chance (chance_accuracy), so the model has no shown
    ability on the task to lose (a change could still move its answers, but not lose a skill)."""
    correct, n = int(per_item["correct"].sum() or 0), len(per_item)
    low, high = wilson_interval(correct, n)
    accuracy = (correct / n if n else None, low, high, n)
    return chance_reason(accuracy, chance_accuracy(table), f"{change} has no shown ability to take away")


def degenerate_reason(agreement: float, n: int) -> str:
    """Why a student cannot be compared with a teacher that keeps its answer on `agreement` of
    `n` items when another item's context is swapped in."""
    return (
        f"the teacher keeps its answer on {round(agreement * 100)}% of {n} items when another item's "
        "context is swapped in (degenerate), so no student can be compared with it on this task"
    )


def skipped(reason: str | None) -> pl.Expr:
    """The SKIPPED column holding `reason` (null: every condition ran)."""
    return pl.lit(reason, dtype=pl.String).alias(SKIPPED)


@dataclass(frozen=True)
class ChancePolicy:
    """The chance policy of one phase: `skip` (config chance.skip) leaves out the conditions that
    cannot show a change where the reference model is at chance (and, for students, where the
    teacher is degenerate); never on the tasks of `always_scored` (the task that defines a
    phase's reference, e.g. the retrieval task of the minimal model). Off by default: a library
    call scores every condition unless asked."""

    skip: bool = False
    always_scored: tuple[str, ...] = ()

    def __post_init__(self):
        if not isinstance(self.skip, bool):
            raise ValueError(f"chance.skip: {self.skip!r} is not true or false")
        object.__setattr__(self, "always_scored", tuple(self.always_scored))

    @classmethod
    def from_config(cls, config: dict) -> ChancePolicy:
        return cls(skip=config["chance"]["skip"])

    def sparing(self, *tasks: str | None) -> ChancePolicy:
        """This policy, never applied to `tasks` (None ignored)."""
        return replace(self, always_scored=self.always_scored + tuple(t for t in tasks if t))

    def applies(self, task: str) -> bool:
        return self.skip and task not in self.always_scored

    def reason(self, per_item: pl.DataFrame, table: pl.DataFrame, change: str) -> str | None:
        """at_chance's reason for the model scored in `per_item` on `table`, where this policy
        applies to the table's task; None otherwise."""
        if table.is_empty() or not self.applies(table["task"][0]):
            return None
        return at_chance(per_item, table, change)

    def teacher_reasons(self, teacher_summary: pl.DataFrame | None, tables: dict[str, pl.DataFrame]) -> dict[str, str]:
        """{task of `tables`: why no student can be compared with the teacher there}: the teacher
        is degenerate (summarize_task's flag) or its accuracy's interval (its summary's 'all' row)
        contains chance; degeneracy is named first. {} where the policy is off or without a summary."""
        if not self.skip or teacher_summary is None:
            return {}
        overall = teacher_summary.filter(pl.col("group") == "all")
        reasons: dict[str, str] = {}
        if "degenerate" in overall.columns:
            flagged = overall.filter((pl.col("metric") == DEGENERACY_METRIC) & pl.col("degenerate").fill_null(False))
            for row in flagged.sort("task").iter_rows(named=True):
                if self.applies(row["task"]) and row["task"] in tables:
                    reasons[row["task"]] = degenerate_reason(row["value"], row["n"])
        for row in overall.filter(pl.col("metric") == "acc").sort("task").iter_rows(named=True):
            task = row["task"]
            if task in reasons or task not in tables or not self.applies(task):
                continue
            reason = chance_reason(
                (row["value"], row["ci_low"], row["ci_high"], row["n"]),
                chance_accuracy(tables[task]),
                "no student can be compared with it on this task",
                who="the teacher's accuracy is ",
            )
            if reason is not None:
                reasons[task] = reason
        return dict(sorted(reasons.items()))


@dataclass(frozen=True)
class Reference:
    """What a phase knows of the reference model before it scores a change against it (the
    unmodified model; for the minimal model's experiments, the minimal model): `scored`, its
    per-item scores by task from an earlier job (its baseline, gradual pruning's prefix scores, a
    student's answers), read instead of scoring the same items again where they hold a table's
    items (None: none, every table is scored); and `chance`, the policy that leaves out the
    conditions that cannot show a change on a task where the reference model is at chance."""

    scored: dict[str, pl.DataFrame] | None = None
    chance: ChancePolicy = ChancePolicy()

    def scores_of(self, task: str) -> pl.DataFrame | None:
        """The reference model's known per-item scores on `task`, or None."""
        return (self.scored or {}).get(task)

    def has(self, task: str) -> bool:
        """Whether scores of the reference model on `task` are known."""
        return bool(self.scored) and task in self.scored


# the default of a phase function's reference: no scores known (every table scored), the chance policy off
NO_REFERENCE = Reference()
