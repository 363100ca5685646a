"""Soak: 20 epochs over random shard sizes, stopped and resumed every 3 epochs at a random step
(alternating between two layouts, so half the resumes are elastic): every epoch exactly once."""

import random
from collections import Counter

from dali_shards import sharded_pipeline
from dali_shards.pytorch import DALIShardedIterator
from dali_shards.sample_data import write_sample_shards

LAYOUTS = [dict(world_size=2, py_num_workers=2, batch_size=4), dict(world_size=3, py_num_workers=1, batch_size=3)]


def test_twenty_epochs_with_resumes(tmp_path):
    rng = random.Random(2024)
    sizes = [rng.choice([0, 1, 2, 5, 9, 17, 30]) for _ in range(9)]
    write_sample_shards(str(tmp_path), shard_sizes=sizes)
    total = sum(sizes)

    def open_ranks(layout, state):
        @sharded_pipeline(
            str(tmp_path / "sample-*.tar"),
            fields=("__index__",),
            shuffle=True,
            seed=99,
            shuffle_buffer=6,
            num_threads=1,
            device_id=None,
            **layout,
        )
        def pipe(index):
            return index

        return [DALIShardedIterator(pipe(rank=r, resume_from=state), ["index"]) for r in range(layout["world_size"])]

    seen = [Counter() for _ in range(20)]
    state, session = None, 0
    ranks = open_ranks(LAYOUTS[0], None)
    while ranks[0].epoch < 20:
        epoch = ranks[0].epoch
        stop_at = None
        if epoch % 3 == 2:  # every third epoch: stop at a random step and resume from the state
            stop_at = rng.randrange(ranks[0].step, ranks[0].step + len(ranks[0]) + 1)  # (step: of the epoch)
        for it in ranks:
            while stop_at is None or it.step < stop_at:
                try:
                    (batch,) = next(it)
                except StopIteration:
                    break
                seen[epoch].update(batch["index"].tolist())
            assert it.epoch in (epoch, epoch + 1)
        steps = {it.step if it.epoch == epoch else "done" for it in ranks}
        assert len(steps) == 1, "every rank took the same number of steps"
        if stop_at is not None:
            states = [it.state_dict() for it in ranks]
            assert all(s == states[0] for s in states)
            state = states[0]
            del ranks
            session += 1
            ranks = open_ranks(LAYOUTS[session % 2], state)
    for epoch, counts in enumerate(seen):
        assert sorted(counts) == list(range(total)) and max(counts.values()) == 1, f"epoch {epoch}"
    assert session >= 6
