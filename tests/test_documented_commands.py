"""What the README and docs/ show a reader still works: every documented script answers
`--help`, every relative link finds its file (and its heading), every Python file named in
code is where the pages say. A file moved or a heading renamed fails here, not for a reader."""

from __future__ import annotations

import os
import re
import subprocess
import sys
import unicodedata
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from urllib.parse import unquote

import pytest
from conftest import ROOT

PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]

FENCE = re.compile(r"^ {0,3}(```|~~~).*?^ {0,3}\1[ \t]*$", re.MULTILINE | re.DOTALL)
INLINE_CODE = re.compile(r"(`+)(.+?)\1", re.DOTALL)
# `KERAS_BACKEND=jax python benchmarks/study.py run ...`: the environment, the script.
COMMAND = re.compile(r"(?P<env>(?:\b[A-Z][A-Z0-9_]*=\S*\s+)*)python3?\s+(?P<script>[\w./-]+\.py)\b")
LINK = re.compile(r"!?\[(?:[^\[\]]|\[[^\]]*\])*\]"  # [text], with [brackets] inside
                  r"\(\s*<?(?P<target>[^)\s>]+)>?(?:\s+\"[^\"]*\")?\s*\)")  # (target "title")
HEADING = re.compile(r"^ {0,3}#{1,6}[ \t]+(?P<text>.+?)(?:[ \t]+#+)?[ \t]*$", re.MULTILINE)
PYTHON_FILE = re.compile(r"(?<![\w./<>-])(?P<path>[\w./-]*\w\.py)\b")


def code_of(text: str) -> list[str]:
    """The code a page shows: its fenced blocks and its inline code spans, whitespace joined."""
    blocks = [match.group(0) for match in FENCE.finditer(text)]
    spans = [" ".join(match.group(2).split())
             for match in INLINE_CODE.finditer(FENCE.sub("", text))]
    return blocks + spans


def documented_commands(pages: list[Path]) -> dict[tuple[str, str], list[str]]:
    """(KERAS_BACKEND or "", script) -> the pages that run it. Other variables (oneDNN's, say)
    do not change what `--help` imports; `python -m ...` and `python -c ...` name no script."""
    commands: dict[tuple[str, str], list[str]] = {}
    for page in pages:
        for code in code_of(page.read_text()):
            for line in code.splitlines():
                for match in COMMAND.finditer(line):
                    backend = re.search(r"\bKERAS_BACKEND=(\S+)", match.group("env"))
                    key = (backend.group(1) if backend else "", match.group("script"))
                    found_on = commands.setdefault(key, [])
                    if page.name not in found_on:
                        found_on.append(page.name)
    return commands


COMMANDS = documented_commands(PAGES)


def test_the_pages_document_the_programs_a_user_runs():
    """Guards the extraction itself: the README's own commands are among those found."""
    scripts = {script for _, script in COMMANDS}
    assert {"d3qn_agent.py", "apex.py", "blind_cliffwalk.py"} <= scripts, sorted(scripts)
    assert ("jax", "d3qn_agent.py") in COMMANDS


def run_help(key: tuple[str, str]) -> subprocess.CompletedProcess:
    """`python SCRIPT --help` from the repository root, on the Keras backend named (if any)."""
    backend, script = key
    env = {**os.environ, "KERAS_BACKEND": backend} if backend else dict(os.environ)
    return subprocess.run([sys.executable, script, "--help"], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=300, stdin=subprocess.DEVNULL)


@pytest.fixture(scope="module")
def help_runs(request) -> dict[tuple[str, str], subprocess.CompletedProcess]:
    """The `--help` of every documented script a selected test asks about, run side by side
    (most import TensorFlow: seconds each)."""
    keys = sorted({item.callspec.params["key"] for item in request.session.items
                   if "key" in getattr(getattr(item, "callspec", None), "params", {})})
    with ThreadPoolExecutor(max_workers=max(2, os.cpu_count() or 1)) as pool:
        return dict(zip(keys, pool.map(run_help, keys), strict=True))


def help_case(key: tuple[str, str]) -> object:
    """Each `--help` starts a Python with TensorFlow (and Ray, or JAX), seconds apiece for a score
    of scripts: d3qn_agent.py's and blind_cliffwalk.py's are in the default tier, the others
    (apex.py, the benchmarks, JAX) in the slow one."""
    backend, script = key
    slow = script.startswith("benchmarks/") or script == "apex.py" or bool(backend)
    return pytest.param(key, id=f"{script}-{backend}" if backend else script,
                        marks=[pytest.mark.slow] if slow else [])


@pytest.mark.parametrize("key", [help_case(key) for key in sorted(COMMANDS)])
def test_each_documented_script_answers_help(key, help_runs):
    backend, script = key
    result = help_runs[key]
    shown = f"{'KERAS_BACKEND=' + backend + ' ' if backend else ''}python {script} --help"
    assert result.returncode == 0, (
        f"`{shown}` (documented in {', '.join(COMMANDS[key])}) exited {result.returncode}:\n"
        f"{result.stderr[-2000:]}")
    assert "usage:" in result.stdout, f"`{shown}` printed no usage:\n{result.stdout[-2000:]}"


def github_slug(heading: str) -> str:
    """The anchor GitHub gives a heading: its text as rendered (code spans' contents, links'
    texts), lower case, each space a '-', every other character but letters, digits, marks,
    '-' and '_' dropped."""
    text = INLINE_CODE.sub(lambda match: match.group(2), heading)
    text = re.sub(r"!?\[((?:[^\[\]]|\[[^\]]*\])*)\]\([^)]*\)", r"\1", text)
    text = re.sub(r"\*+|<[^>]+>", "", text)
    kept = (char for char in text.lower()
            if char in " -_" or unicodedata.category(char)[0] in "LNM")
    return "".join(kept).replace(" ", "-")


def anchors(page: Path) -> set[str]:
    """The anchors of a page's headings; a repeated heading gets -1, -2, ... as on GitHub."""
    seen: dict[str, int] = {}
    for match in HEADING.finditer(FENCE.sub("", page.read_text())):
        slug = github_slug(match.group("text"))
        seen[slug] = seen.get(slug, -1) + 1
        if seen[slug]:
            seen[f"{slug}-{seen[slug]}"] = 0
    return set(seen)


def broken_links(page: Path) -> list[str]:
    """Each relative link of `page` (outside code) whose file, or heading, does not exist."""
    text = INLINE_CODE.sub("code", FENCE.sub("", page.read_text()))
    broken = []
    for match in LINK.finditer(text):
        target = match.group("target")
        if re.match(r"[a-z][a-z0-9+.-]*:", target, re.IGNORECASE):  # https:, mailto:
            continue
        path, _, anchor = unquote(target).partition("#")
        linked = (page.parent / path).resolve() if path else page
        if not linked.exists():
            broken.append(f"{target}: no file {os.path.relpath(linked, ROOT)}")
        elif anchor and linked.suffix == ".md" and anchor not in anchors(linked):
            broken.append(f"{target}: no heading with anchor #{anchor} in {linked.name}")
    return broken


@pytest.mark.parametrize("page", PAGES, ids=lambda page: page.name)
def test_each_relative_link_finds_its_file_and_heading(page):
    assert broken_links(page) == []


def misplaced_python_files(page: Path) -> list[str]:
    """Python files named in the page's code that are not there: a path from the repository
    root, or a benchmark script's bare name (`bench_atari.py`). A module of d3qn_utils/ is
    named with its folder."""
    missing = []
    for code in code_of(page.read_text()):
        for match in PYTHON_FILE.finditer(code):
            path = match.group("path")
            if not ((ROOT / path).is_file() or (ROOT / "benchmarks" / path).is_file()):
                missing.append(path)
    return sorted(set(missing))


@pytest.mark.parametrize("page", PAGES, ids=lambda page: page.name)
def test_each_python_file_named_in_code_is_where_the_page_says(page):
    assert misplaced_python_files(page) == []


def test_the_checks_catch_a_broken_command_a_broken_link_and_a_moved_module(tmp_path):
    """The checks fail where they should, on a page written for them."""
    docs = tmp_path / "docs"
    docs.mkdir()
    (docs / "target.md").write_text("# A title: `GRADIENT_STEPS_PER_CALL`, numpy\n\n## Twice\n"
                                    "## Twice\n")
    page = docs / "page.md"
    page.write_text("[ok](target.md#a-title-gradient_steps_per_call-numpy) "
                    "[ok](target.md#twice-1) [ok](#here)\n# Here\n"
                    "[gone](missing.md) [no heading](target.md#nowhere) "
                    "[no heading](#not-here) `gradient_steps.py` `d3qn_utils/settings.py`\n"
                    "`KERAS_BACKEND=jax python\nno_such_script.py --flag` `python -m pytest`\n")
    assert [line.split(":")[0] for line in broken_links(page)] == [
        "missing.md", "target.md#nowhere", "#not-here"]
    assert misplaced_python_files(page) == ["gradient_steps.py", "no_such_script.py"]
    assert documented_commands([page]) == {("jax", "no_such_script.py"): ["page.md"]}
    assert run_help(("jax", "no_such_script.py")).returncode != 0
