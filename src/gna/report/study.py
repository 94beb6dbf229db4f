"""What the study reports (Bick, Xing, Gu, ICML 2025), in one place: the report's reference columns
and tables and docs/findings.md read these. Labelled references, never results of this pipeline."""

from __future__ import annotations

CITATION = "Bick, Xing, Gu, ICML 2025"

# Llama-3.1-8B with its G&A heads disabled, per task of the contrast: (verb, what the study shows)
CONTRAST = {
    "mmlu_letter": ("falls", "66% → 25% (chance)"),
    "mmlu_cloze": ("holds", "knowledge tasks unchanged"),
    "facts_cloze": ("holds", "knowledge tasks unchanged"),
    "kv_retrieval": ("falls", "KV retrieval collapses"),
}

# the study's verb per comparison family and column kind ("kv", "cloze", "choice"): one head's
# removal takes MMLU letter to chance while cloze knowledge stays; SSMs keep knowledge but fail the
# letter format; hybrids and the critical layer's attention bring it back
VERBS = {
    "topk": {"kv": "falls", "cloze": "holds", "choice": "falls"},
    "ssm": {"kv": "falls", "cloze": "holds", "choice": "falls"},
    "hybrid": {"kv": "rises", "cloze": "holds", "choice": "rises"},
    "swap": {"kv": "rises", "cloze": "holds", "choice": "rises"},
}

# the two G&A roles and the dictionary-size curve, as the study states them
GNA_ROLES = (
    "a Gather head condenses each segment (e.g. each answer option) into a summary token; an Aggregate "
    "head reads the summaries and writes the chosen one at the answer position"
)
DICT_SIZE = (
    "KV accuracy against dictionary size: one head's removal costs a constant share, the other's grows with size"
)

# Llama-3.1-8B-Instruct pruned above layer 17, heads kept in layers 16/17 (None: none kept)
KEPT_HEADS = {
    "what": "Llama-3.1-8B-Instruct pruned above layer 17, heads kept in layers 16/17",
    "columns": ("heads kept L16", "heads kept L17", "MMLU (reference)", "knowledge tasks (reference)"),
    "rows": [(22, 24, "66.32%", "39.09%"), (None, 24, "24.36%", "39.18%"), (22, None, "25.59%", "39.21%"),
             (None, None, "25.56%", "39.21%")],
}  # fmt: skip

# Hybrid-Llama-1B (distilled from Llama-3.2-1B, retrieval-guided heads kept), selected columns
HYBRID_HEADS = {
    "what": "Hybrid-Llama-1B (distilled from Llama-3.2-1B, retrieval-guided heads kept), selected columns",
    "columns": ("attention heads kept", "LAMBADA acc", "MMLU", "KV-Ret", "PIQA (knowledge)"),
    "rows": [(0, 50.7, 39.2, 13.2, 74.2), (10, 54.2, 42.1, 99.0, 74.6), (20, 55.0, 43.0, 99.3, 74.5),
             (40, 54.0, 44.0, 99.4, 73.7), ("512 (Llama-3.2-1B)", 60.1, 46.0, 99.3, 74.4)],
}  # fmt: skip

# the state-size table (Hybrid-Llama-1B, 20 heads kept)
STATE_SIZE = {
    "what": "state-size table (Hybrid-Llama-1B, 20 heads kept)",
    "columns": ("state size", "MMLU", "KV-Ret", "PIQA (knowledge)"),
    "rows": [(4, 37.0, 72.6, 74.6), (8, 41.0, 90.0, 74.0), (64, 43.0, 99.3, 74.5)],
}


def cell(value) -> str:
    return "∅" if value is None else str(value)


def reference_html(table: dict, intro: str) -> str:
    """One of the tables above as the report shows it: a labelled reference note, then the table."""
    head = "".join(f"<th>{c}</th>" for c in table["columns"])
    rows = "".join("<tr>" + "".join(f"<td>{cell(v)}</td>" for v in row) + "</tr>" for row in table["rows"])
    return (
        f"\n<p class='note'><b>Reference, not produced by this pipeline:</b> {intro}:</p>\n"
        f"<table class='ref'><thead><tr>{head}</tr></thead><tbody>{rows}</tbody></table>\n"
    )
