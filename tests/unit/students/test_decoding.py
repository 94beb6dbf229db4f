"""The memory table of the hybrid phase: formula rows per variant and the measured check."""

import copy
from types import SimpleNamespace

import polars as pl
import pytest

from gna.core.settings import Files
from gna.students.decoding import (
    HybridMemory,
    formula_table,
    inference_memory,
    largest_cache,
    measured_cache,
    measured_check,
    memory_rows,
    run_hybrid_memory,
)
from gna.students.spec import hybrid_spec, make_hybrid, save_student

CFG = SimpleNamespace(num_hidden_layers=3, num_attention_heads=4, num_key_value_heads=2, hidden_size=48)


def test_memory_rows_use_the_formula_per_length():
    rows = memory_rows("k1-n8", CFG, [(0, 1)], 8, [10, 20], 2)
    assert [r["seq_len"] for r in rows] == [10, 20]
    assert rows[1] == {
        "variant": "k1-n8",
        "heads_kept": 1,
        "state_size": 8,
        "seq_len": 20,
        **inference_memory(CFG, [(0, 1)], 8, 20, 2),
    }
    teacher = memory_rows("teacher", CFG, None, 0, [10], 2)[0]
    assert teacher["heads_kept"] is None and teacher["state_size"] is None and teacher["ssm_state_bytes"] == 0


def test_formula_table_lists_the_teacher_then_each_student():
    specs = [
        {"variant": "k0-n8", "kept_heads": [], "state_size": 8},
        {"variant": "k2-n4", "kept_heads": [[0, 1], [2, 0]], "state_size": 4},
    ]
    table = formula_table(CFG, specs, [16, 32], 2)
    assert table["variant"].to_list() == ["teacher", "teacher", "k0-n8", "k0-n8", "k2-n4", "k2-n4"]
    assert table["source"].unique().to_list() == ["formula"]
    assert table.filter(pl.col("variant") == "k0-n8")["kv_cache_bytes"].to_list() == [0, 0]


def test_largest_cache_prefers_attention_heads_then_state():
    specs = {
        "a": {"kept_heads": [[0, 0]], "state_size": 64},
        "b": {"kept_heads": [[0, 0], [1, 0]], "state_size": 4},
        "c": {"kept_heads": [[0, 1], [1, 1]], "state_size": 8},
    }
    assert largest_cache(specs) == "c"


def test_measured_check_puts_the_measurement_beside_the_formula():
    spec = {"variant": "k2-n4", "kept_heads": [[0, 1], [2, 0]], "state_size": 4}
    row = measured_check(CFG, spec, 1234, 50, 4).row(0, named=True)
    formula = memory_rows("k2-n4", CFG, spec["kept_heads"], 4, [50], 4)[0]["total_bytes"]
    assert row["source"] == "measured" and row["total_bytes"] == 1234 and row["formula_bytes"] == formula
    assert row["kv_cache_bytes"] is None and row["ssm_state_bytes"] is None and row["seq_len"] == 50


def test_run_hybrid_memory_measures_what_the_formula_says(tmp_path, tiny_llama):
    model, tok = tiny_llama
    folders = []
    for kept, n in (([], 8), ([(0, 1), (2, 3)], 4)):
        folder = tmp_path / f"student-{len(kept)}"
        student = make_hybrid(copy.deepcopy(model), kept, n)
        save_student(student, tok, folder, hybrid_spec(student, variant=f"k{len(kept)}-n{n}"))
        folders.append(str(folder))
    model.config.save_pretrained(tmp_path / "teacher")
    memory = {"seq_lens": [8, 16], "bytes_per_value": 2, "check_len": 12}
    frame = run_hybrid_memory(
        Files(model=str(tmp_path / "teacher"), students=folders),
        Files(memory=str(tmp_path / "memory.parquet")),
        HybridMemory.of({"model": "tiny", "memory": memory}),
    )
    assert pl.read_parquet(tmp_path / "memory.parquet").equals(frame)
    assert frame.columns == [
        "variant",
        "heads_kept",
        "state_size",
        "seq_len",
        "kv_cache_bytes",
        "ssm_state_bytes",
        "total_bytes",
        "source",
        "formula_bytes",
        "model",
    ]
    check = frame.filter(pl.col("source") == "measured").row(0, named=True)
    assert check["variant"] == "k2-n4" and check["total_bytes"] == check["formula_bytes"]
    assert measured_cache(make_hybrid(copy.deepcopy(model), [(0, 1), (2, 3)], 4), 12) == check["total_bytes"]
    assert len(frame) == 3 * 2 + 1


@pytest.mark.parametrize("kept", [[], [(0, 0), (0, 1), (0, 2), (0, 3)]])
def test_memory_of_extreme_students(kept):
    mem = inference_memory(CFG, kept, 8, 100, 2)
    assert mem["total_bytes"] == mem["kv_cache_bytes"] + mem["ssm_state_bytes"]
    assert (mem["kv_cache_bytes"] == 0) == (not kept)
