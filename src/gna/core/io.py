"""Atomic file output, checked reads and checksums.

Every artifact is written to a temporary sibling and renamed into place, so an interrupted job
never leaves a half-written file that a rerun would trust.
"""

from __future__ import annotations

import contextlib
import glob
import hashlib
import json
import os
import shutil
import tempfile
from pathlib import Path
from typing import Iterator

import polars as pl


def sha256_file(path: str | Path, chunk: int = 1 << 20) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        while block := handle.read(chunk):
            digest.update(block)
    return digest.hexdigest()


def current_umask() -> int:
    """The process's umask (read without changing it where /proc allows)."""
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith("Umask:"):
                return int(line.split()[1], 8)
    except OSError:
        pass
    mask = os.umask(0o022)
    os.umask(mask)
    return mask


def temporary_siblings(path: Path) -> list[Path]:
    """The temporary files and folders that atomic_path / atomic_dir make for `path`
    (`.<name>.<random>.tmp` beside it; .dvcignore keeps the pattern out of DVC)."""
    return sorted(path.parent.glob(f".{glob.escape(path.name)}.*.tmp"))


def remove_stale_temporaries(path: Path) -> None:
    """Remove what an interrupted earlier write of `path` left behind (one job writes an output,
    so any temporary of it found when a new write starts is stale)."""
    for stale in temporary_siblings(path):
        if stale.is_dir() and not stale.is_symlink():
            shutil.rmtree(stale, ignore_errors=True)
        else:
            stale.unlink(missing_ok=True)


def with_umask_modes(path: Path) -> None:
    """Give `path` (and, for a folder, everything in it) the mode a plain open() / mkdir gives
    under the user's umask: libraries write some files 0600 (safetensors), which would hide
    results from a shared project's group."""
    mask = current_umask()
    for item in [path, *path.rglob("*")] if path.is_dir() else [path]:
        if not item.is_symlink():
            item.chmod((0o777 if item.is_dir() else 0o666) & ~mask)


@contextlib.contextmanager
def atomic_path(path: str | Path) -> Iterator[Path]:
    """Yield a temporary path beside `path`; rename it onto `path` only if the block succeeds.
    The file gets the permissions of a plain open() under the user's umask (with_umask_modes;
    mkstemp's are 0600). Temporaries an interrupted write of `path` left are removed first."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    remove_stale_temporaries(path)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    os.close(fd)
    tmp_path = Path(tmp)
    try:
        yield tmp_path
        with_umask_modes(tmp_path)  # writers that recreate the file (safetensors: 0600) reset it
        os.replace(tmp_path, path)
    finally:
        if tmp_path.exists():
            tmp_path.unlink()


@contextlib.contextmanager
def atomic_dir(path: str | Path) -> Iterator[Path]:
    """Yield a temporary directory beside `path`; it replaces `path` only if the block succeeds.
    The directory and its contents get the permissions of a plain mkdir / open() under the user's
    umask (with_umask_modes; mkdtemp's are 0700); temporaries an interrupted write of `path` left
    are removed first."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    remove_stale_temporaries(path)
    tmp_path = Path(tempfile.mkdtemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent))
    try:
        yield tmp_path
        with_umask_modes(tmp_path)
        if path.exists():
            shutil.rmtree(path)
        os.replace(tmp_path, path)
    finally:
        if tmp_path.exists():
            shutil.rmtree(tmp_path)


def write_parquet(frame: pl.DataFrame, path: str | Path) -> None:
    with atomic_path(path) as tmp:
        frame.write_parquet(tmp, compression="zstd")


def write_json(obj, path: str | Path) -> None:
    with atomic_path(path) as tmp:
        tmp.write_text(json.dumps(obj, indent=2, sort_keys=True, default=str) + "\n")


def write_text(text: str, path: str | Path) -> None:
    with atomic_path(path) as tmp:
        tmp.write_text(text)


def read_parquet(path: str | Path) -> pl.DataFrame:
    path = Path(path)
    if not path.exists():
        raise FileNotFoundError(f"missing input file: {path}")
    try:
        return pl.read_parquet(path)
    except Exception as err:  # polars raises several types for corrupt files
        raise ValueError(f"cannot read Parquet file {path}: {err}") from err


def read_json(path: str | Path):
    """The JSON object in `path`; a missing or corrupt file raises an error naming it."""
    path = Path(path)
    if not path.exists():
        raise FileNotFoundError(f"missing input file: {path}")
    try:
        with open(path) as handle:
            return json.load(handle)
    except (json.JSONDecodeError, UnicodeDecodeError) as err:
        raise ValueError(f"cannot read JSON file {path}: {err}") from err


def collect_tables(paths) -> pl.DataFrame:
    """The Parquet tables in `paths` stacked in order (columns missing from one file are null;
    an empty frame when there are none)."""
    frames = [read_parquet(path) for path in paths]
    return pl.concat(frames, how="diagonal_relaxed") if frames else pl.DataFrame()
