"""The package imports downward only and has no circle between files (gna.workflow.layers)."""

import shutil
from pathlib import Path

import gna
from gna.workflow.layers import LAYERS, import_cycles, imports, upward_imports

PACKAGE = Path(gna.__file__).parent


def test_the_package_imports_downward_only_without_circles():
    assert sorted(p.name for p in PACKAGE.iterdir() if (p / "__init__.py").is_file()) == sorted(LAYERS)
    assert upward_imports(PACKAGE) == []
    assert import_cycles(PACKAGE) == []


def _copy(tmp_path) -> Path:
    copy = tmp_path / "gna"
    shutil.copytree(PACKAGE, copy, ignore=shutil.ignore_patterns("__pycache__"))
    return copy


def _append(path: Path, text: str) -> None:
    path.write_text(path.read_text() + text)


def test_an_upward_import_is_named_with_its_file_line_and_layers(tmp_path):
    """In a copy of the package: an import inside a function counts, a relative one is resolved,
    and a module outside every layer is named."""
    copy = _copy(tmp_path)
    lines = len((copy / "core" / "io.py").read_text().splitlines())
    _append(copy / "core" / "io.py", "\n\ndef late():\n    from gna.report import page\n    return page\n")
    _append(copy / "engine" / "ssm.py", "\nfrom ..students import spec  # noqa\n")
    (copy / "extra").mkdir()
    (copy / "extra" / "__init__.py").write_text("from gna.core import io\n")
    found = upward_imports(copy)
    assert f"gna.core.io (line {lines + 4}) imports gna.report.page: layer report is above core" in "\n".join(found)
    assert any(m.startswith("gna.engine.ssm (line") and "gna.students.spec: layer students" in m for m in found)
    assert any(m.startswith("gna.extra: not in a layer") for m in found)
    assert _targets(copy, "gna.engine.ssm") >= {"gna.students.spec"}


def _targets(package: Path, module: str) -> set[str]:
    return {i.imported for i in imports(package) if i.module == module}


def test_a_circle_between_files_is_found(tmp_path):
    copy = _copy(tmp_path)
    _append(copy / "core" / "stats.py", "\nfrom gna.core import io  # noqa\n")
    _append(copy / "core" / "io.py", "\nimport gna.core.stats  # noqa\n")
    assert ["gna.core.io", "gna.core.stats"] in import_cycles(copy)
    assert upward_imports(copy) == []  # same layer: only the circle says so
