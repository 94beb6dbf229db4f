import polars as pl
import pytest
import torch
from conftest import MINI_MMLU

from gna.engine.scoring import Scorer
from gna.phases.gather_aggregate import (
    attention_maps,
    head_roles,
    kv_row_segments,
    kv_segments,
    map_frame,
    mmlu_letter_segments,
    role_scores,
)
from gna.tasks.tables import build_kv_retrieval, build_mmlu, load_mmlu_jsonl, select_mmlu


@pytest.mark.parametrize("template", ["lookup", "study"])
def test_kv_segments_are_the_dictionary_lines(tiny_llama, template):
    _, tok = tiny_llama
    row = build_kv_retrieval([4], 1, 3, template).row(0, named=True)
    seg = kv_segments(tok, row["context"], row["query_key"])
    lines = row["context"].split("\n")[1:5]
    assert ["".join(seg.tokens[a:b]) for a, b in seg.spans] == lines
    assert all(seg.tokens[s] == "Ċ" for s in seg.summary)  # byte-level newline
    assert lines[seg.correct].split(":")[0] == row["query_key"]
    assert seg.answer == len(seg.tokens) - 1


def test_mmlu_option_segments(tiny_llama):
    _, tok = tiny_llama
    subset, pool = select_mmlu(load_mmlu_jsonl(MINI_MMLU), 2, 0, [])
    row = build_mmlu(subset, pool, "letter", 1, 0).row(0, named=True)
    seg = mmlu_letter_segments(tok, row["context"], row["target"])
    texts = ["".join(seg.tokens[a:b]).replace("Ġ", " ") for a, b in seg.spans]
    assert [t[:3] for t in texts] == ["A. ", "B. ", "C. ", "D. "]
    assert texts[0] == "A. " + subset["answer_a"][0]  # the final question's options, not the few-shot ones


def test_role_scores_on_constructed_maps(tiny_llama):
    _, tok = tiny_llama
    row = build_kv_retrieval([3], 1, 0, "lookup").row(0, named=True)
    seg = kv_segments(tok, row["context"], row["query_key"])
    T = len(seg.tokens)
    maps = torch.zeros(1, 3, T, T)
    maps[0, :, torch.arange(T), torch.arange(T)] = 1.0  # default: attend to self
    for (a, b), s in zip(seg.spans, seg.summary):  # head 0: a perfect gather head
        maps[0, 0, s] = 0
        maps[0, 0, s, a:b] = 1 / (b - a)
    a, b = seg.spans[seg.correct]  # head 1: a perfect aggregate head
    maps[0, 1, seg.answer] = 0
    maps[0, 1, seg.answer, a:b] = 1 / (b - a)
    scores = role_scores(maps, seg)
    assert scores["gather"][0, 0] == pytest.approx(1.0) and scores["gather"][0, 2] == pytest.approx(0.0)
    assert scores["aggregate"][0, 1] == pytest.approx(1.0) and scores["selectivity"][0, 1] == pytest.approx(1.0)
    assert scores["aggregate"][0, 2] == pytest.approx(0.0)


def test_maps_and_roles_on_a_model(tiny_llama):
    model, tok = tiny_llama
    before = model.config._attn_implementation
    table = build_kv_retrieval([3], 2, 0, "lookup")
    maps = attention_maps(model, tok, table["context"][0])
    assert model.config._attn_implementation == before
    assert torch.allclose(maps.sum(-1), torch.ones(maps.shape[:-1]), atol=1e-5)
    assert torch.all(maps.triu(1) == 0)  # causal
    roles = head_roles(Scorer(model, tok, progress=False), table, kv_row_segments)
    assert len(roles) == 3 * 4 and set(roles["role"]) <= {"gather", "aggregate", "other"}
    frame = map_frame(model, tok, table.row(0, named=True), [(1, 2)], kv_row_segments)
    assert set(frame["mark"]) >= {"summary", "answer"} and frame["weight"].max() <= 1.0


ROLES_TABLE = pl.DataFrame(
    {
        "layer": [0, 1, 1, 2, 2],
        "head": [0, 2, 3, 0, 1],
        "role": ["gather", "gather", "other", "aggregate", "aggregate"],
        "rank": [5, 2, 1, 4, 3],
    }
)


def test_best_role_heads_choose_by_rank():
    from gna.phases.gather_aggregate import best_role_head, map_heads
    from gna.phases.masking import masking_heads

    assert best_role_head(ROLES_TABLE, "gather") == (1, 2) and best_role_head(ROLES_TABLE, "nothing") is None
    assert masking_heads(ROLES_TABLE) == {"gather": (1, 2), "aggregate": (2, 1)}
    assert masking_heads(ROLES_TABLE.filter(pl.col("role") != "aggregate")) == {"gather": (1, 2)}
    ranking = ROLES_TABLE.select("layer", "head", "rank")
    # the two top-ranked heads, then the best Gather / Aggregate heads not among them
    assert map_heads(ranking, ROLES_TABLE, 2) == [(1, 3), (1, 2), (2, 1)]
    assert map_heads(ranking, ROLES_TABLE, 3) == [(1, 3), (1, 2), (2, 1)]
    assert map_heads(ranking, ROLES_TABLE, 0) == [(1, 2), (2, 1)]


def test_a_head_the_verified_sweep_did_not_measure_is_never_the_best_ranked():
    from gna.phases.gather_aggregate import best_role_head

    # verified mode: heads outside the budget have no rank (null after the join)
    unranked = ROLES_TABLE.with_columns(pl.when(pl.col("head") == 0).then(None).otherwise(pl.col("rank")).alias("rank"))
    assert best_role_head(unranked, "gather") == (1, 2) and best_role_head(unranked, "aggregate") == (2, 1)
    only_unranked = unranked.filter(pl.col("head") == 0)
    assert best_role_head(only_unranked, "gather") == (0, 0)  # still a head of the role, ranked or not
