"""gna.core.guard on a hand-made DVC layout (the real DVC drills: tests/workflow/test_dvc.py)."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from gna.core.guard import SET_ASIDE, check, file_md5, guard, record_written


def _cache(root: Path, data: bytes) -> str:
    import hashlib

    md5 = hashlib.md5(data).hexdigest()
    path = root / ".dvc/cache/files/md5" / md5[:2] / md5[2:]
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(data)
    return md5


def repo(tmp_path: Path) -> Path:
    """A folder output data/results (two files) and a file output data/summary.txt, as dvc.lock
    and the DVC cache record them, each written by a job."""
    files = {"data/results/a.txt": b"alpha\n", "data/results/b.txt": b"beta\n", "data/summary.txt": b"sum\n"}
    for name, data in files.items():
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name).write_bytes(data)
        _cache(tmp_path, data)
    listing = json.dumps([{"md5": file_md5(tmp_path / f"data/results/{n}"), "relpath": n} for n in ("a.txt", "b.txt")])
    outs = [
        {"path": "data/results", "md5": _cache(tmp_path, listing.encode()) + ".dir"},
        {"path": "data/summary.txt", "md5": file_md5(tmp_path / "data/summary.txt")},
    ]
    # the listing is cached under its own md5 + ".dir"
    dir_md5 = outs[0]["md5"][:-4]
    cached = tmp_path / ".dvc/cache/files/md5" / dir_md5[:2] / dir_md5[2:]
    cached.rename(cached.with_name(cached.name + ".dir"))
    (tmp_path / "dvc.lock").write_text(yaml.safe_dump({"schema": "2.0", "stages": {"study": {"outs": outs}}}))
    record_written(["data/results", "data/summary.txt"], tmp_path)
    return tmp_path


def test_outputs_as_recorded_or_as_a_job_wrote_them_pass(tmp_path):
    root = repo(tmp_path)
    assert check(root) == []
    (root / "data/summary.txt").write_bytes(b"new sum\n")  # a job rewrote it (a direct Snakemake run)
    record_written(["data/summary.txt"], root)
    assert check(root) == []


def test_edited_deleted_and_added_files_are_set_aside_and_restored_or_left_to_compute(tmp_path):
    root = repo(tmp_path)
    (root / "data/results/a.txt").write_bytes(b"ALPHA\n")  # same size: the mtime tells
    stat = (root / "data/results/a.txt").stat()
    os.utime(root / "data/results/a.txt", ns=(stat.st_atime_ns, stat.st_mtime_ns + 1_000_000_000))
    (root / "data/results/b.txt").unlink()
    (root / "data/results/c.txt").write_bytes(b"by hand\n")
    found = {f.path.relative_to(root).as_posix(): (f.what, f.action) for f in guard(root)}
    assert found == {
        "data/results/a.txt": ("edited", "restored from the DVC cache"),
        "data/results/b.txt": ("deleted", "restored from the DVC cache"),
        "data/results/c.txt": ("added", "to be computed again"),
    }
    assert (root / "data/results/a.txt").read_bytes() == b"alpha\n" and (root / "data/results/b.txt").exists()
    assert not (root / "data/results/c.txt").exists()
    assert (root / SET_ASIDE / "data/results/a.txt").read_bytes() == b"ALPHA\n"
    assert (root / SET_ASIDE / "data/results/c.txt").read_bytes() == b"by hand\n"
    assert check(root) == []


def test_an_edit_after_a_direct_run_is_computed_again_not_restored_to_an_older_result(tmp_path):
    """The cache holds dvc.lock's version; the pipeline has since written another (a direct run
    after a config edit). Restoring the older one would pair it with the newer config."""
    root = repo(tmp_path)
    (root / "data/summary.txt").write_bytes(b"newer sum\n")
    record_written(["data/summary.txt"], root)
    (root / "data/summary.txt").write_bytes(b"edited\n")
    [finding] = guard(root)
    assert (finding.what, finding.action) == ("edited", "to be computed again")
    assert not (root / "data/summary.txt").exists()


def test_a_fresh_clone_has_nothing_to_guard(tmp_path):
    root = repo(tmp_path)
    lock = (root / "dvc.lock").read_text()
    for p in (root / "data", root / ".dvc"):
        subprocess.run(["rm", "-rf", str(p)], check=True)
    (root / "dvc.lock").write_text(lock)
    assert check(root) == []


@pytest.mark.slow
def test_a_job_records_its_outputs_only_when_it_succeeds(tmp_path):
    script = (
        "import sys\nfrom pathlib import Path\nfrom gna.core.runtime import setup\n"
        "setup(None, outputs=['data/out.txt'])\nPath('data').mkdir(exist_ok=True)\n"
        "Path('data/out.txt').write_text('x')\nif sys.argv[1] == 'fail': raise RuntimeError('boom')\n"
    )
    for mode in ("fail", "ok"):
        proc = subprocess.run([sys.executable, "-c", script, mode], cwd=tmp_path, capture_output=True, text=True)
        recorded = tmp_path / "data/run/written/data/out.txt.md5"
        if mode == "fail":
            assert proc.returncode != 0 and "boom" in proc.stderr and not recorded.exists()
        else:
            assert proc.returncode == 0 and json.loads(recorded.read_text())["md5"] == file_md5(
                tmp_path / "data/out.txt"
            )
