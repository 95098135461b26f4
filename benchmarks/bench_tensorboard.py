"""What --tensorboard and the priority figure's replay statistics cost, and a TensorBoard run drawn.

    python benchmarks/bench_tensorboard.py            # the costs, as in the README
    python benchmarks/bench_tensorboard.py --draw runs/DDQN_CartPole-v1_Dueling_PER

Costs: short CartPole runs with d3qn_agent.py's defaults (TOTAL_STEPS 3,000: 1,000 steps of
random play, then 2,000 steps with 1,000 gradient steps), without TensorBoard, with it (a write
every TENSORBOARD_EVERY = 100 gradient steps) and with a write after every gradient step, one
after the other, the order repeated `--rounds` times; each run in a process of its own, so that
no run inherits what an earlier one left behind (a TensorBoard writer's threads); prints the
median seconds per env step of the whole `agent.run()`. Then `Memory.sample` on a full
50,000-slot memory with and without `priority_figure.PriorityFigure` counting each draw (the
counters behind the priority figure), the two in turn for as many rounds. `--draw DIR` instead
draws the scalars of the event files in DIR (e.g. the default run with --tensorboard) to
plots/tensorboard_<run name>.png. Every round's cost goes to a results file too (`--results`).
"""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import keras
import numpy as np
from matplotlib.figure import Figure

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
import d3qn_agent
from benchmarks import provenance, timing
from d3qn_utils.priority_figure import PriorityFigure
from PER import Memory

VARIANTS = {  # label -> flags
    "no TensorBoard": {},
    "--tensorboard": {"tensorboard": True},
    "--tensorboard --tensorboard-every 1": {"tensorboard": True, "tensorboard_every": 1},
}
# Tags drawn by --draw, one panel each.
PANELS = ("episode/score", "eval/greedy_mean_score", "train/loss", "train/mean_abs_td_error",
          "replay/beta", "replay/min_is_weight")


def seconds_per_step(flags: dict, total_steps: int, work_dir: Path) -> float:
    """Train once with the defaults and `flags`; wall seconds per env step of the whole run."""
    keras.backend.clear_session()
    flags = dict(flags)
    if flags.get("tensorboard") is True:
        flags["tensorboard"] = str(work_dir / "runs")
    agent = d3qn_agent.DQNAgent("CartPole-v1", total_steps=total_steps, eval_every=total_steps,
                                model_dir=str(work_dir), plot_dir=str(work_dir), **flags)
    with contextlib.redirect_stdout(io.StringIO()):
        start = time.perf_counter()
        agent.run()
    return (time.perf_counter() - start) / total_steps


def seconds_per_step_alone(label: str, total_steps: int) -> float:
    """`seconds_per_step` of the variant `label`, in a fresh process of this script."""
    result = subprocess.run([sys.executable, __file__, f"--child={label}", "--total-steps",
                             str(total_steps)], capture_output=True, text=True, check=True)
    return float(json.loads(result.stdout.strip().splitlines()[-1]))


def sample_cost(observed: bool, repeats: int = 2_000) -> float:
    """Median microseconds of `Memory.sample(128)` on a full 50,000-slot CartPole memory, with
    the `PriorityFigure` counting the draw or without."""
    memory = Memory(50_000, rng=0)
    stats = PriorityFigure(50_000, batch_size=128)
    state = np.zeros(4, np.float32)
    for _ in range(50_000):
        stats.note_store(memory.store((state, 0, 1.0, state, False)))
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        tree_idx, _, _ = memory.sample(128)
        if observed:
            stats.note_sample(memory.slots_of(tree_idx), len(memory))
        times.append(time.perf_counter() - start)
    return 1e6 * statistics.median(times)


def draw(log_dir: str) -> str:
    """Draw the PANELS tags of the event files in `log_dir`; return the PNG's path."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
    from tensorboard.util.tensor_util import make_ndarray

    events = EventAccumulator(log_dir, size_guidance={"tensors": 0})
    events.Reload()
    name = Path(log_dir).name
    figure = Figure(figsize=(13, 7), layout="constrained")
    figure.suptitle(f"TensorBoard scalars of {log_dir} (tensorboard --logdir "
                    f"{Path(log_dir).parent})", fontsize=11)
    for axes, tag in zip(figure.subplots(2, 3).ravel(), PANELS, strict=True):
        if tag in events.Tags()["tensors"]:
            points = events.Tensors(tag)
            axes.plot([p.step for p in points], [float(make_ndarray(p.tensor_proto))
                                                 for p in points], linewidth=1,
                      marker="o" if len(points) < 100 else None, markersize=3)
        axes.set_title(tag, fontsize=10)
        axes.set_xlabel("environment step")
        axes.grid(alpha=0.3)
    path = os.path.join("plots", f"tensorboard_{name}.png")
    figure.savefig(path, dpi=80)
    return path


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--total-steps", type=int, default=3_000, help="env steps per run")
    timing.add_rounds_argument(parser)
    parser.add_argument("--draw", metavar="DIR", help="draw this run's event files instead")
    parser.add_argument("--child", choices=VARIANTS, help=argparse.SUPPRESS)  # one run, alone
    provenance.add_results_argument(parser, __file__)
    args = parser.parse_args()
    if args.draw:
        print(f"figure: {draw(args.draw)}")
        return
    if args.child:  # timed under its parent's hold on the lock
        with tempfile.TemporaryDirectory() as work_dir:
            print(json.dumps(seconds_per_step(VARIANTS[args.child], args.total_steps,
                                              Path(work_dir))))
        return
    timing.check_rounds(args.rounds)
    provenance.time_alone()  # no other timing shares the cores; its children time under it
    timings: dict[str, list[float]] = {label: [] for label in VARIANTS}
    for round_number in range(args.rounds):
        for label in VARIANTS:
            timings[label].append(seconds_per_step_alone(label, args.total_steps))
            print(f"round {round_number + 1}, {label}: {1e3 * timings[label][-1]:.3f} ms per env "
                  "step", file=sys.stderr, flush=True)
    base = statistics.median(timings["no TensorBoard"])
    print(f"| variant | ms per env step (median of {args.rounds}) | vs no TensorBoard |")
    print("| --- | --- | --- |")
    for label, values in timings.items():
        median = statistics.median(values)
        print(f"| {label} | {1e3 * median:.3f} | {100 * (median / base - 1):+.1f}% |")
    samples: dict[str, list[float]] = {"without replay statistics": [],
                                       "with replay statistics": []}
    for _ in range(args.rounds):  # the two in turn
        samples["without replay statistics"].append(sample_cost(False))
        samples["with replay statistics"].append(sample_cost(True))
    alone, observed = (statistics.median(rounds) for rounds in samples.values())
    print(f"\nMemory.sample(128), 50,000 slots: {alone:.1f} us without replay statistics, "
          f"{observed:.1f} us with them counting the draw (+{observed - alone:.1f} us per "
          "sample of 128)")
    provenance.write_results(args.results, {
        "total_steps": args.total_steps, "rounds": args.rounds,
        "seconds_per_env_step": timings, "sample_128_microseconds": samples})


if __name__ == "__main__":
    main()
