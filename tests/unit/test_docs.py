"""The docs name only what exists: links and anchors, make targets, config keys; the README keeps to
its line budget. Each check is also shown failing on a page that breaks it."""

import pytest
from docs_check import (
    README_LINES,
    REPO,
    broken_links,
    make_targets,
    pages,
    schema,
    unknown_config_keys,
    unknown_make_targets,
)


@pytest.mark.parametrize("page", pages(), ids=lambda p: str(p.relative_to(REPO)))
def test_every_page_names_only_what_exists(page):
    assert broken_links(page) == []
    assert unknown_make_targets(page, make_targets()) == []
    assert unknown_config_keys(page, schema()) == []


def test_the_readme_keeps_to_its_line_budget():
    lines = len((REPO / "README.md").read_text().splitlines())
    assert lines <= README_LINES, f"README.md has {lines} lines; move details to docs/"


def test_a_broken_link_an_unknown_target_and_an_unknown_key_are_caught(tmp_path):
    (tmp_path / "docs").mkdir()
    (tmp_path / "docs" / "other.md").write_text("# Other page\n\n## A section\n")
    page = tmp_path / "docs" / "page.md"
    page.write_text(
        "# Page\n\n[fine](other.md#a-section) [gone](missing.md) [bad anchor](other.md#no-such-section)\n"
        "[here](#page) `make test` `make no-such-target` `heads.sweep_n` `heads.no_such_key` "
        "`models.<name>.overrides.heads` `gna.engine.stack`\n"
    )
    assert broken_links(page) == [
        "page.md: missing.md (no such file)",
        "page.md: other.md#no-such-section (no heading #no-such-section there)",
    ]
    assert unknown_make_targets(page, make_targets()) == ["page.md: make no-such-target"]
    assert unknown_config_keys(page, schema()) == ["page.md: `heads.no_such_key`"]
