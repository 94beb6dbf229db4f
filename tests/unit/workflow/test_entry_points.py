"""One way in: every workflow script makes one call, run_rule(snakemake, run_<rule>, <Settings>);
every run_<rule> takes (inputs, outputs, settings) with typed settings (no raw dicts); every rule
passes its settings as one param; and no public function of the library takes more than six
parameters."""

import ast
import dataclasses
import importlib
import inspect
import re
import typing
from pathlib import Path

import pytest
from conftest import REPO

from gna.core.settings import RuleSettings

PACKAGE = REPO / "src" / "gna"
SCRIPTS = sorted((REPO / "workflow_scripts").glob("*.py"))
MAX_PARAMETERS = 6


def script_call(script: Path) -> tuple[str, str, str]:
    """(module of run_<rule>, run function, settings class) of a script whose only statement
    besides its docstring and imports is run_rule(snakemake, <run>, <settings>)."""
    tree = ast.parse(script.read_text())
    imported, calls = {}, []
    for node in tree.body:
        if isinstance(node, ast.ImportFrom):
            imported.update({alias.asname or alias.name: node.module for alias in node.names})
        elif isinstance(node, ast.Import) or (isinstance(node, ast.Expr) and isinstance(node.value, ast.Constant)):
            continue
        else:
            calls.append(node)
    assert len(calls) == 1, f"{script.name}: {len(calls)} statements besides imports (one run_rule call expected)"
    call = calls[0].value if isinstance(calls[0], ast.Expr) else None
    assert isinstance(call, ast.Call) and getattr(call.func, "id", None) == "run_rule", (
        f"{script.name}: not run_rule(...)"
    )
    args = [getattr(a, "id", None) for a in call.args]
    assert len(args) == 3 and args[0] == "snakemake" and not call.keywords, (
        f"{script.name}: run_rule(snakemake, run, settings)"
    )
    return imported[args[1]], args[1], imported[args[2]] + "." + args[2]


@pytest.mark.parametrize("script", SCRIPTS, ids=lambda s: s.stem)
def test_every_script_calls_its_rule_function_with_the_one_shape(script):
    module, run, settings = script_call(script)
    assert run == f"run_{script.stem}", f"{script.name} calls {run}, not run_{script.stem}"
    function = getattr(importlib.import_module(module), run)
    assert list(inspect.signature(function).parameters) == ["inputs", "outputs", "settings"], run
    settings_module, settings_name = settings.rsplit(".", 1)
    kind = getattr(importlib.import_module(settings_module), settings_name)
    assert issubclass(kind, RuleSettings) and dataclasses.is_dataclass(kind), (
        f"{settings} is not a RuleSettings dataclass"
    )
    assert typing.get_type_hints(function)["settings"] is kind, f"{run}'s settings are not annotated {settings_name}"
    doc = inspect.getdoc(function) or ""
    assert "inputs" in doc and "outputs" in doc, f"{run}'s docstring names no input and output roles"


def raw_dict_fields(kind, seen=()) -> list[str]:
    """Fields of settings class `kind` (and of the settings classes it holds) typed as a plain dict."""
    found = []
    for name, hint in typing.get_type_hints(kind).items():
        options = (
            typing.get_args(hint)
            if typing.get_origin(hint) in (typing.Union, __import__("types").UnionType)
            else (hint,)
        )
        for option in options:
            if option is dict or typing.get_origin(option) is dict:
                found.append(f"{kind.__name__}.{name}")
            elif dataclasses.is_dataclass(option) and option not in seen:
                found += raw_dict_fields(option, (*seen, kind))
    return found


@pytest.mark.parametrize("script", SCRIPTS, ids=lambda s: s.stem)
def test_rule_settings_are_typed_not_raw_dicts(script):
    settings_module, settings_name = script_call(script)[2].rsplit(".", 1)
    kind = getattr(importlib.import_module(settings_module), settings_name)
    assert raw_dict_fields(kind) == []


def rule_blocks() -> dict[str, str]:
    blocks = {}
    for smk in sorted((REPO / "rules").glob("*.smk")):
        for match in re.finditer(r"^rule (\w+):\n((?:[ \t]+.*\n|[ \t]*\n)*)", smk.read_text(), re.M):
            blocks[match.group(1)] = match.group(2)
    return blocks


def section(block: str, name: str) -> list[str]:
    """The entries (first lines) of section `name` of a rule block."""
    match = re.search(rf"^(\s+){name}:\n((?:\1\s+.*\n|\s*\n)*)", block, re.M)
    if not match:
        return []
    indent = len(match.group(1)) + 4
    return [
        line.strip()
        for line in match.group(2).splitlines()
        if line.strip() and len(line) - len(line.lstrip()) == indent
    ]


def test_every_rule_passes_its_settings_as_one_param_and_names_its_files():
    blocks = rule_blocks()
    assert len(blocks) == len(SCRIPTS)
    for name, block in blocks.items():
        params = [re.match(r"(\w+)=", e).group(1) for e in section(block, "params") if re.match(r"(\w+)=", e)]
        assert sorted(params) in (["code", "settings"], ["code"]), f"rule {name}: params {params}"
        for part in ("input", "output"):
            unnamed = [e for e in section(block, part) if not re.match(r"\*\*|\w+=", e)]
            assert unnamed == [], f"rule {name}: {part} entries without a role name: {unnamed}"


def public_functions(path: Path):
    tree = ast.parse(path.read_text())
    for node in ast.walk(tree):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and not node.name.startswith("_"):
            a = node.args
            names = [x.arg for x in a.posonlyargs + a.args + a.kwonlyargs]
            if names and names[0] in ("self", "cls"):
                names = names[1:]
            yield node.name, node.lineno, names


def test_no_public_function_takes_more_than_six_parameters():
    over = [
        f"{path.relative_to(PACKAGE)}:{line} {name}({', '.join(names)})"
        for path in sorted(PACKAGE.rglob("*.py"))
        for name, line, names in public_functions(path)
        if len(names) > MAX_PARAMETERS
    ]
    assert over == []


def test_the_parameter_count_check_sees_keyword_only_and_method_parameters(tmp_path):
    source = tmp_path / "m.py"
    source.write_text(
        "class A:\n    def f(self, a, b, c, d, e, f, g): ...\n"
        "def g(a, b, c, d, e, f, *, g=1): ...\ndef _h(a, b, c, d, e, f, g): ...\ndef ok(a, b, c, d, e, f): ...\n"
    )
    assert sorted((n, len(p)) for n, _, p in public_functions(source)) == [("f", 7), ("g", 7), ("ok", 6)]
