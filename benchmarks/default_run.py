"""The default run: `python d3qn_agent.py` (CartPole-v1, the flags as shipped) at this
checkout, `--rounds` times, and everything the pages show of it from those runs.

    python benchmarks/default_run.py

Trains in an empty temporary directory per round (a seeded run: every round learns the same,
checked), then writes every round's times, the step it solved at and its final evaluation, with
the first round's log and provenance's stamp, to
benchmarks/results/default_run/<UTC date and time>.json (`--results`), and copies its learning
curve and priority figure to plots/DDQN_CartPole-v1_Dueling_PER.png and
plots/DDQN_CartPole-v1_Dueling_PER_priorities.png. docs/classic_control.md renders its table from
the newest such file (`python benchmarks/render_docs.py`). Measure on a quiet machine: the time
is part of what it reports.
"""

from __future__ import annotations

import argparse
import re
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from benchmarks import provenance, timing

ROOT = Path(__file__).resolve().parent.parent
NAME = "DDQN_CartPole-v1_Dueling_PER"  # the default run's files (settings.run_name)
FIGURES = (f"{NAME}.png", f"{NAME}_priorities.png")
# The summary's figures that time the run (a list of the rounds' values each in the file).
TIMED = ("seconds", "evaluation_seconds", "training_steps_per_second", "wall_seconds")
DONE = re.compile(r"done: (?P<steps>[\d,]+) steps in (?P<seconds>\d+) s, (?P<evaluation_seconds>"
                  r"\d+) s of them in evaluations \((?P<steps_per_second>\d+) training steps/s\); "
                  r"final evaluation (?P<final>[-\d.]+), best (?P<best>[-\d.]+); "
                  r"(?:solved at step (?P<solved>\d+)|not solved)")


def summary(log: str) -> dict[str, float | int | None]:
    """What the run's `done:` line says: steps, seconds, evaluation seconds, training steps per
    second, final and best evaluation, the step it solved at (None if it did not)."""
    match = DONE.search(log)
    if match is None:
        raise ValueError("the run's log has no `done:` line")
    found = match.groupdict()
    return {"steps": int(found["steps"].replace(",", "")), "seconds": int(found["seconds"]),
            "evaluation_seconds": int(found["evaluation_seconds"]),
            "training_steps_per_second": int(found["steps_per_second"]),
            "final_evaluation": float(found["final"]), "best_evaluation": float(found["best"]),
            "solved_at_step": None if found["solved"] is None else int(found["solved"])}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    timing.add_rounds_argument(parser)
    provenance.add_results_argument(parser, __file__)
    args = parser.parse_args()
    timing.check_rounds(args.rounds)
    provenance.time_alone()  # no other timing shares the cores
    code = provenance.commit()  # before the run: the checkout may move on meanwhile
    rounds: list[dict] = []
    for round_number in range(args.rounds):
        with tempfile.TemporaryDirectory() as work_dir:
            start = time.perf_counter()
            run = subprocess.run([sys.executable, str(ROOT / "d3qn_agent.py"), "--model-dir",
                                  "models", "--plot-dir", "plots"], cwd=work_dir,
                                 capture_output=True, text=True)
            wall_seconds = time.perf_counter() - start
            if run.returncode != 0:
                print(run.stdout + run.stderr, file=sys.stderr)
                return run.returncode
            if round_number == 0:
                log = run.stdout.splitlines()
                for figure in FIGURES:
                    shutil.copyfile(Path(work_dir) / "plots" / figure, ROOT / "plots" / figure)
                    print(f"figure: plots/{figure}")
        rounds.append({**summary(run.stdout), "wall_seconds": wall_seconds})
        print(f"round {round_number + 1}: {rounds[-1]['seconds']} s", flush=True)
    learned = [{name: value for name, value in found.items() if name not in TIMED}
               for found in rounds]
    if any(found != learned[0] for found in learned):
        print(f"error: the rounds learned differently: {learned}", file=sys.stderr)
        return 1
    provenance.write_results(args.results, {
        **learned[0], **{name: [found[name] for found in rounds] for name in TIMED},
        "rounds": args.rounds, "log": log}, command="python d3qn_agent.py", code=code)
    return 0


if __name__ == "__main__":
    sys.exit(main())
