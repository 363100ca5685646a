"""The public API is typed: ``mypy --strict`` passes on a file of typical use and catches misuse,
and the typed keywords of ``sharded_pipeline`` name every option and DALI pipeline parameter."""

import inspect
import os
import re
import subprocess
import sys

from dali_shards.keywords import ShardedKeywords
from dali_shards.options import OPTION_KEYWORDS

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
TYPING = os.path.join(ROOT, "tests", "typing")


def mypy(name, tmp_path):
    config = open(os.path.join(TYPING, "mypy.ini")).read().replace(".mypy_cache/typing", str(tmp_path))
    (tmp_path / "mypy.ini").write_text(config)
    env = dict(os.environ, MYPYPATH=ROOT)
    args = [sys.executable, "-m", "mypy", "--config-file", str(tmp_path / "mypy.ini"), os.path.join(TYPING, name)]
    return subprocess.run(args, cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)


def test_typical_use_passes_mypy_strict_and_misuse_is_caught(tmp_path):
    out = mypy("typical_use.py", tmp_path)
    assert out.returncode == 0, out.stdout + out.stderr
    out = mypy("misuse.py", tmp_path)
    errors = re.findall(r"misuse\.py:(\d+): error", out.stdout)
    assert out.returncode == 1 and len(errors) == 6, out.stdout + out.stderr
    for what in ('"batch_size"', '"shufle"', '"max_count"', '"keep_padding"', '"sed"', '"ragged"'):
        assert what in out.stdout


def test_typed_keywords_name_every_option_and_pipeline_parameter():
    from nvidia.dali.pipeline import Pipeline

    dali = set(inspect.signature(Pipeline.__init__).parameters) - {"self"} | {"enable_conditionals"}
    assert set(ShardedKeywords.__annotations__) == (set(OPTION_KEYWORDS) - {"source"}) | dali


def test_the_package_type_checks_clean(tmp_path):
    """``mypy`` with the settings of pyproject.toml (``[tool.mypy]``) finds nothing in dali_shards/."""
    args = [sys.executable, "-m", "mypy", "--cache-dir", str(tmp_path / "cache")]
    out = subprocess.run(args, cwd=ROOT, capture_output=True, text=True, timeout=900)
    assert out.returncode == 0 and "Success" in out.stdout, out.stdout[-4000:] + out.stderr[-2000:]


def test_type_checkers_find_the_package_as_the_readme_installs_it(tmp_path):
    """After the README's install (an editable install in ``compat`` mode), mypy run from any
    folder finds dali_shards: setuptools' default editable finder is invisible to static tools."""
    user = tmp_path / "user.py"
    user.write_text('from dali_shards import ShardWriter\nShardWriter("x-%d.tar", max_count="3")\n')
    env = {k: v for k, v in os.environ.items() if k not in ("MYPYPATH", "PYTHONPATH")}
    args = [sys.executable, "-m", "mypy", "--no-incremental", "--follow-imports", "silent", str(user)]
    out = subprocess.run(args, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=600)
    assert '"max_count" to "ShardWriter" has incompatible type "str"' in out.stdout, (
        out.stdout + out.stderr + "\n(install as the README says: pip install -e . --config-settings editable_mode=compat)"
    )
