"""The students' report: inference memory (memory.parquet), formula and measured check."""

from __future__ import annotations

import html

import polars as pl

from gna.report.htmlkit import table
from gna.students.spec import TEACHER_VARIANT

REFERENCE_MEMORY = """
<p class='note'><b>Reference, not produced by this pipeline:</b> the study's inference memory (1B models):
Hybrid-Llamba 1.2 / 11.0 / 21.5 MB and Llama-3.2-1B 4.2 / 67.1 / 134.2 MB at L = 128 / 2048 / 4096.
Its layer swap: replacing layer 17 of the aligned Llamba by attention raised MMLU from 33% to 50%
(knowledge unchanged at 69%).</p>
"""


def _bytes(v) -> str:
    if v is None:
        return "–"
    return f"{v / 2**20:.2f} MB" if v >= 2**20 else f"{v / 2**10:.1f} KB"


def memory_table(sub: pl.DataFrame) -> str:
    """Bytes per variant and sequence length, and the ratio to the teacher at the longest."""
    wide = sub.select("variant", "seq_len", "total_bytes").pivot(on="seq_len", index="variant", values="total_bytes")
    lens = [c for c in wide.columns if c != "variant"]
    teacher_bytes = wide.filter(pl.col("variant") == TEACHER_VARIANT)
    out = wide.select("variant", *[pl.col(c).alias(f"L = {c}") for c in lens])
    if len(teacher_bytes):
        out = out.with_columns(
            [(pl.col(f"L = {c}") / teacher_bytes[c][0]).alias(f"× teacher (L = {c})") for c in lens[-1:]]
        )
    fmts = {f"L = {c}": _bytes for c in lens}
    fmts.update({c: (lambda v: f"{v:.2f}") for c in out.columns if c.startswith("×")})
    return table(out, left=("variant",), fmt=fmts)


def memory_part(memory: pl.DataFrame, hy: dict, reference: bool) -> str:
    """Per model: the inference-memory formula table and its measured check."""
    if memory.is_empty():
        return ""
    parts = []
    formula = memory.filter(pl.col("source") == "formula")
    for model in sorted(formula["model"].unique()):
        parts.append(
            f"<h3>{html.escape(model)}: inference memory (KV cache + SSM state)</h3>"
            f"<p>Computed from each configuration for one sequence at "
            f"{hy['memory']['bytes_per_value']} bytes per value: K/V of every group with a kept "
            "head, and per SSM head an N×P state, the first token's P-vector value and the last three "
            "tokens' values (the local skip).</p>"
        )
        parts.append(memory_table(formula.filter(pl.col("model") == model)))
        measured = memory.filter((pl.col("source") == "measured") & (pl.col("model") == model))
        for row in measured.iter_rows(named=True):
            parts.append(
                f"<p>Measured check: after a prefill of {row['seq_len']} tokens the recurrent cache of "
                f"<code>{html.escape(row['variant'])}</code> held {row['total_bytes']:,} bytes (fp32 "
                f"tensors); the formula gives {row['formula_bytes']:,}.</p>"
            )
    if reference:
        parts.append(REFERENCE_MEMORY)
    return "".join(parts)
