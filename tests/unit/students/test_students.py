"""Students: names of variants and students, which heads are kept, the saved spec."""

import copy
import json

import polars as pl
import pytest

from gna.students.spec import (
    SPEC_FILE,
    TEACHER_VARIANT,
    hybrid_spec,
    is_student,
    make_hybrid,
    parse_variant,
    ranked_heads,
    read_spec,
    save_student,
    split_student_name,
    ssm_heads_for,
    student_name,
    student_variants,
    teacher_of,
    variant_name,
)


def test_variant_and_student_names_round_trip():
    assert variant_name(2, 8) == "k2-n8"
    assert parse_variant(variant_name(12, 64)) == (12, 64)
    name = student_name("smollm2-135m", "k2-n8")
    assert name == "smollm2-135m-hybrid-k2-n8"
    assert split_student_name(name) == ("smollm2-135m", "k2-n8")
    assert teacher_of(name) == "smollm2-135m"
    assert teacher_of(student_name("a-hybrid-b", "k0-n4")) == "a-hybrid-b"
    # wildcard patterns for the workflow
    assert student_name("{model}", variant_name("{k}", "{n}")) == "{model}-hybrid-k{k}-n{n}"


@pytest.mark.parametrize("name", ["teacher", "k2", "k2-n", "kx-n8", "k2-n8-extra", "n8-k2"])
def test_other_names_are_not_variants(name):
    with pytest.raises(ValueError, match="not a student variant"):
        parse_variant(name)
    assert split_student_name(f"model-hybrid-{name}") is None
    assert teacher_of(f"model-hybrid-{name}") == f"model-hybrid-{name}"
    assert teacher_of("plain-model") == "plain-model"
    assert TEACHER_VARIANT == "teacher"


def test_student_variants_follow_the_config_order_without_repeats():
    hybrid = {"state_size": 8, "heads_kept": [0, 2, 4], "state_sweep_heads_kept": [2], "state_sizes": [4, 8, 16]}
    assert student_variants(hybrid) == ["k0-n8", "k2-n8", "k4-n8", "k2-n4", "k2-n16"]


def test_ranked_heads_take_the_best_ranks_and_refuse_too_many():
    ranking = pl.DataFrame({"rank": [3, 1, 2], "layer": [0, 2, 1], "head": [1, 0, 3]})
    assert ranked_heads(ranking, 2) == [(2, 0), (1, 3)]
    assert ranked_heads(ranking, 0) == []
    with pytest.raises(ValueError, match="4 heads asked, but tiny has only 3"):
        ranked_heads(ranking, 4, "tiny")


def test_ssm_heads_are_every_head_not_kept():
    assert ssm_heads_for(2, 3, [(0, 1), (1, 0), (1, 2)]) == {0: [0, 2], 1: [1]}
    assert ssm_heads_for(1, 2, []) == {0: [0, 1]}


def test_spec_says_which_heads_are_kept_and_is_saved_with_the_student(tmp_path, tiny_llama):
    model, tok = tiny_llama
    kept = [(0, 1), (2, 3)]
    student = make_hybrid(copy.deepcopy(model), kept, state_size=4)
    spec = hybrid_spec(student, variant="k2-n4")
    assert spec == {"state_size": 4, "kept_heads": [[0, 1], [2, 3]], "variant": "k2-n4"}
    assert not is_student(tmp_path)
    save_student(student, tok, tmp_path, spec)
    assert is_student(tmp_path) and read_spec(tmp_path) == spec
    assert json.loads((tmp_path / SPEC_FILE).read_text()) == spec


def test_building_a_student_leaves_the_process_warning_filters_alone(tiny_llama):
    import warnings

    before = list(warnings.filters)
    cfg = tiny_llama[0].config
    everything = [(i, h) for i in range(cfg.num_hidden_layers) for h in range(cfg.num_attention_heads)]
    make_hybrid(copy.deepcopy(tiny_llama[0]), everything, state_size=4)  # zero-size SSM blocks
    assert warnings.filters == before
