"""The SSM scan (chunked fast path vs recurrent reference vs materialised matrix) and the
hybrid students built from it."""

import copy

import polars as pl
import pytest
import torch

from gna.core.chance import ChancePolicy
from gna.engine.device import device_of
from gna.engine.packing import collate, pack
from gna.engine.scoring import Scorer
from gna.engine.ssm import (
    ScanInputs,
    causal_predecessors,
    local_matrix,
    local_mix,
    local_mix_causal,
    materialize,
    ssd_chunked,
    ssd_masked,
    ssd_recurrent,
    ssd_tree,
    tree_layout,
)
from gna.students.decoding import cache_nbytes, inference_memory, prefill, step
from gna.students.mixer import mixers, swapped_to_attention
from gna.students.spec import load_any, load_student, make_hybrid, save_student


def _inputs(b=2, length=37, h=3, p=5, n=4, seed=0):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(b, length, h, p, generator=g, dtype=torch.float64)
    log_a = -torch.rand(b, length, h, generator=g, dtype=torch.float64) * 0.5
    Bm = torch.randn(b, length, h, n, generator=g, dtype=torch.float64)
    Cm = torch.randn(b, length, h, n, generator=g, dtype=torch.float64)
    D = torch.randn(h, generator=g, dtype=torch.float64)
    return x, log_a, Bm, Cm, D


@pytest.mark.parametrize("chunk", [1, 8, 16, 64])
def test_chunked_equals_recurrent_and_materialized(chunk):
    x, log_a, Bm, Cm, D = _inputs()
    y_ref, s_ref = ssd_recurrent(x, log_a, Bm, Cm, D)
    y, s = ssd_chunked(ScanInputs(x, log_a, Bm, Cm, D), chunk=chunk)
    torch.testing.assert_close(y, y_ref, rtol=1e-10, atol=1e-10)
    torch.testing.assert_close(s, s_ref, rtol=1e-10, atol=1e-10)
    T = materialize(log_a, Bm, Cm, D)
    torch.testing.assert_close(torch.einsum("bhls,bshp->blhp", T, x), y_ref, rtol=1e-10, atol=1e-10)
    assert torch.all(T.triu(1) == 0), "the implicit attention must be causal"


def test_chunked_continues_from_a_state():
    x, log_a, Bm, Cm, D = _inputs(length=30)
    y_ref, s_ref = ssd_recurrent(x, log_a, Bm, Cm, D)
    y1, s1 = ssd_chunked(ScanInputs(x[:, :13], log_a[:, :13], Bm[:, :13], Cm[:, :13], D), chunk=4)
    y2, s2 = ssd_chunked(ScanInputs(x[:, 13:], log_a[:, 13:], Bm[:, 13:], Cm[:, 13:], D), chunk=4, state=s1)
    torch.testing.assert_close(torch.cat([y1, y2], 1), y_ref)
    torch.testing.assert_close(s2, s_ref)


def test_masked_scan_on_packed_choices_equals_separate_sequences():
    """Context + two choices packed with the block mask: each choice's outputs equal a plain
    causal scan over context + that choice (the decay skips the other choice's steps)."""
    ctx, c1, c2 = 6, 4, 3
    x, log_a, Bm, Cm, D = _inputs(b=1, length=ctx + c1 + c2)
    item = pack(list(range(ctx)), [list(range(c1 + 1)), list(range(c2 + 1))])
    allowed = collate([item]).mask[:, 0] == 0
    y = ssd_masked(x, log_a, Bm, Cm, D, allowed)
    for start, n in ((ctx, c1), (ctx + c1, c2)):
        idx = list(range(ctx)) + list(range(start, start + n))
        y_sep, _ = ssd_recurrent(x[:, idx], log_a[:, idx], Bm[:, idx], Cm[:, idx], D)
        torch.testing.assert_close(y[:, idx], y_sep)
    causal = torch.ones(1, 13, 13, dtype=torch.bool).tril()
    torch.testing.assert_close(ssd_masked(x, log_a, Bm, Cm, D, causal), ssd_recurrent(x, log_a, Bm, Cm, D)[0])


def _scoring_batch():
    """A collated batch as the scorer builds it: contexts of different lengths, multi-token
    choices of different lengths (a tree after the context), single-token choices (plain
    causal), right padding."""
    items = [
        pack(list(range(9)), [[1, 2, 3, 4], [5, 6], [7, 8, 9]]),
        pack(list(range(5)), [[1], [2]]),
        pack(list(range(13)), [[4, 5, 6]]),
        pack(list(range(3)), [[1, 2, 3], [4, 5, 6, 7, 8]]),
    ]
    return collate(items).mask[:, 0] == 0


@pytest.mark.parametrize("chunk", [4, 64])
def test_tree_scan_equals_masked_scan_on_scoring_batches(chunk):
    """The fast path equals the materialised reference on every row of a scoring batch (trunk,
    packed choices at every depth, padding), and the layout it reads is the batch's."""
    allowed = _scoring_batch()
    b, length = allowed.shape[:2]
    x, log_a, Bm, Cm, D = _inputs(b=b, length=length)
    layout = tree_layout(allowed)
    assert layout.trunk.tolist() == [12, 5, 15, 5]  # the first choice continues its context causally
    assert len(layout.levels) == 4  # the longest choice (5 tokens) feeds 4
    torch.testing.assert_close(
        ssd_tree(ScanInputs(x, log_a, Bm, Cm, D), layout, chunk), ssd_masked(x, log_a, Bm, Cm, D, allowed)
    )
    causal = torch.ones(2, 11, 11, dtype=torch.bool).tril()
    x, log_a, Bm, Cm, D = _inputs(b=2, length=11)
    torch.testing.assert_close(
        ssd_tree(ScanInputs(x, log_a, Bm, Cm, D), tree_layout(causal), chunk), ssd_recurrent(x, log_a, Bm, Cm, D)[0]
    )


def test_tree_layout_not_found_where_rows_do_not_follow_one_path():
    """A row that sees another row's tokens without that row's own past is not a tree."""
    assert tree_layout(torch.ones(1, 5, 5, dtype=torch.bool)) is None  # not causal
    allowed = torch.ones(1, 4, 4, dtype=torch.bool).tril()
    allowed[0, 3, 1] = False  # row 3 skips position 1 but sees position 2, which saw it
    assert tree_layout(allowed) is None


def _local_ref(x, weights, path):
    """The local skip by its definition on one sequence given as positions `path` (the
    positions one row sees, in order): y_i = sum_j w_j x_{path[i - j]}."""
    out = torch.zeros(x.shape[0], len(path), *x.shape[2:], dtype=x.dtype)
    for i in range(len(path)):
        for j in range(1, weights.shape[1] + 1):
            if i - j >= 0:
                out[:, i] += weights[:, j - 1][None, :, None] * x[:, path[i - j]]
    return out


def test_local_skip_gather_equals_its_matrix_and_the_definition():
    """Causal order and packed choices: the gathered local skip equals the same term as a matrix
    and the definition on each choice's own sequence (a choice never reads the other choice)."""
    g = torch.Generator().manual_seed(3)
    weights = torch.randn(3, 3, generator=g, dtype=torch.float64)
    x = _inputs(b=1, length=13)[0]
    causal = causal_predecessors(13, 3)
    torch.testing.assert_close(local_mix(x, weights, *causal), _local_ref(x, weights, list(range(13))))
    torch.testing.assert_close(
        local_mix(x, weights, *causal), torch.einsum("bhls,bshp->blhp", local_matrix(weights, None, 13), x)
    )
    ctx, c1, c2 = 6, 4, 3
    allowed = collate([pack(list(range(ctx)), [list(range(c1 + 1)), list(range(c2 + 1))])]).mask[:, 0] == 0
    packed = local_mix(x, weights, *tree_layout(allowed).predecessors(3))
    torch.testing.assert_close(packed, torch.einsum("bhls,bshp->blhp", local_matrix(weights, allowed, 13), x))
    for start, n in ((ctx, c1), (ctx + c1, c2)):
        path = list(range(ctx)) + list(range(start, start + n))
        torch.testing.assert_close(packed[:, path], _local_ref(x, weights, path))
    batch = _scoring_batch()  # trunks, choices at every depth, padding
    xb = _inputs(b=batch.shape[0], length=batch.shape[1])[0]
    torch.testing.assert_close(
        local_mix(xb, weights, *tree_layout(batch).predecessors(3)),
        torch.einsum("bhls,bshp->blhp", local_matrix(weights, batch, batch.shape[1]), xb),
    )
    assert not torch.allclose(packed[:, ctx + c1], local_mix(x, weights, *causal)[:, ctx + c1])  # it bites


def test_causal_local_skip_by_shifts_equals_the_gathered_one():
    """local_mix_causal (shifts) against local_mix with causal_predecessors (gathers): the same
    values bit for bit, and the same gradients up to the order of their sums, in float32 and
    with a bf16 input as under autocast; also for a width past the sequence's length."""
    g = torch.Generator().manual_seed(5)
    for length, width, dtype in ((13, 3, torch.float32), (9, 4, torch.bfloat16), (2, 4, torch.float32)):
        x = torch.randn(2, length, 3, 5, generator=g).to(dtype).requires_grad_(True)
        weights = torch.randn(3, width, generator=g).requires_grad_(True)
        fast = local_mix_causal(x, weights)
        grads_fast = torch.autograd.grad(fast.float().square().sum(), [x, weights])
        slow = local_mix(x, weights, *causal_predecessors(length, width))
        grads_slow = torch.autograd.grad(slow.float().square().sum(), [x, weights])
        assert torch.equal(fast, slow) and fast.dtype == slow.dtype
        for fast_grad, slow_grad in zip(grads_fast, grads_slow):
            torch.testing.assert_close(
                fast_grad, slow_grad, rtol=1e-6 if fast_grad.dtype == torch.float32 else 1e-2, atol=1e-6
            )
    assert not torch.equal(local_mix_causal(x, weights), torch.zeros_like(x))  # it bites


# -- hybrids -------------------------------------------------------------------------------

KEPT = [(0, 1), (2, 0), (2, 3)]


@pytest.fixture(scope="module")
def hybrid(tiny_llama):
    model, tok = tiny_llama
    student = make_hybrid(copy.deepcopy(model), KEPT, state_size=8)
    with torch.no_grad():  # make the SSM heads matter: non-trivial skip terms and decays
        for m in mixers(student):
            m.D.normal_()
            m.local.normal_()
            m.decay_proj.weight.normal_(std=0.05)
    return student.eval(), tok


def _ids(tok, text="The value of K is 42. Lookup: K:", device="cpu"):
    return torch.tensor([tok(text)["input_ids"]], device=device)


def test_all_heads_kept_reproduces_the_teacher(tiny_llama):
    model, tok = tiny_llama
    cfg = model.config
    everything = [(i, h) for i in range(cfg.num_hidden_layers) for h in range(cfg.num_attention_heads)]
    student = make_hybrid(copy.deepcopy(model), everything, state_size=4)
    ids = _ids(tok)
    with torch.no_grad():
        torch.testing.assert_close(student(input_ids=ids).logits, model(input_ids=ids).logits, rtol=1e-5, atol=1e-5)


def test_hybrid_differs_from_teacher_and_swap_restores_it(tiny_llama, hybrid):
    model, tok = tiny_llama
    student, _ = hybrid
    ids = _ids(tok)
    with torch.no_grad():
        teacher = model(input_ids=ids).logits
        assert (student(input_ids=ids).logits - teacher).abs().max() > 1e-3
        with swapped_to_attention(student, list(range(model.config.num_hidden_layers))):
            torch.testing.assert_close(student(input_ids=ids).logits, teacher, rtol=1e-5, atol=1e-5)
        assert (student(input_ids=ids).logits - teacher).abs().max() > 1e-3  # swap undone


def test_packed_engine_equals_reference_on_a_hybrid(hybrid):
    from gna.engine.scoring import score_table, score_table_ref
    from gna.tasks.tables import build_kv_retrieval

    student, tok = hybrid
    table = build_kv_retrieval([3, 5], 3, seed=1, template="lookup")
    fast = score_table(Scorer(student, tok, batch_size=3, progress=False), table)
    ref = score_table_ref(student, tok, table)
    for a, b in zip(fast["logprobs"].to_list(), ref["logprobs"].to_list()):
        assert a == pytest.approx(b, abs=1e-4)


def test_recurrent_decoding_equals_full_forward(hybrid):
    student, tok = hybrid
    ids = _ids(tok)
    full = student(input_ids=ids).logits.detach()
    logits, caches = prefill(student, ids[:, :-3])
    torch.testing.assert_close(logits[:, -1], full[:, -4], rtol=1e-4, atol=1e-4)
    for t in range(ids.shape[1] - 3, ids.shape[1]):
        logits = step(student, ids[:, t : t + 1], t, caches)
        torch.testing.assert_close(logits[:, -1], full[:, t], rtol=1e-4, atol=1e-4)


def test_measured_cache_matches_the_memory_formula(tiny_llama, hybrid):
    model, _ = tiny_llama
    student, _ = hybrid
    cfg = model.config
    ids = torch.randint(0, 200, (1, 50))
    _, caches = prefill(student, ids)
    expected = inference_memory(cfg, KEPT, 8, 50, bytes_per_value=4)
    assert cache_nbytes(caches) == expected["total_bytes"]
    assert expected["kv_cache_bytes"] > 0 and expected["ssm_state_bytes"] > 0
    teacher = inference_memory(cfg, None, 8, 50, bytes_per_value=4)
    assert teacher["ssm_state_bytes"] == 0 and teacher["kv_cache_bytes"] == 2 * 3 * 2 * 12 * 50 * 4


def test_student_round_trip_through_load_any(tmp_path, hybrid):
    """A saved student reloads (load_any) to the same logits, bit for bit (its weights are read,
    not initialised: whatever the random state); the plain loader refuses it by name; a spec that
    does not fit the weights is refused."""
    from gna.models.prepare import load_model

    student, tok = hybrid
    save_student(student, tok, tmp_path, {"state_size": 8, "kept_heads": [list(k) for k in KEPT]})
    torch.manual_seed(12345)
    loaded, _ = load_any(tmp_path)
    with pytest.raises(ValueError, match="is a distilled student.*load_any"):
        load_model(tmp_path)
    assert all(torch.equal(a.cpu(), b) for a, b in zip(loaded.state_dict().values(), student.state_dict().values()))
    # the fixture's student is on the CPU, the loaded one on the suite's device: bit for bit on one device
    on = device_of(loaded)
    ids = _ids(tok, device=on)
    with torch.no_grad():
        assert torch.equal(loaded(input_ids=ids).logits, copy.deepcopy(student).to(on)(input_ids=ids).logits)
    (tmp_path / "gna_hybrid.json").write_text('{"state_size": 4, "kept_heads": []}')
    with pytest.raises((ValueError, RuntimeError)):
        load_student(tmp_path)


def test_a_student_with_a_tied_output_head_round_trips(tmp_path, tiny_llama):
    """A teacher whose output head is its input embedding (SmolLM2's) gives a student that reloads
    tied, to the same logits: the file holds the pair once and loading ties it again."""
    from transformers import AutoModelForCausalLM

    model, tok = tiny_llama
    cfg = copy.deepcopy(model.config)
    cfg.tie_word_embeddings = True
    torch.manual_seed(4)
    student = make_hybrid(AutoModelForCausalLM.from_config(cfg).eval(), KEPT, 8)
    assert student.get_output_embeddings().weight is student.get_input_embeddings().weight
    save_student(student, tok, tmp_path, {"state_size": 8, "kept_heads": [list(k) for k in KEPT]})
    loaded, _ = load_any(tmp_path)
    assert loaded.get_output_embeddings().weight is loaded.get_input_embeddings().weight
    ids = _ids(tok, device=device_of(loaded))
    student.to(ids.device)  # built on the CPU: bit for bit on the loaded one's device
    with torch.no_grad():
        assert torch.equal(loaded(input_ids=ids).logits, student(input_ids=ids).logits)


def test_ablating_an_ssm_head_equals_zeroing_its_output_columns(hybrid):
    from gna.engine.hooks import ablate_heads

    student, tok = hybrid
    ids = _ids(tok)
    m = mixers(student)[1]
    head = m.ssm_heads[0]
    with torch.no_grad(), ablate_heads(student, [(1, head)]):
        ablated = student(input_ids=ids).logits
    surgery = copy.deepcopy(student)
    p = m.head_dim
    with torch.no_grad():
        mixers(surgery)[1].o_proj.weight[:, head * p : (head + 1) * p] = 0
        torch.testing.assert_close(surgery(input_ids=ids).logits, ablated)


# -- G&A tools on students: implicit-attention maps and per-head masks on SSM heads -------------


def test_student_maps_attention_heads_match_teacher_and_ssm_rows_are_normalised(tiny_llama, hybrid):
    from gna.phases.gather_aggregate import attention_maps

    model, tok = tiny_llama
    student, _ = hybrid
    context = "Memorize:\nA:12\nB:34\n\nLookup:\nB:"
    teacher_maps = attention_maps(model, tok, context)
    maps = attention_maps(student, tok, context)
    assert maps.shape == teacher_maps.shape
    # layer 0 sees the same input in both: the kept head (0, 1) has the teacher's exact map
    torch.testing.assert_close(maps[0, 1], teacher_maps[0, 1], rtol=1e-5, atol=1e-6)
    ssm = mixers(student)[0].ssm_heads[0]
    assert not torch.allclose(maps[0, ssm], teacher_maps[0, ssm], atol=1e-3)
    torch.testing.assert_close(maps.sum(-1), torch.ones(maps.shape[:-1]), rtol=1e-5, atol=1e-5)
    assert torch.all(maps.triu(1) == 0)


def test_per_head_masks_on_a_student_reproduce_it_and_restricting_an_ssm_head_bites(hybrid):
    import numpy as np

    from gna.engine.scoring import score_table
    from gna.phases.gather_aggregate import kv_row_segments
    from gna.phases.masking import Segmented, score_masked
    from gna.tasks.tables import build_kv_retrieval

    student, tok = hybrid
    kv = build_kv_retrieval([3, 5], 3, 0, "lookup")
    flat = lambda f: np.concatenate(f["logprobs"].to_list())  # noqa: E731
    plain = flat(score_table(Scorer(student, tok, progress=False), kv))
    for heads in (
        {"gather": (1, 2), "aggregate": (2, 1)},  # SSM heads (layer 1 and 2: heads 1, 2 are SSM)
        {"gather": (0, 1), "aggregate": (2, 3)},
    ):  # kept attention heads
        same = flat(score_masked(Scorer(student, tok), Segmented(kv, kv_row_segments), heads, restrict=False))
        assert np.array_equal(same, plain)
        masked = flat(score_masked(Scorer(student, tok), Segmented(kv, kv_row_segments), heads, restrict=True))
        assert not np.allclose(masked, plain, atol=1e-4)


def test_answer_rows_masking_on_a_hybrid(hybrid, tiny_llama):
    from gna.engine.packing import collate, pack
    from gna.students.student_masking import answer_rows_experiment, answer_rows_mask
    from gna.tasks.tables import build_kv_retrieval

    student, tok = hybrid
    kv = build_kv_retrieval([3], 4, 0, "lookup")
    frame = answer_rows_experiment(student, {"kv_retrieval": kv}, tok, batch_size=2)
    assert frame["condition"].to_list() == ["unmodified", "attention answer rows masked"]
    assert frame["attention_heads"][0] == len(KEPT)
    assert frame["mean_logp"][0] != frame["mean_logp"][1]
    item = pack([5, 6, 7], [[8, 9], [10]])
    batch = collate([item])
    mask = answer_rows_mask(batch, 4, [1])
    answer = item.score_at[0][0]
    assert (mask[0, 1, answer] == 0).nonzero().flatten().tolist() == [answer]
    assert torch.equal(mask[0, 0], batch.mask[0, 0])
    pure = make_hybrid(copy.deepcopy(tiny_llama[0]), [], state_size=4)
    with pytest.raises(ValueError, match="no attention heads"):
        answer_rows_experiment(pure, {"kv_retrieval": kv}, tok)


def test_answer_rows_read_the_unmodified_scores_they_are_given(hybrid):
    from gna.engine.scoring import score_table
    from gna.students.student_masking import answer_rows_experiment
    from gna.tasks.tables import build_kv_retrieval

    student, tok = hybrid
    kv = build_kv_retrieval([3], 5, 0, "lookup")
    part = {"kv_retrieval": kv[1:4]}
    plain = answer_rows_experiment(student, part, tok, batch_size=2)
    # the student's own scores of a superset of the items, batched differently
    answers = score_table(Scorer(student, tok, batch_size=3, progress=False), kv)
    read = answer_rows_experiment(student, part, tok, batch_size=2, scored={"kv_retrieval": answers})
    assert read.drop("mean_logp").equals(plain.drop("mean_logp"))
    assert read["mean_logp"].to_list() == pytest.approx(plain["mean_logp"].to_list(), abs=1e-5)
    # they are read, not recomputed: shifted scores shift the unmodified row only
    shifted = answer_rows_experiment(
        student, part, tok, batch_size=2, scored={"kv_retrieval": answers.with_columns(pl.col("logp_target") - 1)}
    )
    assert shifted["mean_logp"][0] == pytest.approx(plain["mean_logp"][0] - 1, abs=1e-5)
    assert shifted["mean_logp"][1] == plain["mean_logp"][1]
    # scores that lack an item of the table: the unmodified student is scored
    lacking = answer_rows_experiment(student, part, tok, batch_size=2, scored={"kv_retrieval": answers.head(2)})
    assert lacking.equals(plain)


def test_answer_rows_are_not_masked_where_the_unmodified_student_is_at_chance(hybrid):
    from gna.engine.scoring import score_table
    from gna.students.student_masking import answer_rows_experiment
    from gna.tasks.tables import build_kv_retrieval

    student, tok = hybrid
    kv = build_kv_retrieval([3], 12, 0, "lookup")
    answers = score_table(Scorer(student, tok, batch_size=4, progress=False), kv)
    # 1 of 12 right on 3 keys (chance 1/3): at chance, so only the unmodified row, with the reason
    at_chance = (
        answers.with_columns(pl.col("item_id").cum_count().alias("_i"))
        .with_columns(correct=pl.col("_i") == 1)
        .drop("_i")
    )
    frame = answer_rows_experiment(
        student,
        {"kv_retrieval": kv},
        tok,
        batch_size=4,
        scored={"kv_retrieval": at_chance},
        chance=ChancePolicy(skip=True),
    )
    assert frame["condition"].to_list() == ["unmodified"]
    assert "not distinguishable from chance at n=12" in frame["skipped_reason"][0]
    assert frame["skipped_reason"][0].endswith("the masked condition not run")
    # every item right: clear of chance, so both conditions run and no reason is recorded
    clear = answers.with_columns(correct=pl.lit(True))
    frame = answer_rows_experiment(
        student, {"kv_retrieval": kv}, tok, batch_size=4, scored={"kv_retrieval": clear}, chance=ChancePolicy(skip=True)
    )
    assert frame["condition"].to_list() == ["unmodified", "attention answer rows masked"]
    assert frame["skipped_reason"].null_count() == 2
    # without the policy the masked condition runs at chance too
    frame = answer_rows_experiment(student, {"kv_retrieval": kv}, tok, batch_size=4, scored={"kv_retrieval": at_chance})
    assert frame["condition"].to_list() == ["unmodified", "attention answer rows masked"]
    assert frame["skipped_reason"].null_count() == 2  # one result shape, policy on or off
