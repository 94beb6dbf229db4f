"""mamba-ssm's Triton SSD kernel (the SSM heads' GPU path) against the torch scan, its reference.

Where mamba-ssm and triton are installed (`make gpu`), the kernel runs on the CPU through Triton's
interpreter (TRITON_INTERPRET=1, which must be set before triton is imported: a subprocess)."""

import importlib.util
import json
import os
import subprocess
import sys
import textwrap

import pytest
import torch

from gna.engine.ssm import ScanInputs, ssd_chunked, ssd_scan
from gna.engine.ssm_kernel import KERNEL_ENV, kernel_runs

HAS_KERNEL = all(importlib.util.find_spec(m) is not None for m in ("mamba_ssm", "triton"))


def scan_inputs(b=2, length=70, h=3, p=8, n=4, seed=0):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(b, length, h, p, generator=g)
    log_a = -torch.nn.functional.softplus(torch.randn(b, length, h, generator=g))
    Bm, Cm = torch.randn(b, length, h, n, generator=g), torch.randn(b, length, h, n, generator=g)
    return x, log_a, Bm, Cm, torch.randn(h, generator=g)


def test_the_torch_scan_runs_where_the_kernel_cannot(monkeypatch):
    x, log_a, Bm, Cm, D = scan_inputs()
    monkeypatch.delenv("TRITON_INTERPRET", raising=False)
    assert not kernel_runs(x)  # a CPU tensor
    y, state = ssd_scan(ScanInputs(x, log_a, Bm, Cm, D), chunk=16)
    ref_y, ref_state = ssd_chunked(ScanInputs(x, log_a, Bm, Cm, D), chunk=16)
    assert torch.equal(y, ref_y) and torch.equal(state, ref_state)
    monkeypatch.setenv(KERNEL_ENV, "cuda")
    with pytest.raises(ValueError, match="GNA_SSM_KERNEL='cuda': allowed triton"):
        kernel_runs(x)


INTERPRETED = textwrap.dedent("""
    import torch
    from gna.engine.ssm import ScanInputs, ssd_chunked, ssd_scan
    from gna.engine.ssm_kernel import kernel_runs, ssd_chunked_kernel
    from tests.unit.engine.test_ssm_kernel import scan_inputs

    x, log_a, Bm, Cm, D = scan_inputs()
    state = torch.randn(x.shape[0], x.shape[2], Bm.shape[-1], x.shape[-1])
    assert kernel_runs(x)
    for initial in (None, state):
        ref_y, ref_state = ssd_chunked(ScanInputs(x, log_a, Bm, Cm, D), 16, initial)
        y, final = ssd_chunked_kernel(ScanInputs(x, log_a, Bm, Cm, D), 16, initial)
        scale = ref_y.abs().max().item()
        print("max |dy|", (y - ref_y).abs().max().item(), "of", scale,
              "max |dstate|", (final - ref_state).abs().max().item())
        assert torch.allclose(y, ref_y, atol=1e-4 * scale, rtol=1e-4)
        assert torch.allclose(final, ref_state, atol=1e-4 * ref_state.abs().max().item(), rtol=1e-4)
    inputs = ScanInputs(x, log_a, Bm, Cm, D)
    assert torch.equal(ssd_scan(inputs, 16)[0], ssd_chunked_kernel(inputs, 16)[0])
    # gradients through the kernel's own backward equal the reference's
    leaves = [t.clone().requires_grad_() for t in (x, log_a, Bm, Cm)]
    ssd_chunked_kernel(ScanInputs(*leaves, D), 16)[0].square().sum().backward()
    kernel_grads = [t.grad for t in leaves]
    leaves = [t.clone().requires_grad_() for t in (x, log_a, Bm, Cm)]
    ssd_chunked(ScanInputs(*leaves, D), 16)[0].square().sum().backward()
    for name, got, ref in zip(("x", "log_a", "B", "C"), kernel_grads, [t.grad for t in leaves]):
        print("grad", name, (got - ref).abs().max().item(), "of", ref.abs().max().item())
        assert torch.allclose(got, ref, atol=1e-3 * ref.abs().max().item(), rtol=1e-3), name
    print("ok")
""")


@pytest.mark.skipif(not HAS_KERNEL, reason="mamba-ssm and triton are not installed (make gpu)")
# the interpreter stands in for a GPU; where one is, the compiled kernel is compared instead (below).
# On an H100 node's own triton 3.6.0 and numpy 2.5 the interpreter itself fails ("only 0-dimensional
# arrays can be converted to Python scalars"); `make gpu`'s triton 3.7.1 runs it.
@pytest.mark.skipif(torch.cuda.is_available(), reason="a GPU is here: the compiled kernel is compared instead")
@pytest.mark.slow
def test_the_kernel_equals_the_torch_scan_under_tritons_interpreter():
    env = {**os.environ, "TRITON_INTERPRET": "1"}
    env.pop(KERNEL_ENV, None)
    proc = subprocess.run(
        [sys.executable, "-c", INTERPRETED],
        env=env,
        capture_output=True,
        text=True,
        timeout=900,
        cwd=os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(__file__)))),
    )
    assert proc.returncode == 0 and proc.stdout.strip().endswith("ok"), proc.stdout[-3000:] + proc.stderr[-3000:]


@pytest.mark.skipif(not (HAS_KERNEL and torch.cuda.is_available()), reason="needs a GPU and mamba-ssm (make gpu)")
def test_the_kernel_equals_the_torch_scan_on_a_gpu(monkeypatch):
    """On CUDA the kernel's dots use TF32: within 2e-3 of the largest output (measured on an H200:
    8.9e-3 on outputs up to 13.6 at length 2048). It sets the kernel itself: gpu_check runs the other
    tests with GNA_SSM_KERNEL=torch."""
    monkeypatch.setenv(KERNEL_ENV, "triton")
    x, log_a, Bm, Cm, D = (t.cuda() for t in scan_inputs(length=300))
    assert kernel_runs(x)
    y, state = ssd_scan(ScanInputs(x, log_a, Bm, Cm, D), chunk=64)
    ref_y, ref_state = ssd_chunked(ScanInputs(x, log_a, Bm, Cm, D), chunk=64)
    assert torch.allclose(y, ref_y, atol=2e-3 * ref_y.abs().max().item(), rtol=0)
    assert torch.allclose(state, ref_state, atol=2e-3 * ref_state.abs().max().item(), rtol=0)


FORWARDS = textwrap.dedent("""
    import json, sys, types, importlib.util
    import torch
    from gna.engine.ssm_kernel import load_kernel
    mode = sys.argv[1]
    if mode == "kernel":
        assert load_kernel() is not None
    elif mode == "full build":  # `import mamba_ssm` works, as with its CUDA extension built
        spec = importlib.util.find_spec("mamba_ssm")
        package = types.ModuleType("mamba_ssm")
        package.__path__, package.__spec__ = list(spec.submodule_search_locations), spec
        sys.modules["mamba_ssm"] = package
    from gna.models.tiny import tiny_random_model
    out = {}
    for arch in ("mamba2", "zamba2"):
        model, tok = tiny_random_model({"arch": arch, "layers": 4, "hidden": 32, "heads": 4, "kv_heads": 2, "seed": 1})
        with torch.no_grad():
            out[arch] = model(torch.tensor([tok("k1:v1 k2:v2 k1:").input_ids])).logits.flatten()[:64].tolist()
    if mode == "kernel":  # the kernel still runs (here on CPU tensors: Triton's interpreter)
        from gna.engine.ssm import ScanInputs, ssd_chunked
        from gna.engine.ssm_kernel import ssd_chunked_kernel
        from tests.unit.engine.test_ssm_kernel import scan_inputs
        inputs = ScanInputs(*scan_inputs(length=20))
        assert torch.allclose(ssd_chunked_kernel(inputs, 16)[0], ssd_chunked(inputs, 16)[0], atol=1e-4, rtol=1e-4)
    print(json.dumps(out))
""")


def _forwards(mode: str, **env) -> dict:
    proc = subprocess.run(
        [sys.executable, "-c", FORWARDS, mode],
        env={**os.environ, **env},
        capture_output=True,
        text=True,
        timeout=600,
        cwd=os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(__file__)))),
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(proc.stdout.splitlines()[-1])


@pytest.mark.skipif(not HAS_KERNEL, reason="mamba-ssm and triton are not installed (make gpu)")
@pytest.mark.skipif(torch.cuda.is_available(), reason="Triton's interpreter stands in for a GPU here")
@pytest.mark.slow
def test_cpu_models_run_their_torch_scans_after_the_kernel_is_loaded():
    """transformers binds mamba-ssm's Triton kernels for Mamba-2 and Zamba2 wherever `import
    mamba_ssm` works, with no device check: neither loading the kernel (which imports it under a bare
    package entry) nor a full mamba-ssm build may send a CPU model there. The forwards equal those of
    a process that never met mamba-ssm, and the kernel still runs after them."""
    plain = _forwards("plain")
    assert _forwards("kernel", TRITON_INTERPRET="1") == plain
    assert _forwards("full build") == plain
