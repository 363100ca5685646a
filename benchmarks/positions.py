"""Step times by position in the epoch (``throughput.py --positions``): for each step index, the
median over every timed epoch of every round, so that a stall at an epoch's end or start (the
workers turning to the next epoch, DALI's queue refilled after its reset) shows at its place, and
both rates: the steady one (the batch over the median step) and the whole epoch's (its samples over
its time, the turn included: the median epoch's, and, less moved by this shared machine's spikes
of noise, the sum of the positions' medians).

A step's time runs from the end of the step before; the first step's from the end of the epoch
before (the pipeline's reset and refill included), and the epoch's end (its last call, which ends
it, and the reset) is a position of its own, ``end``.
"""

from __future__ import annotations

import statistics
from typing import Dict, List, Sequence

TARGET_STEP = 2.0  # no step near an epoch's end or start over this many times the median step
TARGET_WHOLE = 0.95  # a whole epoch's rate at least this share of the steady rate


def positions_of(epochs: Sequence[Sequence[float]], batch_size: int) -> Dict:
    """The per-position figures of one configuration from its epochs' step times (ms; each
    epoch's list ends with its end): the medians by position, each round's spread, both rates."""
    epochs = [list(e) for e in epochs if e]
    length = min(len(e) for e in epochs)
    steps = [e[: length - 1] for e in epochs]
    by_position = [statistics.median(e[i] for e in steps) for i in range(length - 1)]
    end = statistics.median(e[-1] for e in epochs)
    median_step = statistics.median(x for e in steps for x in e)
    epoch_ms = statistics.median(sum(e) for e in epochs)
    steady = 1000 * batch_size / median_step
    whole = 1000 * batch_size * (length - 1) / epoch_ms
    of_medians = 1000 * batch_size * (length - 1) / (sum(by_position) + end)
    return {
        "steps_per_epoch": length - 1,
        "epochs_measured": len(epochs),
        "step_ms": by_position,
        "end_ms": end,
        "median_step_ms": median_step,
        "worst_step_vs_median": max(by_position) / median_step,
        "worst_position": 1 + by_position.index(max(by_position)),
        "steady_samples_per_s": steady,
        "whole_epoch_samples_per_s": whole,
        "whole_vs_steady": whole / steady,
        "whole_of_medians_samples_per_s": of_medians,
        "whole_of_medians_vs_steady": of_medians / steady,
    }


def per_round(rounds: Sequence[Sequence[Sequence[float]]], batch_size: int) -> Dict[str, List[float]]:
    """Each round's own worst step ratio and whole/steady ratio (their spread over rounds)."""
    got = [positions_of(r, batch_size) for r in rounds if r]
    return {key: [g[key] for g in got] for key in ("worst_step_vs_median", "whole_vs_steady", "whole_of_medians_vs_steady")}


def print_positions(table: Dict[str, Dict], header: str) -> None:
    """The per-position table: one row per configuration, a column per step, then the rates."""
    print()
    print(header)
    width = max(len(label) for label in table)
    length = max(r["steps_per_epoch"] for r in table.values())
    cols = " ".join(f"{i + 1:>5}" for i in range(length))
    print(f"{'':{width}} {cols} {'end':>5} | {'median':>6} {'worst':>18} {'steady/s':>9} {'whole/s':>9} "
          f"{'whole/steady':>18} {'of medians':>18}")  # fmt: skip
    for label, r in table.items():
        steps = " ".join(f"{x:5.1f}" for x in r["step_ms"])
        ratios = [with_range(r, key) for key in ("worst_step_vs_median", "whole_vs_steady", "whole_of_medians_vs_steady")]
        print(f"{label:{width}} {steps} {r['end_ms']:5.1f} | {r['median_step_ms']:6.1f} {ratios[0]:>18} "
              f"{r['steady_samples_per_s']:9.0f} {r['whole_epoch_samples_per_s']:9.0f} {ratios[1]:>18} {ratios[2]:>18}")  # fmt: skip
    print(f"(ms per step by position, medians over every timed epoch of every round; worst: the slowest position "
          f"over the median step, target <= {TARGET_STEP}x; whole/steady: the median epoch's rate over the steady "
          f"rate, target >= {TARGET_WHOLE}x; of medians: the rate of an epoch of the positions' medians over the "
          "steady rate; in brackets: the range over rounds)")  # fmt: skip


def with_range(r: Dict, key: str) -> str:
    """A ratio and its range over rounds."""
    spread = r.get("rounds", {}).get(key)
    return f"{r[key]:.2f}x" + (f" ({min(spread):.2f}-{max(spread):.2f})" if spread else "")


def markdown(table: Dict[str, Dict], header: str) -> str:
    """The per-position table in Markdown (``throughput.py --positions`` writes it beside its JSON)."""
    length = max(r["steps_per_epoch"] for r in table.values())
    lines = [header, "", "| configuration | " + " | ".join(str(i + 1) for i in range(length)) + " | end | median step, ms "
             "| worst / median | steady, samples/s | whole epoch, samples/s | whole / steady | of medians / steady |",
             "| --- |" + " ---: |" * (length + 7)]  # fmt: skip
    for label, r in table.items():
        cells = [f"{x:.1f}" for x in r["step_ms"]] + [f"{r['end_ms']:.1f}", f"{r['median_step_ms']:.1f}"]
        cells += [with_range(r, "worst_step_vs_median"), f"{r['steady_samples_per_s']:,.0f}",
                  f"{r['whole_epoch_samples_per_s']:,.0f}", with_range(r, "whole_vs_steady"),
                  with_range(r, "whole_of_medians_vs_steady")]  # fmt: skip
        lines.append(f"| {label} | " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"
