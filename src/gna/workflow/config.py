"""Config validation with messages that name the offending key.

The workflow calls `validate_config` at parse time, before any job runs. JSON-schema errors are
rewritten as "config key 'a.b.c': ..." and the allowed values or keys are listed.
"""

from __future__ import annotations

import copy
from pathlib import Path

import jsonschema
import yaml


class ConfigError(ValueError):
    pass


# keys that moved: a config still using the old name is refused with the new one named
# old key: (new key, how its value carries over)
MOVED_KEYS = {
    # it sets the ablations', the state-size sweep's and the degeneracy check's size too
    "hybrid.budget_curve.dict_size": ("hybrid.dict_size", "the same value"),
    # one chance policy for every phase (gna.core.chance)
    **{
        old: ("chance.skip", "one switch for every phase")
        for old in (
            "prune.skip_at_chance",
            "heads.skip_at_chance",
            "gna.skip_at_chance",
            "hybrid.skip_where_teacher_degenerate",
            "hybrid.skip_where_teacher_at_chance",
        )
    },
}


def _check_moved(config: dict) -> None:
    for old, (new, how) in MOVED_KEYS.items():
        *parents, key = old.split(".")
        node = config
        for part in parents:
            node = node.get(part) if isinstance(node, dict) else None
        if isinstance(node, dict) and key in node:
            raise ConfigError(f"config key '{old}' is now '{new}' ({how}); rename it in your config")


def _dotted(path) -> str:
    out = ""
    for part in path:
        out += f"[{part}]" if isinstance(part, int) else (f".{part}" if out else str(part))
    return out or "<root>"


def _describe(error: jsonschema.ValidationError) -> str:
    where = _dotted(error.absolute_path)
    if error.validator == "additionalProperties" and isinstance(error.instance, dict):
        allowed = sorted(error.schema.get("properties", {}))
        extra = sorted(set(error.instance) - set(allowed))
        keys = ", ".join(f"{where}.{k}" if where != "<root>" else k for k in extra)
        return f"config key '{keys}' is not allowed; allowed keys here: {', '.join(allowed)}"
    if error.validator == "enum":
        return (
            f"config key '{where}': {error.instance!r} is not allowed; "
            f"allowed values: {', '.join(map(str, error.validator_value))}"
        )
    if error.validator == "required":
        return f"config key '{where}': {error.message}"
    return f"config key '{where}': {error.message}"


def _with_defaults(validator_class):
    """A validator that fills `default` values of absent properties (as snakemake.utils.validate)."""
    validate_properties = validator_class.VALIDATORS["properties"]

    def set_defaults(validator, properties, instance, schema):
        if isinstance(instance, dict):
            for prop, sub in properties.items():
                if "default" in sub and prop not in instance:
                    instance[prop] = copy.deepcopy(sub["default"])
        yield from validate_properties(validator, properties, instance, schema)

    return jsonschema.validators.extend(validator_class, {"properties": set_defaults})


def load_schema(path: str | Path) -> dict:
    return yaml.safe_load(Path(path).read_text())


def canonical(value):
    """`value` with every mapping's keys in sorted order, recursively (lists keep their order):
    the same settings in any key order give equal values with equal repr, and Snakemake compares
    a rule's params by their repr."""
    if isinstance(value, dict):
        return {key: canonical(value[key]) for key in sorted(value)}
    if isinstance(value, list):
        return [canonical(item) for item in value]
    return value


def validate_config(config: dict, schema: dict) -> dict:
    """Return a validated copy of `config` with defaults filled and keys in canonical order (so
    models, too, run and appear in name order); raise ConfigError otherwise."""
    config = copy.deepcopy(config)
    _check_moved(config)
    validator = _with_defaults(jsonschema.Draft202012Validator)(schema)
    errors = sorted(
        validator.iter_errors(config), key=lambda e: (len(e.absolute_path), list(map(str, e.absolute_path)))
    )
    if errors:
        # branch errors of if/then are reported once, the deepest most specific first
        messages = list(dict.fromkeys(_describe(e) for e in errors))
        raise ConfigError("invalid config:\n  " + "\n  ".join(messages))
    _check_semantics(config)
    _check_students(config)
    check_families(config)
    return canonical(config)


def built_tasks(config: dict) -> list[str]:
    """The evaluation tasks a validated config builds: KV retrieval, then each MMLU and facts format."""
    return (
        ["kv_retrieval"]
        + [f"mmlu_{f}" for f in config["tasks"]["mmlu"]["formats"]]
        + [f"facts_{f}" for f in config["tasks"]["facts"]["formats"]]
    )


def _check_students(config: dict) -> None:
    """The hybrid section's lists name students of this config; its KV size is one the config
    builds; the ablations' KD budget is a point of the ablated student's budget curve."""
    from gna.students.spec import ablation_kd, student_variants

    hybrid = config["hybrid"]
    if not hybrid["enabled"]:
        return
    variants = student_variants(hybrid)
    for key, listed in (
        ("gna_variants", hybrid["gna_variants"]),
        ("budget_curve.variants", hybrid["budget_curve"]["variants"]),
        ("ablation.variant", [hybrid["ablation"]["variant"]] if hybrid["ablation"]["remove"] else []),
    ):
        unknown = [v for v in listed if v not in variants]
        if unknown:
            raise ConfigError(
                f"config key 'hybrid.{key}': {unknown} are not students of this config; allowed: {', '.join(variants)}"
            )
    if hybrid["ablation"]["remove"]:
        try:
            ablation_kd(hybrid)
        except ValueError as err:
            raise ConfigError(str(err)) from None
    sizes = config["tasks"]["kv_retrieval"]["sizes"]
    if hybrid["dict_size"] not in sizes:
        raise ConfigError(
            f"config key 'hybrid.dict_size': {hybrid['dict_size']} is not a KV dictionary size of this config; "
            f"allowed: {', '.join(map(str, sizes))}"
        )


def _check_semantics(config: dict) -> None:
    """Rules the schema cannot express."""
    kv = config["tasks"]["kv_retrieval"]
    if kv["sizes"] and len(set(kv["sizes"])) != len(kv["sizes"]):
        raise ConfigError(f"config key 'tasks.kv_retrieval.sizes': duplicate sizes in {kv['sizes']}")
    facts = config["tasks"]["facts"]
    if "choice" in facts["formats"] and "cloze" not in facts["formats"]:
        raise ConfigError(
            "config key 'tasks.facts.formats': choice needs cloze (its known items are read from the "
            "cloze scores); add cloze or remove choice"
        )
    from gna.workflow.plan import model_facts, model_heads, model_prune

    compared = {"tasks.facts": facts["compare"]}
    for name, entry in config["models"].items():
        if "compare" in entry.get("overrides", {}).get("facts", {}):
            compared[f"models.{name}.overrides.facts"] = model_facts(config, name)["compare"]
    for where, forms in compared.items():
        for i, form in enumerate(forms):
            if form.get("prefix") and not form.get("chat"):
                raise ConfigError(
                    f"config key '{where}.compare[{i}].prefix': the reply's 'The answer is' opens an assistant "
                    "turn of the chat template; set chat: true or remove prefix"
                )

    phases = ("prune", "hybrid") if config["hybrid"]["enabled"] else ("prune",)
    for name, entry in config["models"].items():
        running = [p for p in phases if p not in entry.get("skip", [])]
        if model_heads(config, name)["sweep_unit"] == "group" and running:
            raise ConfigError(
                f"config key 'models.{name}': heads.sweep_unit group ranks key/value groups, but "
                f"{' and '.join(running)} keep single heads of the ranking; add them to models.{name}.skip or "
                "rank heads (sweep_unit: head)"
            )

    for where, heads in [("heads", config["heads"])] + [
        (f"models.{name}.overrides.heads", model_heads(config, name))
        for name, spec in config["models"].items()
        if "heads" in spec.get("overrides", {})
    ]:
        outside = sorted(set(heads["control_k"] or []) - set(heads["top_k"]))
        if outside:
            raise ConfigError(
                f"config key '{where}.control_k': {outside} not in {where}.top_k ({heads['top_k']}); the "
                "random-k controls run at k that the table removes"
            )
        if heads["curve_tasks"] is not None and heads["control_k"] is None:
            raise ConfigError(
                f"config key '{where}.curve_tasks': the tasks off the curve are scored at the k of {where}.control_k, "
                "which is null (every k); set control_k or leave curve_tasks null"
            )
    hybrid = config["hybrid"]
    outside = [k for k in hybrid["knowledge_heads_kept"] or [] if k not in hybrid["heads_kept"]]
    if hybrid["enabled"] and outside:
        raise ConfigError(
            f"config key 'hybrid.knowledge_heads_kept': {outside} are not in hybrid.heads_kept {hybrid['heads_kept']}"
        )
    formats = set(built_tasks(config))
    for where, prune in [("prune", config["prune"])] + [
        (f"models.{name}.overrides.prune", model_prune(config, name))
        for name, spec in config["models"].items()
        if "prune" in spec.get("overrides", {})
    ]:
        for task in prune["tasks"]:
            if task not in formats:
                raise ConfigError(
                    f"config key '{where}.tasks': {task!r} is not built; add its format to "
                    f"tasks.mmlu.formats or tasks.facts.formats, or remove it "
                    f"(built: {', '.join(sorted(formats))})"
                )
        if prune["retrieval_task"] not in prune["tasks"]:
            raise ConfigError(
                f"config key '{where}.retrieval_task': {prune['retrieval_task']!r} must be one of "
                f"{where}.tasks ({', '.join(prune['tasks'])})"
            )
    case = config["case_study"]
    unknown = [name for name in case["models"] if name not in config["models"]]
    if unknown:
        raise ConfigError(
            f"config key 'case_study.models': {unknown} are not models (models: {', '.join(config['models'])})"
        )
    missing = [task for task in ["mmlu_letter", *case["tasks"]] if task not in formats]
    if case["models"] and missing:
        raise ConfigError(
            f"config key 'case_study.tasks': {sorted(set(missing))} not built; the case study needs MMLU letter and "
            f"its tasks in tasks.mmlu.formats / tasks.facts.formats (built: {', '.join(sorted(formats))})"
        )
    for name, spec in config["models"].items():
        if "/" in name or name.startswith("."):
            raise ConfigError(f"config key 'models.{name}': model names may not contain '/' or start with '.'")
        if spec["source"] == "tiny-random":
            heads, kv_heads, hidden = spec["heads"], spec["kv_heads"], spec["hidden"]
            if heads % kv_heads or hidden % heads:
                raise ConfigError(
                    f"config key 'models.{name}': heads ({heads}) must be a multiple of kv_heads "
                    f"({kv_heads}) and divide hidden ({hidden})"
                )


def check_families(config: dict) -> None:
    """For models whose family the config names (tiny-random `arch`): a phase the family refuses
    (gna.models.families) must be in the model's `skip`, else ConfigError naming the key."""
    from gna.models.families import ATTENTION_ONLY, REFUSED_BECAUSE, STUDENT_FAMILIES, skip_hint

    hybrid_on = config.get("hybrid", {}).get("enabled", True)
    for name, spec in config["models"].items():
        if spec.get("source") != "tiny-random":
            continue
        arch, skip = spec.get("arch", "llama"), spec.get("skip", [])
        if hybrid_on and "hybrid" not in skip and arch not in STUDENT_FAMILIES:
            raise ConfigError(
                f"config key 'models.{name}.skip': students cannot be distilled from {arch} "
                f"({REFUSED_BECAUSE['students']}; supported: {', '.join(STUDENT_FAMILIES)}); "
                f"{skip_hint(name, 'hybrid')}"
            )
        if "gna" not in skip and arch not in ATTENTION_ONLY:
            raise ConfigError(
                f"config key 'models.{name}.skip': {REFUSED_BECAUSE['gna']} ({arch}); {skip_hint(name, 'gna')}"
            )
