"""README.md, CHANGELOG.md and docs/*.md hold together: every relative link resolves (the file, and the heading an
``#anchor`` names, by GitHub's anchor rules), every ``ctu …`` command they show parses with ctu's own argument parser
and its config validates (no model is loaded), and ``.ci/run`` runs README's install steps and test command as
written. They read as answers to a user: README within 150 lines, every other page within 300, no paragraph over 8
lines, and no words of the development process (issue numbers, the sessions that measured a figure)."""

from __future__ import annotations

import contextlib
import io
import re
import shlex
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
PAGES = [ROOT / "README.md", ROOT / "CHANGELOG.md", *sorted((ROOT / "docs").glob("*.md"))]
FENCE = re.compile(r"^\s*(```|~~~)(\S*)")
LINK = re.compile(r"!?\[(?:[^\]\\]|\\.)*\]\(\s*<?([^)\s>]+)>?(?:\s+\"[^\"]*\")?\s*\)")
HEADING = re.compile(r"^(#{1,6})\s+(.*?)\s*#*\s*$")
SCHEME = re.compile(r"^[a-zA-Z][a-zA-Z0-9+.-]*:")
PLACEHOLDER = re.compile(r"(?<![\w.])[A-Z][A-Z0-9_]*(?![a-z])|[…<>|]")


def split_page(text: str) -> tuple[list[str], list[tuple[str, str]]]:
    """(prose lines, [(fence language, block text)]) of a markdown page."""
    prose, blocks, lang, block = [], [], None, []
    for line in text.splitlines():
        fence = FENCE.match(line)
        if lang is None and fence:
            lang, block = fence.group(2), []
        elif lang is not None and fence and not fence.group(2):
            blocks.append((lang, "\n".join(block)))
            lang = None
        elif lang is not None:
            block.append(line)
        else:
            prose.append(line)
    assert lang is None, "a code block is not closed"
    return prose, blocks


def without_code_spans(line: str) -> str:
    return re.sub(r"(`+).*?\1", "", line)


def slug(heading: str) -> str:
    """GitHub's anchor for a heading: rendered text, lower case, punctuation dropped, spaces to hyphens."""
    text = re.sub(r"!?\[([^\]]*)\]\([^)]*\)", r"\1", heading).replace("`", "").replace("*", "")
    text = re.sub(r"<[^>]+>", "", text).strip().lower()
    return re.sub(r"[^\w\- ]", "", text).replace(" ", "-")


def anchors(page: Path) -> set[str]:
    prose, _ = split_page(page.read_text(encoding="utf-8"))
    seen: dict[str, int] = {}
    out = set()
    for line in prose:
        found = HEADING.match(line)
        if found:
            base = slug(found.group(2))
            n = seen.get(base, 0)
            seen[base] = n + 1
            out.add(base if n == 0 else f"{base}-{n}")
    return out


def relative_links(page: Path) -> list[str]:
    prose, _ = split_page(page.read_text(encoding="utf-8"))
    return [target for line in prose for target in LINK.findall(without_code_spans(line))
            if not SCHEME.match(target) and not target.startswith("//")]


def broken(page: Path, target: str) -> str | None:
    """Why ``target`` (a link on ``page``) does not resolve, or None."""
    path, _, anchor = target.partition("#")
    dest = (page.parent / path).resolve() if path else page
    if not dest.exists():
        return f"{dest.relative_to(ROOT) if dest.is_relative_to(ROOT) else dest} does not exist"
    if anchor:
        if dest.suffix != ".md":
            return f"#{anchor} on a file that is not markdown"
        if anchor not in anchors(dest):
            return f"{dest.name} has no heading #{anchor}"
    return None


def shown_commands(page: Path) -> list[list[str]]:
    """``ctu …`` commands in the page's shell code blocks (continuation lines joined, comments dropped), and in
    inline code spans that name a config or an override and hold no placeholder (``CONFIG``, ``…``, ``<x>``)."""
    prose, blocks = split_page(page.read_text(encoding="utf-8"))
    lines = [ln for lang, text in blocks if lang in ("", "bash", "sh", "shell", "console")
             for ln in text.replace("\\\n", " ").splitlines()]
    spans = [s for line in prose for s in re.findall(r"`([^`]+)`", line)]
    lines += [s for s in spans if s.startswith("ctu ") and ("configs/" in s or "=" in s) and not PLACEHOLDER.search(s)]
    out = []
    for line in lines:
        line = line.strip().removeprefix("$ ")
        if line.startswith("ctu "):
            out.append(shlex.split(line, comments=True)[1:])
    return out


def parse_problem(argv: list[str]) -> str | None:
    """Why ``ctu argv`` would not start (argparse's or config validation's message), or None."""
    from ctu.app.cli import _load, build_parser

    err = io.StringIO()
    try:
        with contextlib.redirect_stderr(err):
            args = build_parser().parse_args(argv)
        if args.command in ("train", "eval", "plan", "play"):
            _load(args)
    except SystemExit as exc:
        return (err.getvalue().strip().splitlines() or [str(exc.code)])[-1]
    return None


def all_links() -> list[tuple[str, str]]:
    return [(page.relative_to(ROOT).as_posix(), target) for page in PAGES for target in relative_links(page)]


def all_commands() -> list[tuple[str, list[str]]]:
    return [(page.relative_to(ROOT).as_posix(), argv) for page in PAGES for argv in shown_commands(page)]


def test_the_docs_exist_link_each_other_and_show_commands():
    names = {p.name for p in PAGES}
    assert "README.md" in names and len(PAGES) >= 8
    linked = {(ROOT / page).parent.joinpath(t.partition("#")[0]).resolve() for page, t in all_links() if t[0] != "#"}
    unlinked = [p.relative_to(ROOT).as_posix() for p in PAGES[1:] if p.resolve() not in linked]
    assert not unlinked, f"docs pages no page links to: {unlinked}"
    assert len(all_commands()) >= 20


@pytest.mark.parametrize(("page", "target"), all_links(), ids=lambda v: v if isinstance(v, str) else None)
def test_every_relative_link_resolves(page, target):
    problem = broken(ROOT / page, target)
    assert problem is None, f"{page}: link ({target}): {problem}"


def written_before(page: str, argv: list[str]) -> list[str]:
    """What the commands shown before ``argv`` on ``page`` write (their ``--out``): a later command may read it."""
    shown = [a for p, a in all_commands() if p == page]
    return [a[i + 1] for a in shown[:shown.index(argv)] for i, token in enumerate(a[:-1]) if token == "--out"]


def output_not_there_yet(problem: str, written: list[str]) -> bool:
    missing = re.search(r"(\S+) does not exist", problem)
    return bool(missing) and any(missing.group(1).startswith(out) for out in written)


@pytest.mark.parametrize(("page", "argv"), all_commands(), ids=lambda v: " ".join(v) if isinstance(v, list) else v)
def test_every_shown_ctu_command_parses_and_its_config_validates(page, argv, monkeypatch):
    monkeypatch.chdir(ROOT)  # commands are shown run from the repository root
    problem = parse_problem(argv)
    if problem and output_not_there_yet(problem, written_before(page, argv)):
        problem = None  # e.g. the tasks file `ctu data import` wrote just above it
    assert problem is None, f"{page}: `ctu {shlex.join(argv)}`: {problem}"


def test_a_broken_link_an_unknown_anchor_and_a_bad_command_are_caught(tmp_path):
    page = tmp_path / "page.md"
    (tmp_path / "other.md").write_text("# Other page\n\n## Train with TRL, verl or SkyRL\n\n## `ctu score`: input\n")
    page.write_text("# Title\n\n```bash\n# [not](a link.md)\nctu train configs/quickstart.yaml \\\n    trainer.nope=1\n"
                    "```\n\n[a](other.md#train-with-trl-verl-or-skyrl) [b](other.md#ctu-score-input) [c](#title)\n"
                    "[d](missing.md) [e](other.md#nowhere) `[f](in-code.md)` [g](https://example.com/x.md)\n")
    assert relative_links(page) == ["other.md#train-with-trl-verl-or-skyrl", "other.md#ctu-score-input", "#title",
                                    "missing.md", "other.md#nowhere"]
    assert [broken(page, t) for t in relative_links(page)][:3] == [None, None, None]
    assert "missing.md does not exist" in broken(page, "missing.md")
    assert broken(page, "other.md#nowhere") == "other.md has no heading #nowhere"
    assert shown_commands(page) == [["train", "configs/quickstart.yaml", "trainer.nope=1"]]
    assert "trainer.nope" in parse_problem(["train", "configs/quickstart.yaml", "trainer.nope=1"])
    assert "invalid choice" in parse_problem(["play", "--domain", "nowhere", "--task", "x"])
    missing = parse_problem(["train", "configs/quickstart.yaml", "env.tasks.mini=out/mini/tasks.json"])
    assert output_not_there_yet(missing, ["out"]) and not output_not_there_yet(missing, ["elsewhere"])


def test_github_anchor_rules():
    assert slug("Datasets in and out (`ctu data`)") == "datasets-in-and-out-ctu-data"
    assert slug("tau2 as a live oracle (`nox -s oracle`)") == "tau2-as-a-live-oracle-nox--s-oracle"
    assert slug("Precision and RL's gain (issue 30)") == "precision-and-rls-gain-issue-30"
    assert slug("Real vLLM on CPU (`nox -s vllm_cpu`)") == "real-vllm-on-cpu-nox--s-vllm_cpu"


def readme_blocks() -> list[str]:
    _, blocks = split_page((ROOT / "README.md").read_text(encoding="utf-8"))
    return [text.strip() for lang, text in blocks if lang == "bash"]


def test_ci_runs_readmes_install_steps_and_its_test_command_as_written():
    install, test_command = readme_blocks()[:2]
    ci = (ROOT / ".ci" / "run").read_text(encoding="utf-8").splitlines()
    assert test_command in ci, f".ci/run does not run README's test command: {test_command}"
    steps = [s for s in install.split(" && ")
             if s not in ("python3 -m venv .venv", ". .venv/bin/activate") and not s.startswith("ctu ")]
    ci_install = next(ln for ln in ci if "pip install -q torch" in ln).split(" || ")[0]
    assert [s.replace(" -q", "") for s in ci_install.split(" && ")] == steps
    assert install.endswith("&& ctu train configs/quickstart.yaml")


# -- how the pages read: short, and in the words of a user, not of the work that produced them -----------------
README_MAX_LINES = 150
PAGE_MAX_LINES = 300
PARAGRAPH_MAX_LINES = 8  # lines of 120 characters: a long line counts as the lines it would wrap to
WRAP = 120
# words of the development process: issue numbers, the sessions that measured a figure, a device lent to one
PROCESS_WORDS = re.compile(
    r"\bissues? #?\d+|\bthe issue's\b|\b(?:this|that|a later|an earlier|earlier|later|previous|next|same|two|one) sessions?\b"
    r"|\bsession's (?:end|time|device|GPU|machine|H100|H200)\b|\bthis stop\b|\blent to\b|\bthis task's device\b",
    re.IGNORECASE)


def paragraphs(text: str) -> list[list[str]]:
    """Runs of consecutive prose lines: blank lines, headings, tables, list items (and their indented
    continuations), quotes and code blocks end a run and are not part of one."""
    out: list[list[str]] = []
    run: list[str] = []
    in_code = False
    for line in text.splitlines():
        fence = FENCE.match(line)
        stripped = line.strip()
        ends = (fence or in_code or not stripped or line.startswith((" ", "\t")) or stripped.startswith(("#", "|", ">"))
                or re.match(r"^([-*+]|\d+[.)])\s", stripped))
        if fence:
            in_code = not in_code
        if ends:
            if run:
                out.append(run)
            run = []
        else:
            run.append(line)
    if run:
        out.append(run)
    return out


def wrapped_lines(paragraph: list[str]) -> int:
    return sum(max(1, -(-len(line) // WRAP)) for line in paragraph)


def test_readme_and_every_docs_page_are_short():
    readme = len((ROOT / "README.md").read_text(encoding="utf-8").splitlines())
    assert readme <= README_MAX_LINES, f"README.md has {readme} lines (at most {README_MAX_LINES})"
    long = {p.relative_to(ROOT).as_posix(): n for p in PAGES
            if (n := len(p.read_text(encoding="utf-8").splitlines())) > PAGE_MAX_LINES}
    assert not long, f"pages over {PAGE_MAX_LINES} lines (split them by the question each part answers): {long}"


@pytest.mark.parametrize("page", PAGES, ids=lambda p: p.relative_to(ROOT).as_posix())
def test_no_paragraph_runs_over_eight_lines(page):
    long = [f"{wrapped_lines(p)} lines: {p[0][:70]}…" for p in paragraphs(page.read_text(encoding="utf-8"))
            if wrapped_lines(p) > PARAGRAPH_MAX_LINES]
    assert not long, f"{page.name}: paragraphs over {PARAGRAPH_MAX_LINES} lines of {WRAP}:\n" + "\n".join(long)


@pytest.mark.parametrize("page", PAGES, ids=lambda p: p.relative_to(ROOT).as_posix())
def test_no_page_speaks_of_the_development_process(page):
    found = [f"{i}: {m.group(0)!r}" for i, line in enumerate(page.read_text(encoding="utf-8").splitlines(), 1)
             for m in PROCESS_WORDS.finditer(line)]
    assert not found, f"{page.name} names issues or the sessions that did the work (say what and when instead):\n" \
        + "\n".join(found)


def test_the_reading_checks_see_long_paragraphs_and_process_words():
    text = "Intro line.\n" * 9 + "\n- a list item\n  continued\n\n| a | table |\n\n```\ncode\n```\nshort\n" + "x" * 250
    runs = paragraphs(text)
    assert [wrapped_lines(r) for r in runs] == [9, 4]
    assert paragraphs("- item\n  more\n\n  indented\n") == []
    for bad in ("measured in issue 30", "a later session found", "this session's machine", "lent to an earlier",
                "before this stop's heap trim", "Issue #12", "the issue's target"):
        assert PROCESS_WORDS.search(bad), bad
    for fine in ("nox sessions: lint, unit", "the nox session installs", "a user simulator with slow sessions",
                 "tissue 3"):
        assert not PROCESS_WORDS.search(fine), fine
