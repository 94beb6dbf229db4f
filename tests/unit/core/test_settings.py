"""gna.core.settings: the settings rules pass to the library, checked where they are made."""

import pytest

from gna.core.settings import Evaluation


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
