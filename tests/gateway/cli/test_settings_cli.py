"""``speclane settings``: every setting is described, docs/configuration.md's table is what
``speclane settings --markdown`` prints, and the values it shows never reveal a secret."""

from __future__ import annotations

from pathlib import Path

import pytest

from gateway.cli.main import main
from gateway.cli.settings import BEGIN, END, markdown_table, spliced
from gateway.settings import GROUPS, Settings

PAGE = Path(__file__).parents[3] / "docs" / "configuration.md"


def test_every_setting_says_what_it_does():
    for name, field in Settings.model_fields.items():
        assert field.description and len(field.description) >= 15, name


def test_every_setting_is_in_one_group_and_keeps_its_variable(monkeypatch):
    grouped = [name for group in GROUPS for name in group.model_fields]
    assert sorted(grouped) == sorted(Settings.model_fields) and len(set(grouped)) == len(grouped)
    assert list(Settings.model_fields) == grouped  # listed in the groups' order
    monkeypatch.setenv("SPECLANE_OUTLIER_MAX_EJECTION_S", "12")
    monkeypatch.setenv("SPECLANE_SHADOW_TIMEOUT_S", "7")
    settings = Settings()
    assert settings.outlier_max_ejection_s == 12 and settings.shadow_timeout_s == 7


def test_the_configuration_page_is_current():
    page = PAGE.read_text()
    assert spliced(page) == page, (
        "docs/configuration.md is out of date: "
        "speclane settings --markdown --update docs/configuration.md"
    )
    for name in Settings.model_fields:
        assert f"| `SPECLANE_{name.upper()}` |" in page
    assert "### Client limits\n" in page and "### Shared state\n" in page


def test_markdown_rows(capsys: pytest.CaptureFixture[str]):
    assert main(["settings", "--markdown"]) == 0
    out = capsys.readouterr().out
    assert out == markdown_table()
    assert "| `SPECLANE_DEFAULT_TOP_P` | `1` | the top_p the backends use" in out
    assert "| `SPECLANE_ADMIN_TOKEN` | unset | bearer token for /admin;" in out


def test_values_here_never_show_a_secret(monkeypatch, capsys):
    monkeypatch.setenv("SPECLANE_ADMIN_TOKEN", "s3cret-value")
    monkeypatch.setenv("SPECLANE_PORT", "9123")
    assert main(["settings"]) == 0
    out = capsys.readouterr().out
    assert "s3cret-value" not in out
    lines = {line.split()[0]: line.split(maxsplit=1)[1] for line in out.splitlines()}
    assert lines["SPECLANE_ADMIN_TOKEN"] == "(set)" and lines["SPECLANE_PORT"] == "9123"
    monkeypatch.setenv("SPECLANE_PORT", "eighty")
    assert main(["settings"]) == 2
    assert capsys.readouterr().err.startswith("speclane settings: SPECLANE_PORT: ")


def test_update_splices_the_table_and_refuses_a_page_without_markers(tmp_path, capsys):
    page = tmp_path / "page.md"
    page.write_text(f"# Settings\n\n{BEGIN}\nold\n{END}\n\nafter\n")
    assert main(["settings", "--markdown", "--update", str(page)]) == 0
    assert page.read_text() == f"# Settings\n\n{BEGIN}\n{markdown_table()}{END}\n\nafter\n"
    page.write_text("no markers\n")
    assert main(["settings", "--markdown", "--update", str(page)]) == 1
    assert "has no" in capsys.readouterr().err and page.read_text() == "no markers\n"
