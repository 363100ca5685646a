import os

import numpy as np
import pytest

from dali_shards.sample_data import DEFAULT_SHARD_SIZES, write_sample_shards

DATA = os.path.join(os.path.dirname(__file__), "data")
MNIST = os.path.join(DATA, "wds-sample-mnist.tgz")


@pytest.fixture(scope="session")
def photo_shards(tmp_path_factory):
    """The 47 built-in photos in 5 shards of uneven sizes, one of them empty."""
    out = tmp_path_factory.mktemp("photos")
    paths = write_sample_shards(str(out), shard_sizes=DEFAULT_SHARD_SIZES)
    return {
        "paths": paths,
        "pattern": os.path.join(str(out), "sample-{000000..000004}.tar"),
        "total": sum(DEFAULT_SHARD_SIZES),
    }


def as_numpy(tensor_list):
    """A DALI TensorList (CPU or GPU) as a list of numpy arrays."""
    if hasattr(tensor_list, "as_cpu"):
        tensor_list = tensor_list.as_cpu()
    return [np.array(tensor_list[i]) for i in range(len(tensor_list))]


def run_epochs(pipe, epochs):
    """Per epoch, the list of steps; each step a tuple of outputs as lists of numpy arrays."""
    pipe.build()
    result = []
    for _ in range(epochs):
        steps = []
        while True:
            try:
                outs = pipe.run()
            except StopIteration:
                break
            steps.append(tuple(as_numpy(o) for o in outs))
        pipe.reset()
        result.append(steps)
    return result
