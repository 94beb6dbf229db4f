"""A GGUF's conversion to the prepared float32 folder: the pipeline's path (gna.models.prepare:
the dequantised weights assigned to a plain model built on the meta device) against the
reference (the same weights copied into a plain model built and initialised in memory), each in
its own process (peak RSS only grows within a process) — seconds, peak RSS, and whether the two
folders hold the same tensors.

    .venv/bin/python benchmarks/prepare_memory.py [--gguf data/downloads/models/qwen2.5-coder-1.5b.gguf]
        [--out /tmp/prepare_memory] [--threads 2]

Both folders are written under --out (a 1.5B model: 7 GB each) and removed at the end.
"""

from __future__ import annotations

import argparse
import json
import resource
import shutil
import subprocess
import sys
import time
from pathlib import Path

import torch


def reference_strip(model):
    """The reference: a plain model built from the config in memory (randomly initialised), the
    dequantised weights copied into it — two models' weights at once."""
    from transformers import AutoConfig, AutoModelForCausalLM

    cfg = model.config.to_dict()
    cfg.pop("quantization_config", None)
    plain = AutoModelForCausalLM.from_config(AutoConfig.for_model(**cfg), dtype=model.dtype)
    plain.load_state_dict(model.state_dict(), strict=True)
    return plain


def convert(gguf: Path, out: Path, path: str) -> dict:
    """Load the GGUF, make it savable by `path`, save it to `out`; seconds and peak RSS."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from gna.models.prepare import _strip_quantization

    start = time.perf_counter()
    tok = AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name)
    model = AutoModelForCausalLM.from_pretrained(gguf.parent, gguf_file=gguf.name, dtype=torch.float32)
    plain = (_strip_quantization if path == "assigned" else reference_strip)(model)
    plain.save_pretrained(out, safe_serialization=True)
    tok.save_pretrained(out)
    return {
        "path": path,
        "seconds": time.perf_counter() - start,
        "peak_rss_gb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20,
    }


def same_tensors(a: Path, b: Path) -> tuple[int, list[str]]:
    """(tensors compared, names that differ) between two folders' safetensors (memory-mapped)."""
    from safetensors import safe_open

    def index(folder: Path) -> dict[str, Path]:
        out = {}
        for file in sorted(folder.glob("*.safetensors")):
            with safe_open(file, "pt") as f:
                out.update({k: file for k in f.keys()})
        return out

    left, right = index(a), index(b)
    differ = sorted(set(left) ^ set(right))
    for name in sorted(set(left) & set(right)):
        with safe_open(left[name], "pt") as f, safe_open(right[name], "pt") as g:
            if not torch.equal(f.get_tensor(name), g.get_tensor(name)):
                differ.append(name)
    return len(set(left) | set(right)), differ


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--gguf", default="data/downloads/models/qwen2.5-coder-1.5b.gguf")
    parser.add_argument("--out", default="/tmp/prepare_memory")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--path", choices=["assigned", "reference"], help=argparse.SUPPRESS)  # one child process
    args = parser.parse_args()
    gguf, out = Path(args.gguf), Path(args.out)
    torch.set_num_threads(args.threads)
    if args.path:
        print(json.dumps(convert(gguf, out / args.path, args.path)))
        return
    if not gguf.is_file():
        raise SystemExit(f"prepare_memory: no GGUF at {gguf} (run the workflow's fetch_model_file first)")
    results = {}
    try:
        for path in ("reference", "assigned"):
            child = subprocess.run(
                [sys.executable, __file__, *sys.argv[1:], "--path", path], check=True, capture_output=True, text=True
            )
            results[path] = json.loads(child.stdout.strip().splitlines()[-1])
        n, differ = same_tensors(out / "reference", out / "assigned")
    finally:
        shutil.rmtree(out, ignore_errors=True)
    ref, new = results["reference"], results["assigned"]
    print(
        f"{gguf.name}: reference {ref['seconds']:.1f} s, peak {ref['peak_rss_gb']:.2f} GB; assigned "
        f"{new['seconds']:.1f} s, peak {new['peak_rss_gb']:.2f} GB -> {new['peak_rss_gb'] / ref['peak_rss_gb']:.2f}x "
        f"the memory, {ref['seconds'] / new['seconds']:.2f}x faster; {n} tensors, "
        + ("all equal" if not differ else f"{len(differ)} differ (first: {differ[0]})")
    )


if __name__ == "__main__":
    main()
