"""What the docs name must exist: relative links (and their #anchors), `make` targets, and config keys
written `section.key` (checked against config/schema.yaml); the README keeps to its line budget.
tests/unit/test_docs.py runs these on every Markdown page of the repository."""

from __future__ import annotations

import re
from pathlib import Path

import yaml

REPO = Path(__file__).resolve().parents[1]
README_LINES = 200
LINK = re.compile(r"(?<!!)\[[^\]]*\]\(([^)\s]+)\)|!\[[^\]]*\]\(([^)\s]+)\)")
CODE = re.compile(r"`([^`\n]+)`")
FILE_SUFFIXES = {"smk", "py", "yaml", "yml", "json", "md", "parquet", "csv", "html", "png", "tsv", "txt", "safetensors"}
KEY = re.compile(r"[a-z_][a-z0-9_]*(?:\.(?:[a-z_][a-z0-9_]*|<name>))+")


def pages(repo: Path = REPO) -> list[Path]:
    """The Markdown pages a reader opens: the README and everything under docs/."""
    return [repo / "README.md", *sorted((repo / "docs").rglob("*.md"))]


def slug(heading: str) -> str:
    """A heading's anchor as GitHub writes it: lower case, punctuation dropped, spaces to hyphens."""
    text = re.sub(r"[`*]", "", heading.strip().lower())
    return re.sub(r"[^\w\- ]", "", text).replace(" ", "-")


def anchors(page: Path) -> set[str]:
    out, seen, fenced = set(), {}, False
    for line in page.read_text().splitlines():
        if line.startswith("```"):
            fenced = not fenced
        elif not fenced and (match := re.match(r"#+\s+(.*)", line)):
            base = slug(match.group(1))
            count = seen.get(base, 0)
            seen[base] = count + 1
            out.add(base if count == 0 else f"{base}-{count}")
    return out


def _prose(text: str) -> str:
    """`text` without its fenced code blocks (shell examples name paths that a reader creates)."""
    return re.sub(r"^```.*?^```", "", text, flags=re.S | re.M)


def broken_links(page: Path) -> list[str]:
    """Each relative link of `page` whose file does not exist, or whose #anchor is no heading there."""
    out = []
    for match in LINK.finditer(_prose(page.read_text())):
        target = match.group(1) or match.group(2)
        if re.match(r"[a-z]+:", target):
            continue  # http, https, mailto: not checked offline
        path, _, anchor = target.partition("#")
        file = (page.parent / path).resolve() if path else page
        if not file.exists():
            out.append(f"{page.name}: {target} (no such file)")
        elif anchor and file.suffix == ".md" and anchor not in anchors(file):
            out.append(f"{page.name}: {target} (no heading #{anchor} there)")
    return out


def make_targets(makefile: Path = REPO / "Makefile") -> set[str]:
    return {m.group(1) for m in re.finditer(r"^([A-Za-z][\w.-]*)\s*:(?!=)", makefile.read_text(), re.M)}


def unknown_make_targets(page: Path, targets: set[str]) -> list[str]:
    """Each `make X` (in backticks, or at a line's start in a code block) whose target X the Makefile lacks."""
    text = page.read_text()
    blocks = "\n".join(re.findall(r"^```.*?^```", text, flags=re.S | re.M))
    named = re.findall(r"`make\s+([a-z][\w-]*)", text) + re.findall(r"^\s*make\s+([a-z][\w-]*)", blocks, re.M)
    return [f"{page.name}: make {t}" for t in named if t not in targets]


def _has(node: dict, parts: list[str], defs: dict) -> bool:
    """Whether the JSON schema `node` has the key path `parts` ('<name>' for any key of a mapping)."""
    if "$ref" in node:
        node = defs[node["$ref"].rsplit("/", 1)[1]]
    if not parts:
        return True
    branches = node.get("oneOf", []) + node.get("anyOf", []) + node.get("allOf", [])
    for branch in branches + [b[c] for b in (node, *branches) for c in ("then", "else") if c in b]:
        if _has(branch, parts, defs):
            return True
    if node.get("type") == "array" and isinstance(node.get("items"), dict):
        return _has(node["items"], parts, defs)
    head, rest = parts[0], parts[1:]
    if head in node.get("properties", {}):
        return _has(node["properties"][head], rest, defs)
    extra = node.get("additionalProperties")
    return isinstance(extra, dict) and _has(extra, rest, defs)


def unknown_config_keys(page: Path, schema: dict) -> list[str]:
    """Each backticked `section.key` whose section is a top-level config section and whose path the
    schema lacks (module names, file names and the like start with no config section)."""
    sections, defs = schema["properties"], schema.get("$defs", {})
    packages = {p.name for p in (REPO / "src" / "gna").iterdir() if p.is_dir()}  # gna.engine.… is code, not `gna`
    out = []
    for code in CODE.findall(page.read_text()):
        for key in KEY.fullmatch(code.strip()) and [code.strip()] or []:
            parts = key.split(".")
            if parts[-1] in FILE_SUFFIXES:  # a file name (`heads.smk`), not a key
                continue
            if (
                parts[0] in sections
                and not (parts[0] == "gna" and parts[1] in packages)
                and not _has(schema, parts, defs)
            ):
                out.append(f"{page.name}: `{key}`")
    return out


def schema(repo: Path = REPO) -> dict:
    return yaml.safe_load((repo / "config" / "schema.yaml").read_text())
