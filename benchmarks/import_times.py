"""How long each workflow script takes from its start to its first input: its imports, each in a
fresh interpreter, against an interpreter that imports nothing (the reference, same run).

    .venv/bin/python benchmarks/import_times.py [--repeats 3] [--limit 2.0]

Per script (workflow_scripts/*.py): the median wall time of `python -c "<its imports>"` over
`--repeats` runs, and the same for `python -c pass`; printed with their difference, and a line
naming the scripts over `--limit` seconds. Loading a model (transformers' model classes, imported
by load_model) is not counted: it is part of reading the model, timed beside as `model classes`.
"""

from __future__ import annotations

import argparse
import ast
import statistics
import subprocess
import sys
import time
from pathlib import Path


def imports_of(script: Path) -> str:
    """The module-level import statements of `script`, as source."""
    tree = ast.parse(script.read_text())
    return "\n".join(ast.unparse(node) for node in tree.body if isinstance(node, ast.Import | ast.ImportFrom))


def seconds(code: str, repeats: int) -> float:
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        subprocess.run([sys.executable, "-c", code], check=True)
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--limit", type=float, default=2.0)
    args = ap.parse_args()
    empty = seconds("pass", args.repeats)
    print(f"{'python -c pass':32s} {empty:5.2f} s (the reference)")
    over = []
    for script in sorted(Path("workflow_scripts").glob("*.py")):
        took = seconds(imports_of(script), args.repeats)
        print(f"{script.stem:32s} {took:5.2f} s  (+{took - empty:.2f} s over the reference)")
        if took > args.limit:
            over.append(script.stem)
    classes = seconds(
        "from transformers import AutoModelForCausalLM, AutoTokenizer; AutoModelForCausalLM", args.repeats
    )
    print(f"{'model classes (load_model)':32s} {classes:5.2f} s  (model loading, not counted)")
    print(f"over {args.limit:.1f} s: {', '.join(over) if over else 'none'}")


if __name__ == "__main__":
    main()
