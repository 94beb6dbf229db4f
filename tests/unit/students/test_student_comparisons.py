"""The students compared item by item (gna.students.student_comparisons), on the golden smoke
run's answers."""

from pathlib import Path

import polars as pl

from gna.core.settings import Files
from gna.students.student_comparisons import HybridComparisons, run_hybrid_comparisons, student_pairs

ANSWERS = (
    Path(__file__).resolve().parents[2] / "data" / "smoke_results" / "results" / "hybrid" / "tiny-llama" / "answers"
)


def test_student_pairs_cover_teacher_pure_ssm_neighbours_and_swap():
    pairs = student_pairs(["teacher", "k0-n16", "k2-n16", "k10-n16", "k0-n4", "k10-n64"], "k0-n16", "swap L3")
    assert ("students vs teacher", "teacher", "k0-n16") in pairs and len([p for p in pairs if p[1] == "teacher"]) == 5
    # the pure SSM against hybrids of its own state size only (k10-n64 differs in two ways)
    assert [p[2] for p in pairs if p[0] == "hybrids vs pure SSM"] == ["k2-n16", "k10-n16"]
    # k2-n16 against the pure SSM is compared once, in the family above
    assert [p[1:] for p in pairs if p[0] == "more heads kept vs fewer"] == [("k2-n16", "k10-n16")]
    assert len({p[1:] for p in pairs}) == len(pairs)  # no pair twice
    assert [p[1:] for p in pairs if p[0] == "larger state vs smaller"] == [("k0-n4", "k0-n16"), ("k10-n16", "k10-n64")]
    assert ("layer swap vs pure SSM", "k0-n16", "swap L3") in pairs


def test_the_rule_compares_the_answers_it_reads(tmp_path):
    answers = sorted(str(p) for p in ANSWERS.glob("*.parquet") if p.stem != "swap")
    out = tmp_path / "comparisons.parquet"
    settings = HybridComparisons("tiny-llama", "k0-n8")
    result = run_hybrid_comparisons(
        Files(answers=answers, swap=[str(ANSWERS / "swap.parquet")]), Files(comparisons=str(out)), settings
    )
    assert pl.read_parquet(out).equals(result) and set(result["model"]) == {"tiny-llama"}
    swap = pl.read_parquet(ANSWERS / "swap.parquet")["variant"][0]
    assert ("layer swap vs pure SSM", "k0-n8", swap) in result.select("family", "reference", "condition").rows()
    teacher = pl.read_parquet(ANSWERS / "teacher.parquet")
    for row in result.filter(pl.col("reference") == "teacher").iter_rows(named=True):
        student = pl.read_parquet(ANSWERS / f"{row['condition']}.parquet").filter(pl.col("task") == row["task"])
        if row["group"] != "all":
            continue
        shared = teacher.filter(pl.col("task") == row["task"]).join(student, on="item_id", suffix="_s")
        assert row["n"] == len(shared)
        assert row["reference_only"] == int((shared["correct"] & ~shared["correct_s"]).sum())
        assert row["condition_only"] == int((~shared["correct"] & shared["correct_s"]).sum())
    # without the layer swap, no swap row
    bare = run_hybrid_comparisons(Files(answers=answers, swap=[]), Files(comparisons=str(out)), settings)
    assert "layer swap vs pure SSM" not in set(bare["family"])
