"""The hybrid phase's rule functions run in order on the tiny teacher (`phase`): distilled once per
session for test_distill.py, test_student_evaluation.py and test_recipe.py."""

import polars as pl
import pytest
from conftest import MINI_MMLU  # tests/conftest.py (this file is unit.students.conftest)

from gna.core.io import write_parquet
from gna.core.settings import Files
from gna.students import alignment, kd
from gna.students.alignment import DistillAlign, run_distill_align
from gna.students.kd import DistillKD, run_distill_kd
from gna.students.teacher_file import DistillTeacher, run_distill_teacher
from gna.tasks.tables import build_kv_retrieval
from unit.students.rules import CORPUS, KD


@pytest.fixture(scope="session", autouse=True)
def training_as_configured():
    """Student tests train in the compute dtype their settings name on every CPU kind: on a CPU
    without bf16 instructions the pipeline trains bf16 settings in float32 instead
    (gna.engine.precision.training_dtype, tested there and in test_distillation)."""
    with pytest.MonkeyPatch.context() as patch:
        for module in (alignment, kd):
            patch.setattr(module, "training_dtype", lambda device, compute_dtype, key: compute_dtype)
        yield


def kd_outputs(root, stem: str, student) -> Files:
    """distill_kd's outputs under `root`, named from `stem` as the rule names them from the variant."""
    return Files(
        student=str(student),
        curve=str(root / f"{stem}.parquet"),
        validation_curve=str(root / f"{stem}-validation.parquet"),
        changes=str(root / f"{stem}-changes.parquet"),
        checkpoints=str(root / f"{stem}-checkpoints.safetensors"),
    )


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
        Files(teacher=str(root / "teacher.safetensors")),
        DistillTeacher.of(
            {"corpus": CORPUS, "top_k": 4, "seed": 1, "mmlu": {"n": 8, "seed": 7, "topics": []}, "template": "lookup"}
        ),
    )
    run_distill_align(
        Files(model=p["teacher"], teacher=str(root / "teacher.safetensors")),
        Files(
            weights=str(root / "align.safetensors"),
            curve=str(root / "align.parquet"),
            heads=str(root / "align-heads.parquet"),
        ),
        DistillAlign.of({"model": "tiny", "state_size": 4, "align": {"steps": 2, "batch": 2, "lr": 1e-3}, "seed": 1}),
    )
    # the checkpoint selection's own prompts (another seed than the evaluation table's)
    write_parquet(build_kv_retrieval([3], 4, seed=5, template="lookup"), root / "kd_validation.parquet")
    p["kd_validation.parquet"] = str(root / "kd_validation.parquet")
    for k, by in ((0, "last"), (2, "validation")):
        settings = {
            "model": "tiny",
            "variant": f"k{k}-n4",
            "kd": KD,
            "checkpoints": [0, 1, 2] if k == 2 else [],
            "seed": 1,
            "select": {"by": by, "every": 1, "batch_size": 4},
            "realign": {"steps": 2, "batch": 2, "lr": 1e-2} if k == 2 else None,
        }
        run_distill_kd(
            Files(
                model=p["teacher"],
                teacher=str(root / "teacher.safetensors"),
                aligned=str(root / "align.safetensors"),
                ranking=p["ranking.parquet"],
                validation=p["kd_validation.parquet"],
            ),
            kd_outputs(root, f"kd{k}", student=root / f"k{k}"),
            DistillKD.of(settings),
        )
    return root, p
