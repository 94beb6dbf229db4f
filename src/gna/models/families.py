"""Which phases run for which model family, and why the others are refused.

The engine needs nothing family-specific (gna.engine.stack records the model's own forward);
what differs between families is which experiments make sense: G&A attention maps need
attention weights in every layer, and hybrid students replace, head by head, an attention with
separate q/k/v/o projections and rotary positions (q/k norms per head or over the projection,
pre- or post-norm layers; no fused projections, soft-capping or sliding window yet).
`FAMILY_PHASES` is what tests/unit/models/test_families.py checks family by family and what the
README's family table is generated from (`python -m gna.models.families`).
"""

from __future__ import annotations

import sys

from gna.engine.stack import UnsupportedModel, family_of, sliding_windows
from gna.models.tiny import DEFAULT_WINDOW

PHASES = ("prepare", "baseline", "pruning", "heads", "attribution", "gna", "students")
STUDENT_FAMILIES = ("llama", "mistral", "qwen2", "qwen3", "olmo2")
WINDOWED = ("mistral", "qwen2", "gemma2", "gemma3")  # may declare sliding windows
ATTENTION_ONLY = ("llama", "mistral", "qwen2", "qwen3", "gemma2", "gemma3", "phi3", "olmo2", "gpt_neox", "gpt2")
SSM_FAMILIES = ("mamba", "falcon_mamba", "mamba2", "zamba2")

REFUSED_BECAUSE = {
    "gna": "G&A maps need attention weights in every layer (the SSM layers have none)",
    "students": "a hybrid student replaces attention head by head where it has separate q/k/v/o "
    "projections and rotary positions (no fused projections, learned positions or soft-capping yet)",
}
FAMILY_PHASES = {
    arch: tuple(
        p
        for p in PHASES
        if not (p == "gna" and arch not in ATTENTION_ONLY) and not (p == "students" and arch not in STUDENT_FAMILIES)
    )
    for arch in ATTENTION_ONLY + SSM_FAMILIES
}


def check_student_family(model) -> None:
    """Raise UnsupportedModel (naming the family and the supported ones) unless hybrid students
    can be built from `model`."""
    family = family_of(model)
    supported = ", ".join(STUDENT_FAMILIES)
    if family not in STUDENT_FAMILIES:
        raise UnsupportedModel(
            f"hybrid students cannot be distilled from {family} ({type(model).__name__}): "
            f"{REFUSED_BECAUSE['students']}; supported: {supported}"
        )
    windows = [w for w in sliding_windows(model.config, model.config.num_hidden_layers) if w]
    if windows:
        raise UnsupportedModel(
            f"hybrid students cannot be distilled from {family} with a sliding window of "
            f"{windows[0]} tokens (the kept heads would attend past it); supported: {supported} "
            "without sliding windows"
        )


def skip_hint(model_name: str, phase: str) -> str:
    return f"to run the rest of the study on it, set models.{model_name}.skip: [{phase}] in the config"


def check_config_families(config: dict) -> None:
    """At config time, for models whose family the config names (tiny-random `arch`): a phase
    the family refuses must be in the model's `skip`, else ValueError naming the key."""
    hybrid_on = config.get("hybrid", {}).get("enabled", True)
    for name, spec in config["models"].items():
        if spec.get("source") != "tiny-random":
            continue
        arch, skip = spec.get("arch", "llama"), spec.get("skip", [])
        windowed = arch in WINDOWED and spec.get("window", DEFAULT_WINDOW) is not None
        if hybrid_on and "hybrid" not in skip and (arch not in STUDENT_FAMILIES or windowed):
            why = "with a sliding window" if arch in STUDENT_FAMILIES else REFUSED_BECAUSE["students"]
            raise ValueError(
                f"config key 'models.{name}.skip': students cannot be distilled from {arch} ({why}; "
                f"supported: {', '.join(STUDENT_FAMILIES)}); {skip_hint(name, 'hybrid')}"
            )
        if "gna" not in skip and arch not in ATTENTION_ONLY:
            raise ValueError(
                f"config key 'models.{name}.skip': {REFUSED_BECAUSE['gna']} ({arch}); {skip_hint(name, 'gna')}"
            )


def family_table() -> str:
    """The README's family × phase table (Markdown)."""
    head = "| family | " + " | ".join(PHASES) + " |"
    rule = "|---" * (len(PHASES) + 1) + "|"

    def cell(arch, phase):
        if phase not in FAMILY_PHASES[arch]:
            return "refused"
        return "runs without sliding window" if phase == "students" and arch in WINDOWED else "runs"

    rows = [f"| {arch} | " + " | ".join(cell(arch, p) for p in PHASES) + " |" for arch in FAMILY_PHASES]
    notes = [f"- refused {phase}: {why}." for phase, why in REFUSED_BECAUSE.items()]
    return "\n".join([head, rule, *rows, "", *notes])


if __name__ == "__main__":
    sys.stdout.write(family_table() + "\n")
