"""A study: games x replay variants x seeds, each run one small result file, and its report.

    python benchmarks/study.py run classic_control            # 4 games x 3 variants x seeds 0-9
    python benchmarks/study.py report classic_control         # tables and figures from the files
    python benchmarks/study.py run minatar --jobs 1           # 5 MinAtar games x 3 x seeds 0-4
    python benchmarks/study.py compare cartpole_jax classic_control   # CartPole PER: JAX vs TF
    python benchmarks/study.py run pong --jobs 2 --work-dir ../pong_study  # 2 x 5 Pong runs
    python benchmarks/study.py status pong --work-dir ../pong_study  # done, stopped, to do
    python benchmarks/study.py compare pong_bf16 pong --game PongNoFrameskip-v4  # bfloat16 or not
    python benchmarks/study.py run screens/lunar --games LunarLander-v3 --variants per \\
        --seeds 100 101 102 -- --learning-rate 5e-4           # flags after -- go to every run

Every run is `python d3qn_agent.py --env-name GAME --seed N` plus its variant's flag (none for
proportional PER, `--rank-based`, `--no-per`) and the flags after `--`, so a game trains with
its preset exactly as a user's run does. `run` starts JOBS of them at a time (two on the two
cores), each a process of its own with CPU_COUNT / JOBS TensorFlow threads (or
TF_NUM_INTRAOP_THREADS, if set: two studies side by side). A finished run is
skipped; a run that was stopped (Ctrl-C, SIGTERM, a kill, a lost session) continues from its
newest checkpoint, kept under --work-dir outside the repository, so a study can span sessions.

A finished run writes benchmarks/results/<study>/<game>/<variant>/seed<N>.json (a "/" in the
game's id as "-"): the run's command and `provenance.stamp`'s commit, date, machine, backend
and versions, the settings, the evaluation curve, the steps to solve, wall time and steps/s
(with the load average: another job shares the cores, so no page shows them; speeds are the
benchmarks', timed alone), the last training episodes' scores, and
the last network's returns on FINAL_EPISODES fresh greedy episodes, whose seeds no evaluation
during training used (the same episodes for every variant of a seed). A study may keep a run's
last network to watch: the MinAtar study copies each game's PER seed-0 network to
models/pretrained/<game>.keras (`--pretrained-dir`).

`report` reads only those files: per game and variant the IQM of the last networks' scores with
its 95% stratified-bootstrap CI (rliable; Agarwal et al. 2021), the mean, the seeds at the
game's target and the median steps to solve; the probability that each PER variant improves on
uniform replay, with its CI, by the last networks and by the last 100 training episodes, per
game and over the games (on the seeds they all have);
for MinAtar, the training episodes' IQM beside the MinAtar paper's DQN at 2M and 5M frames;
plots/<study>_iqm.png (the intervals) and plots/<study>_sample_efficiency.png (IQM of the
evaluation curves with CI bands). A study with "steps_to_target" (Pong) adds the steps to a
100-episode training mean at the target, censored at the budget, with their IQM, CI and P(PER
needs fewer than uniform), and plots/<study>_training_curves.png. The tables are printed and
written to benchmarks/results/<study>/report.md.
"""

from __future__ import annotations

import argparse
import contextlib
import fcntl
import json
import os
import shlex
import shutil
import subprocess
import sys
import tempfile
import time
import warnings
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from benchmarks import provenance
from benchmarks.pong_logs import RunLog, parse_log
from d3qn_utils.replay_memory import variant_flags

ROOT = Path(__file__).resolve().parent.parent
RESULTS = ROOT / "benchmarks" / "results"
FINAL_EPISODES = 20  # fresh greedy episodes that score a run's last network
BOOTSTRAP_REPS = 10_000  # rliable's stratified bootstrap resamples for a CI
CURVE_BOOTSTRAP_REPS = 2_000  # per evaluation step of the sample-efficiency curves
CHECKPOINTS_PER_RUN = 5  # a stopped run loses at most a fifth of its budget

# The classic-control study: each game at its preset's budget, and the score its last networks'
# IQM should reach (the RL Zoo's DQN for Acrobot and MountainCar; the games' "solved" lines for
# CartPole and LunarLander).
TARGETS = {"CartPole-v1": 475.0, "Acrobot-v1": -76.6, "LunarLander-v3": 200.0,
           "MountainCar-v0": -100.8}
# The MinAtar study: the five MinAtar games at the MinAtar preset's 2M frames, against the
# MinAtar paper's DQN at 5M frames (its README's curves: training returns at epsilon 0.1, as the
# preset's training returns are; Seaquest's from before minatar 1.0.11's fix).
MINATAR_TARGETS = {"MinAtar/Asterix-v1": 17.0, "MinAtar/Breakout-v1": 10.0,
                   "MinAtar/Freeway-v1": 50.0, "MinAtar/Seaquest-v1": 20.0,
                   "MinAtar/SpaceInvaders-v1": 43.0}
# The MinAtar paper's DQN on the same curves at 2M frames, our runs' budget.
MINATAR_DQN_AT_2M = {"MinAtar/Asterix-v1": 15.0, "MinAtar/Breakout-v1": 10.0,
                     "MinAtar/Freeway-v1": 50.0, "MinAtar/Seaquest-v1": 5.0,
                     "MinAtar/SpaceInvaders-v1": 40.0}
# Pong: the 100-episode training mean the agent's Pong runs reach at the preset's 500,000 steps
# (docs/atari.md); the study also times each run's way there.
PONG_TARGETS = {"PongNoFrameskip-v4": 18.0}
VARIANTS = {  # directory name -> (label, replay variant: a memory's `kind`)
    "per": ("PER (proportional)", "proportional"),
    "per-rank": ("PER (rank-based)", "rank-based"),
    "uniform": ("uniform", "uniform"),
}
VARIANT_COLORS = {"per": "tab:red", "per-rank": "tab:orange", "uniform": "tab:blue"}  # every figure
# What the report reads of a result file (a run writes more: commit, settings, returns, ...).
RESULT_FIELDS = ("game", "variant", "seed", "command", "target", "evaluation", "solved_score",
                 "steps_to_solve", "final_score", "training_scores_last_100", "wall_seconds",
                 "steps_per_second", "load_average", "settings")
# Which score a study's targets are for: the last networks' greedy episodes, or (MinAtar, whose
# published curves are training returns) the mean of each run's last 100 training episodes.
LAST_NETWORKS, TRAINING = "last networks", "last 100 training episodes"
STUDIES = {"classic_control": {"games": list(TARGETS), "variants": list(VARIANTS),
                               "seeds": list(range(10)), "target_on": LAST_NETWORKS},
           "minatar": {"games": list(MINATAR_TARGETS), "variants": list(VARIANTS),
                       "seeds": list(range(5)), "target_on": TRAINING,
                       # published readings shown beside the training returns' IQM
                       "published": {"the MinAtar paper's DQN at 2M frames": MINATAR_DQN_AT_2M,
                                     "at 5M frames": MINATAR_TARGETS},
                       # each game's network to watch: models/pretrained/<game folder>.keras
                       "keep_network": ("per", 0)},
           "pong": {"games": list(PONG_TARGETS), "variants": ["per", "uniform"],
                    "seeds": list(range(5)), "target_on": TRAINING,
                    # also: the steps to a 100-episode training mean at the target
                    "steps_to_target": 100,
                    # float32 where the preset would pick bfloat16 ("flags": added to every run)
                    "flags": ["--no-bfloat16"]},
           # The same PER runs with bfloat16 convolutions, set against "pong" by
           # `compare pong_bf16 pong --game PongNoFrameskip-v4`.
           "pong_bf16": {"games": list(PONG_TARGETS), "variants": ["per"],
                         "seeds": list(range(5)), "target_on": TRAINING, "steps_to_target": 100,
                         "flags": ["--bfloat16"]}}


@dataclass(frozen=True)
class Run:
    """One training run of a study, and where its result and its working files go."""

    study: str
    game: str
    variant: str
    seed: int
    extra: tuple[str, ...] = ()

    @property
    def name(self) -> str:
        return f"{self.game}/{self.variant}/seed{self.seed}"

    @property
    def folder(self) -> str:
        """The game's folder: its id, with the "/" of a namespaced id ("MinAtar/...") as "-"."""
        return self.game.replace("/", "-")

    def result_path(self, results: Path = RESULTS) -> Path:
        return results / self.study / self.folder / self.variant / f"seed{self.seed}.json"

    def work_dir(self, work_root: Path) -> Path:
        return work_root / self.study / self.folder / self.variant / f"seed{self.seed}"

    def arguments(self) -> list[str]:
        """The run's d3qn_agent.py command-line flags."""
        return ["--env-name", self.game, "--seed", str(self.seed),
                *variant_options(VARIANTS[self.variant][1]), *self.extra]


def variant_options(kind: str) -> list[str]:
    """d3qn_agent.py's flags that pick the replay variant `kind` (the flags `replay_variant`
    maps to it) beside the shipped USE_PER and PER_RANK_BASED: none for proportional PER."""
    use_per, rank_based = variant_flags(kind)
    return [*([] if use_per else ["--no-per"]), *(["--rank-based"] if rank_based else [])]


def pending_runs(runs: list[Run], results: Path = RESULTS) -> list[Run]:
    """The runs without a result file, in order: the ones a `run` still has to do."""
    return [run for run in runs if not run.result_path(results).exists()]


def train(run: Run, work_root: Path, results: Path = RESULTS, keep_network: Path | None = None
          ) -> dict[str, Any] | None:
    """Train `run` in this process (continuing from its newest checkpoint, if any), score its
    last network and write its result file (and copy the network to `keep_network`, if given).
    Returns the result, or None when the run was stopped by a signal before its budget (its
    checkpoint is kept for the next try)."""
    import keras

    import d3qn_agent
    from d3qn_utils import run_files, settings

    code = provenance.commit()  # the code this process loads; the checkout may move on
    work_dir = run.work_dir(work_root)
    work_dir.mkdir(parents=True, exist_ok=True)
    flags = settings.explicit_flags(run.arguments(), settings.d3qn_parser(d3qn_agent))
    # The preset's checkpoints (Pong's every 25,000 steps), else one a fifth of the way: cadence
    # only, the run learns the same (agent_checkpoint.py).
    config, _ = settings.resolve(d3qn_agent, settings.D3QN_FLAGS, settings.d3qn_presets, flags)
    flags["checkpoint_every"] = (config.checkpoint_every
                                 or max(1, config.total_steps // CHECKPOINTS_PER_RUN))
    agent = d3qn_agent.DQNAgent(**flags, model_dir=str(work_dir), plot_dir=str(work_dir))
    # Time and steps of the parts of the run that ended by themselves or by a signal; a killed
    # part's steps since its last checkpoint are trained again and its time is not counted.
    timing_file = work_dir / "timing.json"
    timing = (json.loads(timing_file.read_text()) if timing_file.exists()
              else {"seconds": 0.0, "steps": 0})
    with (work_dir / "training.log").open("a") as log, contextlib.redirect_stdout(log):
        resume = run_files.newest_checkpoints(agent.checkpoint_root)
        agent.begin(run_files.LATEST if resume else None)  # prints "resuming from"
        first_step, start = agent.step, time.perf_counter()
        agent.run()
        timing = {"seconds": timing["seconds"] + time.perf_counter() - start,
                  "steps": timing["steps"] + agent.step - first_step}
    timing_file.write_text(json.dumps(timing))
    if agent.step < agent.config.total_steps:
        return None
    # evaluate() seeds its episodes by the number of evaluations so far: these are fresh.
    final_returns = agent.evaluate(FINAL_EPISODES, len(agent.evaluations))
    steps, episodes, means = (list(column) for column in zip(*agent.evaluations, strict=True))
    result = {
        "study": run.study, "game": run.game, "variant": run.variant, "seed": run.seed,
        # The run's own command, which repeats it; the rest of the stamp is this process's.
        **provenance.stamp(("KERAS_BACKEND=jax " if keras.backend.backend() == "jax" else "")
                           + shlex.join(["python", "d3qn_agent.py", *run.arguments()]), code),
        "settings": {name: list(value) if isinstance(value, tuple) else value
                     for name, value in vars(agent.config).items()
                     if name not in ("model_dir", "plot_dir", "checkpoint_every")},
        "target": {**TARGETS, **MINATAR_TARGETS, **PONG_TARGETS}.get(run.game),
        "solved_score": agent.solved_score,
        "evaluation": {"steps": steps, "episodes": episodes, "means": means},
        "steps_to_solve": agent.steps_to_solve,
        "final_score": float(final_returns.mean()),
        "final_returns": final_returns.tolist(),
        "final_episodes": f"{FINAL_EPISODES} greedy episodes with the evaluation index "
                          f"{len(agent.evaluations)} (no evaluation during training used it)",
        "training_scores_last_100": agent.scores[-100:],
        "training_curve": training_curve(work_dir / "training.log"),
        "resumed": sum(line.startswith("resuming from")  # parts after the first
                       for line in (work_dir / "training.log").read_text().splitlines()),
        "steps_per_second": timing["steps"] / timing["seconds"],
        "wall_seconds": agent.step * timing["seconds"] / timing["steps"],
        "load_average": os.getloadavg(),
        "threads": int(os.environ.get("TF_NUM_INTRAOP_THREADS") or os.cpu_count() or 1),
    }
    path = run.result_path(results)
    path.parent.mkdir(parents=True, exist_ok=True)
    temporary = path.with_suffix(".tmp")
    temporary.write_text(json.dumps(result, indent=1) + "\n")
    os.replace(temporary, path)
    if keep_network is not None:
        keep_network.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(agent.Last_model_name, keep_network)
    return result


def training_curve(log: Path) -> dict[str, list]:
    """Each training episode's last step and score, in order, from a run's log (a resumed run's
    replayed lines replace the old ones: `pong_logs.parse_log`)."""
    run_log = parse_log(log.read_text())
    return {"steps": run_log.steps.tolist(), "scores": run_log.scores.tolist()}


def is_training(work_dir: Path) -> bool:
    """True while a process holds the lock of a run's files in `work_dir` (run_files.RunLock:
    flock, let go when the process ends)."""
    for lock in work_dir.glob("*.lock"):
        with contextlib.suppress(FileNotFoundError), lock.open() as file:
            try:
                fcntl.flock(file, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                return True
    return False


def status(runs: list[Run], work_root: Path, results: Path = RESULTS) -> str:
    """A line per run: done (its last network's score, and how often it was resumed), training
    now, stopped at a checkpoint (a `run` resumes it there), or still to do."""
    lines = []
    for run in runs:
        path = run.result_path(results)
        checkpoints = sorted(run.work_dir(work_root).glob("*.checkpoints/run-*/step-*"))
        newest = (f", newest checkpoint at step {int(checkpoints[-1].name[5:]):,}"
                  if checkpoints else "")
        if path.exists():
            result = json.loads(path.read_text())
            resumed = result.get("resumed", 0)
            lines.append(f"{run.name}: done, last network {result['final_score']:.1f}"
                         + (f", resumed {resumed} time{'s' if resumed > 1 else ''}"
                            if resumed else ""))
        elif is_training(run.work_dir(work_root)):
            lines.append(f"{run.name}: training now{newest}")
        elif checkpoints:
            lines.append(f"{run.name}: stopped{newest}; `run` resumes it there")
        elif (run.work_dir(work_root) / "training.log").exists():
            lines.append(f"{run.name}: stopped before its first checkpoint; `run` starts it anew")
        else:
            lines.append(f"{run.name}: to do")
    return "\n".join(lines) + "\n"


def run_all(runs: list[Run], jobs: int, work_root: Path, results: Path = RESULTS,
            keep_networks: dict[Run, Path] | None = None) -> int:
    """Train every pending run, `jobs` processes at a time; one line per finished run; the runs
    in `keep_networks` copy their last network to the path it gives. Returns the number of
    runs that failed."""
    todo = pending_runs(runs, results)
    print(f"{len(runs) - len(todo)} of {len(runs)} runs done already; {len(todo)} to go, "
          f"{jobs} at a time; working files in {work_root}", flush=True)
    # Each run's share of the cores, unless the caller set it (two studies side by side).
    threads = os.environ.get("TF_NUM_INTRAOP_THREADS") or str(max(1, (os.cpu_count() or 1)
                                                                  // jobs))
    environment = {**os.environ, "TF_NUM_INTRAOP_THREADS": threads,
                   "TF_NUM_INTEROP_THREADS": "1", "TF_CPP_MIN_LOG_LEVEL": "2"}
    running: dict[Run, subprocess.Popen] = {}
    failed = 0
    while todo or running:
        while todo and len(running) < jobs:
            run = todo.pop(0)
            command = [sys.executable, __file__, "train", run.study, run.game, run.variant,
                       str(run.seed), "--work-dir", str(work_root), "--results", str(results),
                       *(["--keep-network", str(keep_networks[run])]
                         if run in (keep_networks or {}) else []),
                       "--", *run.extra]
            run.work_dir(work_root).mkdir(parents=True, exist_ok=True)
            with (run.work_dir(work_root) / "stderr.log").open("ab") as errors:
                running[run] = subprocess.Popen(command, env=environment,
                                                stdout=subprocess.DEVNULL, stderr=errors)
        time.sleep(0.5)
        for run, process in list(running.items()):
            if process.poll() is None:
                continue
            del running[run]
            path = run.result_path(results)
            if process.returncode == 0 and path.exists():
                result = json.loads(path.read_text())
                print(f"{run.name}: last network {result['final_score']:.1f}, "
                      f"{result['wall_seconds']:.0f} s, {result['steps_per_second']:.0f} steps/s",
                      flush=True)
            else:
                failed += 1
                log = run.work_dir(work_root) / "stderr.log"
                error = log.read_text(errors="replace").strip().splitlines()
                print(f"{run.name}: failed (exit {process.returncode}): "
                      f"{error[-1] if error else 'no message'} (all of it: {log})", flush=True)
    return failed


# ---- The report ----------------------------------------------------------------------------
def load_results(study: str, results: Path = RESULTS) -> dict[str, dict[str, list[dict]]]:
    """{game: {variant: [result, ...] by seed}} of the study's result files."""
    found: dict[str, dict[str, list[dict]]] = {}
    for path in sorted((results / study).glob("*/*/seed*.json")):
        result = json.loads(path.read_text())
        missing = [field for field in RESULT_FIELDS if field not in result]
        if missing:
            raise ValueError(f"result file {path} lacks {', '.join(missing)}")
        found.setdefault(result["game"], {}).setdefault(result["variant"], []).append(result)
    for variants in found.values():
        for runs in variants.values():
            runs.sort(key=lambda result: result["seed"])
    return found


class IntervalCache:
    """Bootstrap estimates already computed, each under a hash of all it was computed from: the
    metric, the resamples, the scores and rliable's and arch's versions. A bootstrap of 10,000
    resamples takes seconds per game, so rendering every page from the result files at each
    check would take many minutes; a changed score changes the hash and is computed afresh.
    `save` keeps only the entries used since the cache was read."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.stored: dict[str, dict] = json.loads(path.read_text()) if path.exists() else {}
        self.used: dict[str, dict] = {}

    @staticmethod
    def key(scores: dict[str, Any], metric: Any, reps: int) -> str:
        import hashlib
        import importlib.metadata

        # The scores in their order: rliable resamples them in turn from one generator.
        inputs = {"metric": metric.__qualname__, "reps": reps,
                  "versions": [importlib.metadata.version(name) for name in ("rliable", "arch")],
                  "scores": [[name, [np.asarray(part).tolist() for part in value]
                              if isinstance(value, tuple) else np.asarray(value).tolist()]
                             for name, value in scores.items()]}
        return hashlib.sha256(json.dumps(inputs).encode()).hexdigest()

    def estimates(self, scores: dict[str, Any], metric: Any, reps: int
                  ) -> tuple[dict[str, np.ndarray], dict[str, np.ndarray]]:
        key = self.key(scores, metric, reps)
        if key not in self.stored:
            points, intervals = bootstrap(scores, metric, reps)
            self.stored[key] = {"points": {name: np.asarray(value).tolist()
                                           for name, value in points.items()},
                                "intervals": {name: np.asarray(value).tolist()
                                              for name, value in intervals.items()}}
        self.used[key] = self.stored[key]
        return ({name: np.asarray(value) for name, value in self.used[key]["points"].items()},
                {name: np.asarray(value) for name, value in self.used[key]["intervals"].items()})

    def text(self) -> str:
        """The file `save` writes: the entries used, one a line, in a fixed order."""
        return "{\n" + ",\n".join(f"{json.dumps(key)}: {json.dumps(entry)}"
                                   for key, entry in sorted(self.used.items())) + "\n}\n"

    def save(self) -> None:
        self.path.write_text(self.text())


INTERVAL_CACHE: IntervalCache | None = None  # set by `cached_intervals`


@contextlib.contextmanager
def cached_intervals(cache: IntervalCache) -> Iterator[IntervalCache]:
    """Within the block every bootstrap goes through `cache`."""
    global INTERVAL_CACHE  # one cache for all the nested calls of a report
    INTERVAL_CACHE = cache
    try:
        yield cache
    finally:
        INTERVAL_CACHE = None


def interval_estimates(scores: dict[str, Any], metric: Any, reps: int
                       ) -> tuple[dict[str, np.ndarray], dict[str, np.ndarray]]:
    """rliable's point estimates and 95% stratified-bootstrap CIs of `metric` on `scores`,
    repeatable (a fixed bootstrap seed); from INTERVAL_CACHE where one is set."""
    if INTERVAL_CACHE is not None:
        return INTERVAL_CACHE.estimates(scores, metric, reps)
    return bootstrap(scores, metric, reps)


def bootstrap(scores: dict[str, Any], metric: Any, reps: int
              ) -> tuple[dict[str, np.ndarray], dict[str, np.ndarray]]:
    """`interval_estimates` computed: rliable with a fixed seed."""
    from rliable import library

    # rliable draws the resamples of two independent groups (P(X > Y)) from numpy's global
    # generator, whatever random_state says: seed that too, and give its state back after.
    global_state = np.random.get_state()  # noqa: NPY002 (the generator rliable uses)
    np.random.seed(0)  # noqa: NPY002
    try:
        with warnings.catch_warnings():
            # rliable 1.2 hands arch a RandomState, which arch 7 takes with a FutureWarning.
            warnings.filterwarnings("ignore", "random_state is deprecated", FutureWarning)
            return library.get_interval_estimates(scores, metric, reps=reps,
                                                  random_state=np.random.RandomState(0))
    finally:
        np.random.set_state(global_state)  # noqa: NPY002


def iqm_interval(scores: dict[str, Any], reps: int | None = None
                 ) -> tuple[dict[str, float], dict[str, np.ndarray]]:
    """{variant: IQM} and {variant: [low, high]} of the scores of each variant's runs on one
    game: the mean of the middle half of the runs, robust to one outlier seed."""
    from rliable import metrics

    points, intervals = interval_estimates(
        {variant: np.asarray(values, float)[:, np.newaxis] for variant, values in scores.items()},
        lambda runs: np.array([metrics.aggregate_iqm(runs)]), reps or BOOTSTRAP_REPS)
    return ({variant: float(point[0]) for variant, point in points.items()},
            {variant: interval[:, 0] for variant, interval in intervals.items()})


def improvement_interval(better: Any, baseline: Any, reps: int | None = None
                         ) -> tuple[float, np.ndarray]:
    """P(a run of `better` scores above a run of `baseline`), ties counting half, and its CI
    (rliable's probability of improvement, a Mann-Whitney U statistic). One game: two lists of
    run scores; several: two (runs, games) arrays, and P is the average over the games."""
    from rliable import metrics

    pair = tuple(np.asarray(scores, float).reshape(len(scores), -1)
                 for scores in (better, baseline))
    point, interval = interval_estimates({"pair": pair}, metrics.probability_of_improvement,
                                         reps or BOOTSTRAP_REPS)
    return float(point["pair"]), np.asarray(interval["pair"]).ravel()


def iqm_curve(curves: Any, reps: int | None = None) -> tuple[np.ndarray, np.ndarray]:
    """IQM over runs at each evaluation step of `curves` (runs, steps), and its CI band
    (2, steps)."""
    from rliable import metrics

    points, intervals = interval_estimates(
        {"curve": np.asarray(curves, float)[:, np.newaxis, :]},
        lambda sample: np.array([metrics.aggregate_iqm(sample[..., i])
                                 for i in range(sample.shape[-1])]),
        reps or CURVE_BOOTSTRAP_REPS)
    return points["curve"], intervals["curve"]


def format_interval(point: float, interval: np.ndarray, digits: int = 1) -> str:
    return f"{point:.{digits}f} [{interval[0]:.{digits}f}, {interval[1]:.{digits}f}]"


def format_steps(point: float, interval: np.ndarray) -> str:
    """A count of env steps and its interval, in whole steps with thousands separators."""
    return f"{point:,.0f} [{interval[0]:,.0f}, {interval[1]:,.0f}]"


def training_score(run: dict) -> float:
    """The mean return of a run's last 100 training episodes (exploring as it trained)."""
    return float(np.mean(run["training_scores_last_100"]))


def report_tables(found: dict[str, dict[str, list[dict]]], target_on: str = LAST_NETWORKS,
                  published: dict[str, dict[str, float]] | None = None) -> str:
    """The report's markdown: a row per game and variant, then PER against uniform, per game
    and over the games (on the seeds they all have). `target_on` says which score the games'
    targets are for (LAST_NETWORKS or TRAINING). `published` ({column: {game: score}},
    training returns) adds a table of each variant's training-episode IQM beside those
    readings."""
    lines = ["| game | variant | runs | IQM of last networks [95% CI] | mean | IQM of last 100 "
             f"training episodes [95% CI] | seeds at target ({target_on}) | median steps to "
             "solve | command | machine | commit |", "|---" * 11 + "|"]
    improvements = ["| game | variant | P(improves on uniform) [95% CI]: last networks | "
                    "last 100 training episodes |", "|---|---|---|---|"]
    training_cells: dict[str, dict[str, str]] = {}  # game -> variant -> IQM [CI]
    for game, variants in found.items():
        scores = {variant: [run["final_score"] for run in runs]
                  for variant, runs in variants.items()}
        training = {variant: [training_score(run) for run in runs]
                    for variant, runs in variants.items()}
        points, intervals = iqm_interval(scores)
        training_points, training_intervals = iqm_interval(training)
        judged = training if target_on == TRAINING else scores
        target = variants[next(iter(variants))][0]["target"]
        training_cells[game] = {variant: format_interval(training_points[variant],
                                                         training_intervals[variant])
                                for variant in variants}
        for variant, runs in variants.items():
            solve = [run["steps_to_solve"] if run["steps_to_solve"] is not None else np.inf
                     for run in runs]
            median = float(np.median(solve))
            budget = runs[0]["settings"]["total_steps"]
            lines.append("| " + " | ".join([
                game, VARIANTS[variant][0], str(len(runs)),
                format_interval(points[variant], intervals[variant]),
                f"{np.mean(scores[variant]):.1f}",
                training_cells[game][variant],
                "n/a" if target is None else
                f"{sum(score >= target for score in judged[variant])}/{len(runs)} (>= {target:g})",
                "n/a (no solved score)" if runs[0]["solved_score"] is None else
                f"{median:,.0f}" if np.isfinite(median) else f"not solved by {budget:,}",
                *provenance_cells(runs)]) + " |")
        if "uniform" in scores:
            for variant in (name for name in scores if name != "uniform"):
                cells = [format_interval(*improvement_interval(both[variant], both["uniform"]), 2)
                         for both in (scores, training)]
                improvements.append(f"| {game} | {VARIANTS[variant][0]} | {' | '.join(cells)} |")
    for variant in (name for name in VARIANTS if name != "uniform"):
        # Over the games: rliable averages P over games of as many runs each, so every game
        # gives its runs of the seeds that all the games have for both variants.
        paired = [(runs[variant], runs["uniform"]) for runs in found.values()
                  if variant in runs and "uniform" in runs]
        seeds = set.intersection(*({run["seed"] for run in runs} for pair in paired
                                   for runs in pair)) if paired else set()
        if len(paired) > 1 and seeds:
            kept = [[[run for run in runs if run["seed"] in seeds] for runs in pair]
                    for pair in paired]
            cells = []
            for score in (lambda run: run["final_score"], training_score):
                matrices = [np.array([[score(run) for run in pair[side]] for pair in kept]).T
                            for side in (0, 1)]
                cells.append(format_interval(*improvement_interval(*matrices), 2))
            over = f"all {len(paired)} games"
            if any(len(runs) > len(seeds) for pair in paired for runs in pair):
                over += f" (seeds {', '.join(map(str, sorted(seeds)))})"
            improvements.append(f"| {over} | {VARIANTS[variant][0]} | {' | '.join(cells)} |")
    tables = [*lines, "", *improvements]
    if published:
        tables += ["", *published_table(training_cells, published)]
    return "\n".join(tables) + "\n"


def seeds_text(seeds: list[int]) -> str:
    """[0, 1, 2, 4] -> "0-2, 4", with an en dash, as the pages write a span of seeds."""
    spans: list[list[int]] = []
    for seed in sorted(seeds):
        if spans and seed == spans[-1][1] + 1:
            spans[-1][1] = seed
        else:
            spans.append([seed, seed])
    return ", ".join(str(first) if first == last else f"{first}\N{EN DASH}{last}"
                     for first, last in spans)


def by_seeds(runs: list[dict], label: Any) -> str:
    """`label(run)` for `runs`: the one label they share, or each with the seeds it is for."""
    groups: dict[str, list[int]] = {}
    for run in runs:
        groups.setdefault(label(run), []).append(run["seed"])
    if len(groups) == 1:
        return next(iter(groups))
    return "; ".join(f"{text} (seeds {seeds_text(seeds)})" for text, seeds in groups.items())


def reproducing_command(run: dict) -> str:
    """The command that repeats `run` today: its recorded command, plus each flag its study now
    gives every run (STUDIES' "flags") that the command lacks. A run older than such a flag ran
    without it: the Pong study's float32 runs predate the bfloat16 preset, so today they need
    `--no-bfloat16`. Each added flag is checked against the settings the run recorded; ValueError
    naming the run and the flag where they disagree."""
    words = shlex.split(run["command"])
    added = [flag for flag in STUDIES.get(run.get("study", ""), {}).get("flags", ())
             if flag not in words]
    for flag in added:
        name = flag.removeprefix("--")
        value = not name.startswith("no-")
        name = name.removeprefix("no-").replace("-", "_")
        if run.get("settings", {}).get(name) is not value:
            raise ValueError(f"{run['study']} seed {run['seed']}: its command lacks {flag}, and "
                             f"its settings do not say {name} {value}")
    return " ".join([run["command"], *added])


def provenance_cells(runs: list[dict]) -> list[str]:
    """A table row's command, machine and commit cells, from its runs' result files: the
    command that repeats the runs (`reproducing_command`) with the seed as N."""
    return [by_seeds(runs, lambda run: "`" + reproducing_command(run).replace(
                f"--seed {run['seed']}", "--seed N") + "`"),
            by_seeds(runs, provenance.machine_label),
            by_seeds(runs, provenance.commit_label)]


def published_table(training_cells: dict[str, dict[str, str]],
                    published: dict[str, dict[str, float]]) -> list[str]:
    """Markdown rows: per game, each variant's IQM [CI] of its last 100 training episodes, then
    the published readings (training returns too), "n/a" where a game has none."""
    variants = [name for name in VARIANTS
                if any(name in cells for cells in training_cells.values())]
    header = [f"{VARIANTS[name][0]}: IQM of last 100 training episodes" for name in variants]
    rows = ["| " + " | ".join(["game", *header, *published]) + " |",
            "|" + "---|" * (1 + len(variants) + len(published))]
    for game, cells in training_cells.items():
        readings = [f"{column[game]:g}" if game in column else "n/a"
                    for column in published.values()]
        rows.append("| " + " | ".join([game, *(cells.get(name, "n/a") for name in variants),
                                       *readings]) + " |")
    return rows


def draw_figures(study: str, found: dict[str, dict[str, list[dict]]], plot_dir: Path,
                 target_on: str = LAST_NETWORKS) -> list[Path]:
    """The IQM interval figure and the sample-efficiency figure; returns their paths. The
    curves are greedy evaluations, so a target line is drawn only for targets of that kind
    (LAST_NETWORKS), not for targets on training returns."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from rliable import plot_utils

    # Every variant side by side: the games whose runs so far cover each variant that any has.
    variants = [name for name in VARIANTS if any(name in runs for runs in found.values())]
    games = [game for game, runs in found.items() if all(name in runs for name in variants)]
    if not games:
        raise ValueError(f"no game of study {study!r} has runs of every variant "
                         f"({', '.join(variants)}) yet")
    labels = {name: VARIANTS[name][0] for name in variants}
    colors = variant_colors(variants)
    estimates = [iqm_interval({name: [run["final_score"] for run in found[game][name]]
                               for name in variants}) for game in games]
    figure, axes = plot_utils.plot_interval_estimates(
        {labels[name]: np.array([points[name] for points, _ in estimates]) for name in variants},
        {labels[name]: np.stack([intervals[name] for _, intervals in estimates], axis=1)
         for name in variants},
        metric_names=games, algorithms=list(labels.values()), colors=colors, xlabel="",
        max_ticks=3, subfigure_width=3.6, row_height=0.6)
    for axis in np.ravel(axes):
        axis.set_xlabel("IQM of the last networks (95% CI)", fontsize="medium")
    plot_dir.mkdir(parents=True, exist_ok=True)
    paths = [plot_dir / f"{study.replace('/', '-')}_iqm.png",
             plot_dir / f"{study.replace('/', '-')}_sample_efficiency.png"]
    figure.savefig(paths[0], dpi=100, bbox_inches="tight")
    plt.close(figure)

    figure, axes = plt.subplots(1, len(games), figsize=(4.5 * len(games), 4), squeeze=False)
    for axis, game in zip(axes[0], games, strict=True):
        curves = {labels[name]: iqm_curve(np.array([run["evaluation"]["means"]
                                                    for run in found[game][name]]))
                  for name in variants}
        steps = np.array(found[game][variants[0]][0]["evaluation"]["steps"]) / 1000
        plot_utils.plot_sample_efficiency_curve(
            steps, {label: curve[0] for label, curve in curves.items()},
            {label: curve[1] for label, curve in curves.items()},
            algorithms=list(curves), colors=colors, ax=axis, xlabel="env steps (thousands)",
            ylabel="IQM of greedy evaluations", labelsize="medium", ticklabelsize="small")
        axis.set_title(f"{game} ({seeds_label(found[game])})", fontsize="medium")
        target = found[game][variants[0]][0]["target"]
        if target is not None and target_on == LAST_NETWORKS:
            axis.axhline(target, color="black", linestyle="--", linewidth=1)
    axes[0][0].legend(fontsize="small", loc="lower right")
    figure.tight_layout()
    figure.savefig(paths[1], dpi=100)
    plt.close(figure)
    return paths


def variant_colors(variants: Iterable[str]) -> dict[str, str]:
    """Each variant's label -> its colour, the same in every figure."""
    return {VARIANTS[name][0]: VARIANT_COLORS[name] for name in variants}


def seeds_label(runs: dict[str, list[dict]]) -> str:
    """How many seeds a figure's variants have: "5 seeds", or "per 4, uniform 3 seeds" while a
    study is under way."""
    counts = {len(found) for found in runs.values()}
    if len(counts) == 1:
        return f"{counts.pop()} seeds"
    return ", ".join(f"{name} {len(found)}" for name, found in runs.items()) + " seeds"


def training_history(run: dict) -> RunLog:
    """A result's training curve as `pong_logs.RunLog`, for its moving averages."""
    curve = run["training_curve"]
    return RunLog(np.asarray(curve["steps"]), np.asarray(curve["scores"]), {},
                  run["settings"]["total_steps"])


def first_step_at_target(run: dict, window: int) -> int | None:
    """The first step at which the run's `window`-episode training mean reached its target, or
    None if it never did."""
    return training_history(run).first_step_with_mean(run["target"], window)


def steps_to_target(run: dict, window: int) -> int:
    """`first_step_at_target`, censored at the run's budget: a run that never got there counts
    as reaching the target at its last step, so an IQM over such runs is a lower bound."""
    first = first_step_at_target(run, window)
    return run["settings"]["total_steps"] if first is None else first


def runs_at_target(runs: list[dict], window: int) -> int:
    """How many of `runs` reached their target (`first_step_at_target`)."""
    return sum(first_step_at_target(run, window) is not None for run in runs)


def draw_training_curves(study: str, found: dict[str, dict[str, list[dict]]], plot_dir: Path,
                         window: int, points: int = 101) -> Path:
    """Per game, the IQM over runs of the `window`-episode training mean against env steps,
    with its 95% CI band, a colour per variant, and the target as a dashed line."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from rliable import plot_utils

    figure, axes = plt.subplots(1, len(found), figsize=(5 * len(found), 4), squeeze=False)
    for axis, (game, variants) in zip(axes[0], found.items(), strict=True):
        first = next(iter(variants.values()))[0]
        grid = np.linspace(0, first["settings"]["total_steps"], points)
        curves = {}
        for variant, runs in variants.items():
            means = []
            for run in runs:
                history = training_history(run)
                # The mean after the last episode ended by each grid step (before the first
                # ended: the first episode's score).
                ended = np.searchsorted(history.steps, grid, side="right")
                means.append(history.moving_average(window)[np.maximum(ended - 1, 0)])
            curves[VARIANTS[variant][0]] = iqm_curve(np.array(means))
        plot_utils.plot_sample_efficiency_curve(
            grid / 1000, {label: curve[0] for label, curve in curves.items()},
            {label: curve[1] for label, curve in curves.items()}, algorithms=list(curves),
            colors=variant_colors(variants), ax=axis, xlabel="env steps (thousands)",
            ylabel=f"IQM of the {window}-episode training mean", labelsize="medium",
            ticklabelsize="small")
        axis.axhline(first["target"], color="black", linestyle="--", linewidth=1)
        axis.set_title(f"{game} ({seeds_label(variants)})", fontsize="medium")
        axis.legend(fontsize="small", loc="lower right")
    figure.tight_layout()
    path = plot_dir / f"{study.replace('/', '-')}_training_curves.png"
    figure.savefig(path, dpi=100)
    plt.close(figure)
    return path


def steps_to_target_tables(found: dict[str, dict[str, list[dict]]], window: int) -> str:
    """Markdown: per game and variant the IQM [95% CI] of the steps to the target (fewer is
    better) and how many runs got there; then P(PER beats uniform) on those steps."""
    lines = [f"| game | variant | runs | steps to a {window}-episode training mean at the target: "
             "IQM [95% CI] | runs that got there |", "|---|---|---|---|---|"]
    improvements = ["| game | variant | P(fewer steps to the target than uniform) [95% CI] |",
                    "|---|---|---|"]
    for game, variants in found.items():
        steps = {variant: [steps_to_target(run, window) for run in runs]
                 for variant, runs in variants.items()}
        points, intervals = iqm_interval(steps)
        for variant, runs in variants.items():
            lines.append(f"| {game} | {VARIANTS[variant][0]} | {len(runs)} | "
                         f"{format_steps(points[variant], intervals[variant])} | "
                         f"{runs_at_target(runs, window)}/{len(runs)} "
                         f"(target {runs[0]['target']:g}) |")
        if "uniform" in steps:
            for variant in (name for name in steps if name != "uniform"):
                # Fewer steps is better: P(-steps of a run above -steps of a uniform run).
                cell = format_interval(*improvement_interval(
                    -np.asarray(steps[variant]), -np.asarray(steps["uniform"])), 2)
                improvements.append(f"| {game} | {VARIANTS[variant][0]} | {cell} |")
    censored = ("A run that never got there counts as getting there at its last step (censored "
                "at its budget): the IQM is then a lower bound, and in P two such runs tie (half "
                "each).")
    return "\n".join([*lines, "", censored, "", *improvements]) + "\n"


def study_tables(study: str, results: Path = RESULTS) -> str:
    """The study's tables, computed from its result files (what `report` writes, and what
    `render_docs.py` puts on the pages)."""
    found = load_results(study, results)
    if not found:
        raise ValueError(f"no result files for study {study!r} under {results / study}")
    defaults = STUDIES.get(study, {})
    tables = report_tables(found, defaults.get("target_on", LAST_NETWORKS),
                           defaults.get("published"))
    if window := defaults.get("steps_to_target"):
        tables += "\n" + steps_to_target_tables(found, window)
    return tables


def report_markdown(study: str, tables: str) -> str:
    """The text of benchmarks/results/<study>/report.md."""
    return (f"Written by `python benchmarks/study.py report {study}` from the result files "
            f"beside it.\n\n{tables}")


def report(study: str, results: Path = RESULTS, plot_dir: Path = ROOT / "plots") -> str:
    """Recompute the study's tables and figures from its result files; return the tables."""
    tables = study_tables(study, results)
    (results / study / "report.md").write_text(report_markdown(study, tables))
    found = load_results(study, results)
    defaults = STUDIES.get(study, {})
    paths = draw_figures(study, found, plot_dir, defaults.get("target_on", LAST_NETWORKS))
    if window := defaults.get("steps_to_target"):
        paths.append(draw_training_curves(study, found, plot_dir, window))
    return tables + "\n" + "\n".join(
        f"figure: {os.path.relpath(path, ROOT)}" for path in paths) + "\n"


def compare(study: str, baseline: str, game: str, variant: str, results: Path = RESULTS) -> str:
    """One game and variant in two studies (the same runs on two backends, say): each study's
    IQM of the last networks' scores with its CI, and P(a run of `study` scores above a run of
    `baseline`), by the last networks and by the last 100 training episodes; where `baseline`
    counts the steps to its target (Pong), by those too (fewer is better)."""
    runs = {}
    for name in (study, baseline):
        runs[name] = load_results(name, results).get(game, {}).get(variant, [])
        if not runs[name]:
            raise ValueError(f"study {name!r} has no {variant} runs of {game}")
    window = STUDIES.get(baseline, {}).get("steps_to_target")
    header = "| study | runs | IQM, last networks [95% CI] | IQM, last 100 training episodes |"
    if window:
        header += f" IQM, steps to a {window}-episode training mean at the target | got there |"
    header += " command | machine | commit |"
    lines = [f"{game}, {VARIANTS[variant][0]}: {study} against {baseline}", "", header,
             "|---" * (header.count("|") - 1) + "|"]
    for name, found in runs.items():
        measures = {"last": [run["final_score"] for run in found],
                    "training": [training_score(run) for run in found]}
        if window:
            measures["steps"] = [steps_to_target(run, window) for run in found]
        points, intervals = iqm_interval(measures)
        cells = [format_interval(points["last"], intervals["last"]),
                 format_interval(points["training"], intervals["training"])]
        if window:
            cells += [format_steps(points["steps"], intervals["steps"]),
                      f"{runs_at_target(found, window)}/{len(found)}"]
        cells += provenance_cells(found)
        lines.append(f"| {name} | {len(found)} | " + " | ".join(cells) + " |")
    scores = {"last networks": lambda run: run["final_score"],
              "last 100 training episodes": training_score}
    if window:
        # Fewer steps is better: P(-steps of a run above -steps of a baseline run).
        scores[f"fewer steps to a {window}-episode training mean at the target"] = (
            lambda run: -steps_to_target(run, window))
    for label, score in scores.items():
        point, interval = improvement_interval([score(run) for run in runs[study]],
                                               [score(run) for run in runs[baseline]])
        lines.append(f"\nP({study} run beats {baseline} run), {label}: "
                     f"{format_interval(point, interval, 2)}")
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    extra: list[str] = []
    if "--" in argv:
        argv, extra = argv[:argv.index("--")], argv[argv.index("--") + 1:]
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    commands = parser.add_subparsers(dest="command", required=True)
    run_parser = commands.add_parser("run", help="train the study's missing runs")
    status_parser = commands.add_parser("status", help="which runs are done, stopped, to do")
    for sub in (run_parser, status_parser):
        sub.add_argument("study", help=f"the study's name (defaults known: {list(STUDIES)})")
        sub.add_argument("--games", nargs="+", help="gymnasium ids")
        sub.add_argument("--variants", nargs="+", choices=list(VARIANTS))
        sub.add_argument("--seeds", nargs="+", type=int)
        sub.add_argument("--work-dir", type=Path,
                         default=Path(tempfile.gettempdir()) / "d3qn_study",
                         help="checkpoints and logs of unfinished runs (outside the repository)")
    run_parser.add_argument("--jobs", type=int, default=2, help="runs at a time")
    run_parser.add_argument("--pretrained-dir", type=Path, default=ROOT / "models" / "pretrained",
                            help="where the study's networks to watch go (minatar: PER seed 0)")
    train_parser = commands.add_parser("train", help="train one run in this process")
    for name, kind in (("study", str), ("game", str), ("variant", str), ("seed", int)):
        train_parser.add_argument(name, type=kind)
    train_parser.add_argument("--work-dir", type=Path, required=True)
    train_parser.add_argument("--keep-network", type=Path, help="copy the last network here")
    report_parser = commands.add_parser("report", help="tables and figures from result files")
    report_parser.add_argument("study")
    compare_parser = commands.add_parser("compare", help="one game and variant in two studies")
    compare_parser.add_argument("study")
    compare_parser.add_argument("baseline")
    compare_parser.add_argument("--game", default="CartPole-v1")
    compare_parser.add_argument("--variant", default="per", choices=list(VARIANTS))
    for sub in (run_parser, status_parser, train_parser, report_parser, compare_parser):
        sub.add_argument("--results", type=Path, default=RESULTS, help="result files' root")
    args = parser.parse_args(argv)
    if args.command in ("report", "compare"):
        try:
            print(report(args.study, args.results) if args.command == "report" else
                  compare(args.study, args.baseline, args.game, args.variant, args.results),
                  end="")
        except ValueError as err:
            print(f"error: {err}", file=sys.stderr)
            return 2
        return 0
    if args.command == "train":
        run = Run(args.study, args.game, args.variant, args.seed, tuple(extra))
        return 0 if train(run, args.work_dir, args.results, args.keep_network) else 1
    defaults = STUDIES.get(args.study, {})
    chosen = {key: getattr(args, key) or defaults.get(key) for key in ("games", "variants",
                                                                          "seeds")}
    missing = [key for key, value in chosen.items() if not value]
    if missing:
        parser.error(f"study {args.study!r} is not predefined: give --{' --'.join(missing)}")
    # Seed by seed: a study cut short still has every game and variant on its first seeds.
    flags = (*defaults.get("flags", ()), *extra)
    runs = [Run(args.study, game, variant, seed, flags) for seed in chosen["seeds"]
            for game in chosen["games"] for variant in chosen["variants"]]
    if args.command == "status":
        print(status(runs, args.work_dir, args.results), end="")
        return 0
    if args.jobs < 1:
        parser.error(f"--jobs must be at least 1, got {args.jobs}")
    # No benchmark times while its runs fill the cores; they start at once (no page shows
    # their speed).
    provenance.time_alone(quiet_within=0)
    kept = defaults.get("keep_network")
    keep_networks = {run: args.pretrained_dir / f"{run.folder}.keras" for run in runs
                     if (run.variant, run.seed) == kept}
    return 1 if run_all(runs, args.jobs, args.work_dir, args.results, keep_networks) else 0


if __name__ == "__main__":
    sys.exit(main())
