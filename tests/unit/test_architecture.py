"""docs/architecture.md names every module of the package (and no module that is gone), so that a
newcomer finds each concept from the folder and file names."""

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
