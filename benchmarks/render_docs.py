"""The pages' results tables, rendered from the results files their scripts wrote.

    python benchmarks/render_docs.py             # rewrite every rendered block from the files
    python benchmarks/render_docs.py --check     # change nothing; exit 1 naming each that differs
    python benchmarks/render_docs.py --check --recompute   # the bootstrap intervals afresh too

A block in README.md or docs/*.md is the lines between `<!-- rendered: NAME -->` and
`<!-- end rendered -->`; RENDERERS says how each NAME is rendered from the files under
benchmarks/results/, each table with the command, machine and commit of its rows, and each
committed figure with the command, machine and commit it came from (figure_stamps.py). A number
typed into a block by hand makes `--check` (run by tests/test_render_docs.py) fail, naming the
block; so does a study's report.md that its result files no longer give, and a figure drawn from
an older results file than its table's.

The studies' confidence intervals are bootstraps of 10,000 resamples, minutes for a page, so
they are kept in benchmarks/results/bootstrap_intervals.json under a hash of all they were
computed from (`study.IntervalCache`): a changed result file is computed afresh, and
`--recompute` computes every interval again and checks the kept ones against it.
"""

from __future__ import annotations

import argparse
import re
import sys
from collections.abc import Callable
from dataclasses import dataclass
from functools import partial
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from benchmarks import benchmark_tables as tables
from benchmarks import figure_stamps, learning_tables, provenance, study
from benchmarks.timing import spread

ROOT = Path(__file__).resolve().parent.parent
INTERVALS_FILE = "bootstrap_intervals.json"  # under the results root
BLOCK = re.compile(r"^<!-- rendered: (?P<name>\S+) -->\n(?P<body>.*?)^<!-- end rendered -->$",
                   re.MULTILINE | re.DOTALL)
BLOCK_START = re.compile(r"^<!-- rendered: \S+ -->$", re.MULTILINE)
REPORTS = ("classic_control", "minatar", "pong")  # studies whose report.md is kept rendered


@dataclass(frozen=True)
class Screen:
    """A table row of a screen: a study of its own under screens/, one game, a few seeds."""

    study: str  # under benchmarks/results/<folder>/
    game: str
    setting: str  # what the row tried, in words: the flags beyond the preset of today
    folder: str = "screens"


def shown(path: Path) -> str:
    """`path` as a message names it: from the repository root where it is inside."""
    path = path.resolve()
    return path.relative_to(ROOT).as_posix() if path.is_relative_to(ROOT) else str(path)


def pages(root: Path) -> list[Path]:
    return [root / "README.md", *sorted((root / "docs").glob("*.md"))]


def screens_table(screens: list[Screen], digits: int, results: Path) -> str:
    """Markdown: a row per screen with each seed's last-network score, training return and best
    evaluation, and the runs' command, machine and commit."""
    rows = []
    for screen in screens:
        variants = study.load_results(f"{screen.folder}/{screen.study}", results).get(screen.game)
        if not variants:
            raise ValueError(f"screens/{screen.study} has no runs of {screen.game}")
        runs = [run for found in variants.values() for run in found]
        rows.append((screen, runs))
    several = any(len(runs) > 1 for _, runs in rows)  # a mean column only where it means more
    header = ["game", "setting (flags on today's preset)", "study (`screens/…`)", "seeds",
              "last network", *(["mean"] if several else []), "last 100 training episodes",
              "best evaluation (at step)", "command", "machine", "commit"]
    lines = ["| " + " | ".join(header) + " |", "|---" * len(header) + "|"]
    for screen, runs in rows:
        last = [run["final_score"] for run in runs]
        cells = [screen.game, screen.setting, f"`{screen.study}`",
                 ", ".join(str(run["seed"]) for run in runs),
                 ", ".join(f"{score:.{digits}f}" for score in last),
                 *([f"{np.mean(last):.{digits}f}"] if several else []),
                 ", ".join(f"{study.training_score(run):.{digits}f}" for run in runs),
                 ", ".join(best_evaluation(run) for run in runs),
                 *study.provenance_cells(runs)]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


# A row is set against the first (the chance its runs beat the first row's) only on the same
# seeds, at least this many: a study still running shows no chance from the seeds done so far.
MIN_RUNS_COMPARED = 3


def defaults_screen_table(screens: list[Screen], results: Path) -> str:
    """Markdown: a row per screen of one game, the first the defaults and each other one of them
    changed: each seed's last-network score, the IQM of the last networks [95% CI] and their
    mean, the IQM of the last 100 training episodes [95% CI], the median steps to solve, and
    P(a run of the defaults scores above a run of the row's) by both scores (on the first row's
    seeds, MIN_RUNS_COMPARED of them or more; else n/a, saying why); with the runs' command,
    machine and commit."""
    rows = []
    for screen in screens:
        variants = study.load_results(f"{screen.folder}/{screen.study}", results).get(screen.game)
        if not variants:
            raise ValueError(f"screens/{screen.study} has no runs of {screen.game}")
        rows.append((screen, [run for found in variants.values() for run in found]))
    header = ["setting", f"study (`{rows[0][0].folder}/…`)", "seeds", "last network",
              "IQM, last networks [95% CI]", "mean", "IQM, last 100 training episodes [95% CI]",
              "median steps to solve", f"P({rows[0][0].study} run beats this run): last networks",
              "last 100 training episodes", "command", "machine", "commit"]
    lines = ["| " + " | ".join(header) + " |", "|---" * len(header) + "|"]
    scores = {"last": lambda run: run["final_score"], "training": study.training_score}
    defaults = {name: [score(run) for run in rows[0][1]] for name, score in scores.items()}
    for index, (screen, runs) in enumerate(rows):
        measures = {name: [score(run) for run in runs] for name, score in scores.items()}
        points, intervals = study.iqm_interval(measures)
        # A run that never solved counts as never: "not solved" where half the runs did not.
        median = float(np.median([np.inf if run["steps_to_solve"] is None
                                  else run["steps_to_solve"] for run in runs]))
        budget = runs[0]["settings"]["total_steps"]
        seeds, first_seeds = (sorted(run["seed"] for run in found) for found in (runs, rows[0][1]))
        unmatched = (None if index == 0 else f"n/a (fewer than {MIN_RUNS_COMPARED} runs)"
                     if min(len(seeds), len(first_seeds)) < MIN_RUNS_COMPARED
                     else "n/a (other seeds than the first row's)" if seeds != first_seeds
                     else None)
        improvements = ["n/a" if index == 0 else unmatched or study.format_interval(
            *study.improvement_interval(defaults[name], measures[name]), 2) for name in scores]
        cells = [screen.setting, f"`{screen.study}`", ", ".join(str(run["seed"]) for run in runs),
                 ", ".join(f"{score:.1f}" for score in measures["last"]),
                 study.format_interval(points["last"], intervals["last"]),
                 f"{np.mean(measures['last']):.1f}",
                 study.format_interval(points["training"], intervals["training"]),
                 ("n/a (no solved score)" if runs[0]["solved_score"] is None
                  else f"{median:,.0f}" if np.isfinite(median) else f"not solved by {budget:,}"),
                 *improvements, *study.provenance_cells(runs)]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


def best_evaluation(run: dict) -> str:
    """The run's best greedy evaluation and its step: "23.1 at 2.0M" in a run of millions."""
    means = run["evaluation"]["means"]
    best = int(np.argmax(means))
    step = run["evaluation"]["steps"][best]
    at = f"{step / 1e6:.1f}M" if run["settings"]["total_steps"] >= 1_000_000 else f"{step:,}"
    return f"{means[best]:.1f} at {at}"


CLASSIC_SCREENS = [
    Screen("acrobot_train_frequency_4", "Acrobot-v1", "`--train-frequency 4 --epsilon-min 0.1`"),
    Screen("acrobot_train_frequency_1", "Acrobot-v1",
           "`--epsilon-min 0.1` (a gradient step every env step, as the RL Zoo)"),
    Screen("acrobot_train_frequency_1_epsilon_0.01", "Acrobot-v1", "**none: the preset**"),
    Screen("lunarlander_preset", "LunarLander-v3", "**none: the preset** (a gradient step every "
           "env step, ε down to 0.1, a target copy every 250 steps)"),
    Screen("lunarlander_target_update_500", "LunarLander-v3", "`--target-update 500`"),
    Screen("lunarlander_epsilon_0.02", "LunarLander-v3",
           "`--epsilon-min 0.02` (stopped after one seed)"),
    Screen("mountaincar_preset", "MountainCar-v0", "**none: the preset**"),
]
# CartPole's defaults against each of TARGET_UPDATE 500, N_STEP 3, LR_DECAY and hard target
# copies changed back, on seeds 10-14: neither the study's 0-9 nor the seeds they were picked on.
CARTPOLE_DEFAULTS_SCREENS = [
    Screen("cartpole_defaults", "CartPole-v1", "**none: the defaults**"),
    Screen("cartpole_target_update_100", "CartPole-v1",
           "`--target-update 100` (the period before the screen)"),
    Screen("cartpole_n_step_1", "CartPole-v1", "`--n-step 1` (the tutorial's 1-step returns)"),
    Screen("cartpole_no_lr_decay", "CartPole-v1",
           "`--no-lr-decay` (a constant step, as the tutorial)"),
    Screen("cartpole_soft_update", "CartPole-v1",
           "`--soft-update` (τ 0.005 after every gradient step)"),
]
# CartPole with N_ENVS 4 against one environment, the same budget in environment steps, on seeds
# 20-29 (none tuned on: the study's are 0-9, the defaults screen's 10-14).
CARTPOLE_N_ENVS = [
    Screen("cartpole_1", "CartPole-v1", "**N_ENVS 1: the default**", "n_envs"),
    Screen("cartpole_4", "CartPole-v1", "`--n-envs 4`", "n_envs"),
]
MINATAR_N_ENVS = {game: [
    Screen("minatar_1", game, "**N_ENVS 1: the default**", "n_envs"),
    Screen("minatar_4", game, "`--n-envs 4`", "n_envs"),
] for game in ("MinAtar/Breakout-v1", "MinAtar/Asterix-v1")}
MINATAR_FIRST_SCREENS = [
    Screen("minatar", "MinAtar/Breakout-v1", "`--n-step 3 --adam-epsilon 1e-7`"),
    Screen("minatar-nstep1", "MinAtar/Breakout-v1", "`--adam-epsilon 1e-7`"),
    Screen("minatar", "MinAtar/Asterix-v1", "`--n-step 3 --adam-epsilon 1e-7`"),
    Screen("minatar-uniform", "MinAtar/Asterix-v1", "the same, `--no-per` (uniform replay)"),
    Screen("minatar-gsc16", "MinAtar/Asterix-v1", "the same, `--gradient-steps-per-call 16`"),
    Screen("minatar-lr2.5e-4", "MinAtar/Asterix-v1",
           "the same, `--learning-rate 2.5e-4` (the MinAtar paper's step)"),
    Screen("minatar-tf2", "MinAtar/Asterix-v1",
           "the same, `--train-frequency 2` (twice the gradient steps)"),
    Screen("minatar-adam-eps", "MinAtar/Asterix-v1",
           "`--n-step 3` (Dopamine's Adam epsilon, 3-step returns)"),
    Screen("minatar-nstep1", "MinAtar/Asterix-v1", "`--adam-epsilon 1e-7`"),
]
MINATAR_SECOND_SCREENS = [
    *(Screen("minatar-nstep1", f"MinAtar/{game}-v1", "`--adam-epsilon 1e-7`")
      for game in ("Freeway", "Seaquest", "SpaceInvaders")),
    *(Screen("minatar-nstep1-adam-eps", f"MinAtar/{game}-v1", "none: today's preset")
      for game in ("Asterix", "Breakout", "Freeway", "Seaquest", "SpaceInvaders")),
    *(Screen("minatar-dopamine", f"MinAtar/{game}-v1",
             "`--learning-rate 2.5e-4` (Revisiting Rainbow's DQN)")
      for game in ("Asterix", "Breakout")),
]

# Block name -> its text from the results root.
def default_run(results: Path) -> str:
    """The default run's table, from the newest file of benchmarks/default_run.py (its times over
    the rounds it ran, whole numbers)."""
    run = tables.newest_results(results, "default_run")

    def timed(values: float | list[float], unit: str = "") -> str:
        return tables.timed(spread(values), "{:,.0f}", unit)

    found = run["results"]
    solved = (f"at step {found['solved_at_step']:,}" if found["solved_at_step"] is not None
              else "not solved")
    rows = [("command", f"`{run['command']}`"),
            ("time", f"{timed(found['wall_seconds'], ' s')} in all with start-up, "
                     f"{timed(found['seconds'], ' s')} of training loop, "
                     f"{timed(found['evaluation_seconds'], ' s')} of them greedy evaluations; "
                     f"{timed(found['training_steps_per_second'])} training steps per second"),
            ("solved (a greedy evaluation with a mean of at least 475 over 20 episodes)", solved),
            ("final evaluation (20 greedy episodes)", f"{found['final_evaluation']:.1f}"),
            ("machine", provenance.machine_label(run)), ("commit", provenance.commit_label(run)),
            ("load", provenance.load_label(run))]
    return "| the default run | |\n|---|---|\n" + "".join(f"| {name} | {value} |\n"
                                                          for name, value in rows)


RENDERERS: dict[str, Callable[[Path], str]] = {
    "default_run": default_run,
    "quiet_rule": lambda results: provenance.quiet_rule(),  # from the constants, no file
    "classic_control": partial(study.study_tables, "classic_control"),
    "classic_control_screens": partial(screens_table, CLASSIC_SCREENS, 1),
    "cartpole_defaults_screen": partial(defaults_screen_table, CARTPOLE_DEFAULTS_SCREENS),
    "cartpole_n_envs": partial(defaults_screen_table, CARTPOLE_N_ENVS),
    "cartpole_jax": partial(study.compare, "cartpole_jax", "classic_control", "CartPole-v1",
                            "per"),
    "minatar": partial(study.study_tables, "minatar"),
    "minatar_screens_first_round": partial(screens_table, MINATAR_FIRST_SCREENS, 2),
    "minatar_screens_second_round": partial(screens_table, MINATAR_SECOND_SCREENS, 2),
    "minatar_n_envs_breakout": partial(defaults_screen_table,
                                       MINATAR_N_ENVS["MinAtar/Breakout-v1"]),
    "minatar_n_envs_asterix": partial(defaults_screen_table, MINATAR_N_ENVS["MinAtar/Asterix-v1"]),
    "minatar_jax": partial(study.compare, "minatar_jax", "minatar_tf_now",
                           "MinAtar/Breakout-v1", "per"),
    "pong": partial(study.study_tables, "pong"),
    "pong_bf16": partial(study.compare, "pong_bf16", "pong", "PongNoFrameskip-v4", "per"),
    "pong_n_envs": partial(study.compare, "n_envs/pong_8", "pong_bf16", "PongNoFrameskip-v4",
                           "per"),
    # Learning results outside the studies, from their scripts' files (learning_tables.py).
    "blind_cliffwalk": partial(learning_tables.blind_cliffwalk, learning_tables.BLIND_CLIFFWALK),
    "blind_cliffwalk_priority_epsilon": partial(learning_tables.blind_cliffwalk,
                                                learning_tables.BLIND_CLIFFWALK_EPSILON),
    "pretrained": learning_tables.pretrained,
    "pong_runs": learning_tables.pong_runs,
    "pong_means": learning_tables.pong_means,
    # The line under each committed figure (figure_stamps.py).
    **{f"figure_{Path(figure.path).stem}": partial(figure_stamps.file_figure, figure)
       for figure in figure_stamps.FILE_FIGURES},
    "figure_classic_control": partial(figure_stamps.study_figures, "classic_control", 2),
    "figure_minatar": partial(figure_stamps.study_figures, "minatar", 2),
    "figure_pong_training_curves": partial(figure_stamps.study_figures, "pong", 1),
    "figure_pong_runs": partial(figure_stamps.pong_logs_figure, "plots/pong_runs.png"),
    "figure_default_run": figure_stamps.default_run_figure,  # the learning curve
    "figure_default_run_priorities": figure_stamps.default_run_figure,
    # The speed and size benchmarks (benchmark_tables.py).
    "bench_per": tables.bench_per,
    "bench_atari_cartpole": partial(tables.bench_atari, "CartPole-v1"),
    "bench_atari_pong": partial(tables.bench_atari, "PongNoFrameskip-v4"),
    "bench_atari_minatar": partial(tables.bench_atari, "MinAtar/Breakout-v1"),
    "bench_backends": partial(tables.bench_backends, list(tables.GAMES)),
    "bench_backends_minatar": partial(tables.bench_backends, ["MinAtar/Breakout-v1"]),
    "bench_backends_ratios": partial(tables.bench_backends_ratios, list(tables.GAMES)),
    "bench_pong_kernels": tables.bench_pong_kernels,
    "pong_xla": tables.pong_xla,
    "bench_steps_per_call": tables.bench_steps_per_call,
    "bench_vs_sb3_minatar": partial(tables.bench_vs_sb3, "MinAtar/Breakout-v1"),
    "bench_vs_sb3_pong": partial(tables.bench_vs_sb3, "PongNoFrameskip-v4"),
    "bench_tensorboard": tables.bench_tensorboard,
    "n_envs_speed": tables.n_envs_speed,
    "vector_envs": tables.vector_envs,
    "bench_replay_memory_bytes": tables.bench_replay_memory_bytes,
    "bench_checkpoint": tables.bench_checkpoint,
    "bench_apex_solved": tables.bench_apex_solved,
    "bench_apex_throughput": tables.bench_apex_throughput,
    "bench_apex_costs": tables.bench_apex_costs,
    "bench_apex_projection": tables.bench_apex_projection,
    "one_quantity": tables.one_quantity,
    "same_log": tables.same_log,  # docs/reference.md: which games logged the same on two commits
}


def render_text(text: str, results: Path, where: str) -> tuple[str, list[str]]:
    """`text` with each block rendered afresh, and the names of the blocks that changed."""
    if len(BLOCK_START.findall(text)) != len(BLOCK.findall(text)):
        raise ValueError(f"{where}: a `<!-- rendered: NAME -->` without its "
                         "`<!-- end rendered -->`")
    changed: list[str] = []

    def render(match: re.Match) -> str:
        name = match.group("name")
        if name not in RENDERERS:
            raise ValueError(f"{where}: block {name!r} has no renderer "
                             f"(known: {', '.join(RENDERERS)})")
        body = RENDERERS[name](results)
        if body != match.group("body"):
            changed.append(name)
        return f"<!-- rendered: {name} -->\n{body}<!-- end rendered -->"

    return BLOCK.sub(render, text), changed


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true",
                        help="write nothing; exit 1 naming each block that differs")
    parser.add_argument("--recompute", action="store_true",
                        help=f"compute every bootstrap afresh, not from {INTERVALS_FILE}")
    parser.add_argument("--root", type=Path, default=ROOT, help="where README.md and docs/ are")
    parser.add_argument("--results", type=Path, default=study.RESULTS,
                        help="the results files' root")
    args = parser.parse_args(argv)
    intervals = args.results / INTERVALS_FILE
    cache = study.IntervalCache(intervals)
    kept = dict(cache.stored)
    if args.recompute:
        cache.stored = {}
    differs: list[str] = []
    try:
        with study.cached_intervals(cache):
            for page in pages(args.root):
                where = shown(page)
                text, changed = render_text(page.read_text(), args.results, where)
                differs += [f"{where}: block {name}" for name in changed]
                if changed and not args.check:
                    page.write_text(text)
            for name in REPORTS:
                report = args.results / name / "report.md"
                text = study.report_markdown(name, study.study_tables(name, args.results))
                if not report.exists() or report.read_text() != text:
                    differs.append(shown(report))
                    if not args.check:
                        report.write_text(text)
    except ValueError as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    if cache.used != kept:  # an interval missing, changed or no longer used
        differs.append(shown(intervals))
        if not args.check:
            cache.save()
    for line in differs:
        print(f"{line} {'differs from what its files render' if args.check else 'rewritten'}")
    return 1 if differs and args.check else 0


if __name__ == "__main__":
    sys.exit(main())
