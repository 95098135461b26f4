"""Does a change alter learning? Train the same seeded runs on an earlier commit and on this
checkout, side by side, and compare their logs line by line, timings left out.

    python benchmarks/same_log.py                        # every game, against REFERENCE_COMMIT
    python benchmarks/same_log.py --games cartpole pong  # some of them
    python benchmarks/same_log.py --before HEAD~3        # against another commit

A game whose flags an earlier commit lacks needs a later `--before`: pong (`--bfloat16`) one from
5626a16 on, the -n-envs games (`--n-envs`) one from 0ae09e2 on.

A refactoring that should not change what the agent learns proves it here: every episode,
evaluation and summary line the same, only speeds and durations differing. Each run starts in an
empty directory of its own with `--model-dir models --plot-dir plots`, so the paths a log names
are the same on both sides. The two sides run one after the other, each printing its wall time
(a rough check only: `bench_agent.py` and `bench_vs_sb3.py` time the agent properly). Exits 1
if any game's logs differ, after printing the first line that does. Either way it writes the
two commits and each game's lines compared and verdict to a results file stamped as the other
scripts' are (`--results`, by default under benchmarks/results/same_log/), from which
docs/reference.md's reproducibility section says which games logged the same between which
commits.
"""

from __future__ import annotations

import argparse
import contextlib
import re
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from benchmarks import provenance

ROOT = Path(__file__).resolve().parent.parent
# The last commit before d3qn_agent.py and PER.py were cut back to the tutorial's story.
REFERENCE_COMMIT = "3f8ba61"
# Seeded runs that exercise every path the games take: the default CartPole run whole, and a few
# thousand steps of the other games with training and an evaluation.
GAMES: dict[str, list[str]] = {
    "cartpole": [],
    "lunarlander": ["--env-name", "LunarLander-v3", "--total-steps", "4000",
                    "--learning-starts", "1000", "--eval-every", "2000", "--eval-episodes", "5"],
    "minatar": ["--env-name", "MinAtar/Breakout-v1", "--total-steps", "5000",
                "--learning-starts", "1000", "--eval-every", "2500", "--eval-episodes", "5"],
    # bfloat16 given: on a CPU with bfloat16 units the preset decides it from a timing (cached),
    # and two commits have decided one noisy timing differently.
    "pong": ["--env-name", "PongNoFrameskip-v4", "--total-steps", "2000", "--memory-size",
             "10000", "--learning-starts", "1000", "--eval-every", "2000", "--eval-episodes",
             "1", "--checkpoint-every", "0", "--bfloat16"],
    # The other games the docs report, and the replay and target variants, briefly.
    "acrobot": ["--env-name", "Acrobot-v1", "--total-steps", "3000", "--eval-every", "1500"],
    "mountaincar": ["--env-name", "MountainCar-v0", "--total-steps", "3000", "--eval-every",
                    "1500"],
    "cartpole-rank-based": ["--rank-based", "--total-steps", "5000"],
    "cartpole-uniform": ["--no-per", "--total-steps", "5000"],
    "cartpole-soft-update": ["--soft-update", "--total-steps", "5000"],
    # Environments stepped together (N_ENVS), each budget a multiple of N: vectors and frames.
    "cartpole-n-envs-4": ["--n-envs", "4", "--total-steps", "8000"],
    "minatar-n-envs-3": ["--env-name", "MinAtar/Breakout-v1", "--n-envs", "3", "--total-steps",
                         "4998", "--learning-starts", "1000", "--eval-every", "2499",
                         "--eval-episodes", "5"],
}
TIMINGS = [
    (re.compile(r"; Keras on \w+$"), ""),  # the first line's backend, named since JAX runs
    (re.compile(r", [\d,.]+ steps/s(, .* left)?$"), ""),  # episode lines: speed, time left
    (re.compile(r" in [\d,.]+ (s|min|h)( [\d]+ min)?, .*training steps/s\)"), " in ..."),
    # The bfloat16 preset's note: the CPU's bfloat16 units it needs, or its timing's figures.
    (re.compile(r"bfloat16 (True|False) \((\S+) (?:on \w+ preset|preset: .*?"
                r"(?:measured at start|cached in [^)]*))\)"),
     r"bfloat16 \1 (\2 preset)"),
]


def without_timings(log: str) -> list[str]:
    """The log's lines with speeds and durations removed, and the one-off estimate line."""
    lines = []
    for line in log.splitlines():
        if line.startswith("estimate:"):
            continue
        for pattern, replacement in TIMINGS:
            line = pattern.sub(replacement, line)
        lines.append(line)
    return lines


def train(code: Path, flags: list[str]) -> tuple[list[str], float]:
    """Run `code`'s d3qn_agent.py with `flags` in a fresh directory: (log lines, seconds)."""
    with tempfile.TemporaryDirectory() as work_dir:
        start = time.perf_counter()
        result = subprocess.run(
            [sys.executable, str(code / "d3qn_agent.py"), *flags, "--model-dir", "models",
             "--plot-dir", "plots"], cwd=work_dir, capture_output=True, text=True)
        seconds = time.perf_counter() - start
    if result.returncode != 0:
        raise RuntimeError(f"{code / 'd3qn_agent.py'} {' '.join(flags)} exited "
                           f"{result.returncode}:\n{result.stdout}{result.stderr}")
    return without_timings(result.stdout), seconds


def first_difference(before: list[str], now: list[str]) -> str | None:
    """'line N: ... / ...' for the first line that differs, or None if the logs are the same."""
    for number, (old, new) in enumerate(zip(before, now, strict=False), start=1):
        if old != new:
            return f"line {number}:\n  before: {old}\n  now:    {new}"
    if len(before) != len(now):
        return f"before has {len(before)} lines, now {len(now)}"
    return None


@contextlib.contextmanager
def checkout(revision: str) -> Iterator[Path]:
    """The files of commit `revision`, in a temporary directory while inside."""
    with tempfile.TemporaryDirectory() as code:
        archive = subprocess.run(["git", "-C", str(ROOT), "archive", revision],
                                 capture_output=True, check=True).stdout
        subprocess.run(["tar", "-x", "-C", code], input=archive, check=True)
        yield Path(code)


def compare(revision: str, runs: dict[str, list[str]]) -> dict[str, dict[str, Any]]:
    """Train each of `runs` (name -> d3qn_agent.py flags) at `revision` and in this checkout;
    print each verdict; each game's record: its lines before and now, whether they are
    "identical" or "different", the first difference (None where identical) and the seconds."""
    compared = {}
    with checkout(revision) as code:
        for game, flags in runs.items():
            before, before_seconds = train(code, flags)
            now, now_seconds = train(ROOT, flags)
            difference = first_difference(before, now)
            verdict = "identical" if difference is None else "different"
            shown = verdict if difference is None else f"DIFFERENT, {difference}"
            print(f"{game}: {len(now)} lines, {shown} (before {before_seconds:.0f} s, "
                  f"now {now_seconds:.0f} s)", flush=True)
            compared[game] = {
                "flags": flags, "lines_before": len(before), "lines_now": len(now),
                "verdict": verdict, "first_difference": difference,
                "before_seconds": before_seconds, "now_seconds": now_seconds}
    return compared


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--before", default=REFERENCE_COMMIT, metavar="REV",
                        help="the commit to compare with")
    parser.add_argument("--games", nargs="+", choices=list(GAMES), default=list(GAMES))
    provenance.add_results_argument(parser, __file__)
    args = parser.parse_args()
    code = provenance.commit()  # this checkout's, before the runs: it may move on meanwhile
    before = provenance.git("rev-parse", "--short", f"{args.before}^{{commit}}")
    if not before:
        parser.error(f"--before {args.before}: no such commit in this clone")
    print(f"command: python benchmarks/same_log.py {' '.join(sys.argv[1:])}".rstrip())
    compared = compare(args.before, {game: GAMES[game] for game in args.games})
    provenance.write_results(args.results, {"before": before, "now": code[0], "games": compared},
                             code=code)
    return 0 if all(game["verdict"] == "identical" for game in compared.values()) else 1


if __name__ == "__main__":
    sys.exit(main())
