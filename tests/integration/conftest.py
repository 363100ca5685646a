"""Fixtures of the integration tier."""

import pytest


@pytest.fixture(scope="module")
def shard_dir(make_shards, request, tmp_path_factory):
    """A folder to serve: the photos in shards of the module's ``SIZES``, named as its ``PATTERN``
    (``"<prefix>-{000000..000011}.tar"``), and their manifest."""
    prefix = request.module.PATTERN.split("-{")[0]
    folder = tmp_path_factory.mktemp(prefix)
    make_shards(request.module.SIZES, prefix=prefix, manifest=True, folder=folder)
    return folder
