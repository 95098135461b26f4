"""Pong runs side by side from their logs: a table of scores and speeds, and a plot.

    python benchmarks/pong_logs.py benchmarks/logs/pong_per_preset.log \
        benchmarks/logs/pong_bf16_preset.log --names preset bfloat16 --plot ../pong_runs.png

Each log is the printed output of one `python d3qn_agent.py --env-name PongNoFrameskip-v4 ...`
run, appended chunk after chunk when the run is continued with `--resume`. A resumed chunk starts
again from its checkpoint, so episodes logged after that checkpoint appear twice; the later line
is the run's history and wins. The committed runs' logs are in benchmarks/logs/ (docs/atari.md).

Prints one markdown table, a column per log: the 100- and 50-episode means of the training
scores at 100k, 200k, ..., 500k agent steps, the first step at which the 100-episode mean reaches
18, the greedy evaluations at 250k and 500k, the agent steps per second each chunk printed last
and the wall time (each chunk's steps over that speed, summed). With --plot, draws each run's
50-episode moving average against agent steps. With --results, writes what the table says, run by
run, with provenance's stamp to a results file: docs/atari.md renders its tables of the committed
runs from it (`benchmarks/render_docs.py`). `benchmarks/study.py` reads its runs' logs here.
"""

from __future__ import annotations

import argparse
import re
import sys
from dataclasses import dataclass, field
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt
import matplotlib.ticker
import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from benchmarks import provenance
from benchmarks.markdown_table import format_row

CHECKPOINTS = (100_000, 200_000, 300_000, 400_000, 500_000)  # steps the table reports
EVALUATION_STEPS = (250_000, 500_000)  # the Atari defaults evaluate every 250,000 steps
SOLVED_MEAN = 18.0  # the Pong target (docs/atari.md), a 100-episode mean
WINDOWS = (100, 50)  # episodes in the two moving averages the table reports; the plot uses 50

# Logs since the estimate end an episode line with the time left: "..., 47 steps/s, 2 h 3 min left".
EPISODE_LINE = re.compile(r"^episode: (\d+), step: (\d+)/\d+, score: (-?[\d.]+), .*?, "
                          r"(\d+) steps/s(?:, [\w ]+ left)?$")
EVALUATION_LINE = re.compile(r"^evaluation at step (\d+): mean (-?[\d.]+) \+/- ([\d.]+) over")
RESUME_LINE = re.compile(r"^resuming from .* at step (\d+)$")
# Older logs say "interrupted at step N:", newer ones name the signal: "interrupted by SIGTERM at".
INTERRUPT_LINE = re.compile(r"^interrupted (?:by \w+ )?at step (\d+):")
CHECKPOINT_LINE = re.compile(r"^checkpoint: .*step-(\d+)$")


@dataclass
class Chunk:
    """One process's stretch of a run: where it started and ended, the last speed it printed."""

    start_step: int
    end_step: int
    steps_per_second: float = 0.0

    @property
    def seconds(self) -> float:
        steps = self.end_step - self.start_step
        return steps / self.steps_per_second if steps > 0 else 0.0


@dataclass
class RunLog:
    """A run's history: per episode its last step and score, the evaluations, the chunks."""

    steps: np.ndarray  # agent step at which each episode ended, in episode order
    scores: np.ndarray  # each episode's (unclipped) score
    evaluations: dict[int, tuple[float, float]]  # step -> (mean, std) over the greedy episodes
    reached: int  # the last agent step the log vouches for (episode, evaluation or checkpoint)
    chunks: list[Chunk] = field(default_factory=list)

    def mean_at(self, step: int, window: int) -> float | None:
        """Mean score of the last `window` episodes that ended by `step` (fewer at the start)."""
        ended = int(np.searchsorted(self.steps, step, side="right"))
        if ended == 0 or self.reached < step:
            return None  # no episode yet, or the run has not reached `step`
        return float(self.scores[max(0, ended - window):ended].mean())

    def first_step_with_mean(self, target: float, window: int) -> int | None:
        """The first episode-end step at which the `window`-episode mean is >= target."""
        hits = np.flatnonzero(self.moving_average(window) >= target)
        return int(self.steps[hits[0]]) if len(hits) else None

    def moving_average(self, window: int) -> np.ndarray:
        """The `window`-episode trailing mean after every episode, as d3qn_agent plots it."""
        sums = np.cumsum(np.concatenate([[0.0], self.scores]))
        ends = np.arange(1, len(self.scores) + 1)
        starts = np.maximum(0, ends - window)
        return (sums[ends] - sums[starts]) / (ends - starts)

    @property
    def seconds(self) -> float:
        return sum(chunk.seconds for chunk in self.chunks)


def parse_log(text: str) -> RunLog:
    """Read a d3qn_agent.py log; after a resume, the replayed lines replace the old ones."""
    episodes: dict[int, tuple[int, float]] = {}  # episode -> (step it ended at, score)
    evaluations: dict[int, tuple[float, float]] = {}
    chunks: list[Chunk] = []
    resume_step = reached = 0
    for line in text.splitlines():
        if match := RESUME_LINE.match(line):
            # What the last chunk logged after its checkpoint is replayed (or lost): drop it.
            resume_step = reached = int(match[1])
            episodes = {e: ended for e, ended in episodes.items() if ended[0] <= resume_step}
            evaluations = {s: value for s, value in evaluations.items() if s <= resume_step}
        elif line.startswith("training on "):
            chunks.append(Chunk(resume_step, resume_step))
            resume_step = 0
        elif match := EPISODE_LINE.match(line):
            step = reached = int(match[2])
            episodes[int(match[1])] = (step, float(match[3]))
            if chunks:
                chunks[-1].end_step = step
                chunks[-1].steps_per_second = float(match[4])
        elif (match := INTERRUPT_LINE.match(line)) and chunks:
            chunks[-1].end_step = reached = int(match[1])  # a stop signal: past its last episode
        elif match := CHECKPOINT_LINE.match(line):
            reached = int(match[1])
        elif match := EVALUATION_LINE.match(line):
            reached = int(match[1])
            evaluations[reached] = (float(match[2]), float(match[3]))
    if not episodes:
        raise ValueError("no 'episode: N, step: ...' lines in the log: is it the output of "
                         "d3qn_agent.py?")
    order = sorted(episodes)
    return RunLog(steps=np.array([episodes[e][0] for e in order]),
                  scores=np.array([episodes[e][1] for e in order]),
                  evaluations=evaluations, reached=reached, chunks=chunks)


def format_mean(value: float | None) -> str:
    """One decimal, with the typographic minus the README uses; a dash for no value."""
    return "—" if value is None else f"{value:.1f}".replace("-", "\u2212")


def table_rows(runs: dict[str, RunLog]) -> list[list[str]]:
    """The side-by-side table: one row per quantity, one column per run."""
    rows = []
    for step in CHECKPOINTS:
        cells = []
        for run in runs.values():
            if run.reached < step:
                cells.append(f"not reached (log ends at {run.reached:,})")
            else:
                cells.append(" / ".join(format_mean(run.mean_at(step, w)) for w in WINDOWS))
        rows.append([f"{WINDOWS[0]}- / {WINDOWS[1]}-episode mean at step {step:,}", *cells])
    solved = []
    for run in runs.values():
        step = run.first_step_with_mean(SOLVED_MEAN, WINDOWS[0])
        solved.append(f"{step:,}" if step is not None
                      else f"not within {run.reached:,}")
    rows.append([f"steps to a {WINDOWS[0]}-episode mean of {SOLVED_MEAN:g}", *solved])
    for step in EVALUATION_STEPS:
        rows.append([f"greedy evaluation at step {step:,} (10 episodes)",
                     *[f"{format_mean(run.evaluations[step][0])} ± {run.evaluations[step][1]:.1f}"
                       if step in run.evaluations else "—" for run in runs.values()]])
    rows.append(["agent steps/s, chunk by chunk",
                 *[", ".join(f"{chunk.steps_per_second:g}" for chunk in run.chunks)
                   for run in runs.values()]])
    rows.append(["wall time (sum of chunks)",
                 *[f"{run.seconds / 3600:.1f} h" for run in runs.values()]])
    return rows


def measured(name: str, log: Path, run: RunLog) -> dict[str, object]:
    """One run's row of the results file: what `table_rows` shows of it, as numbers (None: the
    log never reaches it), with the log's path from the repository root where it is inside."""
    log = log.resolve()
    shown = log.relative_to(provenance.ROOT) if log.is_relative_to(provenance.ROOT) else log
    solved = run.first_step_with_mean(SOLVED_MEAN, WINDOWS[0])
    return {"name": name, "log": shown.as_posix(), "episodes": len(run.scores),
            "reached": run.reached,
            "means": {f"{step}": [run.mean_at(step, window) for window in WINDOWS]
                      for step in CHECKPOINTS},
            "solved_mean": SOLVED_MEAN, "solved_window": WINDOWS[0], "solved_at_step": solved,
            "solved_at_episode": None if solved is None
            else int(np.searchsorted(run.steps, solved) + 1),
            "evaluations": {f"{step}": list(run.evaluations[step]) for step in EVALUATION_STEPS
                            if step in run.evaluations},
            "chunks": [[chunk.start_step, chunk.end_step, chunk.steps_per_second]
                       for chunk in run.chunks],
            "seconds": run.seconds}


def draw(runs: dict[str, RunLog], path: Path) -> None:
    """Each run's 50-episode moving average (and faint raw scores) against agent steps."""
    figure, axes = plt.subplots(figsize=(9, 5))
    for (name, run), color in zip(runs.items(), plt.cm.tab10.colors, strict=False):
        axes.plot(run.steps, run.scores, ".", color=color, alpha=0.2, markersize=3)
        axes.plot(run.steps, run.moving_average(WINDOWS[1]), color=color, linewidth=2,
                  label=f"{name}: {WINDOWS[1]}-episode moving average")
        if run.evaluations:
            steps = sorted(run.evaluations)
            axes.errorbar(steps, [run.evaluations[s][0] for s in steps],
                          yerr=[run.evaluations[s][1] for s in steps], fmt="D", color=color,
                          capsize=4, label=f"{name}: greedy evaluation (10 episodes)")
    axes.set_xlabel("agent steps")
    axes.set_ylabel("episode score")
    axes.set_ylim(-21.5, 21.5)
    axes.set_title("PongNoFrameskip-v4, D3QN")
    axes.grid(alpha=0.3)
    axes.xaxis.set_major_formatter(matplotlib.ticker.StrMethodFormatter("{x:,.0f}"))
    axes.legend(loc="upper left")
    figure.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    figure.savefig(path, dpi=100)
    plt.close(figure)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("logs", type=Path, nargs="+", help="d3qn_agent.py logs, one per run")
    parser.add_argument("--names", nargs="+",
                        help="the runs' column names, one per log (default: the file names)")
    parser.add_argument("--plot", type=Path, help="where to draw the figure (default: no figure)")
    parser.add_argument("--results", type=Path,
                        help="where to write what the table says, stamped (default: nowhere)")
    args = parser.parse_args(argv)
    names = args.names or [path.stem for path in args.logs]
    if len(names) != len(args.logs):
        parser.error(f"--names gives {len(names)} names for {len(args.logs)} logs")
    if len(set(names)) != len(names):
        parser.error(f"--names repeats a name: {names}")
    runs = {}
    for name, path in zip(names, args.logs, strict=True):
        if not path.is_file():
            parser.error(f"no log file at {path}")
        runs[name] = parse_log(path.read_text(errors="replace"))
        chunks = ", ".join(f"{c.start_step:,}-{c.end_step:,} at {c.steps_per_second:g} steps/s"
                           for c in runs[name].chunks)
        print(f"{name}: {len(runs[name].scores)} episodes to step {runs[name].reached:,}; "
              f"chunks {chunks}")
    print()
    print(format_row(["", *runs]))
    print(format_row(["---"] * (len(runs) + 1)))
    for row in table_rows(runs):
        print(format_row(row))
    if args.plot:
        draw(runs, args.plot)
        print(f"\nplot: {args.plot}")
    if args.results:
        provenance.write_results(args.results, {"windows": list(WINDOWS), "runs": [
            measured(name, path, run) for (name, run), path in zip(runs.items(), args.logs,
                                                                   strict=True)]})


if __name__ == "__main__":
    main()
