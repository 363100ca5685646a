"""pyproject.toml: an SPDX license string, a setuptools that reads it, bounded S3 test dependencies."""

import os
import re
import tomllib

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def load():
    with open(os.path.join(ROOT, "pyproject.toml"), "rb") as f:
        return tomllib.load(f)


def test_license_is_an_spdx_string_and_setuptools_reads_it():
    project = load()
    assert project["project"]["license"] == "Apache-2.0"
    setuptools = [r for r in project["build-system"]["requires"] if r.startswith("setuptools")]
    assert setuptools and int(re.search(r">=(\d+)", setuptools[0]).group(1)) >= 77


def test_s3_test_dependencies_are_bounded_above():
    project = load()
    for extra in ("test", "bench"):
        deps = {re.split(r"[\[<>=!~ ]", d, maxsplit=1)[0]: d for d in project["project"]["optional-dependencies"][extra]}
        for name in ("s3fs", "aiobotocore", "boto3", "moto"):
            assert name in deps and "<" in deps[name], f"{extra}: {name} needs an upper bound ({deps.get(name)})"


def test_torch_stays_pinned():
    deps = load()["project"]["optional-dependencies"]
    for extra in ("test", "examples", "bench"):
        assert "torch==2.14.1" in deps[extra] and "torchvision==0.29.1" in deps[extra]
