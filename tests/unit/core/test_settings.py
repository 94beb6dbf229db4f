"""gna.core.settings: the settings rules pass to the library, checked where they are made."""

import dataclasses

import pytest

from gna.core.settings import Evaluation, RuleSettings


def test_evaluation_from_the_config_round_trips_through_params():
    config = {"dtype": "bfloat16", "eval": {"batch_size": 16, "compute_dtype": "bfloat16"}}
    evaluation = Evaluation.from_config(config)
    assert evaluation == Evaluation(batch_size=16, dtype="bfloat16", compute_dtype="bfloat16")
    assert Evaluation(**evaluation.as_params()) == evaluation
    with pytest.raises(AttributeError):
        evaluation.batch_size = 1  # frozen: safe as a default argument


@pytest.mark.parametrize(
    "bad, key",
    [
        ({"batch_size": 0}, "eval.batch_size"),
        ({"dtype": "int8"}, "dtype"),
        ({"compute_dtype": "float16"}, "eval.compute_dtype"),
    ],
)
def test_a_bad_evaluation_setting_names_its_key(bad, key):
    with pytest.raises(ValueError, match=f"^{key}: "):
        Evaluation(**bad)


def test_student_scoring_names_the_key_and_passes_only_the_fields_a_rule_reads():
    from gna.core.settings import StudentScoring

    hybrid = {
        "eval_items": None,
        "answer_rows_items": 50,
        "degeneracy_items": 20,
        "dict_size": 10,
    }
    evaluation = {"batch_size": 4, "compute_dtype": "float32"}
    config = {"hybrid": hybrid, "dtype": "float32", "eval": evaluation, "chance": {"skip": False}}
    scoring = StudentScoring.from_config(config)
    assert not scoring.chance.skip and scoring.dict_size == 10 and scoring.items is None
    assert StudentScoring.from_config(config, "answer_rows_items").items == 50
    assert StudentScoring(**scoring.as_params()) == scoring
    assert scoring.as_params("dict_size", "evaluation") == {
        "dict_size": 10,
        "evaluation": scoring.evaluation.as_params(),
    }
    for bad, key in (
        ({"items": -1}, "hybrid.eval_items"),
        ({"dict_size": 0}, "hybrid.dict_size"),
        ({"chance": {"skip": "yes"}}, "chance.skip"),
    ):
        with pytest.raises(ValueError, match=f"^{key}: "):
            StudentScoring(**bad)


def test_top_k_settings_name_their_key_and_round_trip_through_rule_params():
    from gna.core.settings import TopK

    heads = {"top_k": [0, 1, 5], "random_draws": 2, "control_tasks": ["kv_retrieval"], "seed": 7}
    top_k = TopK.from_heads(heads | {"control_k": [5], "control_draws": None, "curve_tasks": ["facts_cloze"]})
    assert top_k.ks == (0, 1, 5) and top_k.control_k == (5,) and TopK(**top_k.as_params()) == top_k
    assert top_k.curve_tasks == ("facts_cloze",)
    for bad, key in (({"ks": [-1]}, "heads.top_k"), ({"random_draws": -2}, "heads.random_draws")):
        with pytest.raises(ValueError, match=f"^{key}: "):
            TopK(**bad)


def test_files_name_their_roles_and_a_missing_role():
    from gna.core.settings import Files

    files = Files(model="m", tasks=("a", "b"), baseline=[])
    assert files.model == "m" and files.tasks == ["a", "b"] and files.get("baseline") is None
    with pytest.raises(AttributeError, match="no 'teacher' file here \\(files: model, tasks, baseline\\)"):
        _ = files.teacher
    assert Files.of({"model": "m", "tasks": ("a",)}).tasks == ["a"]  # as from Snakemake's named lists


@dataclasses.dataclass(frozen=True)
class _Block(RuleSettings):
    steps: int
    sizes: tuple[int, ...] = ()


@dataclasses.dataclass(frozen=True)
class _Rule(RuleSettings):
    model: str
    block: _Block
    evaluation: Evaluation = Evaluation()
    optional: _Block | None = None


def test_rule_settings_are_built_typed_from_what_a_rule_passes_and_back():
    settings = _Rule.of({"model": "m", "block": {"steps": 3, "sizes": [4, 16]}, "evaluation": {"batch_size": 2}})
    assert settings.block == _Block(3, (4, 16)) and settings.evaluation.batch_size == 2 and settings.optional is None
    assert _Rule.of(settings.as_params()) == settings
    assert settings.as_params()["block"] == {"steps": 3, "sizes": [4, 16]}


def test_rule_settings_name_the_unknown_or_misplaced_key():
    with pytest.raises(ValueError, match=r"_Rule.block: unknown keys \['step'\]"):
        _Rule.of({"model": "m", "block": {"step": 3}})
    with pytest.raises(ValueError, match=r"_Rule.block: 3 is not a mapping"):
        _Rule.of({"model": "m", "block": 3})
    with pytest.raises(ValueError, match="eval.batch_size"):
        _Rule.of({"model": "m", "block": {"steps": 1}, "evaluation": {"batch_size": 0}})
