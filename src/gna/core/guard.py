"""Only what the pipeline computed is ever recorded as its result.

Every workflow job records the md5 (with size and mtime) of each file it wrote (`record_written`, called by
gna.core.runtime.setup when the job ends without error) under data/run/written/. Before DVC
records a run (`make reproduce`), `guard` compares every file of dvc.lock's outputs with its
recorded hash: a file that differs and that no job wrote — edited, replaced, deleted, or added by
hand — is moved aside to data/run/set-aside/ (nothing is lost), then restored from the DVC cache
where the cache holds the recorded version and that version is also the one the pipeline last
wrote, otherwise left missing so that Snakemake computes it again. Each is named on stderr.

    python -m gna.core.guard [REPO_DIR]
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import sys
from dataclasses import dataclass
from pathlib import Path

import yaml

from gna.core.io import atomic_path

WRITTEN = Path("data/run/written")  # per output file: the md5 of what a job wrote there
SET_ASIDE = Path("data/run/set-aside")  # files no job wrote, kept for the user


def file_md5(path: str | Path) -> str:
    digest = hashlib.md5(usedforsecurity=False)
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def _files(path: Path) -> list[Path]:
    return sorted(p for p in path.rglob("*") if p.is_file()) if path.is_dir() else [path] if path.is_file() else []


def _record_path(root: Path, file: Path) -> Path:
    return root / WRITTEN / (file.relative_to(root).as_posix() + ".md5")


def record_written(outputs: list[str | Path], root: str | Path = ".") -> None:
    """Record the md5 of every file of `outputs` (files or folders, under `root`/data) as written
    by the pipeline."""
    root = Path(root).resolve()
    for output in outputs:
        for file in _files(Path(root, output)):
            file = file.resolve()
            if root / "data" not in file.parents or root / WRITTEN in file.parents:
                continue
            record = _record_path(root, file)
            record.parent.mkdir(parents=True, exist_ok=True)
            stat = file.stat()
            with atomic_path(record) as tmp:
                Path(tmp).write_text(
                    json.dumps({"md5": file_md5(file), "size": stat.st_size, "mtime_ns": stat.st_mtime_ns}) + "\n"
                )


def _record(root: Path, file: Path) -> dict | None:
    path = _record_path(root, file)
    return json.loads(path.read_text()) if path.exists() else None


def written_md5(root: Path, file: Path) -> str | None:
    """The md5 of what a job last wrote to `file`, None where none did."""
    record = _record(root, file)
    return record["md5"] if record else None


def current_md5(root: Path, file: Path) -> str | None:
    """The md5 of `file` as it is (None: missing); read from its record where size and mtime
    are still the ones a job left, as DVC's own state does, so unchanged outputs are not hashed."""
    if not file.is_file():
        return None
    record, stat = _record(root, file), file.stat()
    if record and (record["size"], record["mtime_ns"]) == (stat.st_size, stat.st_mtime_ns):
        return record["md5"]
    return file_md5(file)


def _cache_file(root: Path, md5: str) -> Path:
    return root / ".dvc" / "cache" / "files" / "md5" / md5[:2] / md5[2:]


def _lock_outs(root: Path) -> list[dict]:
    lock_path = root / "dvc.lock"
    stages = (yaml.safe_load(lock_path.read_text()) or {}).get("stages", {}) if lock_path.exists() else {}
    return [out for stage in stages.values() for out in stage.get("outs", []) if out.get("md5")]


def locked_files(root: str | Path = ".") -> dict[Path, str]:
    """{file: md5} of every output file dvc.lock records that can be checked here: a folder
    output's files through the folder's listing in the DVC cache (absent in a fresh clone)."""
    root = Path(root).resolve()
    files = {}
    for out in _lock_outs(root):
        path, md5 = root / out["path"], out["md5"]
        if not md5.endswith(".dir"):
            files[path] = md5
        elif _cache_file(root, md5).exists():
            files.update({path / e["relpath"]: e["md5"] for e in json.loads(_cache_file(root, md5).read_text())})
    return files


@dataclass
class Finding:
    path: Path
    what: str  # "edited" (differs from dvc.lock), "deleted", "added" (in no lock, no job wrote it)
    action: str  # "restored from the DVC cache", "to be computed again"


def check(root: str | Path = ".") -> list[Finding]:
    """The files of dvc.lock's outputs (and any other file in its output folders) that differ
    from what dvc.lock records and that no job of the pipeline wrote, with what is done about each.
    A deleted file the cache cannot restore is left to Snakemake, which computes missing files."""
    root = Path(root).resolve()
    locked = locked_files(root)
    findings = []
    for file, md5 in sorted(locked.items()):
        current = current_md5(root, file)
        if current == md5:
            continue
        written = written_md5(root, file)
        if current is not None and current == written:
            continue  # a job wrote it (a direct Snakemake run): DVC records it
        # the cached version is the right one only if it is also what the pipeline last wrote
        cached = _cache_file(root, md5).exists() and written in (None, md5)
        if current is None and not cached:
            continue
        findings.append(
            Finding(
                file,
                "deleted" if current is None else "edited",
                "restored from the DVC cache" if cached else "to be computed again",
            )
        )
    for out in _lock_outs(root):
        for file in _files(root / out["path"]) if out["md5"].endswith(".dir") else []:
            if file not in locked and written_md5(root, file) != current_md5(root, file):
                findings.append(Finding(file, "added", "to be computed again"))
    return findings


def guard(root: str | Path = ".") -> list[Finding]:
    """Act on `check`: set each finding's file aside, then restore it from the DVC cache or leave
    it missing (Snakemake then computes it); returns the findings."""
    root = Path(root).resolve()
    findings = check(root)
    locked = locked_files(root) if findings else {}
    for finding in findings:
        if finding.path.is_file():
            aside = root / SET_ASIDE / finding.path.relative_to(root)
            aside.parent.mkdir(parents=True, exist_ok=True)
            os.replace(finding.path, aside)
        if finding.action == "restored from the DVC cache":
            with atomic_path(finding.path) as tmp:
                shutil.copyfile(_cache_file(root, locked[finding.path]), tmp)
            record_written([finding.path.relative_to(root)], root)  # the pipeline's own version again
    return findings


def main(argv: list[str] | None = None) -> int:
    """python -m gna.core.guard [REPO_DIR]"""
    argv = sys.argv[1:] if argv is None else argv
    root = Path(argv[0] if argv else ".").resolve()
    findings = guard(root)
    for f in findings:
        note = f"; the file as found is in {SET_ASIDE.as_posix()}/" if f.what != "deleted" else ""
        print(
            f"make reproduce: {f.path.relative_to(root).as_posix()} {f.what} outside the pipeline: {f.action}{note}",
            file=sys.stderr,
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
