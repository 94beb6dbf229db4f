"""Which phases run for which model family, and why the others are refused.

The engine needs nothing family-specific (gna.engine.stack records the model's own forward);
what differs between families is which experiments make sense: G&A attention maps need
attention weights in every layer, and hybrid students replace a transformer's attention head by
head (gna.students.mixer takes each family's projections, norms, positions, soft-capping,
windows and layer layout from the model), so they are built for every attention family.
`FAMILY_PHASES` is what tests/unit/models/test_families.py checks family by family and what the
family table of docs/usage.md is generated from (`python -m gna.models.families`).
"""

from __future__ import annotations

import sys

PHASES = ("prepare", "baseline", "pruning", "heads", "attribution", "gna", "students")
ATTENTION_ONLY = ("llama", "mistral", "qwen2", "qwen3", "gemma2", "gemma3", "phi3", "olmo2", "gpt_neox", "gpt2")
STUDENT_FAMILIES = ATTENTION_ONLY  # every attention family
SSM_FAMILIES = ("mamba", "falcon_mamba", "mamba2", "zamba2")

REFUSED_BECAUSE = {
    "gna": "G&A maps need attention weights in every layer (the SSM layers have none)",
    "students": "students are distilled from transformers, whose every layer is attention "
    "(these families have SSM layers)",
}
FAMILY_PHASES = {
    arch: tuple(
        p
        for p in PHASES
        if not (p == "gna" and arch not in ATTENTION_ONLY) and not (p == "students" and arch not in STUDENT_FAMILIES)
    )
    for arch in ATTENTION_ONLY + SSM_FAMILIES
}


def student_family(model) -> str:
    """The family name students know `model` by (Gemma 3's text model: gemma3)."""
    # the model's anatomy needs torch; the tables above do not (the config check reads them at parse time)
    from gna.engine.anatomy import family_of

    return family_of(model).removesuffix("_text")


def check_student_family(model) -> None:
    """Raise UnsupportedModel (naming the family and the supported ones) unless hybrid students
    can be built from `model`."""
    from gna.engine.anatomy import UnsupportedModel

    family = student_family(model)
    if family not in STUDENT_FAMILIES:
        raise UnsupportedModel(
            f"hybrid students cannot be distilled from {family} ({type(model).__name__}): "
            f"{REFUSED_BECAUSE['students']}; supported: {', '.join(STUDENT_FAMILIES)}"
        )


def skip_hint(model_name: str, phase: str) -> str:
    return f"to run the rest of the study on it, set models.{model_name}.skip: [{phase}] in the config"


def family_table() -> str:
    """The family × phase table of docs/usage.md (Markdown)."""
    head = "| family | " + " | ".join(PHASES) + " |"
    rule = "|---" * (len(PHASES) + 1) + "|"

    def cell(arch, phase):
        return "runs" if phase in FAMILY_PHASES[arch] else "refused"

    rows = [f"| {arch} | " + " | ".join(cell(arch, p) for p in PHASES) + " |" for arch in FAMILY_PHASES]
    notes = [f"- refused {phase}: {why}." for phase, why in REFUSED_BECAUSE.items()]
    return "\n".join([head, rule, *rows, "", *notes])


if __name__ == "__main__":
    sys.stdout.write(family_table() + "\n")
