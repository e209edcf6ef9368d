"""docs/options.md is the generator's output, and the generator covers every RunOptions field."""

from __future__ import annotations

import dataclasses
import subprocess
import sys
from pathlib import Path

import pytest

from otel_train.common import options_doc
from otel_train.common.options import RunOptions

REPO = Path(__file__).resolve().parents[2]
PAGE = REPO / "docs" / "options.md"


def _fields() -> list[dataclasses.Field]:
    return [f for f in dataclasses.fields(RunOptions) if f.name != "sources"]


def _row(page: str, name: str) -> str:
    rows = [line for line in page.splitlines() if line.startswith(f"| `{name}` |")]
    assert len(rows) == 1, f"option {name} has {len(rows)} rows on the page"
    return rows[0]


def test_the_committed_page_is_what_the_generator_renders() -> None:
    assert PAGE.read_text() == options_doc.render_options_page(), (
        "docs/options.md is stale: run `python -m otel_train.common.options_doc > "
        "docs/options.md` (or `make docs`)")


def test_every_option_is_on_the_page_with_its_variable_and_default() -> None:
    page = PAGE.read_text()
    for f in _fields():
        row = _row(page, f.name)
        assert f"`OTEL_TRAIN_{f.name.upper()}`" in row
        if f.default is not options_doc.DEFAULT:
            assert f"`{f.default!r}`" in row, f"{f.name}: default {f.default!r} not shown"
    assert "`9464` + local rank" in _row(page, "prometheus_port")
    assert "`0.05`" in _row(page, "budget")


def test_the_module_run_as_a_script_prints_the_page() -> None:
    proc = subprocess.run([sys.executable, "-m", "otel_train.common.options_doc"],
                          capture_output=True, text=True, cwd=REPO, timeout=60)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout == options_doc.render_options_page()


def test_a_field_without_a_description_fails_the_generator(monkeypatch) -> None:
    docs = dict(options_doc.OPTION_DOCS)
    del docs["budget"]
    monkeypatch.setattr(options_doc, "OPTION_DOCS", docs)
    with pytest.raises(ValueError, match=r"no description for \['budget'\]"):
        options_doc.render_options_page()


def test_a_description_that_names_no_field_fails_the_generator(monkeypatch) -> None:
    docs = dict(options_doc.OPTION_DOCS)
    docs["budgett"] = options_doc.OptionDoc("budget", "a typo")
    monkeypatch.setattr(options_doc, "OPTION_DOCS", docs)
    with pytest.raises(ValueError, match=r"no field for \['budgett'\]"):
        options_doc.render_options_page()


def test_a_description_in_an_unknown_section_fails_the_generator(monkeypatch) -> None:
    docs = dict(options_doc.OPTION_DOCS)
    docs["budget"] = dataclasses.replace(docs["budget"], section="nowhere")
    monkeypatch.setattr(options_doc, "OPTION_DOCS", docs)
    with pytest.raises(ValueError, match=r"unknown section for \['budget'\]"):
        options_doc.render_options_page()


def test_sizes_in_bytes_are_also_shown_in_mebibytes() -> None:
    assert "`268435456` (256 MiB)" in _row(PAGE.read_text(), "spans_file_max_bytes")
