"""The package's import graph: no cycles (imports inside functions included; those only for type
checkers left out), and the options layer imports nothing above it."""

import ast
import os

import dali_shards

ROOT = os.path.dirname(dali_shards.__file__)


def modules():
    out = {}
    for folder, _, files in os.walk(ROOT):
        for name in files:
            if name.endswith(".py"):
                path = os.path.join(folder, name)
                rel = os.path.relpath(path, os.path.dirname(ROOT))[:-3].replace(os.sep, ".")
                out[rel[: -len(".__init__")] if rel.endswith(".__init__") else rel] = path
    return out


def imports(module, path, known):
    tree = ast.parse(open(path).read())
    typing_only = {id(c) for n in ast.walk(tree) if isinstance(n, ast.If) and "TYPE_CHECKING" in ast.unparse(n.test)
                   for c in ast.walk(n)}  # fmt: skip
    package = module if path.endswith("__init__.py") else module.rsplit(".", 1)[0]
    found = set()
    for node in ast.walk(tree):
        if id(node) in typing_only:
            continue
        if isinstance(node, ast.ImportFrom):
            base = package.split(".")[: len(package.split(".")) - node.level + 1] if node.level else []
            name = ".".join(base + ([node.module] if node.module else []))
            names = [name] + [f"{name}.{a.name}" for a in node.names]
        elif isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        else:
            continue
        found |= {n for n in names if n in known and n != module}
    return found


def graph():
    known = modules()
    return {m: imports(m, p, known) for m, p in known.items()}


def cycle_from(start, edges):
    """A cycle through ``start``, or None (depth-first)."""
    stack = [(start, [start])]
    seen = set()
    while stack:
        node, path = stack.pop()
        for nxt in edges[node]:
            if nxt == start:
                return path + [start]
            if nxt not in seen:
                seen.add(nxt)
                stack.append((nxt, path + [nxt]))
    return None


def test_no_import_cycles():
    edges = graph()
    cycles = [c for c in (cycle_from(m, edges) for m in sorted(edges)) if c]
    assert not cycles, "import cycles: " + "; ".join(" -> ".join(c) for c in cycles[:5])


def test_the_options_layer_imports_nothing_above_it():
    edges = graph()
    assert edges["dali_shards.options"] <= {"dali_shards.errors", "dali_shards.fields", "dali_shards.stream",
                                             "dali_shards.choices"}
    assert edges["dali_shards.choices"] <= {"dali_shards.errors", "dali_shards.fields"}
    assert edges["dali_shards.fields"] <= {"dali_shards.errors"}
    assert edges["dali_shards.stream"] <= {"dali_shards.errors"}  # a mix's Stream, told apart by the options
