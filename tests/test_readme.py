"""The README reads in a minute, its links and the docs' links resolve, and its quick start runs."""

from __future__ import annotations

import re
import subprocess
import textwrap
from pathlib import Path

from integration_support import PYTHON, REPO, children, monitor_roots, step_roots, subprocess_env
from otlp_receivers import GrpcOtlpReceiver

README = REPO / "README.md"
DOCS = REPO / "docs"

FIRST_COMMAND_MAX_LINE = 25
MAX_LINE_CHARS = 200
MAX_WORDS = 1500

# Markdown links and images: [text](target) and ![alt](target).
LINK = re.compile(r"!?\[[^\]]*\]\(([^)\s]+)\)")

# What the quick start leaves to the reader: a model, an optimizer, a loader, an eval.
QUICK_START_FIXTURES = textwrap.dedent("""\
    import torch

    torch.manual_seed(0)
    model_net = torch.nn.Linear(8, 1)
    def model(batch):
        return model_net(batch).pow(2).mean()
    opt = torch.optim.SGD(model_net.parameters(), lr=0.01)
    train_loader = [torch.randn(4, 8) for _ in range(5)]
    def evaluate(m):
        with torch.no_grad():
            m(torch.randn(4, 8))
    """)


def _lines() -> list[str]:
    return README.read_text().splitlines()


def _code_blocks(text: str, language: str) -> list[str]:
    return re.findall(rf"^```{language}\n(.*?)^```", text, re.S | re.M)


def test_the_first_command_comes_within_the_first_screen() -> None:
    first = next(i for i, line in enumerate(_lines(), 1) if line.strip() == "```bash")
    assert first <= FIRST_COMMAND_MAX_LINE, f"the first ```bash block starts at line {first}"


def test_the_set_up_and_test_commands_are_there_as_they_are() -> None:
    commands = [c.strip() for c in _code_blocks(README.read_text(), "bash")]
    assert commands[0] == ("python3 -m venv .venv && .venv/bin/pip install torch==2.13.0 numpy "
                           "-e '.[report]' && .venv/bin/otel-train demo")
    assert "make test" in commands


def test_no_line_is_longer_than_a_screen() -> None:
    long = [(i, len(line)) for i, line in enumerate(_lines(), 1) if len(line) > MAX_LINE_CHARS]
    assert not long, f"lines over {MAX_LINE_CHARS} characters (line, length): {long}"


def test_the_readme_is_under_its_word_budget() -> None:
    words = len(README.read_text().split())
    assert words < MAX_WORDS, f"README.md has {words} words"


def test_the_first_screen_shows_the_report_screenshot() -> None:
    head = "\n".join(_lines()[:FIRST_COMMAND_MAX_LINE])
    images = re.findall(r"!\[[^\]]*\]\(([^)\s]+)\)", head)
    assert images, "no image in the README's first screen"
    for target in images:
        assert (README.parent / target).is_file(), f"the image {target} does not exist"


def _relative_links(page: Path) -> list[str]:
    text = page.read_text()
    # Code blocks hold commands and paths, not links.
    text = re.sub(r"^```.*?^```", "", text, flags=re.S | re.M)
    return [t for t in LINK.findall(text)
            if not re.match(r"[a-z]+:", t) and not t.startswith("#")]


def test_every_relative_link_in_the_readme_and_docs_points_at_a_file() -> None:
    pages = [README, *sorted(DOCS.glob("*.md"))]
    broken = [f"{page.relative_to(REPO)} -> {target}"
              for page in pages for target in _relative_links(page)
              if not (page.parent / target.split("#")[0]).exists()]
    assert not broken, "broken links:\n" + "\n".join(broken)
    assert len(_relative_links(README)) >= 10, "the README should link its reference pages"


def test_the_link_check_catches_a_missing_file(tmp_path) -> None:
    page = tmp_path / "page.md"
    page.write_text("[there](page.md) [gone](nowhere.md) [web](https://example.com)\n"
                    "```\n[in code](ignored.md)\n```\n")
    assert _relative_links(page) == ["page.md", "nowhere.md"]
    assert not (tmp_path / "nowhere.md").exists()


def test_the_quick_start_runs_and_exports_its_steps(tmp_path) -> None:
    quick_start = _code_blocks(README.read_text(), "python")[0]
    assert "start_run" in quick_start
    script = tmp_path / "quick_start.py"
    script.write_text(QUICK_START_FIXTURES + "\n" + quick_start)
    with GrpcOtlpReceiver() as recv:
        # A free metrics port (0), not the fixed 9464; the run directory under tmp_path.
        env = subprocess_env(recv, tmp_path, OTEL_TRAIN_PROMETHEUS_PORT="0")
        proc = subprocess.run([PYTHON, str(script)], env=env, capture_output=True, text=True,
                              timeout=120, cwd=tmp_path)
        assert proc.returncode == 0, proc.stderr[-3000:]
        spans = recv.spans()
    roots = step_roots(spans)
    assert sorted(roots) == [0, 1, 2, 3, 4]
    assert [s.name for s in children(spans, roots[0])] == [
        "data", "forward", "backward", "optimizer", "val_loss"]
    assert [s.name for s in children(spans, roots[1])] == [
        "data", "forward", "backward", "optimizer"]
    assert not monitor_roots(spans)
    assert "val_loss" in proc.stdout  # the costs table printed at the end


def test_the_readmes_cost_ratios_and_shares_agree_and_name_their_estimator() -> None:
    text = " ".join((Path(__file__).resolve().parents[1] / "README.md").read_text().split())
    medians = re.findall(r"\*\*(\d\.\d+)x\*\*", text)
    assert medians == ["1.044", "1.006"]
    assert "Those ratios are the median pair's" in text
    geometric = re.search(r"geometric mean ratio, (\d\.\d+)x and (\d\.\d+)x", text)
    shares = re.search(r"(\d\.\d)% \[[\d., ]+\] and (\d\.\d)% \[[\d., ]+\], and the run "
                       r"reports", text)
    assert geometric and shares
    for ratio, share in zip(geometric.groups(), shares.groups()):
        assert abs(100 * (1 - 1 / float(ratio)) - float(share)) < 0.06, (ratio, share)
