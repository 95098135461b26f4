"""The stopwatch the benchmarks share (`bench_apex.py`, `bench_backends.py` and others), and how a
figure timed over rounds is shown: its median with the minimum and maximum of its rounds beside
it, and a comparison of two figures drawn only where their ranges do not overlap.

A results file holds each timed figure as the list of its rounds' values; a file written before
the scripts timed in rounds holds one value, which `spread` reads as one round and the pages mark
so ("1 round"): one value has no range to compare.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass

ROUNDS = 3  # a timing script's rounds by default (`add_rounds_argument`)
DASH = "\N{EN DASH}"
TIMES = "\N{MULTIPLICATION SIGN}"


def median_seconds(function: Callable[[], object], repeats: int) -> float:
    """Median wall time of `repeats` calls of `function`, after one warm-up call."""
    function()
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        function()
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def add_rounds_argument(parser: argparse.ArgumentParser, default: int = ROUNDS) -> None:
    """`--rounds N`: how many times each timed figure is measured (every round's value is kept)."""
    parser.add_argument("--rounds", type=int, default=default,
                        help=f"rounds of each timing, every round kept (default {default})")


def check_rounds(rounds: int) -> None:
    """Exit with status 2 after one `error:` line naming `--rounds` unless it is at least 1,
    before any work."""
    if rounds < 1:
        print(f"error: --rounds must be at least 1, got {rounds}", file=sys.stderr)
        raise SystemExit(2)


@dataclass(frozen=True)
class Spread:
    """A timed figure over its rounds: the median, the smallest and largest round, how many."""

    median: float
    low: float
    high: float
    rounds: int

    def scaled(self, factor: float) -> Spread:
        """The same rounds in another unit (`factor` > 0): milliseconds from seconds, say."""
        return Spread(self.median * factor, self.low * factor, self.high * factor, self.rounds)


def spread(values: float | Sequence[float]) -> Spread:
    """(median, min, max) of a figure's rounds; one number (an older file's) is one round."""
    rounds = [float(values)] if isinstance(values, int | float) else [float(v) for v in values]
    if not rounds:
        raise ValueError("a timed figure with no rounds")
    return Spread(statistics.median(rounds), min(rounds), max(rounds), len(rounds))


def shown(figure: Spread, form: Callable[[float], str], unit: str = "") -> str:
    """A figure in a table cell: its median, then its minimum and maximum joined by an en dash
    in brackets, or "1,234 (1 round)" where there is no range to give; `unit` (" ms") after
    the median."""
    if figure.rounds == 1:
        return f"{form(figure.median)}{unit} (1 round)"
    return f"{form(figure.median)}{unit} ({form(figure.low)}{DASH}{form(figure.high)})"


def ranges_apart(first: Spread, second: Spread) -> bool:
    """Whether every round of one figure lies beyond every round of the other (two rounds or
    more each: one value has no range)."""
    if first.rounds < 2 or second.rounds < 2:
        return False
    return first.high < second.low or second.high < first.low


def comparison(numerator: Spread, denominator: Spread, form: Callable[[float], str]) -> str:
    """`numerator / denominator` of the medians (`form` writes it), said as a comparison only
    where the ranges are apart: "1.40 times (ranges apart)", "no clear difference (ranges
    overlap; medians 1.05 times)", or the ratio marked where a figure has one round."""
    value = form(numerator.median / denominator.median)
    if numerator.rounds < 2 or denominator.rounds < 2:
        return f"{value} (1 round: no range to compare)"
    if ranges_apart(numerator, denominator):
        return f"{value} (ranges apart)"
    return f"no clear difference (ranges overlap; medians {value})"


def paired_ratio(numerator: Sequence[float], denominator: Sequence[float], digits: int = 2
                 ) -> str:
    """Round by round, `numerator[i] / denominator[i]` of two figures timed in the same
    alternating rounds (a drift of the machine hits both alike): the median ratio, then the
    smallest and largest in brackets, as `shown` writes them; ValueError for unequal rounds."""
    if len(numerator) != len(denominator) or not numerator:
        raise ValueError(f"paired rounds need the same count, got {len(numerator)} and "
                         f"{len(denominator)}")
    ratios = spread([top / bottom for top, bottom in zip(numerator, denominator, strict=True)])
    return shown(ratios, lambda value: f"{value:.{digits}f}{TIMES}")


def ratio(numerator: Spread, denominator: Spread, digits: int = 2) -> str:
    """`comparison` as a ratio: "1.40" and a multiplication sign."""
    return comparison(numerator, denominator, lambda value: f"{value:.{digits}f}{TIMES}")


def change(numerator: Spread, denominator: Spread, digits: int = 0) -> str:
    """`comparison` as a change: "+12%"."""
    return comparison(numerator, denominator, lambda value: f"{value - 1:+.{digits}%}")
