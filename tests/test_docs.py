"""The README and docs/ stay what a newcomer can use: a short README with exactly two set-up
commands, every README block either run by the newcomer test or marked ``{not-run}``, one
table of contents per page that matches its sections, and links that lead somewhere."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from tests.integration.test_newcomer import blocks, quick_start

ROOT = Path(__file__).parent.parent
README = ROOT / "README.md"
PAGES = sorted((ROOT / "docs").glob("*.md"))
LINK = re.compile(r"\]\(([^)\s]+)\)")


def prose(text: str) -> str:
    """The text without its fenced blocks (whose lines may look like headings or links)."""
    return re.sub(r"^```.*?^```[^\n]*$", "", text, flags=re.S | re.M)


def anchor(heading: str) -> str:
    """GitHub's anchor for a heading: lower case, punctuation dropped, spaces to hyphens."""
    return re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")


def headings(text: str, level: str = "## ") -> list[str]:
    return [line[len(level) :] for line in prose(text).splitlines() if line.startswith(level)]


def test_the_readme_is_short_and_names_exactly_two_set_up_commands():
    text = README.read_text()
    assert len(text.splitlines()) <= 200
    section = text.split("## Set-up: two commands", 1)[1].split("\n## ", 1)[0]
    [block] = blocks(section)
    commands = [line.split("#")[0].strip() for line in block.text.splitlines() if line.strip()]
    assert commands == ["make demo", "make check"]
    for step in ("pip install", "speclane init", "speclane serve", "curl", "from openai"):
        assert step in text, step


def test_every_readme_block_is_run_by_the_newcomer_test_or_marked():
    found = blocks(README.read_text())
    run = quick_start(README.read_text())
    assert run, "the newcomer test runs nothing"
    for block in found:
        if block.marked:
            continue
        assert block in run and block.lang in ("sh", "python"), (
            f"README.md:{block.line}: a ```{block.lang} block the newcomer test cannot run; "
            "mark it ```" + block.lang + " {not-run}"
        )
    assert [b.lang for b in found if b.marked]  # the vLLM commands, at least, are not run


@pytest.mark.parametrize("page", PAGES, ids=lambda p: p.name)
def test_each_page_has_a_title_and_a_table_of_contents_that_matches(page):
    text = page.read_text()
    assert text.startswith("# ")
    sections = [h for h in headings(text) if h != "Contents"]
    contents = prose(text).split("## Contents", 1)[1].split("\n## ", 1)[0]
    listed = re.findall(r"^- \[(.+)\]\(#([^)]+)\)$", contents, flags=re.M)
    assert [title for title, _ in listed] == sections
    assert [target for _, target in listed] == [anchor(h) for h in sections]


@pytest.mark.parametrize("page", [README, *PAGES], ids=lambda p: p.name)
def test_links_lead_to_files_and_sections_that_exist(page):
    for link in LINK.findall(prose(page.read_text())):
        if re.match(r"[a-z]+:", link):
            continue
        target, _, section = link.partition("#")
        path = (page.parent / target).resolve() if target else page
        assert path.exists(), f"{page.name}: {link}"
        if section and path.suffix == ".md":
            text = path.read_text()
            found = [anchor(h) for level in ("# ", "## ", "### ") for h in headings(text, level)]
            assert section in found, f"{page.name}: {link}"


def test_the_pages_a_starter_policy_and_the_readme_name_exist():
    for name in ("policy", "measuring", "guardrail", "operations", "observability"):
        assert (ROOT / "docs" / f"{name}.md").exists()
    for name in ("configuration", "deployment", "development", "benchmarks"):
        assert (ROOT / "docs" / f"{name}.md").exists()


CLIENT = re.compile(r"(?:OpenAI|Anthropic)\(\s*base_url=[^)]*\)", re.S)


@pytest.mark.parametrize("page", [README, *PAGES], ids=lambda p: p.name)
def test_every_client_shown_has_its_api_key(page):
    """openai's and anthropic's clients refuse to start without a key (or its variable)."""
    for call in CLIENT.findall(page.read_text().replace("`", "")):
        assert "api_key=" in call, f"{page.name}: {call}"


def test_claude_code_is_pointed_at_the_served_model_for_its_background_requests():
    text = (ROOT / "docs" / "agents.md").read_text()
    for variable in (
        "ANTHROPIC_DEFAULT_HAIKU_MODEL=Qwen/Qwen3-8B",
        "ANTHROPIC_SMALL_FAST_MODEL=Qwen/Qwen3-8B",
        "CLAUDE_CODE_MAX_OUTPUT_TOKENS=",
    ):
        assert variable in text
