"""An ``output_map`` that does not name every output once is refused before anything runs."""

import pytest

from dali_shards import ConfigError, sharded_pipeline
from dali_shards.pytorch import DALIShardedIterator


def jpg_cls_pipe(pattern, fields=("jpg", "cls")):
    @sharded_pipeline(pattern, fields=fields, batch_size=6, py_num_workers=2, num_threads=1, device_id=None)
    def pipe(*outs):
        return outs

    return pipe


@pytest.mark.parametrize(
    "names, fields, counts",
    [
        (["images"], ("jpg", "cls"), "1 name .* returns 2 outputs"),  # the newcomer's: 52 of 300 samples, silently
        (["a", "b", "c"], ("jpg", "cls"), "3 names .* returns 2 outputs"),  # was KeyError: '__dali_shards_status__'
        (["a"], ("jpg", "__key__"), "1 name .* returns 2 outputs"),  # was AttributeError
        (["a", "a"], ("jpg", "cls"), "more than once"),
    ],
)
def test_a_wrong_output_map_is_a_config_error(photo_shards, names, fields, counts):
    with pytest.raises(ConfigError, match=counts):
        DALIShardedIterator(jpg_cls_pipe(photo_shards["pattern"], fields)(), names)


def test_the_right_map_still_works_after_a_refusal(photo_shards):
    pipe = jpg_cls_pipe(photo_shards["pattern"])()
    with pytest.raises(ConfigError):
        DALIShardedIterator(pipe, ["images"])
    it = DALIShardedIterator(pipe, ["images", "labels"])
    assert sum(len(b["labels"]) for (b,) in it) == photo_shards["total"]



def test_the_unused_field_warning_points_at_the_users_line(photo_shards):
    """The ring's warning (merge's graph uses every field) used to point at dali_shards/pytorch.py."""

    @sharded_pipeline(photo_shards["pattern"], fields=("jpg", "cls"), batch_size=6, py_num_workers=2,
                      num_threads=1, device_id=None)  # fmt: skip
    def labels_only(jpg, cls):
        return cls

    with pytest.warns(UserWarning, match=r"fields \['jpg'\] are read .* does not use them") as caught:
        DALIShardedIterator(labels_only(), ["labels"])
    ours = [w for w in caught if "does not use" in str(w.message)]
    assert [w.filename for w in ours] == [__file__]
