"""Gather-and-Aggregate: segments of a prompt, attention maps, and per-head role scores.

A *Gather* head condenses each segment (a key:value line, an answer option) into a summary
token — the token that ends the segment's line (its newline); an *Aggregate* head, at the
answer position, reads the segments and picks one. See `role_scores` for the exact measures.
"""

from __future__ import annotations

import contextlib
import logging
import re
from dataclasses import dataclass

import polars as pl
import torch

from gna.core.io import read_parquet, write_parquet
from gna.core.settings import Evaluation, Files, RuleSettings
from gna.engine.ablation import head_ranks
from gna.engine.anatomy import UnsupportedModel, family_of, head_sites
from gna.engine.device import device_of
from gna.engine.scoring import Scorer, starts_with_bos
from gna.models.families import skip_hint
from gna.students.mixer import captured_maps, mixers, ssm_heads_of
from gna.students.spec import load_any
from gna.tasks.tables import LETTERS, load_task_tables

log = logging.getLogger("gna.phases.gather_aggregate")
ROLES = ("gather", "aggregate")


@dataclass
class Segments:
    spans: list[tuple[int, int]]  # token ranges [start, end) of each segment
    summary: list[int]  # token index of each segment's summary token
    answer: int  # the answer position (last context token)
    correct: int  # index of the segment holding the answer
    tokens: list[str]


def _token_span(offsets: list[tuple[int, int]], start: int, end: int) -> tuple[int, int]:
    idx = [i for i, (a, b) in enumerate(offsets) if a < end and b > start and b > a]
    if not idx:
        raise ValueError(f"no token covers characters {start}..{end}")
    return idx[0], idx[-1] + 1


def _segments(tok, context: str, char_spans: list[tuple[int, int]], correct: int) -> Segments:
    enc = tok(context, return_offsets_mapping=True, add_special_tokens=False)
    offsets = [tuple(o) for o in enc["offset_mapping"]]
    shift = 1 if starts_with_bos(tok) else 0  # token positions as the engine and attention_maps see them
    spans, summary = [], []
    for start, end in char_spans:
        first, last = _token_span(offsets, start, end)
        # the summary token ends the line: the token holding the newline after it, if any
        newline = [i for i, (a, b) in enumerate(offsets) if a <= end < b] if end < len(context) else []
        spans.append((first + shift, last + shift))
        summary.append((newline[0] if newline else last - 1) + shift)
    tokens = [tok.bos_token] * shift + tok.convert_ids_to_tokens(enc["input_ids"])
    return Segments(spans, summary, len(offsets) - 1 + shift, correct, tokens)


def kv_segments(tok, context: str, query_key: str) -> Segments:
    """Each dictionary line `key:value` is a segment (not the lookup example after it)."""
    body_start = context.index("\n") + 1
    body_end = context.find("\n\n", body_start)
    body_end = body_end if body_end >= 0 else context.rfind("\n")
    char_spans, keys, pos = [], [], body_start
    for line in context[body_start:body_end].split("\n"):
        if re.fullmatch(r"[^:\n]+:\d+", line):
            char_spans.append((pos, pos + len(line)))
            keys.append(line.split(":")[0])
        pos += len(line) + 1
    return _segments(tok, context, char_spans, keys.index(query_key))


def mmlu_letter_segments(tok, context: str, target: int) -> Segments:
    """Each answer option line `X. text` of the final question is a segment."""
    char_spans = []
    for letter in LETTERS:
        start = context.rindex(f"\n{letter}. ") + 1
        end = context.index("\n", start)
        char_spans.append((start, end))
    return _segments(tok, context, char_spans, target)


@contextlib.contextmanager
def eager_attention(model):
    """Attention weights need the eager implementation; restore the original afterwards."""
    original = model.config._attn_implementation
    model.set_attn_implementation("eager")
    try:
        yield model
    finally:
        model.set_attn_implementation(original)


@torch.inference_mode()
def attention_maps(model, tok, context: str) -> torch.Tensor:
    """[layers, heads, T, T] attention weights of the context (no choice appended). For hybrid
    students, SSM heads give their implicit attention |T| normalised per row (gna.students.mixer)."""
    bos = [tok.bos_token_id] if starts_with_bos(tok) else []  # as the engine scores it (Segments count it)
    ids = torch.tensor([bos + tok(context, add_special_tokens=False).input_ids], device=device_of(model))
    if mixers(model):
        with captured_maps(model) as maps:
            model(ids)
        return torch.stack([m[0] for m in maps]).float()
    kinds = {s.kind for s in head_sites(model)}
    if kinds != {"attention"}:
        raise UnsupportedModel(
            f"{family_of(model)} ({type(model).__name__}): G&A maps need attention weights in every "
            f"layer; this model has {', '.join(sorted(kinds - {'attention'}))} layers"
        )
    with eager_attention(model):
        out = model(ids, output_attentions=True)
    return torch.stack([a[0] for a in out.attentions]).float()


def role_scores(maps: torch.Tensor, seg: Segments) -> dict[str, torch.Tensor]:
    """Per (layer, head) scores of one sample:
    gather              mass from each segment's summary token onto its own segment (mean)
    gather_strict       the same, leaving out the token just before the summary token
    aggregate_summary   mass from the answer position onto the summary tokens (the study's reading)
    aggregate           mass from the answer position onto the segments, summary tokens included
                        (small models often read the value inside the segment directly)
    selectivity         share of `aggregate` that lands on the correct segment
    sharpness           top-1 weight of the summary rows and the answer row (mean): 1 = every such
                        row puts all its weight on one position (the study: SSM G&A is smoother)"""
    gather = torch.stack([maps[:, :, s, a:b].sum(-1) for (a, b), s in zip(seg.spans, seg.summary)]).mean(0)
    # the same without the token right before the summary: a previous-token head scores high on
    # `gather` by attending only to the line's last token, which condenses nothing
    gather_strict = torch.stack(
        [
            maps[:, :, s, a:b].sum(-1) - (maps[:, :, s, s - 1] if a <= s - 1 < b else 0)
            for (a, b), s in zip(seg.spans, seg.summary)
        ]
    ).mean(0)
    answer_row = maps[:, :, seg.answer]
    per_segment = torch.stack(
        [
            answer_row[..., a:b].sum(-1) + (answer_row[..., s] if not a <= s < b else 0)
            for (a, b), s in zip(seg.spans, seg.summary)
        ],
        dim=-1,
    )
    aggregate = per_segment.sum(-1)
    # sharpness: top-1 share of the rows that matter (summary rows and the answer row)
    rows = list(seg.summary) + [seg.answer]
    sharpness = maps[:, :, rows].max(-1).values.mean(-1)
    return {
        "sharpness": sharpness,
        "gather": gather,
        "gather_strict": gather_strict,
        "aggregate_summary": answer_row[..., seg.summary].sum(-1),
        "aggregate": aggregate,
        "selectivity": per_segment[..., seg.correct] / aggregate.clamp_min(1e-9),
    }


SCORES = ("gather", "gather_strict", "aggregate", "aggregate_summary", "selectivity", "sharpness")


def classify(
    gather: float, aggregate: float, selectivity: float, gather_min: float, aggregate_min: float, n_segments: float
) -> str:
    """Aggregate: the answer position reads the segments and prefers the correct one (selectivity
    at least twice chance); Gather: summary tokens condense their own segment beyond the token
    right before them (`gather` here is the strict score); else other."""
    if aggregate >= aggregate_min and selectivity >= min(1.0, 2.0 / n_segments):
        return "aggregate"
    return "gather" if gather >= gather_min else "other"


def head_roles(
    scorer: Scorer, table: pl.DataFrame, segment_fn, gather_min: float = 0.5, aggregate_min: float = 0.3
) -> pl.DataFrame:
    """Mean role scores of every head over the items of `table` (one item at a time: the scorer's
    batch size is not used), and a role per head (classify with `gather_min`, `aggregate_min`)."""
    from tqdm.auto import tqdm

    model, tok, progress = scorer.model, scorer.tok, scorer.progress
    totals: dict[str, torch.Tensor] = {}
    n_segments = 0.0
    for row in tqdm(table.iter_rows(named=True), total=len(table), desc="G&A roles", disable=not progress):
        seg = segment_fn(tok, row)
        n_segments += len(seg.spans) / len(table)
        scores = role_scores(attention_maps(model, tok, row["context"]), seg)
        for k, v in scores.items():
            totals[k] = totals.get(k, 0) + v / len(table)
    n_layers, n_heads = totals["gather"].shape
    ssm = ssm_heads_of(model)
    rows = []
    for layer in range(n_layers):
        for head in range(n_heads):
            vals = {k: float(totals[k][layer, head]) for k in SCORES}
            rows.append(
                {
                    "layer": layer,
                    "head": head,
                    "kind": "ssm" if (layer, head) in ssm else "attention",
                    **vals,
                    "n": len(table),
                    "role": classify(
                        vals["gather_strict"],
                        vals["aggregate"],
                        vals["selectivity"],
                        gather_min,
                        aggregate_min,
                        n_segments,
                    ),
                }
            )
    return pl.DataFrame(rows)


def kv_row_segments(tok, row: dict) -> Segments:
    return kv_segments(tok, row["context"], row["query_key"])


def mmlu_row_segments(tok, row: dict) -> Segments:
    return mmlu_letter_segments(tok, row["context"], row["target"])


def map_frame(model, tok, row: dict, heads: list[tuple[int, int]], segment_fn) -> pl.DataFrame:
    """Long table of one sample's attention maps for `heads`: layer, head, query, key, weight,
    plus token strings and segment marks for axis labels."""
    seg = segment_fn(tok, row)
    maps = attention_maps(model, tok, row["context"])
    role_of = {i: "summary" for i in seg.summary} | {seg.answer: "answer"}
    rows = []
    T = maps.shape[-1]
    for layer, head in heads:
        weights = maps[layer, head]
        for q in range(T):
            for k in range(q + 1):
                rows.append({"layer": layer, "head": head, "query": q, "key": k, "weight": float(weights[q, k])})
    tokens = pl.DataFrame(
        {"query": list(range(T)), "token": seg.tokens, "mark": [role_of.get(i, "") for i in range(T)]}
    )
    return pl.DataFrame(rows).join(tokens, on="query", how="left")


def best_role_head(roles: pl.DataFrame, role: str) -> tuple[int, int] | None:
    """(layer, head) of the best-ranked head classified as `role` in a roles table (rank: the
    head's rank in the ablation sweep), or None if no head has that role."""
    best = roles.filter(pl.col("role") == role).sort("rank", "layer", "head", nulls_last=True).head(1)
    return None if best.is_empty() else (best["layer"][0], best["head"][0])


def map_heads(ranking: pl.DataFrame, roles: pl.DataFrame, n: int) -> list[tuple[int, int]]:
    """The heads whose maps are drawn: the `n` top-ranked heads, then the best-ranked Gather and
    Aggregate heads of `roles` if they are not among them."""
    top = head_ranks(ranking).sort("rank", "head").head(n)
    heads = list(zip(top["layer"].to_list(), top["head"].to_list()))
    for role in ROLES:
        best = best_role_head(roles, role)
        if best is not None and best not in heads:
            heads.append(best)
    return heads


def shortest_item(table: pl.DataFrame) -> dict:
    """The row of `table` with the shortest context (a small map to draw)."""
    return table.with_columns(pl.col("context").str.len_chars().alias("chars")).sort("chars").row(0, named=True)


@dataclass(frozen=True)
class GnaRoleConfig:
    """The roles' keys of config section gna: the scores a head needs for the Gather and the
    Aggregate role (`gather_min`, `aggregate_min`: gna.gather_min, gna.aggregate_min; classify)
    and the top-ranked heads whose maps are drawn (`map_heads`: gna.map_heads; map_heads)."""

    gather_min: float = 0.5
    aggregate_min: float = 0.3
    map_heads: int = 4


@dataclass(frozen=True)
class GnaRoles(RuleSettings):
    """Settings of rule gna_roles: the `model` (wildcard), the roles' config keys (`gna`:
    GnaRoleConfig) and how the model is loaded (`evaluation`: its dtypes; items are scored one at
    a time, so the rule passes no batch size)."""

    model: str
    gna: GnaRoleConfig = GnaRoleConfig()
    evaluation: Evaluation = Evaluation()


def run_gna_roles(inputs: Files, outputs: Files, settings: GnaRoles) -> pl.DataFrame:
    """Phase gna_roles: head_roles of every head on the KV prompts (data/tasks/prompts/gna_roles;
    `gna` thresholds gather_min, aggregate_min) joined with the ablation rank and acc_drop of the
    ranking, written to the roles output; and the map_frame of the map_heads (its roles from the
    teacher's roles table when teacher_roles names one, so teacher and students show the same
    heads) on the KV prompt of map_prompt (data/tasks/prompts/gna_map) and on the shortest MMLU
    letter item if mmlu_letter names a table, written to the maps output. Both with a model
    column. inputs: model, ranking, prompts, map_prompt, optional teacher_roles and mmlu_letter
    (lists); outputs: roles, maps."""
    evaluation, gna, model_name = settings.evaluation, settings.gna, settings.model
    teacher_roles_paths = inputs.get("teacher_roles", [])
    model, tok = load_any(inputs.model, evaluation.dtype, compute_dtype=evaluation.compute_dtype)
    ranking = read_parquet(inputs.ranking)
    table = read_parquet(inputs.prompts)
    try:
        roles = head_roles(Scorer(model, tok), table, kv_row_segments, gna.gather_min, gna.aggregate_min)
    except UnsupportedModel as err:
        raise UnsupportedModel(f"{err}; {skip_hint(model_name, 'gna')}") from None
    roles = roles.join(
        head_ranks(ranking).select("layer", "head", "rank", "acc_drop"), on=["layer", "head"], how="left"
    )
    write_parquet(roles.with_columns(pl.lit(model_name).alias("model")), outputs.roles)
    role_source = read_parquet(teacher_roles_paths[0]) if teacher_roles_paths else roles
    heads = map_heads(ranking, role_source, gna.map_heads)
    sample = read_parquet(inputs.map_prompt).row(0, named=True)
    maps = [map_frame(model, tok, sample, heads, kv_row_segments).with_columns(pl.lit("kv_retrieval").alias("task"))]
    for letter in load_task_tables(inputs.get("mmlu_letter", [])).values():
        maps.append(
            map_frame(model, tok, shortest_item(letter), heads, mmlu_row_segments).with_columns(
                pl.lit("mmlu_letter").alias("task")
            )
        )
    write_parquet(pl.concat(maps).with_columns(pl.lit(model_name).alias("model")), outputs.maps)
    for role in ROLES:
        best = roles.filter(pl.col("role") == role).sort("rank").head(3)
        log.info(
            "%s heads (best ranked): %s",
            role,
            ", ".join(f"L{r['layer']}H{r['head']} (rank {r['rank']})" for r in best.iter_rows(named=True)),
        )
    return roles
