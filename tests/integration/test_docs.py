"""The documentation cannot go stale: its programs run, its links and the paths it cites exist.

THE RULE: a ```python block of README.md or docs/*.md is a complete program if and only if its first
line is ``# runnable``; every other block is a fragment, never run. Each complete program runs in a
subprocess of its own, from an empty temporary directory, on the CPU (no GPU visible), with proxies
pointing nowhere so that nothing reaches the network, and must exit with 0 within 300 s: it may use
only the repository (the built-in photos of ``dali_shards.sample_data``, ``device_id=None``). So that
a program cannot slip out of CI by forgetting the marker, a block without it that starts with an
import and holds no ``...`` is refused: mark it, or make it visibly a fragment.

Also checked: every relative link ``](path)`` of those pages leads to an existing file (anchors
ignored), every repository path they cite in backquotes exists (package modules under
``dali_shards/``), and every test of the guarantees table (``docs/guarantees.md``) is defined where
it says.
"""

import os
import re
import subprocess
import sys
from typing import List, NamedTuple

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
MARKER = "# runnable"
TIMEOUT = 300
PAGES = ["README.md"] + sorted(
    os.path.join("docs", name) for name in os.listdir(os.path.join(ROOT, "docs")) if name.endswith(".md")
)
FENCE = re.compile(r"^(\s*)(`{3,}|~{3,})(.*)$")


class Block(NamedTuple):
    page: str
    line: int  # of the opening fence, 1-based
    lang: str
    text: str

    @property
    def name(self) -> str:
        return f"{self.page}:{self.line}"


def read(page: str) -> str:
    with open(os.path.join(ROOT, page), encoding="utf-8") as f:
        return f.read()


def blocks(page: str) -> List[Block]:
    """The fenced code blocks of a page."""
    found, lines = [], read(page).split("\n")
    i = 0
    while i < len(lines):
        m = FENCE.match(lines[i])
        if not m:
            i += 1
            continue
        indent, fence, info = m.groups()
        body, j = [], i + 1
        while j < len(lines) and not (lines[j].strip().startswith(fence) and lines[j].strip().strip(fence[0]) == ""):
            body.append(lines[j][len(indent):] if lines[j].startswith(indent) else lines[j])
            j += 1
        assert j < len(lines), f"{page}:{i + 1}: code block never closed"
        found.append(Block(page, i + 1, info.strip().split(" ")[0].lower(), "\n".join(body)))
        i = j + 1
    return found


def without_code(page: str) -> str:
    """A page's text with its fenced blocks blanked (links and paths are checked in the prose)."""
    text = read(page)
    for b in blocks(page):
        text = text.replace(b.text, "")
    return text


PYTHON = [b for page in PAGES for b in blocks(page) if b.lang in ("python", "py")]
PROGRAMS = [b for b in PYTHON if b.text.split("\n", 1)[0].strip() == MARKER]


def test_the_pages_hold_complete_programs():
    assert any(b.page == "README.md" for b in PROGRAMS), "the README's usage is a complete program"
    assert len(PROGRAMS) >= 3, [b.name for b in PROGRAMS]


@pytest.mark.parametrize("block", PYTHON, ids=lambda b: b.name)
def test_a_block_that_looks_complete_is_marked(block):
    if block in PROGRAMS:
        return
    code = [line for line in block.text.split("\n") if line.strip() and not line.lstrip().startswith("#")]
    looks_complete = bool(code) and re.match(r"(import|from)\s", code[0]) and "..." not in block.text
    assert not looks_complete, (
        f"{block.name}: this block starts with imports and has no '...': if it is a complete program, make "
        f"'{MARKER}' its first line (CI then runs it); if it is a fragment, show it (e.g. with '...')"
    )


@pytest.mark.parametrize("block", PROGRAMS, ids=lambda b: b.name)
def test_complete_programs_run_on_the_cpu(block, tmp_path):
    program = tmp_path / "program.py"
    program.write_text(block.text + "\n", encoding="utf-8")
    work = tmp_path / "work"
    work.mkdir()
    nowhere = "http://127.0.0.1:9"  # the discard port: any attempt to reach the network fails at once
    env = dict(os.environ)
    env.update(
        CUDA_VISIBLE_DEVICES="",
        TMPDIR=str(tmp_path),
        PYTHONPATH=os.pathsep.join(p for p in (ROOT, env.get("PYTHONPATH", "")) if p),
        HTTP_PROXY=nowhere, HTTPS_PROXY=nowhere, http_proxy=nowhere, https_proxy=nowhere,
        NO_PROXY="", no_proxy="", AWS_EC2_METADATA_DISABLED="true",
    )  # fmt: skip
    try:
        out = subprocess.run(
            [sys.executable, str(program)], cwd=work, env=env, capture_output=True, text=True, timeout=TIMEOUT
        )
    except subprocess.TimeoutExpired as exc:
        pytest.fail(f"{block.name}: still running after {TIMEOUT} s\n{exc.stdout or ''}{exc.stderr or ''}")
    assert out.returncode == 0, f"{block.name} exited with {out.returncode}\n{out.stdout}\n{out.stderr}"


LINK = re.compile(r"\]\(([^)\s]+)\)")


@pytest.mark.parametrize("page", PAGES)
def test_relative_links_lead_to_files(page):
    folder = os.path.dirname(os.path.join(ROOT, page))
    broken = []
    for target in LINK.findall(without_code(page)):
        if re.match(r"[a-z][a-z0-9+.-]*:", target) or target.startswith("#"):
            continue  # http(s), mailto...; an anchor of the page itself
        path = target.split("#", 1)[0]
        if not os.path.exists(os.path.normpath(os.path.join(folder, path))):
            broken.append(target)
    assert not broken, f"{page}: links to nothing: {broken}"


CITED = re.compile(r"`([^`\s]+)`")
REPO_PATH = re.compile(r"^(?:tests|examples|benchmarks|dali_shards|docs)/[\w./-]*$")
MODULE_PATH = re.compile(r"^[a-z_]+/[\w/]*\.py$")  # a module of the package, as the pages name them


@pytest.mark.parametrize("page", PAGES)
def test_cited_paths_exist(page):
    missing = []
    for token in CITED.findall(without_code(page)):
        path = token.split("::", 1)[0]
        if REPO_PATH.match(path):
            ok = os.path.exists(os.path.join(ROOT, path))
        elif MODULE_PATH.match(path):
            ok = os.path.exists(os.path.join(ROOT, path)) or os.path.exists(os.path.join(ROOT, "dali_shards", path))
        else:
            continue
        if not ok:
            missing.append(token)
    assert not missing, f"{page} cites paths that do not exist: {missing}"


def test_every_test_the_guarantees_cite_exists():
    """``file.py::name`` names a test (or helper) of that file; ``::name`` one of the file named before
    it on the same row; a bare ``test_x.py`` a file in the folder of the one named before it."""
    missing, rows = [], 0
    for line in read(os.path.join("docs", "guarantees.md")).split("\n"):
        if not line.startswith("| ") or line.startswith(("| guarantee", "| ---")):
            continue
        rows += 1
        current = None
        for token in CITED.findall(line.split(" | ")[-1]):
            m = re.match(r"^(tests/[\w/]*?\w+\.py)(?:::(\w+))?$", token)
            if m:
                current, name = m.group(1), m.group(2)
            elif re.match(r"^::\w+$", token) and current:
                name = token[2:]
            elif re.match(r"^test_\w+\.py$", token) and current:
                current, name = os.path.join(os.path.dirname(current), token), None
            else:
                continue
            source = os.path.join(ROOT, current)
            if not os.path.exists(source):
                missing.append(current)
            elif name and not re.search(rf"^\s*(?:async\s+)?(?:def|class)\s+{name}\b", read(current), re.M):
                missing.append(f"{current}::{name}")
    assert rows >= 30, f"the guarantees table has {rows} rows"
    assert not missing, f"docs/guarantees.md cites tests that do not exist: {missing}"


def test_every_option_is_documented():
    """Each keyword of ``sharded_pipeline`` and each parameter of ``DALIShardedIterator`` has its row in
    docs/options.md."""
    import inspect

    from dali_shards.options import OPTION_KEYWORDS
    from dali_shards.pytorch import DALIShardedIterator

    table = " ".join(line.split(" | ")[0] for line in read(os.path.join("docs", "options.md")).split("\n") if line.startswith("| `"))
    documented = set(re.findall(r"`(\w+)`", table))
    params = [p for p in inspect.signature(DALIShardedIterator.__init__).parameters if p not in ("self", "pipeline")]
    missing = [n for n in ("source", *OPTION_KEYWORDS, *params) if n not in documented and n != "pipeline"]
    assert not missing, f"docs/options.md has no row for {missing}"
