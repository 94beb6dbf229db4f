"""Golden results of the smoke config: every Parquet result of a smoke run (data/results and
data/distill), stored in tests/data/smoke_results/, so that a change to any number is caught.

On the kind of CPU they were recorded on (its vendor and bf16 instructions, in recorded_on.json)
every file must match bit for bit. On another kind the float kernels round differently: every
file must still match value by value, non-float columns exactly and floats within 1e-4 (the
teacher's results: every rule before distillation) or 1e-3 (the students': data/distill and every
hybrid result, whose few training steps amplify rounding) of their column's largest magnitude.
The smoke config trains its students in float32 so that this holds: bf16 autocast rounds by each
CPU's own bf16 kernels. The comparisons' sign test of the answer's log-prob counts items by the
sign of a change that can sit at the kernels' rounding, so on another kind those counts may move
by a few items (sign_slack), the median change by what the per-item log-probs move (MEDIAN_SLACK
nats: measured 0.007 on the smoke's students, AVX-512 against AVX2 kernels; the column's own scale,
a difference of log-probs, says nothing of theirs), and the p-values computed from them are left to
the unit tests.

On a device (a GPU: kind 'cuda') a student's numbers compound the device's float32 summation order
through alignment, realignment and KD: one ulp of the teacher moves a realigned student's first KD
gradient by more than 1e-3 (tests/unit/students/test_distillation.py). So they are judged two ways:
- each student stage replayed alone from the golden run's own inputs (STAGE_INPUTS_DIR, committed:
  the teacher file, the aligned students, the student folders, the tasks; `replay_stages`), its
  results within 1e-3 as on another CPU kind: the stage's own arithmetic;
- the whole run's student results within DEVICE_SPREAD (device_spread.json beside the golden files):
  per file and column, SPREAD_FACTOR times the largest move, relative to the column's largest
  magnitude, in SPREAD_K reruns of the student chain on the recording CPU with the teacher's
  embeddings moved by one ulp (`record_spread`), and never below 1e-3; the columns that such a
  rerun changed though they hold no floats (a chosen checkpoint's step) are not compared there.
  A comparisons table's sign-test counts and median log-prob change keep their CPU slack, widened to
  SPREAD_FACTOR times their largest move in those reruns (in items and in nats: `sign` in the file's
  entry), since a trained student's per-item log-probs move further than between two CPU kinds.
CPU kinds keep 1e-3, and the recording kind bit for bit.

    python tests/golden.py refresh WORKDIR   # store the results of a finished smoke run in WORKDIR
    python tests/golden.py refresh           # run the smoke config in a temporary folder first
    python tests/golden.py spread            # record device_spread.json (after a refresh, same CPU)

Refresh only after a change that is meant to change results (`make smoke-golden`)."""

from __future__ import annotations

import json
import math
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import polars as pl
import yaml
from polars.testing import assert_frame_equal

REPO = Path(__file__).resolve().parents[1]
GOLDEN_DIR = REPO / "tests" / "data" / "smoke_results"
STAGE_INPUTS_DIR = REPO / "tests" / "data" / "smoke_stage_inputs"
PLAN = REPO / "tests" / "data" / "smoke_plan.json"
DEVICE_SPREAD = "device_spread.json"
SPREAD_K = 4
SPREAD_FACTOR = 2.0
# How the suite runs Snakemake on the smoke config: its jobs are tiny and spend most of their
# seconds starting Python, so two single-threaded jobs at a time take half the wall time of one
# two-threaded job after another (the results are the same bytes: test_golden checks).
SMOKE_RUN = ("--cores", "2", "--max-threads", "1")
RESULT_FOLDERS = ("results", "distill")
RECORDED_ON = "recorded_on.json"
# the CPU features whose kernels decide float rounding here (measured: AMD Zen 4 and Zen 5 give
# bit-identical results; an Intel CPU with AMX does not)
KERNEL_FLAGS = ("avx2", "avx512f", "avx512_bf16", "amx_bf16")
TEACHER_RTOL = 1e-4
STUDENT_RTOL = 1e-3
# the log-prob sign test's counts and p-values (gna.core.paired.logp_change) in a comparisons table
SIGN_COUNTS, SIGN_P = ("logp_lower", "logp_higher"), ("p_logp", "p_logp_holm")
MEDIAN_SLACK = 0.02


def sign_slack(n: int) -> int:
    """Items a sign-test count of `n` items may move by on another kind of CPU: 2, or 5% of them."""
    return max(2, math.ceil(0.05 * n))


def sign_counts_close(actual: pl.DataFrame, expected: pl.DataFrame, moved: dict | None = None) -> None:
    """Assert each row's log-prob sign counts within sign_slack of the golden ones and its median change
    within MEDIAN_SLACK nats (nulls where they are null), each widened to `moved` where given (a
    device's student: {"items": ..., "nats": ...}, device_spread's `sign`); raises AssertionError
    naming the column, the row and both values."""
    moved = moved or {}
    items = [(max(sign_slack(m), moved.get("items", 0)), "items") for m in expected["logp_n"].to_list()]
    nats = max(MEDIAN_SLACK, moved.get("nats", 0.0))
    slacks = {column: items for column in SIGN_COUNTS} | {"logp_median_diff": [(nats, "nats")] * len(items)}
    for column, allowed in slacks.items():
        a, e = actual[column], expected[column]
        if not a.is_null().equals(e.is_null()):
            raise AssertionError(f"column {column!r}: nulls differ")
        for row, (x, y, (slack, unit)) in enumerate(zip(a.to_list(), e.to_list(), allowed)):
            if x is not None and abs(x - y) > slack:
                raise AssertionError(f"column {column!r}, row {row}: {x} != golden {y}, beyond {slack} {unit}")


def capped(flags: set[str], env) -> set[str]:
    """`flags` less the kernels the environment keeps PyTorch from using: ATen's dispatch
    (ATEN_CPU_CAPABILITY) and oneDNN's matmuls (ONEDNN_MAX_CPU_ISA, DNNL_MAX_CPU_ISA) capped below
    AVX-512 round as a CPU without it does, so a run under such caps is another kind."""
    isa = (env.get("ONEDNN_MAX_CPU_ISA") or env.get("DNNL_MAX_CPU_ISA") or "ALL").upper()
    aten = (env.get("ATEN_CPU_CAPABILITY") or "").upper()
    out = set(flags)
    if isa != "ALL":
        if "AMX" not in isa:
            out.discard("amx_bf16")
            if not isa.startswith(("AVX512", "AVX10")):
                out -= {"avx512f", "avx512_bf16"}
            elif isa.startswith("AVX512") and not isa.endswith(("BF16", "FP16")):
                out.discard("avx512_bf16")
        if isa in ("SSE41", "AVX"):
            out.discard("avx2")
    if aten in ("AVX2", "DEFAULT"):
        out -= {"avx512f", "avx512_bf16", "amx_bf16"}
    if aten == "DEFAULT":
        out.discard("avx2")
    return out


def cpu_kind(cpuinfo: str | None = None, env=None) -> str:
    """'<vendor> <kernel flags present>' of this machine (or of a /proc/cpuinfo text), less those
    the environment (`env`, default os.environ) caps the kernels below (capped), then 'capped': the
    caps cover some kernels only (MKL's float32 ones keep their own ISA), so such a run is a kind of
    its own, not the CPU it imitates."""
    if cpuinfo is None:
        try:
            cpuinfo = Path("/proc/cpuinfo").read_text()
        except OSError:
            return "unknown"
    fields = dict(line.split(":", 1) for line in cpuinfo.splitlines()[:40] if ":" in line)
    fields = {k.strip(): v.strip() for k, v in fields.items()}
    present = set(fields.get("flags", "").split())
    flags = capped(present, os.environ if env is None else env)
    marker = ["capped"] if flags != present else []
    return " ".join([fields.get("vendor_id", "unknown"), *[f for f in KERNEL_FLAGS if f in flags], *marker])


def trained(name: str) -> bool:
    """Whether a result file comes from (or scores) a distilled student."""
    return name.startswith("distill/") or "hybrid" in name


def _float_valued(dtype) -> bool:
    return dtype.is_float() or (isinstance(dtype, pl.List) and dtype.inner.is_float())


def stable(frame: pl.DataFrame) -> pl.DataFrame:
    """`frame` with its rows sorted by every column, the float-valued ones last (a stable order):
    rows that share their labels keep their order on another kind of CPU, where a float that
    sorted first could swap two of them (measured: a student's attention-map rows on Intel AMX)."""
    if not frame.width:
        return frame
    floats = [c for c in frame.columns if _float_valued(frame[c].dtype)]
    return frame.sort([c for c in frame.columns if c not in floats] + floats, nulls_last=True)


def snapshot(data_dir: str | Path) -> dict[str, pl.DataFrame]:
    """{path relative to `data_dir`: stable frame} for every Parquet result of a run."""
    data_dir = Path(data_dir)
    return {
        path.relative_to(data_dir).as_posix(): stable(pl.read_parquet(path))
        for folder in RESULT_FOLDERS
        for path in sorted((data_dir / folder).rglob("*.parquet"))
    }


def read_golden(golden_dir: str | Path = GOLDEN_DIR) -> dict[str, pl.DataFrame]:
    golden_dir = Path(golden_dir)
    return {
        path.relative_to(golden_dir).as_posix(): pl.read_parquet(path) for path in sorted(golden_dir.rglob("*.parquet"))
    }


def first_difference(actual: pl.DataFrame, expected: pl.DataFrame) -> str:
    """Where two frames of the same columns first differ: column, row and both values."""
    if actual.columns != expected.columns:
        return f"columns {actual.columns} != golden {expected.columns}"
    if actual.height != expected.height:
        return f"{actual.height} rows != golden {expected.height} rows"
    for column in expected.columns:
        if actual[column].dtype != expected[column].dtype:
            return f"column {column!r}: dtype {actual[column].dtype} != golden {expected[column].dtype}"
        differs = actual[column].ne_missing(expected[column])
        if differs.any():
            row = differs.arg_true()[0]
            return (
                f"column {column!r}, first at row {row} (rows sorted by all columns): "
                f"{actual[column][row]!r} != golden {expected[column][row]!r}"
            )
    return "frames differ"


def recorded_kind(golden_dir: str | Path = GOLDEN_DIR) -> str | None:
    path = Path(golden_dir) / RECORDED_ON
    return json.loads(path.read_text())["cpu"] if path.is_file() else None


def within(actual: pl.DataFrame, expected: pl.DataFrame, rtol: float, column_rtol: dict | None = None) -> None:
    """Assert the frames equal, every finite float within `rtol` of its golden column's largest
    finite magnitude (rounding errors scale with the quantities a value is computed from, so a
    near-zero entry of a column of ones, e.g. a position's attention weight of 3e-6, may move by
    1e-7 on another CPU: measured, AMD AVX2 against AVX-512), infinities, NaNs and nulls where the
    golden ones are, lists of floats element by element, other columns exactly; `column_rtol`
    overrides `rtol` by column. Raises AssertionError naming the column, the row and both values
    of the largest difference."""
    if actual.schema != expected.schema or actual.height != expected.height:
        raise AssertionError(first_difference(actual, expected))
    for column in expected.columns:
        a, e = actual[column], expected[column]
        rows = pl.Series(range(len(e)))
        if isinstance(e.dtype, pl.List) and e.dtype.inner.is_float():  # per-choice values: as one column
            if not a.list.len().equals(e.list.len()):
                raise AssertionError(f"column {column!r}: list lengths differ ({first_difference(actual, expected)})")
            rows = rows.repeat_by(e.list.len()).explode()  # each element's row, as explode lays them out
            a, e = a.explode(), e.explode()
        if not e.dtype.is_float():
            if not a.equals(e):
                raise AssertionError(first_difference(actual, expected))
            continue
        finite = e.is_finite().fill_null(False)
        largest = e.filter(finite).abs().max()
        tol = (column_rtol or {}).get(column, rtol)
        allowed = tol * (float(largest) if largest is not None else 0.0)
        gap = (a - e).abs().fill_nan(0.0).fill_null(0.0).zip_with(finite, pl.Series([0.0] * len(e)))
        same = (a.eq_missing(e) | (a.is_nan() & e.is_nan())).fill_null(False)  # inf, NaN, null alike
        misplaced = (~finite & ~same) | (finite & ~a.is_finite().fill_null(False))
        if (gap > allowed).any() or misplaced.any():
            at = int(misplaced.arg_true()[0]) if misplaced.any() else int(gap.arg_max())
            raise AssertionError(
                f"column {column!r}, row {rows[at]} (rows sorted by all columns): {a[at]!r} != golden {e[at]!r}, "
                f"beyond {tol:g} of the column's largest finite magnitude {largest!r}"
            )


def is_device(kind: str) -> bool:
    """Whether `kind` names a device (cuda) rather than a kind of CPU (cpu_kind)."""
    return kind.split()[0] == "cuda"


def device_spread(golden_dir: str | Path = GOLDEN_DIR) -> dict:
    """The recorded spread (record_spread): {"files": {name: {"rtol": {column: tol}, "varies": [...]}}, ...}."""
    path = Path(golden_dir) / DEVICE_SPREAD
    return json.loads(path.read_text()) if path.is_file() else {"files": {}}


def check(name: str, actual: pl.DataFrame, expected: pl.DataFrame, same_kind: bool, spread: dict | None = None) -> str:
    """How result file `name` matches its golden frame: 'bit for bit', or where the golden
    results come from another kind of machine (not `same_kind`) 'within 1e-4' (the teacher's
    results) or 'within 0.001' (the students'; `within`: of the value's or its column's scale),
    non-float columns exactly; on a device, a student file's `spread` entry (device_spread) gives
    its columns' tolerances ('within the device spread'). Raises AssertionError naming the difference."""
    try:
        assert_frame_equal(actual, expected, check_exact=True)
        return "bit for bit"
    except AssertionError as error:
        exact_error = error
    if same_kind:
        raise AssertionError(f"{name}: {first_difference(actual, expected)}\n{exact_error}") from None
    rtol = STUDENT_RTOL if trained(name) else TEACHER_RTOL
    try:
        if set(SIGN_COUNTS) <= set(expected.columns) and actual.columns == expected.columns:
            sign_counts_close(actual, expected, (spread or {}).get("sign") if trained(name) else None)
            actual, expected = (frame.drop(*SIGN_COUNTS, *SIGN_P, "logp_median_diff") for frame in (actual, expected))
        if spread and trained(name):
            varies = [c for c in spread.get("varies", []) if c in expected.columns]
            actual, expected = actual.drop(varies), expected.drop(varies)
            within(actual, expected, rtol, spread.get("rtol", {}))
            return "within the device spread"
        within(actual, expected, rtol)
    except AssertionError as error:
        raise AssertionError(f"{name}: {error}") from None
    return f"within {rtol:g}"


def outcomes(actual_dir: str | Path, *, kind: str, golden_dir: str | Path = GOLDEN_DIR) -> dict[str, str]:
    """{result file: check's outcome, or 'differs: ...'} for the run's data folder `actual_dir`,
    computed on a CPU of `kind` (cpu_kind() where the run was made on this machine; there is no
    default, so a test says which kind it means); 'missing' / 'not in the golden results' for
    files only one side has."""
    actual, golden = snapshot(actual_dir), read_golden(golden_dir)
    same_kind = kind == recorded_kind(golden_dir)
    spread = device_spread(golden_dir)["files"] if is_device(kind) else {}
    out = {name: "missing" for name in golden.keys() - actual.keys()}
    out |= {name: "not in the golden results" for name in actual.keys() - golden.keys()}
    for name in golden.keys() & actual.keys():
        try:
            out[name] = check(name, actual[name], golden[name], same_kind, spread.get(name))
        except AssertionError as error:
            out[name] = f"differs: {str(error).splitlines()[0]}"
    return dict(sorted(out.items()))


def compare(actual_dir: str | Path, *, kind: str, golden_dir: str | Path = GOLDEN_DIR) -> None:
    """Assert that the run's data folder `actual_dir`, computed on a CPU of `kind` (no default:
    the caller says which), holds the golden results (rows in any
    order): bit for bit on the kind of CPU they were recorded on,
    else as the module docstring says; the error names the file, the column and the first row."""
    actual, golden = snapshot(actual_dir), read_golden(golden_dir)
    missing, extra = sorted(golden.keys() - actual.keys()), sorted(actual.keys() - golden.keys())
    if missing or extra:
        raise AssertionError(f"result files differ from {golden_dir}: missing {missing}, extra {extra}")
    same_kind = kind == recorded_kind(golden_dir)
    spread = device_spread(golden_dir)["files"] if is_device(kind) else {}
    for name in sorted(golden):
        check(name, actual[name], golden[name], same_kind, spread.get(name))


def _data_name(path: str) -> str | None:
    """A plan path's name relative to data/ (None outside data/)."""
    return path[len("data/") :] if path.startswith("data/") else None


def _student_output(name: str | None) -> bool:
    """Whether a path under data/ is a student's: its folder (models/<teacher>-hybrid-…) or a trained result."""
    if name is None:
        return False
    if name.startswith("models/"):
        return "-hybrid-" in name
    return name.split("/")[0] in RESULT_FOLDERS and name.endswith(".parquet") and trained(name)


def student_jobs(plan: dict) -> list[dict]:
    """The plan's jobs that train or score a student: those writing a student's folder or a trained result
    (the teacher file, the corpus check and the report are not students' stages)."""
    return [job for job in plan["jobs"] if any(_student_output(_data_name(p)) for p in job["output"]["items"])]


def stage_input_paths(plan: dict) -> list[str]:
    """What the student jobs read that some job of the plan writes (paths under data/)."""
    written = {p for job in plan["jobs"] for p in job["output"]["items"]}
    return sorted({p for job in student_jobs(plan) for p in job["input"]["items"] if p in written})


def store_stage_inputs(workdir: str | Path, inputs_dir: Path = STAGE_INPUTS_DIR) -> None:
    """Keep the student jobs' inputs from the finished smoke run in `workdir` (refresh does)."""
    from gna.core.replay import read_plan

    shutil.rmtree(inputs_dir, ignore_errors=True)
    for path in stage_input_paths(read_plan(PLAN)):
        source, target = Path(workdir) / path, inputs_dir / path
        target.parent.mkdir(parents=True, exist_ok=True)
        (shutil.copytree if source.is_dir() else shutil.copy2)(source, target)


def _seeded(workdir: Path, inputs_dir: Path, rules: tuple[str, ...], plan: dict) -> Path:
    """`workdir` holding the golden run's stage inputs, less what the jobs of `rules` write."""
    shutil.rmtree(workdir, ignore_errors=True)
    shutil.copytree(inputs_dir, workdir)
    for job in plan["jobs"]:
        for path in job["output"]["items"] if job["rule"] in rules else []:
            target = workdir / path
            shutil.rmtree(target) if target.is_dir() else target.unlink(missing_ok=True)
    return workdir


def _written_results(plan: dict, rules: tuple[str, ...]) -> list[str]:
    return sorted(
        name
        for job in plan["jobs"]
        if job["rule"] in rules
        for p in job["output"]["items"]
        if (name := _data_name(p)) and name.endswith(".parquet") and name.split("/")[0] in RESULT_FOLDERS
    )


def replay_stages(
    root: str | Path,
    *,
    kind: str,
    rules: tuple[str, ...] | None = None,
    env: dict | None = None,
    parallel: int = 2,
    inputs_dir: Path = STAGE_INPUTS_DIR,
    deadline: float | None = None,
) -> dict[str, str]:
    """Each student rule (or each of `rules`) replayed alone in a folder of its own under `root`, from
    the golden run's inputs, its results judged as check judges another kind's (bit for bit on the
    recording kind, else within 1e-3, never by the device spread): {result file: outcome}, and
    {job: status} for a job that did not succeed; past `deadline` (time.monotonic()) a rule is not
    started, its results 'not run: time'."""
    import time

    from gna.core.replay import Rules, read_plan, replay

    plan, golden = read_plan(PLAN), read_golden()
    same_kind = kind == recorded_kind()
    out = {}
    for rule in rules or dict.fromkeys(job["rule"] for job in student_jobs(plan)):
        if deadline is not None and time.monotonic() > deadline:
            out |= dict.fromkeys(_written_results(plan, (rule,)), "not run: time")
            continue
        workdir = _seeded(Path(root) / rule, inputs_dir, (rule,), plan)
        for record in replay(PLAN, workdir, rules=Rules(only=(rule,)), env=env, parallel=parallel):
            if record["rule"] == rule and record["status"] != "ok":
                out[record["label"]] = f"{record['status']}: {record.get('error', '')[-300:]}"
        for name in _written_results(plan, (rule,)):
            path = workdir / "data" / name
            try:
                out[name] = (
                    check(name, stable(pl.read_parquet(path)), golden[name], same_kind) if path.exists() else "missing"
                )
            except AssertionError as error:
                out[name] = f"differs: {str(error).splitlines()[0]}"
    return dict(sorted(out.items()))


def _nudged_teacher(workdir: Path, plan: dict, rerun: int) -> None:
    """The teacher folder's input embeddings each moved by one ulp, up or down by a draw of `rerun`."""
    import torch
    from safetensors.torch import load_file, save_file

    teacher = next(
        p
        for job in plan["jobs"]
        if job["rule"] == "distill_teacher"
        for p in job["input"]["items"]
        if p.startswith("data/models/")
    )
    path = workdir / teacher / "model.safetensors"
    tensors = load_file(path)
    name = next(k for k in tensors if k.endswith("embed_tokens.weight"))
    weight = tensors[name]
    up = torch.rand(weight.shape, generator=torch.Generator().manual_seed(rerun)) < 0.5
    towards = torch.where(up, torch.full_like(weight, float("inf")), torch.full_like(weight, float("-inf")))
    tensors[name] = torch.nextafter(weight, towards)
    save_file(tensors, str(path), metadata={"format": "pt"})


def record_spread(
    root: str | Path, k: int = SPREAD_K, golden_dir: Path = GOLDEN_DIR, inputs_dir: Path = STAGE_INPUTS_DIR
) -> dict:
    """Rerun the teacher file and the student chain `k` times from the golden run's inputs, the
    teacher's embeddings moved by one ulp each time (_nudged_teacher), and write device_spread.json:
    per student result file, each float column's tolerance (SPREAD_FACTOR times its largest relative
    move, at least STUDENT_RTOL) and the columns without floats that a rerun changed. Run it on the
    kind of CPU the golden results were recorded on (their reruns are compared with them)."""
    from gna.core.replay import Rules, read_plan, replay

    if cpu_kind() != recorded_kind(golden_dir):
        raise SystemExit(f"record the spread where the golden results were recorded ({recorded_kind(golden_dir)})")
    plan, golden = read_plan(PLAN), read_golden(golden_dir)
    rules = ("distill_teacher", *dict.fromkeys(job["rule"] for job in student_jobs(plan)))
    names = [name for name in _written_results(plan, rules) if trained(name)]  # a rule's teacher jobs keep 1e-4
    moves: dict[str, dict[str, float]] = {name: {} for name in names}
    varies: dict[str, set[str]] = {name: set() for name in names}
    sign: dict[str, dict[str, float]] = {name: {} for name in names}
    for rerun in range(k):
        workdir = _seeded(Path(root) / f"rerun-{rerun}", inputs_dir, rules, plan)
        _nudged_teacher(workdir, plan, rerun)
        records = replay(PLAN, workdir, rules=Rules(only=rules), parallel=2)
        failed = {r["label"]: r.get("error", "")[-300:] for r in records if r["status"] not in ("ok", "given")}
        if failed:
            raise RuntimeError(f"spread rerun {rerun}: jobs did not succeed: {failed}")
        for name in names:
            rerun_frame = stable(pl.read_parquet(workdir / "data" / name))
            for column, move in _relative_moves(rerun_frame, golden[name]).items():
                if move is None:
                    varies[name].add(column)
                else:
                    moves[name][column] = max(moves[name].get(column, 0.0), move)
            for unit, move in _sign_moves(rerun_frame, golden[name]).items():
                sign[name][unit] = max(sign[name].get(unit, 0.0), move)
    spread = {
        "measured_on": cpu_kind(),
        "reruns": k,
        "rule": f"per column: {SPREAD_FACTOR:g} x the largest move in {k} one-ulp reruns, relative to the "
        f"column's largest magnitude, at least {STUDENT_RTOL:g}",
        "files": {
            name: {
                "rtol": {
                    c: max(STUDENT_RTOL, float(f"{SPREAD_FACTOR * m:.2g}")) for c, m in sorted(moves[name].items())
                },
                "varies": sorted(varies[name]),
                "largest_move": {c: float(f"{m:.3g}") for c, m in sorted(moves[name].items())},
            }
            | ({"sign": _sign_slack(sign[name])} if sign[name] else {})
            for name in names
        },
    }
    write_json = Path(golden_dir) / DEVICE_SPREAD
    write_json.write_text(json.dumps(spread, indent=1) + "\n")
    return spread


def _sign_moves(actual: pl.DataFrame, expected: pl.DataFrame) -> dict[str, float]:
    """A rerun's largest move of a comparisons table's sign-test counts (items) and median log-prob
    change (nats), rows where both are set; {} for a frame without them or whose rows differ."""
    if not set(SIGN_COUNTS) <= set(expected.columns) or actual.height != expected.height:
        return {}

    def largest(columns) -> float:
        gaps = [abs(x - y) for c in columns for x, y in zip(actual[c], expected[c]) if x is not None and y is not None]
        return float(max(gaps, default=0.0))

    return {"items": largest(SIGN_COUNTS), "nats": largest(["logp_median_diff"])}


def _sign_slack(moves: dict[str, float]) -> dict[str, float]:
    """SPREAD_FACTOR times the sign columns' largest moves: whole items, nats to 3 digits."""
    return {"items": math.ceil(SPREAD_FACTOR * moves["items"]), "nats": float(f"{SPREAD_FACTOR * moves['nats']:.3g}")}


def _relative_moves(actual: pl.DataFrame, expected: pl.DataFrame) -> dict[str, float | None]:
    """Per column of a rerun's frame: its float values' largest move relative to the golden column's
    largest finite magnitude; None for a column without floats that differs (or a frame whose rows
    differ: every column). The sign-test columns are judged by their own slack (sign_counts_close)."""
    if actual.height != expected.height or actual.columns != expected.columns:
        return dict.fromkeys(expected.columns)
    out = {}
    for column in expected.columns:
        if column in (*SIGN_COUNTS, *SIGN_P, "logp_median_diff"):
            continue
        a, e = actual[column], expected[column]
        if isinstance(e.dtype, pl.List) and e.dtype.inner.is_float():
            if not a.list.len().equals(e.list.len()):
                out[column] = None
                continue
            a, e = a.explode(), e.explode()
        if not e.dtype.is_float():
            if not a.equals(e):
                out[column] = None
            continue
        finite = (e.is_finite() & a.is_finite()).fill_null(False)
        if not a.is_finite().fill_null(False).equals(e.is_finite().fill_null(False)):
            out[column] = None  # a value became or stopped being inf, NaN or null
            continue
        largest = e.filter(finite).abs().max()
        gap = (a - e).filter(finite).abs().max()
        if not largest:  # a column of zeros: any move is of its whole scale
            out[column] = None if gap else 0.0
            continue
        out[column] = float(gap) / float(largest)
    return out


def run_smoke(workdir: Path) -> None:
    """Run the whole smoke config in `workdir`, as tests/workflow/test_workflow.py does."""
    config = workdir / "config.yaml"
    config.write_text(yaml.safe_dump(yaml.safe_load((REPO / "config" / "smoke.yaml").read_text())))
    subprocess.run(
        [
            sys.executable,
            "-m",
            "snakemake",
            "--snakefile",
            str(REPO / "Snakefile"),
            "--directory",
            str(workdir),
            "--configfile",
            str(config),
            *SMOKE_RUN,
        ],
        cwd=REPO,
        check=True,
    )


def refresh(workdir: str | Path | None = None, golden_dir: Path = GOLDEN_DIR) -> None:
    """Replace the golden results by those of the smoke run in `workdir` (run it first if None)."""
    if workdir is None:
        with tempfile.TemporaryDirectory(prefix="gna-smoke-") as tmp:
            run_smoke(Path(tmp))
            refresh(tmp, golden_dir)
        return
    frames = snapshot(Path(workdir) / "data")
    if not frames:
        raise SystemExit(f"no results under {workdir}/data: is it a finished smoke run?")
    shutil.rmtree(golden_dir, ignore_errors=True)
    for name, frame in frames.items():
        (golden_dir / name).parent.mkdir(parents=True, exist_ok=True)
        frame.write_parquet(golden_dir / name, compression="zstd", compression_level=19)
    (golden_dir / RECORDED_ON).write_text(json.dumps({"cpu": cpu_kind()}) + "\n")
    stored = golden_dir == GOLDEN_DIR
    if stored:
        store_stage_inputs(workdir)
    print(
        f"wrote {len(frames)} golden files to {golden_dir}{' and the student stages’ inputs' if stored else ''}, "
        f"recorded on {cpu_kind()}; record their device spread next: python tests/golden.py spread"
    )


if __name__ == "__main__":
    sys.path.insert(0, str(REPO / "src"))
    if len(sys.argv) == 2 and sys.argv[1] == "spread":
        with tempfile.TemporaryDirectory(prefix="gna-spread-") as tmp:
            print(json.dumps(record_spread(tmp)["files"], indent=1))
    elif len(sys.argv) in (2, 3) and sys.argv[1] == "refresh":
        refresh(sys.argv[2] if len(sys.argv) == 3 else None)
    else:
        raise SystemExit(__doc__)
