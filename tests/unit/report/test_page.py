"""The report page (gna.report.page): every section renders through a module the report script
imports."""

from pathlib import Path

from conftest import REPO

from gna.core.provenance import import_closure
from gna.report.page import render_function
from gna.report.registry import SECTIONS


def test_every_section_renders_through_a_module_the_report_script_imports():
    closure = set(import_closure(REPO / "workflow_scripts" / "report.py"))
    for section in SECTIONS:
        render = render_function(section)
        assert callable(render)
        assert Path(render.__code__.co_filename).resolve() in {p.resolve() for p in closure}, section.name
