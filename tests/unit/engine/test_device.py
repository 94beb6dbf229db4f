"""The engine places every tensor it creates on its model's device. On a CPU-only machine this is
checked by making 'meta' torch's default device while the engine runs on a CPU model: a tensor
created without an explicit device lands on 'meta' and cannot meet the model's CPU tensors: the run fails, or (where
torch lets the two meet) reads no data, so the results must also equal a plain run's."""

import contextlib

import polars as pl
import pytest
import torch
from polars.testing import assert_frame_equal

from gna.engine.device import compute_device, device_of
from gna.engine.scoring import Scorer, score_table
from gna.tasks.tables import build_kv_retrieval


@contextlib.contextmanager
def default_device_meta():
    """torch's default device is 'meta' within the block: only explicitly placed tensors are real."""
    with torch.device("meta"):
        yield


def test_auto_is_cuda_only_where_torch_sees_a_gpu(monkeypatch):
    monkeypatch.delenv("GNA_DEVICE")  # the suite pins it (conftest)
    assert compute_device("auto").type == ("cuda" if torch.cuda.is_available() else "cpu")
    assert compute_device("cpu") == torch.device("cpu")
    with pytest.raises(ValueError, match="unknown device 'tpu'; allowed: auto, cpu, cuda"):
        compute_device("tpu")
    if not torch.cuda.is_available():
        with pytest.raises(RuntimeError, match="torch sees no GPU"):
            compute_device("cuda")


def test_gna_device_decides_what_auto_means(monkeypatch):
    monkeypatch.setenv("GNA_DEVICE", "cpu")
    assert compute_device("auto") == compute_device(None) == torch.device("cpu")
    monkeypatch.setenv("GNA_DEVICE", "gpu")
    with pytest.raises(ValueError, match="GNA_DEVICE='gpu': unknown device; allowed: auto, cpu, cuda"):
        compute_device("auto")
    assert compute_device("cpu") == torch.device("cpu")  # an explicit device is kept
    if not torch.cuda.is_available():
        monkeypatch.setenv("GNA_DEVICE", "cuda")
        with pytest.raises(RuntimeError, match="torch sees no GPU"):
            compute_device("auto")


def test_the_meta_default_catches_a_tensor_created_without_a_device():
    weights = torch.arange(6.0).view(3, 2)  # as a model's, on the CPU
    with default_device_meta():
        assert torch.tensor([0, 2]).device.type == "meta"
        with pytest.raises(RuntimeError, match="device"):
            (weights + torch.ones(3, 2)).sum().item()
        assert (weights + torch.ones(3, 2, device=weights.device)).sum().item() == 21.0


def test_scoring_places_every_tensor_on_the_model_device(tiny_llama):
    model, tok = tiny_llama
    table = build_kv_retrieval([3, 5], 2, 0, "lookup")
    reference = score_table(Scorer(model, tok, progress=False), table)
    with default_device_meta():
        placed = score_table(Scorer(model, tok, progress=False), table)
    assert device_of(model).type == "cpu"
    assert_frame_equal(placed, reference)


def _frames_equal(a, b):
    """Results of the same computation on the same device: equal (tensors, frames, dicts of them)."""
    if isinstance(a, pl.DataFrame):
        assert_frame_equal(a, b)
    elif isinstance(a, torch.Tensor):
        assert a.device == b.device and torch.equal(a, b)
    elif isinstance(a, dict):
        assert a.keys() == b.keys()
        for key in a:
            _frames_equal(a[key], b[key])
    elif isinstance(a, (tuple, list)):
        assert len(a) == len(b)
        for x, y in zip(a, b):
            _frames_equal(x, y)
    else:
        assert a == b


def _phase_calls():
    """(name, call(model, tok) -> result) for the compute of every phase that loads a model."""
    import copy

    from gna.engine.scoring import Scorer
    from gna.phases.gather_aggregate import head_roles, kv_row_segments
    from gna.phases.head_ablation import attribution_scores, sweep_heads
    from gna.phases.masking import Segmented, masking_experiment
    from gna.phases.pruning import gradual, individual
    from gna.students.alignment import Align, align_layers, head_errors
    from gna.students.decoding import measured_cache
    from gna.students.kd import KD, Watch, distill_logits
    from gna.students.spec import make_hybrid
    from gna.students.student_evaluation import score_model
    from gna.students.student_masking import answer_rows_experiment
    from gna.students.teacher_file import teacher_activations

    kv = build_kv_retrieval([3, 5], 2, 0, "lookup")
    tables = {"kv_retrieval": kv}
    ids = torch.arange(2 * 12).view(2, 12) % 200 + 10

    def student(model):
        return make_hybrid(copy.deepcopy(model), [(1, 0)], 4)

    def distill(model, tok):
        acts = teacher_activations(model, ids.to(device_of(model)), top_k=4, progress=False)
        targets = {"ids": ids.to(device_of(model)), "top_logp": acts["top_logp"], "top_idx": acts["top_idx"]}
        kd = KD(steps=2, batch=2, lr=1e-3)
        curve, _ = distill_logits(student(model), targets, kd, seed=0, watch=Watch(progress=False))
        aligned = align_layers(model, acts["hidden"], 4, Align(steps=2, batch=2, lr=1e-2), 0, progress=False)[1]
        return (
            curve.drop("seconds", strict=False),
            aligned.drop("seconds", strict=False),
            head_errors(student(model), acts["hidden"]),
        )

    return [
        ("head sweep", lambda m, t: sweep_heads(Scorer(m, t, progress=False), kv, heads=[(0, 0), (2, 1)])),
        ("attribution", lambda m, t: attribution_scores(Scorer(m, t, progress=False), kv)),
        (
            "pruning",
            lambda m, t: (
                gradual(Scorer(m, t, progress=False), tables),
                individual(Scorer(m, t, progress=False), tables, kept_layers=[0, 2]),
            ),
        ),
        ("G&A roles", lambda m, t: head_roles(Scorer(m, t, progress=False), kv, kv_row_segments)),
        (
            "G&A masking",
            lambda m, t: masking_experiment(
                Scorer(m, t), Segmented(kv, kv_row_segments), {"gather": (1, 2), "aggregate": (2, 0)}
            ),
        ),
        ("answer rows", lambda m, t: answer_rows_experiment(student(m), tables, t)),
        (
            "student scoring",
            lambda m, t: score_model(Scorer(student(m), t, 2, progress=False), tables, ids.to(device_of(m)), None),
        ),
        ("layer swap", lambda m, t: _swapped_scores(student(m), t, kv)),
        ("distillation", distill),
        ("decoding memory", lambda m, t: measured_cache(student(m), 12)),
    ]


def _swapped_scores(student, tok, table):
    from gna.students.mixer import swapped_to_attention

    with swapped_to_attention(student, [1]):
        return score_table(Scorer(student, tok, progress=False), table)


def _adam_steps_under_meta() -> bool:
    """Whether torch's own AdamW steps a CPU parameter with 'meta' the default device: torch 2.13
    makes its step counter on the CPU; older builds (2.11, a GPU node's CUDA wheel) make it with
    torch.tensor(0.0) on the default device, and their step calls .item() on it."""
    param = torch.zeros(1, requires_grad=True)
    param.grad = torch.ones(1)
    opt = torch.optim.AdamW([param])
    with default_device_meta():
        try:
            opt.step()
        except (RuntimeError, NotImplementedError):
            return False
    return True


@pytest.mark.parametrize("name", [name for name, _ in _phase_calls()])
def test_every_phase_places_its_tensors_on_the_model_device(tiny_llama, name):
    if name == "distillation" and not _adam_steps_under_meta():
        pytest.skip(
            f"torch {torch.__version__}'s AdamW creates its step counter on the default device ('meta' "
            "here) and calls .item() on it: torch's tensor, not the engine's"
        )
    model, tok = tiny_llama
    call = dict(_phase_calls())[name]
    torch.manual_seed(0)
    reference = call(model, tok)
    torch.manual_seed(0)
    with default_device_meta():
        placed = call(model, tok)
    _frames_equal(placed, reference)
