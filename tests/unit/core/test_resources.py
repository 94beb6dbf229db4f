"""Memory requests from model size: a tiny random model's size is computed exactly, every rule
that loads a model has an entry, and requests grow with the model."""

import re

import pytest
from conftest import REPO

from gna.core.resources import DEFAULT_PARAMS_B, RULE_MEMORY, mem_mb, model_params_b
from gna.models.tiny import tiny_random_model


@pytest.mark.parametrize(
    "spec",
    [
        {"source": "tiny-random"},
        {"source": "tiny-random", "layers": 3, "hidden": 48, "heads": 4, "kv_heads": 2, "intermediate": 80},
    ],
)
def test_tiny_random_size_is_its_parameter_count(spec):
    model, _ = tiny_random_model(spec)
    assert model_params_b(spec) * 1e9 == pytest.approx(sum(p.numel() for p in model.parameters()), rel=0.01)


def test_every_rule_that_sizes_by_model_has_an_entry():
    declared = set(re.findall(r'job_mem_mb\("(\w+)"\)', "".join(p.read_text() for p in (REPO / "rules").glob("*.smk"))))
    assert declared == set(RULE_MEMORY)


def test_requests_are_the_floor_for_small_models_and_grow_with_large_ones():
    assert mem_mb("baseline", 0.135, "float32") == RULE_MEMORY["baseline"][0]
    assert model_params_b({"source": "hf", "id": "a/b"}) == DEFAULT_PARAMS_B
    eight_b = {"source": "hf", "id": "a/b", "params_b": 8.03}
    weights_mb = 8.03e9 * 2 / 2**20
    assert weights_mb < mem_mb("baseline", model_params_b(eight_b), "bfloat16") < mem_mb("distill_kd", 8.03, "bfloat16")
    assert mem_mb("baseline", 8.03, "float32") > mem_mb("baseline", 8.03, "bfloat16")
    with pytest.raises(KeyError, match="rule 'nope' has no memory entry"):
        mem_mb("nope", 1.0, "float32")
