"""The machine's matmul peak (gna.engine.peak): the GEMM references, oneDNN's kernel names, and the
rounds that keep a ratio from describing another tenant."""

import pytest
import torch

from gna.engine.peak import (
    fraction_of,
    gemm_rates,
    kept_round,
    measure_peak,
    median_ratios,
    onednn_calls,
    peak_dtype,
    timed_round,
)


def test_every_kernel_tried_is_timed_and_the_peak_is_the_best_of_the_peak_dtype():
    rates = gemm_rates((64, 96, 80), torch.float32, repeats=1)
    assert "F.linear" in rates and all(r > 0 for r in rates.values())
    peak = measure_peak(size=64, repeats=1)
    assert peak["dtype"] == str(peak_dtype()).removeprefix("torch.")
    assert peak["GFLOP/s"] == max(peak["rates"].values()) == peak["rates"][peak["kernel"]]
    assert fraction_of(peak["GFLOP/s"] / 4, peak) == pytest.approx(0.25)
    assert fraction_of(None, peak) is None and fraction_of(1.0, None) is None


@pytest.mark.skipif(not torch.backends.mkldnn.is_available(), reason="PyTorch built without oneDNN")
def test_onednn_names_the_kernels_it_ran_and_the_process_keeps_its_stdout(capfd):
    x, w = torch.randn(16, 32), torch.randn(24, 32)
    calls = onednn_calls(lambda: torch.ops.mkldnn._linear_pointwise(x, w, None, "none", [], ""))
    assert sum(calls.values()) >= 1 and all(name.endswith(" f32") for name in calls)
    assert not onednn_calls(lambda: x + 1)  # no oneDNN primitive: nothing named
    print("after")
    assert "after" in capfd.readouterr().out


def _round(reference: float, model: float, busy: float = 2.0, steal: float | None = 0.0) -> dict:
    return {"GFLOP/s": {"reference": reference, "m": model}, "busy threads": busy, "steal": steal}


def test_ratios_are_medians_over_the_rounds_that_ran_alone():
    rounds = [_round(100, 50), _round(100, 40), _round(200, 120), _round(100, 10, busy=1.0), _round(100, 5, steal=0.3)]
    assert not kept_round(rounds[3], threads=2) and not kept_round(rounds[4], threads=2)
    assert kept_round(_round(1, 1, steal=None), threads=2)  # steal unknown: the busy threads decide
    summary = median_ratios(rounds, "reference", threads=2)
    assert summary == {"kept rounds": 3, "rounds": 5, "ratios": {"m": 0.5}}  # of 0.5, 0.4, 0.6
    with pytest.raises(RuntimeError, match="only 1 of 3 rounds ran alone"):
        median_ratios([_round(1, 1), _round(1, 1, busy=0.5), _round(1, 1, steal=0.5)], "reference", threads=2)


def test_a_round_times_each_call_from_the_flops_it_returns():
    measured = timed_round({"reference": lambda: 2e9, "m": lambda: 1e9})
    assert set(measured["GFLOP/s"]) == {"reference", "m"} and all(v > 0 for v in measured["GFLOP/s"].values())
    assert measured["busy threads"] >= 0
