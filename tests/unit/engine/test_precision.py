"""Evaluation in bf16 linears (gna.engine.precision.linears_computed_in) against the float32
reference on tiny random models: a teacher, a hybrid student, head ablation and scoring."""

import copy

import polars as pl
import pytest
import torch

from gna.engine import precision
from gna.engine.anatomy import all_heads
from gna.engine.hooks import ablate_heads
from gna.engine.precision import (
    emulated_low_matmul,
    float32_kernel_available,
    float32_linear,
    linear_group,
    linears_computed_in,
)
from gna.engine.scoring import Scorer, score_table
from gna.students.mixer import mixers
from gna.students.spec import make_hybrid
from gna.tasks.tables import build_kv_retrieval


def _logp(model, ids):
    with torch.inference_mode():
        return torch.log_softmax(model(input_ids=ids).logits.float(), -1)


def _ids(model, seed=0):
    return torch.randint(0, model.config.vocab_size, (2, 12), generator=torch.Generator().manual_seed(seed))


# bf16 linears against float32, largest |difference| of a log-prob: measured 0.0023-0.0025 on the
# tiny teacher's logits (inputs of seeds 0-4), 0.0033 on the hybrid student's, 0.0017 on the KV
# scoring's summed target log-probs; 3x the largest. Ablating one head moves them by far more
# (logits: >= 0.12, scoring: >= 0.03, the weakest head; each test measures it against this), and
# so does an error of that size: bf16 weight copies rounded through float8 move them ~0.02-0.03.
BF16_LOGP_TOL = 0.01


@pytest.fixture(params=["bf16 kernel", "emulated"])
def bf16_path(request, monkeypatch):
    """Each bf16 test on both ways a CPU multiplies bf16 linears, whatever this CPU has: PyTorch's
    bf16 kernel (a CPU with bf16 instructions) and bf16-rounded operands through the float32
    kernel (a CPU without; gna.engine.precision._low_matmul)."""
    monkeypatch.setattr(precision, "cpu_lacks_bf16", lambda: request.param == "emulated")
    return request.param


def _low_dtype(model) -> torch.dtype:
    """The dtype linears_computed_in holds a bf16 weight copy in on `model`'s device."""
    return torch.float32 if emulated_low_matmul(model.device, torch.bfloat16) else torch.bfloat16


def _smallest_head_effect(model, measure) -> float:
    """The smallest, over every single head of `model` (float32) ablated alone, of the largest
    |change| of `measure(model)` (a tensor or Series of log-probs)."""
    unablated = measure(model)
    effects = []
    for head in all_heads(model):
        with ablate_heads(model, [head]):
            effects.append(float(abs(measure(model) - unablated).max()))
    return min(effects)


def test_bf16_linears_agree_with_float32_and_leave_the_weights(tiny_llama, bf16_path):
    model = tiny_llama[0]
    ids = _ids(model)
    reference = _logp(model, ids)
    weights = {n: p.detach().clone() for n, p in model.named_parameters()}
    fast = linears_computed_in(copy.deepcopy(model), "bfloat16")
    got = _logp(fast, ids)
    err = (got - reference).abs().max().item()
    assert 0 < err < BF16_LOGP_TOL, err  # bf16 rounding of the matmuls' inputs, nothing else
    assert BF16_LOGP_TOL < _smallest_head_effect(model, lambda m: _logp(m, ids))  # a missing head would show
    for name, p in fast.named_parameters():
        assert p.dtype == torch.float32 and torch.equal(p, weights[name]), name
    assert fast.base_model.layers[0].mlp.up_proj.weight_low.dtype == _low_dtype(model)
    # the output head multiplies with its own bf16 copy; an input embedding tied to it still
    # looks up the float32 weight
    assert fast.get_output_embeddings().weight_low.dtype == _low_dtype(model)
    tied = copy.deepcopy(model)
    tied.get_output_embeddings().weight = tied.get_input_embeddings().weight  # as SmolLM2's
    embedded = tied.get_input_embeddings()(ids).detach()
    linears_computed_in(tied, "bfloat16")
    assert tied.get_output_embeddings().weight is tied.get_input_embeddings().weight
    assert tied.get_input_embeddings().weight.dtype == torch.float32
    assert torch.equal(tied.get_input_embeddings()(ids), embedded)
    assert linears_computed_in(copy.deepcopy(model), "float32") is not None


def test_bf16_linears_keep_head_ablation_and_activation_gradients(tiny_llama, bf16_path):
    """Head ablation hooks on o_proj's input still act (they see the float32 input), and
    gradients still reach activations (attribution patching) though the weights take none."""
    model = tiny_llama[0]
    fast = linears_computed_in(copy.deepcopy(model), "bfloat16")
    ids = _ids(model, 1)
    with ablate_heads(model, [(1, 2)]):
        reference = _logp(model, ids)
    with ablate_heads(fast, [(1, 2)]):
        ablated = _logp(fast, ids)
    assert (ablated - reference).abs().max() < BF16_LOGP_TOL
    assert (ablated - _logp(fast, ids)).abs().max() > BF16_LOGP_TOL  # the hook changed the output
    embeds = fast.get_input_embeddings()(ids).detach().requires_grad_(True)
    fast(inputs_embeds=embeds).logits.sum().backward()
    assert embeds.grad is not None and embeds.grad.abs().sum() > 0
    assert all(not m.weight.requires_grad for m in fast.modules() if hasattr(m, "weight_low"))


def test_bf16_linears_on_a_student_keep_its_scan_in_float32(tiny_llama, bf16_path):
    student = make_hybrid(copy.deepcopy(tiny_llama[0]), [(1, 0)], 4)
    ids = _ids(student, 2)
    reference = _logp(student, ids)
    fast = linears_computed_in(copy.deepcopy(student), "bfloat16")
    m = mixers(fast)[1]
    assert m.x_proj.weight.dtype == torch.float32 and m.ssm_dtype(torch.zeros(1)).dtype == torch.float32
    assert hasattr(m.x_proj, "weight_low") and hasattr(m.q_proj, "weight_low")
    err = (_logp(fast, ids) - reference).abs().max().item()
    assert 0 < err < BF16_LOGP_TOL, err


def test_bf16_scoring_agrees_with_float32(tiny_llama, bf16_path):
    model, tok = tiny_llama
    table = build_kv_retrieval([3], 6, 1, "lookup")
    reference = score_table(Scorer(model, tok, batch_size=4, progress=False), table)
    fast = score_table(
        Scorer(linears_computed_in(copy.deepcopy(model), "bfloat16"), tok, batch_size=4, progress=False), table
    )
    assert reference["item_id"].to_list() == fast["item_id"].to_list()
    diff = (reference["logp_target"] - fast["logp_target"]).abs().max()
    assert 0 < diff < BF16_LOGP_TOL, diff
    head_effect = _smallest_head_effect(
        model, lambda m: score_table(Scorer(m, tok, batch_size=4, progress=False), table)["logp_target"]
    )
    assert BF16_LOGP_TOL < head_effect, head_effect  # the weakest head's ablation would fail the check above
    assert pl.Series(reference["pred"] == fast["pred"]).mean() >= 5 / 6


def test_the_engine_probe_runs_bf16_linears_in_full_precision(tiny_llama):
    """check_engine compares the engine with the model's own forward: a structural check, made
    with the weights themselves, so a badly conditioned model in bf16 is not refused for
    rounding (seen on an unaligned student); afterwards the bf16 copies are used again."""
    from gna.engine.precision import linears_in_full_precision
    from gna.engine.stack import check_engine

    model = tiny_llama[0]
    fast = linears_computed_in(copy.deepcopy(model), "bfloat16")
    ids = _ids(model, 3)
    with linears_in_full_precision(fast):
        assert torch.equal(_logp(fast, ids), _logp(model, ids))
    assert (_logp(fast, ids) - _logp(model, ids)).abs().max() > 0
    calls = []
    up = fast.base_model.layers[0].mlp.up_proj
    handle = up.register_forward_pre_hook(lambda m, args: calls.append("forward" in vars(m)))
    check_engine(fast)
    handle.remove()
    assert calls and not any(calls)  # the probe ran with the class's own forward
    assert "forward" in vars(up)  # and the bf16 path is back
    # a student's SSM projections, multiplied together (linear_group), follow the switch too
    student = make_hybrid(copy.deepcopy(model), [(1, 0)], 4)
    fast = linears_computed_in(copy.deepcopy(student), "bfloat16")
    for layer in student.modules():  # as linears_computed_in leaves them (a student's float32 forward
        if isinstance(layer, torch.nn.Linear):  # rounds differently with weights that take gradients)
            layer.weight.requires_grad_(False)
    with linears_in_full_precision(fast):
        assert torch.equal(_logp(fast, ids), _logp(student, ids))
    assert (_logp(fast, ids) - _logp(student, ids)).abs().max() > 0


def test_bf16_linears_follow_weights_changed_in_place(tiny_llama, bf16_path):
    """A checkpoint restored into an evaluated student (the budget curve) changes its weights
    in place: the bf16 copies must follow, or every point would score the last weights."""
    model = tiny_llama[0]
    fast = linears_computed_in(copy.deepcopy(model), "bfloat16")
    ids = _ids(model, 4)
    before = _logp(fast, ids)
    changed = copy.deepcopy(model)
    with torch.no_grad():
        for m in (fast, changed):
            m.base_model.layers[1].mlp.down_proj.weight.mul_(0.5)
    after = _logp(fast, ids)
    assert (after - before).abs().max() > 0.01
    assert torch.equal(after, _logp(linears_computed_in(changed, "bfloat16"), ids))


def test_emulated_bf16_linears_give_the_bf16_kernels_results(tiny_llama, monkeypatch):
    """On a CPU without bf16 instructions bf16 linears multiply bf16-rounded operands with the
    float32 kernel: exact products summed in float32, as bf16 instructions do. Against PyTorch's
    bf16 kernel (the reference) an output may differ only where the two sums round to neighbouring
    bf16 values (one step of bf16's 8-bit mantissa), and the model's log-probs far less than bf16
    against float32 does."""
    gen = torch.Generator().manual_seed(3)
    x, weight = torch.randn(64, 96, generator=gen), torch.randn(80, 96, generator=gen)
    reference = precision._low_matmul(x, weight.to(torch.bfloat16), torch.bfloat16)
    got = precision._low_matmul(x, weight.to(torch.bfloat16).float(), torch.bfloat16)
    step = 2.0**-7 * reference.abs()  # one bf16 step at each output's magnitude, at most
    assert ((got - reference).abs() <= step).all()
    assert (got == reference).float().mean() > 0.95
    assert not torch.equal(got, x @ weight.T)  # rounded to bf16: not the float32 result
    model = tiny_llama[0]
    ids = _ids(model, 2)
    monkeypatch.setattr(precision, "cpu_lacks_bf16", lambda: False)
    kernel = _logp(linears_computed_in(copy.deepcopy(model), "bfloat16"), ids)
    monkeypatch.setattr(precision, "cpu_lacks_bf16", lambda: True)
    emulated = _logp(linears_computed_in(copy.deepcopy(model), "bfloat16"), ids)
    full = _logp(model, ids)
    assert (emulated - kernel).abs().max() < 0.25 * (kernel - full).abs().max()


def _projections(m):
    return [m.x_proj, m.B_proj, m.C_proj, m.decay_proj, m.sink_proj]


def test_linear_group_gives_each_layers_own_output_and_gradients(tiny_llama, bf16_path):
    """One matmul for a student's five SSM projections (mixed biases) against each layer's own
    call: float32, under bf16 linears (with a weight changed in place since), and the gradients
    under bf16 autocast."""
    student = make_hybrid(copy.deepcopy(tiny_llama[0]), [(1, 0), (1, 2)], 4)
    m = mixers(student)[1]
    with torch.no_grad():  # nonzero decay and sink weights, so every block's output differs
        m.decay_proj.weight.normal_(std=0.1)
        m.sink_proj.weight.normal_(std=0.1)
    u = torch.randn(2, 7, m.x_proj.in_features, generator=torch.Generator().manual_seed(5))
    got, reference = linear_group(_projections(m), u), [layer(u) for layer in _projections(m)]
    assert [g.shape for g in got] == [r.shape for r in reference]
    for g, r in zip(got, reference):
        torch.testing.assert_close(g, r, rtol=1e-5, atol=1e-6)
    biased = [torch.nn.Linear(8, 3), torch.nn.Linear(8, 5, bias=False), torch.nn.Linear(8, 2)]
    x = torch.randn(4, 8)
    for g, layer in zip(linear_group(biased, x), biased):
        torch.testing.assert_close(g, layer(x), rtol=1e-5, atol=1e-6)

    fast = linears_computed_in(copy.deepcopy(student), "bfloat16")
    f = mixers(fast)[1]
    with torch.no_grad():
        f.B_proj.weight.mul_(0.5)
    for g, r in zip(linear_group(_projections(f), u), [layer(u) for layer in _projections(f)]):
        torch.testing.assert_close(g, r, rtol=1e-5, atol=1e-5)
        assert g.dtype == torch.float32
    exact = linears_computed_in(copy.deepcopy(student), "float32")  # oneDNN's float32 kernel
    e = mixers(exact)[1]
    for g, r in zip(linear_group(_projections(e), u), reference):
        torch.testing.assert_close(g, r, rtol=1e-5, atol=1e-6)
    if float32_kernel_available(u.device):  # one oneDNN matmul for the five projections
        assert "mkldnn::_linear_pointwise" in _ops_run(lambda: linear_group(_projections(e), u))

    def grads(group: bool):
        for layer in _projections(m):
            layer.weight.grad = None
            if layer.bias is not None:
                layer.bias.grad = None
        with torch.autocast("cpu", dtype=torch.bfloat16):
            outs = linear_group(_projections(m), u) if group else [layer(u) for layer in _projections(m)]
        sum((o.float() * (k + 1)).sum() for k, o in enumerate(outs)).backward()
        return [p.grad.clone() for layer in _projections(m) for p in layer.parameters()]

    for g, r in zip(grads(True), grads(False)):
        assert r.abs().sum() > 0
        torch.testing.assert_close(g, r, rtol=1e-2, atol=1e-2)


def _ops_run(fn) -> set[str]:
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as prof:
        fn()
    return {event.key for event in prof.key_averages()}


needs_onednn = pytest.mark.skipif(
    not float32_kernel_available(torch.device("cpu")), reason="PyTorch built without oneDNN"
)


@needs_onednn
def test_float32_linear_agrees_with_f_linear_and_passes_gradients():
    gen = torch.Generator().manual_seed(0)
    x = torch.randn(3, 37, 300, generator=gen)
    weight = torch.randn(200, 300, generator=gen) / 300**0.5
    torch.testing.assert_close(float32_linear(x, weight), torch.nn.functional.linear(x, weight), rtol=1e-5, atol=1e-5)
    assert "mkldnn::_linear_pointwise" in _ops_run(lambda: float32_linear(x, weight))
    assert "mkldnn::_linear_pointwise" not in _ops_run(lambda: torch.nn.functional.linear(x, weight))
    assert float32_linear(x[:0], weight).shape == (0, 37, 200)
    grads = []
    for linear in (float32_linear, torch.nn.functional.linear):
        leaf, w = x.clone().requires_grad_(True), weight.clone().requires_grad_(True)
        (linear(leaf, w) * x[..., :200]).sum().backward()
        grads.append((leaf.grad, w.grad))
    for got, reference in zip(*grads):
        assert reference.abs().sum() > 0
        torch.testing.assert_close(got, reference, rtol=1e-5, atol=1e-5)


@needs_onednn
def test_float32_kernel_evaluates_like_the_reference(tiny_llama):
    """eval.compute_dtype float32 on a CPU: every linear layer (the head included) multiplies
    through oneDNN's float32 kernel, within float32 rounding of F.linear, head ablation and
    activation gradients included; the probe's full-precision switch restores F.linear."""
    from gna.engine.precision import linears_in_full_precision

    model = tiny_llama[0]
    exact = linears_computed_in(copy.deepcopy(model), "float32")
    ids = _ids(model, 6)
    assert "mkldnn::_linear_pointwise" in _ops_run(lambda: _logp(exact, ids))
    with linears_in_full_precision(exact):
        assert "mkldnn::_linear_pointwise" not in _ops_run(lambda: _logp(exact, ids))
        assert torch.equal(_logp(exact, ids), _logp(model, ids))
    assert "forward" in vars(exact.get_output_embeddings())
    torch.testing.assert_close(_logp(exact, ids), _logp(model, ids), rtol=0, atol=1e-5)
    with ablate_heads(model, [(1, 2)]), ablate_heads(exact, [(1, 2)]):
        torch.testing.assert_close(_logp(exact, ids), _logp(model, ids), rtol=0, atol=1e-5)
    grads = []
    for m in (exact, copy.deepcopy(model)):
        embeds = m.get_input_embeddings()(ids).detach().requires_grad_(True)
        m(inputs_embeds=embeds).logits.sum().backward()
        grads.append(embeds.grad)
    assert grads[1].abs().sum() > 0
    torch.testing.assert_close(grads[0], grads[1], rtol=1e-4, atol=1e-5)


def test_training_in_bf16_on_a_cpu_without_bf16_instructions_runs_in_float32_and_says_so(monkeypatch, caplog):
    """bf16 autocast has no float32-kernel path: where it would run emulated, training takes float32 and
    the log names the config key; elsewhere, and for float32, the dtype asked for, silently."""
    cpu = torch.device("cpu")
    for lacks, dtype, expected in (
        (True, "bfloat16", "float32"),
        (True, "float32", "float32"),
        (False, "bfloat16", "bfloat16"),
    ):
        monkeypatch.setattr(precision, "cpu_lacks_bf16", lambda lacks=lacks: lacks)
        caplog.clear()
        with caplog.at_level("INFO", logger="gna.engine.precision"):
            assert precision.training_dtype(cpu, dtype, "hybrid.kd") == expected
        assert ("hybrid.kd.compute_dtype bfloat16" in caplog.text) == (dtype != expected), (lacks, dtype)
    monkeypatch.setattr(precision, "cpu_lacks_bf16", lambda: True)
    assert precision.training_dtype(torch.device("meta"), "bfloat16", "hybrid.align") == "bfloat16"  # not a CPU


def test_checkpoint_selection_scores_a_student_as_its_evaluation_does_then_training_goes_on(tiny_llama, bf16_path):
    """The validation scorer (gna.students.kd) multiplies in eval.compute_dtype, as the evaluation of
    the chosen student will (its scores are the evaluation's, bit for bit), then gives the student
    back as it was: each linear layer its own forward, its weight's requires_grad, no copy kept."""
    from gna.students.kd import validation_scorer

    model, tok = tiny_llama
    student = make_hybrid(copy.deepcopy(model), [(1, 0)], 4)
    for p in student.parameters():
        p.requires_grad_(False)
    trained = [p for m in mixers(student) for p in m.ssm_params() if p.numel()]
    for p in trained:
        p.requires_grad_(True)
    table = build_kv_retrieval([3], 6, 1, "lookup")
    evaluation = score_table(
        Scorer(linears_computed_in(copy.deepcopy(student), "bfloat16"), tok, batch_size=4, progress=False), table
    )
    correct, logp = validation_scorer(tok, table, 4, "bfloat16")(student)
    assert correct == evaluation["correct"].to_list() and logp == float(evaluation["logp_target"].mean())
    assert logp != validation_scorer(tok, table, 4, "float32")(student)[1]  # the precision is the evaluation's
    linears = [m for m in student.modules() if isinstance(m, torch.nn.Linear)]
    assert all("forward" not in vars(m) and not hasattr(m, "weight_low") for m in linears)
    assert [p.requires_grad for p in student.parameters()] == [
        any(p is t for t in trained) for p in student.parameters()
    ]
    assert any(m.weight.requires_grad for m in linears)  # an SSM projection trains on


def test_a_model_set_up_for_evaluation_is_set_up_the_same_after_a_scoped_evaluation(tiny_llama, bf16_path):
    """evaluated_in restores what it found: on a model linears_computed_in already set up, its own
    forward, low copies and their bookkeeping stay, and it scores as before."""
    from gna.engine.precision import evaluated_in

    model, tok = tiny_llama
    fast = linears_computed_in(copy.deepcopy(model), "bfloat16")
    ids = _ids(fast, 3)
    before = _logp(fast, ids)
    with evaluated_in(fast, "float32"):
        pass
    assert torch.equal(_logp(fast, ids), before)
    assert all(hasattr(m, "weight_low") for m in fast.modules() if isinstance(m, torch.nn.Linear))


def test_layers_that_read_one_input_multiply_as_one_and_agree_with_a_matmul_each(tiny_llama, bf16_path, monkeypatch):
    """q|k|v and gate|up multiply as one matmul (one cast of their input), their weight copies views
    of the group's (no extra memory); the log-probs agree with one matmul per layer (the reference,
    grouped=False) far within bf16's rounding, and follow a member's weight changed in place."""
    model = tiny_llama[0]
    ids = _ids(model, 5)
    grouped = linears_computed_in(copy.deepcopy(model), "bfloat16")
    single = linears_computed_in(copy.deepcopy(model), "bfloat16", grouped=False)
    attention, mlp = grouped.base_model.layers[0].self_attn, grouped.base_model.layers[0].mlp
    group = attention.q_proj.input_group
    assert group is attention.k_proj.input_group is attention.v_proj.input_group
    assert mlp.gate_proj.input_group is mlp.up_proj.input_group and not hasattr(mlp.down_proj, "input_group")
    assert all(m.weight_low._base is group.fused for m in group.members)
    matmuls = []
    low_matmul = precision._low_matmul
    monkeypatch.setattr(precision, "_low_matmul", lambda *a: matmuls.append(1) or low_matmul(*a))
    reference = _logp(single, ids)
    per_layer = len(matmuls)
    matmuls.clear()
    got = _logp(grouped, ids)
    layers = model.config.num_hidden_layers
    assert (per_layer, len(matmuls)) == (7 * layers + 1, 4 * layers + 1)  # + the output head
    assert (got - reference).abs().max() < BF16_LOGP_TOL / 10
    assert group.pending is None  # every output made was asked for
    changed = copy.deepcopy(model)
    with torch.no_grad():
        for m in (grouped, changed):
            m.base_model.layers[0].self_attn.v_proj.weight.mul_(0.5)
    after = _logp(grouped, ids)
    assert (after - got).abs().max() > 1e-3
    assert torch.equal(after, _logp(linears_computed_in(changed, "bfloat16"), ids))


def test_bf16_scoring_with_the_last_layer_at_the_read_rows_agrees_with_the_full_layer(tiny_llama, bf16_path):
    """Under bf16 linears, the last layer's MLP and output projection over the read rows only round
    their matmuls over fewer rows: the scores stay far within bf16's own difference from float32."""
    model, tok = tiny_llama
    fast_model = linears_computed_in(copy.deepcopy(model), "bfloat16")
    table = build_kv_retrieval([3, 5], 6, 2, "lookup")
    fast = score_table(Scorer(fast_model, tok, batch_size=4, progress=False), table)
    full = score_table(Scorer(fast_model, tok, batch_size=4, progress=False, read_rows_only=False), table)
    diff = (fast["logp_target"] - full["logp_target"]).abs().max()
    assert diff < BF16_LOGP_TOL / 10, diff
    assert fast["pred"].to_list() == full["pred"].to_list()
