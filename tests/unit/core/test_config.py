import copy

import pytest
import yaml

from conftest import REPO
from gna.core.config import ConfigError, load_schema, validate_config

SCHEMA = load_schema(REPO / "config" / "schema.yaml")


def default():
    return yaml.safe_load((REPO / "config" / "config.yaml").read_text())


@pytest.mark.parametrize("name", ["config.yaml", "smoke.yaml", "paper.yaml"])
def test_shipped_configs_are_valid(name):
    validate_config(yaml.safe_load((REPO / "config" / name).read_text()), SCHEMA)


def test_defaults_are_filled():
    cfg = default()
    del cfg["eval"]
    out = validate_config(cfg, SCHEMA)
    assert out["eval"]["batch_size"] == 8
    assert out["lm_eval"]["tasks"] == []


@pytest.mark.parametrize(
    "mutate, expected",
    [
        (lambda c: c.update(bogus=1), "config key 'bogus' is not allowed"),
        (lambda c: c["tasks"]["kv_retrieval"].update(sizes=["x"]), "tasks.kv_retrieval.sizes[0]"),
        (lambda c: c["tasks"]["kv_retrieval"].update(n_per_size="ten"), "tasks.kv_retrieval.n_per_size"),
        (lambda c: c["models"]["smollm2-135m"].update(source="ftp"), "allowed values: pypi-file, hf, local, tiny-random"),
        (lambda c: c["models"]["smollm2-135m"].pop("sha256"), "'sha256' is a required property"),
        (lambda c: c["models"].update(x={"source": "hf", "id": "a/b", "revison": "v1"}), "models.x.revison"),
        (lambda c: c["tasks"]["kv_retrieval"].update(template="prose"), "allowed values: lookup, study"),
        (lambda c: c["tasks"]["kv_retrieval"].update(sizes=[5, 5]), "duplicate sizes"),
    ],
)
def test_bad_config_names_the_key(mutate, expected):
    cfg = default()
    mutate(cfg)
    with pytest.raises(ConfigError) as err:
        validate_config(cfg, SCHEMA)
    assert expected in str(err.value)


def test_validation_does_not_mutate_input():
    cfg = default()
    before = copy.deepcopy(cfg)
    validate_config(cfg, SCHEMA)
    assert cfg == before
