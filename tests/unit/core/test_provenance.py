"""Computed code fingerprints: a rule's fingerprint covers its script and exactly the gna modules
it imports, directly or through other gna modules, and every rule has its own script."""

import re
from pathlib import Path

import pytest
from conftest import REPO

from gna.core.provenance import import_closure, script_fingerprint

PACKAGE = REPO / "src" / "gna"
SCRIPTS = sorted((REPO / "workflow_scripts").glob("*.py"))

# a gna-like package: an import inside a function, a submodule named in `from gna.x import y`,
# a relative import, a function imported by name, and modules no one imports
FAKE_PACKAGE = {
    "__init__.py": "__version__ = '0'\n",
    "engine/__init__.py": "",
    "engine/stack.py": "import numpy\nfrom gna import packing\nfrom gna.packing import pack\n",
    "engine/helpers.py": "from . import consts\n",
    "engine/consts.py": "SIZE = 1\n",
    "packing.py": "def pack():\n    from gna.engine import helpers\n    return helpers\n",
    "report.py": "from gna.engine.stack import pack\n",
    "unused.py": "import gna.report\n",
}
FAKE_SCRIPT = "import polars\nfrom gna.engine import stack\n"
FAKE_CLOSURE = {
    "__init__.py",
    "engine/__init__.py",
    "engine/stack.py",
    "engine/helpers.py",
    "engine/consts.py",
    "packing.py",
}


@pytest.fixture
def fake(tmp_path):
    """(script, package dir) of a small gna-like package written to tmp_path."""
    package = tmp_path / "src" / "gna"
    for name, source in FAKE_PACKAGE.items():
        (package / name).parent.mkdir(parents=True, exist_ok=True)
        (package / name).write_text(source)
    script = tmp_path / "script.py"
    script.write_text(FAKE_SCRIPT)
    return script, package


def test_import_closure_is_the_transitive_closure(fake):
    script, package = fake
    closure = import_closure(script, package)
    assert {p.relative_to(package).as_posix() for p in closure} == FAKE_CLOSURE
    assert closure == sorted(closure)


@pytest.mark.parametrize("name", sorted(FAKE_PACKAGE))
def test_fingerprint_follows_exactly_the_closure(fake, name):
    script, package = fake
    before = script_fingerprint(script, package)
    assert script_fingerprint(script, package) == before
    with (package / name).open("a") as module:
        module.write("EDITED = 1\n")
    assert (script_fingerprint(script, package) != before) == (name in FAKE_CLOSURE)


def test_comments_and_docstrings_change_no_fingerprint_code_does(fake):
    """Fingerprints follow what Python runs: a comment or a docstring (module, class, function) is
    no change; a string that is not a docstring, a renamed argument or a changed constant is."""
    script, package = fake
    module = package / "packing.py"
    box = 'class Box:\n    """A box."""\n\n    def pack(self, x):\n        {body}\n'
    module.write_text('"""Packing."""\n\n\n' + box.format(body="return x + 1"))
    before = script_fingerprint(script, package)
    for unchanged in (
        '"""Packing, documented anew."""\n# a comment\n' + box.format(body='"""Pack."""\n        return x + 1  # why'),
        box.replace('    """A box."""\n\n', "").format(body="return x + 1"),
    ):
        module.write_text(unchanged)
        assert script_fingerprint(script, package) == before, unchanged
    for changed in (
        box.format(body="return x + 2"),
        box.replace("(self, x)", "(self, y)").format(body="return y + 1"),
        box.format(body='x = x\n        "a string after code"\n        return x + 1'),
    ):
        module.write_text(changed)
        assert script_fingerprint(script, package) != before, changed


def test_fingerprint_follows_the_script(fake):
    script, package = fake
    before = script_fingerprint(script, package)
    script.write_text(FAKE_SCRIPT + "# edited\n")
    assert script_fingerprint(script, package) != before


def module(name: str) -> Path:
    """The one gna module file called `name`.py, wherever the layout puts it."""
    found = list(PACKAGE.rglob(f"{name}.py"))
    assert len(found) == 1, f"expected one gna module {name}.py, found {found}"
    return found[0]


def scripts_importing(modules: set[Path]) -> set[str]:
    """Names of the workflow scripts whose import closure holds any of `modules`."""
    return {s.stem for s in SCRIPTS if modules & set(import_closure(s, PACKAGE))}


def test_only_the_report_imports_report_modules():
    report_modules = {
        p
        for p in PACKAGE.rglob("*.py")
        if p.relative_to(PACKAGE).parts[0].startswith("report") or p.name == "htmlkit.py"
    }
    assert report_modules
    assert scripts_importing(report_modules) == {"report"}


def test_only_the_rules_that_run_students_depend_on_the_students_code():
    """A change to the students' code reruns the students, G&A (which runs on students too; the case
    study's G&A step with it) and the report — never the model, the baseline, the head sweep, pruning or
    the case study's other steps."""
    students = set((PACKAGE / "students").glob("*.py")) | {module("ssm")}
    assert scripts_importing(students) == {
        s.stem for s in SCRIPTS if s.stem.startswith(("distill_", "hybrid_", "gna_"))
    } | {"report", "case_gna"}


def test_only_the_head_sweep_and_attribution_run_head_ablation():
    assert scripts_importing({module("head_ablation")}) == {"heads_sweep", "heads_attribution"}


@pytest.mark.slow
def test_every_script_that_scores_covers_the_engine():
    scoring = scripts_importing({module("scoring")})
    assert "baseline" in scoring
    for script in sorted(scoring):
        closure = set(import_closure(REPO / "workflow_scripts" / f"{script}.py", PACKAGE))
        assert {module("stack"), module("packing")} <= closure, script


def rule_blocks() -> dict[str, str]:
    """{rule name: its text} for every rule in rules/*.smk (a block ends at the next top-level line)."""
    blocks = {}
    for smk in sorted((REPO / "rules").glob("*.smk")):
        for match in re.finditer(r"^rule (\w+):\n((?:[ \t]+.*\n|[ \t]*\n)*)", smk.read_text(), re.M):
            assert match.group(1) not in blocks, f"rule {match.group(1)} defined twice"
            blocks[match.group(1)] = match.group(2)
    return blocks


def test_every_rule_runs_its_own_script_with_its_fingerprint():
    blocks = rule_blocks()
    assert "baseline" in blocks and "report" in blocks
    for name, block in blocks.items():
        assert re.findall(r'^\s*script:\s*"([^"]+)"', block, re.M) == [f"../workflow_scripts/{name}.py"], name
        assert re.findall(r"^\s*code=(.*?),?\s*$", block, re.M) == [f'code_of("{name}")'], name


def test_every_script_belongs_to_exactly_one_rule():
    assert {s.stem for s in SCRIPTS} == set(rule_blocks())
