"""Planner v5's parts on their own: pieces, the deal to ranks, workers' parts, interleaving and what
a prefix of it consumed, chunked runs, and the rest of an epoch as stretches of shards."""

from collections import Counter

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from dali_shards.plan.deal import Deal, RankParts, block_sizes, consumed_counts, cut_pieces, interleave_order, piece_counts
from dali_shards.plan.epoch import PlanSpec
from dali_shards.plan.runs import chunk_done, chunk_order
from dali_shards.plan.units import Units

sizes_lists = st.lists(st.integers(0, 50), min_size=1, max_size=40).filter(lambda s: sum(s) > 0)


@settings(max_examples=200, deadline=None)
@given(sizes_lists, st.integers(1, 400), st.integers(0, 2**32), st.integers(0, 50))
def test_pieces_cover_every_unit_once(sizes, wanted, seed, epoch):
    units = Units.whole(sizes)
    counts = piece_counts(units.sizes, wanted)
    assert (counts <= units.sizes).all() and ((counts > 0) == (units.sizes > 0)).all()
    nonempty = int((units.sizes > 0).sum())
    if nonempty >= wanted:
        assert counts.sum() == nonempty
    else:  # about 0.95 x wanted pieces of about one size, at most one more per unit
        assert counts.sum() <= 0.95 * wanted + nonempty
        assert counts.sum() >= min(0.95 * wanted, units.total) or (counts == units.sizes).any()
    pieces = cut_pieces(units, counts, seed, epoch)
    starts = np.concatenate([[0], np.cumsum(sizes)[:-1]])
    seen = np.concatenate(pieces.positions(starts)) if len(pieces) else np.zeros(0, int)
    assert sorted(seen.tolist()) == list(range(sum(sizes)))
    lengths = Counter()
    for j in range(len(pieces)):
        lengths[int(pieces.unit[j])] += 1
        assert len(pieces.stretches(j)) <= 2, "a piece is at most two stretches of its shard"
    for u in lengths:
        mine = pieces.length[pieces.unit == u]
        assert mine.max() - mine.min() <= 1, "a unit's pieces are balanced"


@settings(max_examples=200, deadline=None)
@given(st.lists(st.integers(0, 60), min_size=1, max_size=12), st.data())
def test_consumed_counts_are_what_the_interleaved_order_took(lengths, data):
    lengths = np.array(lengths)
    part, t = interleave_order(lengths)
    for j in range(len(lengths)):
        assert (np.diff(t[part == j]) == 1).all() and (t[part == j][:1] == 0).all(), "each part in order"
    done = data.draw(st.integers(0, int(lengths.sum())))
    expected = np.bincount(part[:done], minlength=len(lengths))
    assert consumed_counts(lengths, done).tolist() == expected.tolist()


def test_interleaving_spreads_each_part_over_the_block():
    part, _ = interleave_order(np.array([100, 100, 50, 10]))
    assert len(set(part[:20].tolist())) == 4, "every part within the first samples"
    assert max(np.diff(np.flatnonzero(part == 3))) <= 27, "a small part's samples evenly apart (260 / 10)"
    for j, n in enumerate([100, 100, 50, 10]):
        where = np.flatnonzero(part == j)
        assert abs(where.mean() - 130) < 260 / n + 5, "each part spread evenly over the whole"


@settings(max_examples=150, deadline=None)
@given(sizes_lists, st.integers(1, 9), st.integers(1, 4), st.integers(1, 4), st.sampled_from(["pad", "drop"]), st.integers(0, 99))
def test_ranks_and_workers_share_every_sample_once(sizes, world, workers, per_worker, mode, epoch):
    batch = workers * per_worker
    total = sum(sizes)
    if mode == "drop" and total < world * batch:
        mode = "pad"
    steps = -(-total // (world * batch)) if mode == "pad" else total // (world * batch)
    planned = total if mode == "pad" else steps * world * batch
    deal = Deal(Units.whole(sizes), world, batch, planned, mode == "drop", 7, epoch)
    starts = np.concatenate([[0], np.cumsum(sizes)[:-1]])
    seen, totals = [], []
    for rank in range(world):
        parts = RankParts(deal.rank_streams(rank), max(batch, 3), workers, 7, epoch, rank)
        totals.append(int(parts.counts.sum()))
        assert parts.counts.max() - parts.counts.min() <= 1 and parts.counts.max() <= steps * per_worker
        for w in range(workers):
            for part in parts.parts(w):
                seen += [x for p in part.positions(starts) for x in p.tolist()]
    assert max(totals) - min(totals) <= 1
    assert len(seen) == len(set(seen)) == planned


def test_each_shard_is_read_by_about_as_many_workers_as_mixing_needs():
    """2,000 shards x 200 samples, 64 ranks x 4 workers, batch 256: the ranks need 16,384 pieces, so
    about 8.2 readers per shard (the target: 1.1 x that at most); 20,000 shards: about 1."""
    for shards, per_shard, bound in ((2000, 200, 1.1 * 256 * 64 / 2000), (20000, 20, 2.0)):
        spec = PlanSpec((per_shard,) * shards, world_size=64, py_num_workers=4, batch_size=256, shuffle=True, seed=3)
        plan = spec.epoch(1)
        readers = Counter()
        for v in range(spec.num_virtual_workers):
            for shard in {seg.shard for seg in plan.worker_pieces(v)}:
                readers[shard] += 1
        mean = sum(readers.values()) / shards
        assert len(readers) == shards and mean <= bound, (shards, mean)


@settings(max_examples=200, deadline=None)
@given(st.integers(0, 300), st.integers(1, 64), st.integers(0, 2**32), st.data())
def test_chunked_runs_are_permutations_whose_prefixes_are_known(n, chunk, seed, data):
    order = chunk_order(n, chunk, seed, 3, 5)
    assert sorted(order.tolist()) == list(range(n))
    for start in range(0, n, chunk):
        assert set(order[start : start + chunk].tolist()) == set(range(start, min(n, start + chunk)))
    done = data.draw(st.integers(0, n))
    whole, taken = chunk_done(n, chunk, done, seed, 3, 5)
    assert set(range(whole)) | set(taken.tolist()) == set(order[:done].tolist())
    assert whole + len(taken) == done


def test_blocks_hold_at_least_block_pieces():
    assert block_sizes(10, 4).tolist() == [5, 5]
    assert block_sizes(3, 4).tolist() == [3]
    assert block_sizes(0, 4).tolist() == [0]
    assert all(b >= 256 for b in block_sizes(1000, 256))


@pytest.mark.parametrize("interleave", [True, False])
@settings(max_examples=60, deadline=None)
@given(sizes=sizes_lists, world=st.integers(1, 5), workers=st.integers(1, 3), data=st.data())
def test_what_is_left_and_what_was_delivered_make_the_epoch(interleave, sizes, world, workers, data):
    spec = PlanSpec(tuple(sizes), world_size=world, py_num_workers=workers, batch_size=workers * 2, seed=11,
                    shuffle=True, shuffle_block=4 if interleave else 0, shuffle_buffer=data.draw(st.integers(1, 9)))  # fmt: skip
    plan = spec.epoch(data.draw(st.integers(0, 9)))
    steps = data.draw(st.integers(0, plan.steps))
    consumed = plan.consumed(steps).tolist()
    left = plan.remaining(steps).positions(plan.canonical_starts).tolist()
    assert len(set(consumed)) == len(consumed) and not set(consumed) & set(left)
    assert sorted(consumed + left) == list(range(spec.num_samples))
