"""The hybrid phase's rule functions run in order on the tiny teacher (`phase`): distilled once per
session for test_distill.py, test_student_evaluation.py and test_recipe.py."""

import polars as pl
import pytest
from conftest import MINI_MMLU  # tests/conftest.py (this file is unit.students.conftest)

from gna.core.io import write_parquet
from gna.core.settings import Files
from gna.students.distill import run_distill_align, run_distill_kd, run_distill_teacher
from gna.tasks.tables import build_kv_retrieval
from unit.students.rules import CORPUS, KD


@pytest.fixture(scope="session")
def phase(tmp_path_factory, tiny_llama):
    """The hybrid phase's rule functions run in order on the tiny teacher."""
    model, tok = tiny_llama
    root = tmp_path_factory.mktemp("hybrid")
    model.save_pretrained(root / "teacher")
    tok.save_pretrained(root / "teacher")
    write_parquet(pl.DataFrame({"rank": [1, 2, 3], "layer": [2, 0, 1], "head": [1, 3, 0]}), root / "ranking.parquet")
    write_parquet(build_kv_retrieval([3, 5], 2, seed=0, template="lookup"), root / "kv_retrieval.parquet")
    p = {name: str(root / name) for name in ("teacher", "ranking.parquet", "kv_retrieval.parquet")}
    run_distill_teacher(
        Files(model=p["teacher"], mmlu=str(MINI_MMLU)),
        str(root / "teacher.safetensors"),
        CORPUS,
        top_k=4,
        seed=1,
        mmlu={"n": 8, "seed": 7, "topics": []},
        template="lookup",
    )
    run_distill_align(
        "tiny",
        4,
        Files(model=p["teacher"], teacher=str(root / "teacher.safetensors")),
        Files(
            weights=str(root / "align.safetensors"),
            curve=str(root / "align.parquet"),
            heads=str(root / "align-heads.parquet"),
        ),
        {"steps": 2, "batch": 2, "lr": 1e-3},
        seed=1,
    )
    for k in (0, 2):
        run_distill_kd(
            "tiny",
            f"k{k}-n4",
            Files(
                model=p["teacher"],
                teacher=str(root / "teacher.safetensors"),
                aligned=str(root / "align.safetensors"),
                ranking=p["ranking.parquet"],
            ),
            Files(
                student=str(root / f"k{k}"),
                curve=str(root / f"kd{k}.parquet"),
                checkpoints=str(root / f"kd{k}-checkpoints.safetensors"),
            ),
            KD,
            checkpoints=[0, 1, 2] if k == 2 else [],
            seed=1,
        )
    return root, p
