"""How clustered the labels of a shard set are: shards that each hold few classes (written class
by class) make batches that see few classes, whatever the loader's shuffle buffer does.

The measure: the mean number of distinct ``.cls`` labels per shard, against the number a shard
of the same size would hold if the samples were mixed at random across shards (the exact
expectation, sampling without replacement). A ratio well below 1 means class-sorted shards.
"""

from __future__ import annotations

import math
from collections import Counter
from typing import Dict, Optional, Sequence

from dali_shards.io.storage import open_shard
from dali_shards.tar.format import TarReader
from dali_shards.options import StorageOptions

LABEL_EXT = "cls"
CLUSTERED_BELOW = 0.7  # a ratio under this: the shards look class-sorted (mixed ones give about 1)


def shard_labels(url: str, config: StorageOptions) -> Counter:
    """The ``.cls`` labels of one shard, counted (samples without a readable label are left out)."""
    counts: Counter = Counter()
    with open_shard(url, config) as stream:
        for sample in TarReader(stream, url).samples({LABEL_EXT}):
            data = sample.data.get(LABEL_EXT)
            if data is None:  # no label
                continue
            try:
                counts[int(bytes(data).strip())] += 1
            except (TypeError, ValueError):
                continue
    return counts


def expected_distinct(class_counts: Sequence[int], size: int) -> float:
    """Expected distinct classes among ``size`` samples drawn without replacement from a set with
    these per-class counts."""
    total = sum(class_counts)
    if size <= 0 or total == 0:
        return 0.0
    size = min(size, total)
    log_all = math.lgamma(total + 1) - math.lgamma(total - size + 1)
    missing = 0.0
    for n in class_counts:
        if total - n >= size:  # P(class absent) = C(total - n, size) / C(total, size)
            missing += math.exp(math.lgamma(total - n + 1) - math.lgamma(total - n - size + 1) - log_all)
    return len(class_counts) - missing


def clustering(per_shard: Sequence[Counter]) -> Optional[Dict[str, object]]:
    """The label summary of a shard set, or None if no shard has labels."""
    shards = [c for c in per_shard if c]
    if not shards:
        return None
    whole: Counter = Counter()
    for c in shards:
        whole.update(c)
    counts = list(whole.values())
    distinct = sum(len(c) for c in shards) / len(shards)
    expected = sum(expected_distinct(counts, sum(c.values())) for c in shards) / len(shards)
    ratio = distinct / expected if expected else 1.0
    return {
        "classes": len(whole),
        "mean_distinct_per_shard": round(distinct, 2),
        "expected_if_mixed": round(expected, 2),
        "ratio": round(ratio, 3),
        "class_sorted": ratio < CLUSTERED_BELOW,
    }
