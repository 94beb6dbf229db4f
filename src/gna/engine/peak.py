"""The machine's matmul peak: the yardstick of a step's useful GFLOP/s (gna.core.work) in the run
record, and the reference of benchmarks/machine_peak.py.

The peak is the best of the host's GEMM kernels on one square shape, each timed after a warm-up
(best of `repeats`): F.linear (MKL or oneDNN, as PyTorch dispatches), oneDNN's linear on plain
weights (the engine's float32 kernel, gna.engine.precision) and on weights prepacked for the shape,
and MKL's prepacked float32 GEMM. The peak's dtype is the one evaluation multiplies in: bf16 where
the CPU has bf16 instructions (AVX512-BF16 or AMX), else float32, the speed of the float32 kernel
that evaluation uses there (gna.engine.precision._low_matmul).

    python -m gna.engine.peak data/run/peak.json   # what `make reproduce` measures at a run's start
"""

from __future__ import annotations

import contextlib
import json
import os
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Callable
from pathlib import Path

import torch

from gna.engine.precision import cpu_lacks_bf16

PEAK_SIZE = 4096
PEAK_FILE = "data/run/peak.json"


def peak_dtype(device: torch.device | str = "cpu") -> torch.dtype:
    """The dtype a run's fraction of the peak is read in: bf16, or float32 on a CPU without bf16
    instructions (its evaluation multiplies bf16-rounded operands with the float32 kernel)."""
    return torch.float32 if torch.device(device).type == "cpu" and cpu_lacks_bf16() else torch.bfloat16


def gemm_kernels(x: torch.Tensor, w: torch.Tensor) -> dict[str, Callable[[], torch.Tensor]]:
    """The host's ways to compute x wᵀ, by name, each a call ready to time; a kernel this PyTorch
    build lacks, or that refuses the dtype, is left out."""
    kernels = {"F.linear": lambda: torch.nn.functional.linear(x, w)}
    if x.device.type != "cpu" or not torch.backends.mkldnn.is_available():
        return kernels
    pointwise = torch.ops.mkldnn._linear_pointwise
    kernels["oneDNN"] = lambda: pointwise(x, w, None, "none", [], "")
    with contextlib.suppress(RuntimeError, AttributeError):
        packed = torch.ops.mkldnn._reorder_linear_weight(w, x.shape[0])
        kernels["oneDNN prepacked"] = lambda: pointwise(x, packed, None, "none", [], "")
    if x.dtype == torch.float32 and torch.backends.mkl.is_available():
        with contextlib.suppress(RuntimeError, AttributeError):
            mkl_packed = torch.ops.mkl._mkl_reorder_linear_weight(w, x.shape[0])
            kernels["MKL prepacked"] = lambda: torch.ops.mkl._mkl_linear(x, mkl_packed, w, None, x.shape[0])
    return kernels


def best_seconds(call: Callable[[], object], repeats: int = 3) -> float:
    """The shortest wall time of `call` over `repeats` runs after one warm-up run."""
    call()
    best = float("inf")
    for _ in range(repeats):
        start = time.perf_counter()
        call()
        best = min(best, time.perf_counter() - start)
    return best


def gemm_rates(shape: tuple[int, int, int], dtype: torch.dtype, repeats: int = 3) -> dict[str, float]:
    """GFLOP/s of each kernel of gemm_kernels on `shape` (m, k, n: an [m, k] input times an [n, k]
    weight) in `dtype` on the CPU; a kernel that fails to run is left out."""
    m, k, n = shape
    gen = torch.Generator().manual_seed(0)
    x = torch.randn(m, k, generator=gen).to(dtype)
    w = torch.randn(n, k, generator=gen).to(dtype)
    rates = {}
    for name, call in gemm_kernels(x, w).items():
        with contextlib.suppress(RuntimeError):
            rates[name] = 2 * m * k * n / best_seconds(call, repeats) / 1e9
    return rates


def triad_rate(n: int = 1 << 25, repeats: int = 3) -> float:
    """Memory bandwidth in GB/s of the triad a = b + 3c on float32 arrays of `n` (three arrays
    moved, write-allocate traffic not counted)."""
    b, c = torch.rand(n), torch.rand(n)
    a = torch.empty(n)
    return 3 * 4 * n / best_seconds(lambda: torch.add(b, c, alpha=3.0, out=a), repeats) / 1e9


def measure_peak(size: int = PEAK_SIZE, repeats: int = 2) -> dict:
    """The peak a run's fractions are read against: the best kernel of gemm_rates on size³ in
    peak_dtype, with the rate of every kernel tried, the threads and the CPU."""
    from gna.core.provenance import cpu_kernels, cpu_name

    dtype = peak_dtype()
    rates = gemm_rates((size, size, size), dtype, repeats)
    kernel = max(rates, key=rates.get)
    return {
        "dtype": str(dtype).removeprefix("torch."),
        "GFLOP/s": rates[kernel],
        "kernel": kernel,
        "shape": [size, size, size],
        "rates": rates,
        "threads": torch.get_num_threads(),
        "cpu": cpu_name(),
        "kernels": cpu_kernels(),
    }


def onednn_calls(call: Callable[[], object]) -> Counter:
    """What oneDNN ran during `call()`: {'<primitive> <implementation> <source dtype>': executions},
    read from its verbose log (which oneDNN writes to the process's stdout). Shows, for example,
    whether AMX kernels run at all ('brg_matmul:avx512_core_amx')."""
    sys.stdout.flush()
    saved = os.dup(1)
    with tempfile.TemporaryFile() as log:
        os.dup2(log.fileno(), 1)
        try:
            with torch.backends.mkldnn.verbose(torch.backends.mkldnn.VERBOSE_ON):
                call()
        finally:
            sys.stdout.flush()
            os.dup2(saved, 1)
            os.close(saved)
        log.seek(0)
        text = log.read().decode(errors="replace")
    calls = Counter()
    for line in text.splitlines():
        fields = line.split(",")
        if len(fields) > 7 and fields[0] == "onednn_verbose" and fields[3] == "exec":
            source = next((d.split(":")[1] for d in fields[8].split() if d.startswith("src:")), "?")
            calls[f"{fields[5]} {fields[6]} {source}"] += 1
    return calls


def fraction_of(gflops: float | None, peak: dict | None) -> float | None:
    """`gflops` as a fraction of the measured `peak` (measure_peak's dict); None where either is missing."""
    if gflops is None or not peak or not peak.get("GFLOP/s"):
        return None
    return gflops / peak["GFLOP/s"]


def read_peak(path: str | Path = PEAK_FILE) -> dict | None:
    """The peak measured at a run's start (measure_peak's dict), None where none was written."""
    path = Path(path)
    return json.loads(path.read_text()) if path.is_file() else None


def main(argv: list[str]) -> None:
    from gna.core.io import write_text

    if len(argv) != 1:
        raise SystemExit("usage: python -m gna.engine.peak OUT.json")
    peak = measure_peak()
    write_text(json.dumps(peak, indent=1) + "\n", argv[0])
    print(f"matmul peak: {peak['GFLOP/s']:.0f} GFLOP/s {peak['dtype']} ({peak['kernel']}, {peak['threads']} threads)")


if __name__ == "__main__":
    main(sys.argv[1:])


def _steal_ticks() -> int | None:
    """The CPUs' steal time so far (/proc/stat, in clock ticks); None where it cannot be read."""
    try:
        fields = Path("/proc/stat").read_text().splitlines()[0].split()
    except OSError:
        return None
    return int(fields[8]) if fields[0] == "cpu" and len(fields) > 8 else None


def timed_round(calls: dict[str, Callable[[], float]]) -> dict:
    """Run each of `calls` {name: call returning its FLOPs} once, in order; per call its GFLOP/s,
    and for the round the CPU time of this process per wall second (its threads at work) and the
    share of wall time the hypervisor gave to another tenant (steal; None where unknown)."""
    ticks_per_s = os.sysconf("SC_CLK_TCK")
    cpus = os.cpu_count() or 1
    steal, cpu, wall = _steal_ticks(), time.process_time(), time.perf_counter()
    rates = {}
    for name, call in calls.items():
        start = time.perf_counter()
        flops = call()
        rates[name] = flops / (time.perf_counter() - start) / 1e9
    wall = time.perf_counter() - wall
    stolen = None if steal is None else (_steal_ticks() - steal) / ticks_per_s / (wall * cpus)
    return {"GFLOP/s": rates, "busy threads": (time.process_time() - cpu) / wall, "steal": stolen}


def kept_round(measured: dict, threads: int, max_steal: float = 0.02, min_busy: float = 0.75) -> bool:
    """Whether a round of timed_round ran alone: under `max_steal` of its time stolen and its threads
    busy at least `min_busy` of the wall time each (a round that waits for another tenant's job
    shows fewer busy threads)."""
    steal = measured["steal"]
    return (steal is None or steal <= max_steal) and measured["busy threads"] >= min_busy * threads


def median_ratios(rounds: list[dict], reference: str, threads: int) -> dict:
    """Per workload of `rounds` (timed_round's, the `reference` among their calls): the median over
    the kept rounds (kept_round) of its GFLOP/s divided by the reference's in the same round.
    Raises RuntimeError where fewer than half the rounds are kept: the machine is shared, and a
    ratio read from it would describe the other tenant."""
    kept = [r for r in rounds if kept_round(r, threads)]
    if 2 * len(kept) < len(rounds):
        raise RuntimeError(
            f"only {len(kept)} of {len(rounds)} rounds ran alone (steal time or idle threads show another "
            "tenant): rerun on a quiet machine"
        )
    names = [n for n in rounds[0]["GFLOP/s"] if n != reference]
    ratios = {}
    for name in names:
        values = sorted(r["GFLOP/s"][name] / r["GFLOP/s"][reference] for r in kept)
        ratios[name] = values[len(values) // 2] if len(values) % 2 else sum(values[len(values) // 2 - 1 :][:2]) / 2
    return {"kept rounds": len(kept), "rounds": len(rounds), "ratios": ratios}
