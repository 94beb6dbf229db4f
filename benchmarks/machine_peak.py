"""The fraction of the machine's matmul peak the engine reaches, on one sweep batch of each default
model at its real shapes (one process, under 2 minutes on 2 cores).

    .venv/bin/python benchmarks/machine_peak.py [--rounds 10] [--layers 2] [--tokens 155] [--threads 2]
        [--out data/benchmarks/machine_peak.json]

References, measured once: the best GEMM kernel (gna.engine.peak.gemm_kernels: F.linear, oneDNN on
plain and prepacked weights, MKL prepacked) in bf16 and float32 at 1024×4096×4096 and at each model's
largest linear shape in a layer (the sweep batch's tokens × its MLP); a float32 triad (memory bandwidth); the
float32 GEMM on 1 thread against `--threads`, which shows SMT siblings (two threads on one core gain
little). Rounds: the peak-dtype GEMM (gna.engine.peak.peak_dtype: float32 on a CPU without bf16
instructions) and each model's workload, interleaved `--rounds` times. The workload is the engine's
scoring pass (record and read-out, at the config's eval.compute_dtype and eval.batch_size) over
`--layers` random layers of the model's shapes (data/models/<model>/config.json: prepared by
`make reproduce`), sequences of `--tokens` (the sweep prompts' length); its useful FLOPs are
gna.core.work's, the run record's. Printed and written as JSON: per model the median ratio of its
GFLOP/s to the reference's over the rounds that ran alone (no steal time, threads busy), and the
oneDNN kernels each ran (gna.engine.peak.onednn_calls: AMX shows as avx512_core_amx).
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import torch
import yaml

from gna.core import work
from gna.core.io import write_text
from gna.core.provenance import cpu_kernels, cpu_name
from gna.engine.packing import collate, pack
from gna.engine.peak import (
    gemm_kernels,
    gemm_rates,
    median_ratios,
    onednn_calls,
    peak_dtype,
    timed_round,
    triad_rate,
)
from gna.engine.precision import linears_computed_in
from gna.engine.stack import check_engine
from gna.models.tiny import shaped_random_model

DTYPES = (torch.bfloat16, torch.float32)


def workload(model_dir: Path, layers: int, tokens: int, batch_size: int, compute_dtype: str):
    """(a call scoring one batch and returning its useful FLOPs, the largest linear shape of its layers)."""
    model = linears_computed_in(shaped_random_model(model_dir, layers), compute_dtype)
    stack = check_engine(model)
    vocab = stack.head.weight.shape[0]
    gen = torch.Generator().manual_seed(0)
    items = [pack(torch.randint(1, vocab, (tokens - 1,), generator=gen).tolist(), [[7]]) for _ in range(batch_size)]
    batch = collate(items)
    # the output head runs at the read-out rows only: the largest matmul at every position is in a layer
    linears = [m for layer in stack.layers for m in layer.modules() if isinstance(m, torch.nn.Linear)]
    biggest = max(linears, key=lambda m: m.weight.numel())

    @torch.inference_mode()
    def call() -> float:
        work.reset()
        stack.readout(stack.record(batch).final, batch)
        return work.useful_flops()

    return call, (batch_size * tokens, biggest.in_features, biggest.out_features)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--config", default="config/config.yaml")
    ap.add_argument("--rounds", type=int, default=10)
    ap.add_argument("--layers", type=int, default=2)
    ap.add_argument("--tokens", type=int, default=155)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--out", default="data/benchmarks/machine_peak.json")
    args = ap.parse_args()
    begun = time.perf_counter()
    config = yaml.safe_load(Path(args.config).read_text())
    evaluation = config.get("eval", {})
    torch.set_num_threads(args.threads)
    dtype = peak_dtype()
    shape = (1024, 4096, 4096)
    result = {
        "cpu": cpu_name(),
        "kernels": cpu_kernels(),
        "threads": args.threads,
        "peak dtype": str(dtype).removeprefix("torch."),
        "reference shape": list(shape),
        "GEMM GFLOP/s": {str(d).removeprefix("torch."): gemm_rates(shape, d) for d in DTYPES},
        "triad GB/s": triad_rate(),
    }
    torch.set_num_threads(1)
    one = max(gemm_rates(shape, torch.float32).values())
    torch.set_num_threads(args.threads)
    many = max(result["GEMM GFLOP/s"]["float32"].values())
    result["threads' speed-up (float32 GEMM)"] = many / one
    if args.threads > 1 and many / one < 0.6 * args.threads:
        print(f"the {args.threads} threads gain only {many / one:.2f}x over one: they share cores (SMT siblings)")
    gen = torch.Generator().manual_seed(1)
    x, w = torch.randn(shape[:2], generator=gen).to(dtype), torch.randn(shape[2:0:-1], generator=gen).to(dtype)
    reference_kernel = max(result["GEMM GFLOP/s"][result["peak dtype"]].items(), key=lambda kv: kv[1])[0]
    gemm = gemm_kernels(x, w)[reference_kernel]
    calls, models = {"reference": lambda: (gemm(), 2 * shape[0] * shape[1] * shape[2])[1]}, {}
    for name in config.get("models", {}):
        model_dir = Path("data/models") / name
        if not (model_dir / "config.json").is_file():
            print(f"{name}: skipped, not prepared ({model_dir}/config.json; `make reproduce` prepares it)")
            continue
        batch_size, compute_dtype = evaluation.get("batch_size", 8), evaluation.get("compute_dtype", "bfloat16")
        call, biggest = workload(model_dir, args.layers, args.tokens, batch_size, compute_dtype)
        calls[name] = call
        models[name] = {
            "largest linear shape": list(biggest),
            "GEMM GFLOP/s at it": {str(d).removeprefix("torch."): gemm_rates(biggest, d, repeats=1) for d in DTYPES},
            "oneDNN kernels": dict(onednn_calls(call)),
        }
    result["reference"] = f"{reference_kernel} {result['peak dtype']} {'×'.join(map(str, shape))}"
    result["reference oneDNN kernels"] = dict(onednn_calls(gemm))
    rounds = [timed_round(calls) for _ in range(args.rounds)]
    summary = median_ratios(rounds, "reference", args.threads)
    for name, ratio in summary["ratios"].items():
        models[name]["fraction of peak"] = ratio
        models[name]["GFLOP/s (median)"] = sorted(r["GFLOP/s"][name] for r in rounds)[len(rounds) // 2]
    result |= {"models": models, "kept rounds": summary["kept rounds"], "rounds": summary["rounds"]}
    result["seconds"] = time.perf_counter() - begun
    write_text(json.dumps(result, indent=1) + "\n", args.out)
    print(json.dumps(result, indent=1))


if __name__ == "__main__":
    main()
