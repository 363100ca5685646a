"""docs/architecture.md names every module of the package (and no module that is gone), so that a
newcomer finds each concept from the folder and file names, and says truly which import DALI."""

import ast
import os
import re

import dali_shards

ROOT = os.path.dirname(dali_shards.__file__)
DOC = os.path.join(os.path.dirname(ROOT), "docs", "architecture.md")


def test_the_module_table_names_every_module_and_only_those():
    text = open(DOC).read()
    table = text[text.index("## Modules") : text.index("## Invariants by layer")]
    listed = {m for m in re.findall(r"`([a-z_/]+\.py)`", table) if not m.startswith("tests/")}
    modules = {
        os.path.relpath(os.path.join(folder, name), ROOT).replace(os.sep, "/")
        for folder, _, files in os.walk(ROOT)
        for name in files
        if name.endswith(".py") and name != "__init__.py" and "sample_data" not in folder
    }
    assert not modules - listed, f"modules missing from docs/architecture.md: {sorted(modules - listed)}"
    assert not listed - modules, f"docs/architecture.md names modules that do not exist: {sorted(listed - modules)}"


def _imported_at_module_level(path):
    """The modules a file imports when it is imported: its top-level imports, those inside top-level
    ``if``/``try`` blocks included (not those inside functions or classes, nor under ``TYPE_CHECKING``)."""
    stack = list(ast.parse(open(path).read()).body)
    while stack:
        node = stack.pop()
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            continue
        if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
            stack.extend(node.orelse)
            continue
        if isinstance(node, ast.Import):
            yield from (a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            yield node.module
        else:
            stack.extend(c for c in ast.iter_child_nodes(node) if isinstance(c, ast.stmt))


def test_the_modules_said_to_import_dali_are_those_that_do():
    text = open(DOC).read()
    found = re.search(r"Only these modules import DALI.*?:(.*?)\.\s", text, re.S)
    assert found, "docs/architecture.md no longer says which modules import DALI"
    listed = set(re.findall(r"`([a-z_/]+\.py)`", found.group(1)))
    importing = {
        os.path.relpath(os.path.join(folder, name), ROOT).replace(os.sep, "/")
        for folder, _, files in os.walk(ROOT)
        for name in files
        if name.endswith(".py")
        and any(
            m == "nvidia.dali" or m.startswith("nvidia.dali.")
            for m in _imported_at_module_level(os.path.join(folder, name))
        )
    }
    assert importing, "no module imports DALI: the scan is broken"
    assert not importing - listed, (
        f"modules that import DALI, not listed in docs/architecture.md: {sorted(importing - listed)}"
    )
    assert not listed - importing, (
        f"docs/architecture.md lists modules that do not import DALI: {sorted(listed - importing)}"
    )
