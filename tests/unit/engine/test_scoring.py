import numpy as np
import polars as pl
import pytest
from conftest import MINI_MMLU

from gna.core.stats import wilson_interval
from gna.engine.scoring import Scorer, encode, score_table, score_table_ref, summarize, summarize_task
from gna.tasks.tables import build_kv_retrieval, build_mmlu, load_mmlu_jsonl, select_mmlu


def _tables():
    mmlu = load_mmlu_jsonl(MINI_MMLU)
    subset, pool = select_mmlu(mmlu, 6, 0, [])
    return {
        "kv": build_kv_retrieval([3, 5], 3, 0, "lookup"),
        "kv_study": build_kv_retrieval([4], 3, 0, "study"),
        "letter": build_mmlu(subset, pool, "letter", 1, 0),
        "cloze": build_mmlu(subset, pool, "cloze", 0, 0),
    }


@pytest.mark.parametrize("name", ["kv", "kv_study", "letter", "cloze"])
def test_fast_engine_equals_full_forward_reference(tiny_llama, name):
    model, tok = tiny_llama
    table = _tables()[name]
    fast = score_table(Scorer(model, tok, batch_size=4, progress=False), table)
    ref = score_table_ref(model, tok, table)
    a = np.concatenate(fast["logprobs"].to_list())
    b = np.concatenate(ref["logprobs"].to_list())
    assert a.shape == b.shape and np.isfinite(a).all()
    np.testing.assert_allclose(a, b, atol=1e-4, rtol=1e-5)
    assert fast["pred"].to_list() == ref["pred"].to_list()
    assert fast["greedy_match"].to_list() == ref["greedy_match"].to_list()


def test_encode_moves_trailing_space_into_choice(tiny_llama):
    _, tok = tiny_llama
    enc = encode(tok, "key is ", ["42"])
    assert tok.decode(enc.context) == "key is" and tok.decode(enc.choices[0]) == " 42"


def test_summary_metrics_match_per_item(tiny_llama):
    model, tok = tiny_llama
    table = _tables()["kv"]
    items = score_table(Scorer(model, tok, progress=False), table)
    summary = summarize(items, by_group=True)
    for size in ("3", "5"):
        acc = summary.filter((pl.col("group") == size) & (pl.col("metric") == "acc"))["value"][0]
        assert acc == items.filter(pl.col("group") == size)["correct"].mean()
    assert set(summary["metric"]) == {"acc", "acc_norm", "greedy_exact_match", "mean_logp_target"}
    for row in summary.iter_rows(named=True):
        if row["metric"] == "mean_logp_target":
            assert row["ci_low"] is None and row["ci_high"] is None
        else:
            assert (row["ci_low"], row["ci_high"]) == pytest.approx(wilson_interval(row["value"] * row["n"], row["n"]))


def _answers(preds, swapped, correct):
    n = len(preds)
    return pl.DataFrame(
        {
            "task": ["kv_retrieval"] * n,
            "item_id": list(range(n)),
            "group": ["4"] * n,
            "target": [0] * n,
            "pred": preds,
            "correct": correct,
            "pred_norm": preds,
            "correct_norm": correct,
            "greedy_match": [False] * n,
            "logp_target": [-1.0] * n,
            "pred_other_context": swapped,
        }
    )


def test_a_model_that_ignores_the_context_is_flagged_degenerate():
    # same prediction with the item's own context and with another's on 9 of 10 checked items
    steady = summarize_task(_answers([1] * 12, [1] * 9 + [2] + [None] * 2, [True] * 3 + [False] * 9))
    agreement = steady.filter((pl.col("metric") == "degeneracy_agreement") & (pl.col("group") == "all"))
    assert agreement["value"][0] == 0.9 and agreement["n"][0] == 10
    assert steady["degenerate"].all()
    reader = summarize_task(_answers([0, 1, 2, 3] * 3, [1, 2, 3, 0] * 3, [True] * 12))
    assert not reader["degenerate"].any()
    assert "degenerate" not in summarize_task(_answers([0] * 4, [None] * 4, [True] * 4)).columns


def test_baseline_summary_adds_chance_format_and_engine(tiny_llama):
    from gna.engine.scoring import summarize_task
    from gna.phases.evaluation import baseline_summary

    model, tok = tiny_llama
    for name, groups in (("kv", ["3", "5", "all"]), ("letter", ["all"])):
        table = _tables()[name]
        items = score_table(Scorer(model, tok, progress=False), table)
        summary = baseline_summary("tiny", table, items)
        assert summary.select("task", "group", "n", "metric", "value", "ci_low", "ci_high").equals(
            summarize_task(items)
        )
        assert list(dict.fromkeys(summary["group"])) == groups
        chance = dict(zip(summary["group"], summary["chance"]))
        assert chance["all"] == pytest.approx(sum(1 / len(c) for c in table["choices"]) / len(table))
        if name == "kv":
            assert chance["3"] == pytest.approx(1 / 3) and chance["5"] == pytest.approx(1 / 5)
        assert set(summary["format"]) == {"lookup" if name == "kv" else "letter"}
        assert set(summary["model"]) == {"tiny"} and set(summary["engine"]) == {"gna"}
        assert not [c for c in summary.columns if "second" in c]  # timings are not results


def test_layer_masks_replace_the_packed_mask_only_where_given(tiny_llama):
    import torch

    model, tok = tiny_llama
    table = _tables()["kv"]
    flat = lambda f: np.concatenate(f["logprobs"].to_list())  # noqa: E731
    plain = score_table(Scorer(model, tok, batch_size=2, progress=False), table)
    same = score_table(
        Scorer(model, tok, batch_size=2, progress=False),
        table,
        layer_masks=lambda batch, rows: {layer: batch.mask for layer in range(3)},
    )
    assert np.array_equal(flat(plain), flat(same))
    seen = []

    def self_only(batch, rows):  # layer 1 attends to nothing but each token itself
        seen.extend(rows)
        eye = torch.eye(batch.mask.shape[-1], dtype=torch.bool)
        return {1: torch.zeros_like(batch.mask).masked_fill_(~eye, torch.finfo(batch.mask.dtype).min)}

    masked = score_table(Scorer(model, tok, batch_size=2, progress=False), table, layer_masks=self_only)
    assert sorted(seen) == list(range(len(table)))  # rows: the batch's item indices in the table
    assert not np.allclose(flat(plain), flat(masked), atol=1e-4)


def test_bos_is_put_first_where_the_tokenizer_puts_it_by_default(tiny_llama):
    """Gemma's and Llama 3's tokenizers add BOS through their post-processor while their
    `add_bos_token` attribute says False: the engine, the G&A segments and maps follow what the
    tokenizer does (and lm-eval, add_bos_token unset, does the same)."""
    from tokenizers import processors

    from gna.engine.scoring import starts_with_bos
    from gna.models.tiny import byte_level_tokenizer
    from gna.phases.gather_aggregate import attention_maps, kv_segments

    model, plain = tiny_llama
    bos_tok = byte_level_tokenizer()
    bos_tok.backend_tokenizer.post_processor = processors.TemplateProcessing(
        single="<|endoftext|> $A", special_tokens=[("<|endoftext|>", bos_tok.bos_token_id)]
    )
    assert not getattr(bos_tok, "add_bos_token", False) and bos_tok("ab")["input_ids"][0] == bos_tok.bos_token_id
    assert starts_with_bos(bos_tok) and not starts_with_bos(plain)
    row = build_kv_retrieval([3], 1, 0, "lookup").row(0, named=True)
    with_bos, without = encode(bos_tok, row["context"], row["choices"]), encode(plain, row["context"], row["choices"])
    assert with_bos.context == [bos_tok.bos_token_id] + without.context and with_bos.choices == without.choices
    seg, seg_plain = (
        kv_segments(bos_tok, row["context"], row["query_key"]),
        kv_segments(plain, row["context"], row["query_key"]),
    )
    assert len(seg.tokens) == len(with_bos.context) and seg.answer == seg_plain.answer + 1
    assert seg.spans == [(a + 1, b + 1) for a, b in seg_plain.spans]
    assert attention_maps(model, bos_tok, row["context"]).shape[-1] == len(with_bos.context)


def test_per_item_scores_keep_the_facts_relation_and_copyable_flag(tiny_llama):
    from gna.engine.scoring import ITEM_ATTRIBUTES
    from gna.tasks.facts import FactSelection, build_facts, read_local_facts

    model, tok = tiny_llama
    facts = read_local_facts(MINI_MMLU.parent / "mini_facts.csv")
    cloze = build_facts(facts, FactSelection(("capital", "symbol"), 6, seed=1), "cloze")
    items = score_table(Scorer(model, tok, progress=False), cloze)
    assert items.select(*ITEM_ATTRIBUTES).equals(cloze.select(*ITEM_ATTRIBUTES))
    kv = build_kv_retrieval([5], 2, seed=0, template="lookup")
    kv_items = score_table(Scorer(model, tok, progress=False), kv)
    assert kv_items.select(*ITEM_ATTRIBUTES).null_count().row(0) == (len(kv), len(kv))
    assert pl.concat([kv_items, items]).height == len(kv) + len(cloze)  # the tasks' frames stack


def test_a_packed_tree_shows_each_choice_exactly_its_own_sequence():
    """pack_tree: every choice's read rows see, through the collated mask, exactly the tokens of
    its own context (prefix + rest) and its own earlier tokens, at the positions a separate
    forward gives them; padding sees only itself."""
    import torch

    from gna.engine.packing import collate, pack, pack_tree

    prefix = [1, 2, 3]
    branches = [([4, 5], [[20], [21]]), ([6], [[22, 23, 24], [25]]), ([7, 8, 9], [[26, 27]])]
    tree = pack_tree(prefix, branches)
    plain = pack([0, 1], [[5, 6]])  # a shorter item: padding in the batch
    batch = collate([tree, plain])
    visible = batch.mask[0, 0] == 0
    ids, positions = batch.ids[0].tolist(), batch.positions[0].tolist()
    choices = [(prefix + rest, cont) for rest, conts in branches for cont in conts]
    assert len(tree.score_at) == len(choices) == len(tree.targets)
    for (context, cont), rows, targets in zip(choices, tree.score_at, tree.targets):
        assert targets == cont
        sequence = context + cont[:-1]
        for t, row in enumerate(rows):  # the row predicting token t of the choice
            seen = visible[row].nonzero().flatten().tolist()
            assert [ids[p] for p in seen] == sequence[: len(context) + t]
            assert [positions[p] for p in seen] == list(range(len(context) + t))
    pad = batch.mask[1, 0] == 0
    width = len(plain.ids)
    assert all(pad[p].nonzero().flatten().tolist() == [p] for p in range(width, pad.shape[0]))
    assert torch.equal(pad[:width, :width], collate([plain]).mask[0, 0] == 0)
    with pytest.raises(ValueError, match="prefix"):
        pack_tree([], branches)
