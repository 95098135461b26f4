"""How to step N environments: env steps per second of the agent's own `Environments` (stepped
in turn, in one process) beside gymnasium's SyncVectorEnv and AsyncVectorEnv (a process per
environment) and, for Atari, ale-py's AtariVectorEnv (the emulator and its preprocessing in C++
threads); and, for Atari, whether AtariVectorEnv's frames are the project's.

    python benchmarks/bench_vector_envs.py                             # Pong
    python benchmarks/bench_vector_envs.py --env-name MinAtar/Breakout-v1
    python benchmarks/bench_vector_envs.py --n-envs 1 8 --steps 800 --rounds 1

Every stepper steps the same game, made by the agent's `make_env` (AtariVectorEnv: its own
preprocessing, at its defaults, which are v4 ids': no sticky actions), N = 1, 2, 4 and 8
environments, with the same uniformly random actions, and every env step is a game's step: an
episode that ends is reset on top, as that stepper resets it (`Environments`: with the next
episode's own seed, before its next step, as the agent's loop does, which makes ale-py reload the
game; the vectors: their autoreset in the same step, unseeded). Each round times a window of
`--steps` env steps of every stepper and N in turn, so a drift of the machine hits them all,
after an untimed window of each. Only the environments are timed: no network, no replay.

Frames (Atari): for three seeds, gymnasium's `AtariPreprocessing` and AtariVectorEnv are reset
with the same seed and stepped with the same actions for up to FRAME_STEPS steps (to the first
episode's end), with the random no-ops on reset (30, both's default) or none, and FIRE pressed on
reset (the agent's `FireOnReset`; AtariVectorEnv's `use_fire_reset`) or not; the results file
holds the first step (1, 2, ...; 0 the reset) whose newest frames differ (none: equal to the last
pixel), and how each starts its first episode's stack. Rendered in docs/benchmarks.md ("How the
environments are stepped").
"""

from __future__ import annotations

import argparse
import functools
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, NamedTuple

import gymnasium as gym
import numpy as np
from ale_py.vector_env import AtariVectorEnv

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from d3qn_utils import quiet_startup  # noqa: F401  # isort: skip -- first: before TensorFlow
from atari_wrappers import FireOnReset, is_atari
from benchmarks import provenance, timing
from benchmarks.bench_n_envs import N_ENVS, check_n_envs
from d3qn_utils import games
from d3qn_utils.environments import Environments

ENV_NAME = "PongNoFrameskip-v4"
# Timed env steps per window, by family: about 1 to 5 seconds a window on 2 cores.
STEPS = {games.CLASSIC.name: 20_000, games.MINATAR.name: 20_000, games.ATARI.name: 1_600}
SEED = 0
FRAME_SEEDS = (0, 1, 2)
FRAME_STEPS = 300  # long enough for Pong's ball to be served and hit


class Stepper(NamedTuple):
    """N environments of one kind: `step(actions)` one step of each; `close()`."""

    step: Callable[[np.ndarray], Any]
    close: Callable[[], Any]


def agent_environments(env_name: str, n: int) -> Stepper:
    """The agent's `Environments` (stepped in turn), an ended episode reset before the next step
    with its number's seed, as `DQNAgent.run` does."""
    make = functools.partial(games.make_env, env_name)
    envs = Environments(make(), n, make, seed_of=lambda number: SEED + number)
    envs.start_episodes()

    def step(actions: np.ndarray) -> None:
        _, _, terminated, truncated, _ = envs.step(actions.tolist())
        ended = [i for i in range(n) if terminated[i] or truncated[i]]
        for i in ended:
            envs.end_episode(i)
        if ended:
            envs.start_episodes()

    return Stepper(step, lambda: [env.close() for env in envs.envs])


def gymnasium_vector(vector_class: type, env_name: str, n: int) -> Stepper:
    """gymnasium's SyncVectorEnv or AsyncVectorEnv of the agent's environments (autoreset in
    the step that ends an episode)."""
    envs = vector_class([functools.partial(games.make_env, env_name)] * n,
                        autoreset_mode=gym.vector.AutoresetMode.SAME_STEP)
    envs.reset(seed=SEED)
    return Stepper(envs.step, envs.close)


def ale_game(env_name: str) -> str:
    """The ALE's name of an Atari id's game ("PongNoFrameskip-v4" -> "pong")."""
    return gym.spec(env_name).kwargs["game"]


def ale_vector(env_name: str, n: int) -> Stepper:
    """ale-py's AtariVectorEnv of the game, at its defaults (`num_threads` 0: ale-py's choice),
    autoreset in the step that ends an episode."""
    envs = AtariVectorEnv(ale_game(env_name), n,
                          autoreset_mode=gym.vector.AutoresetMode.SAME_STEP)
    envs.reset(seed=SEED)
    return Stepper(envs.step, envs.close)


STEPPERS: dict[str, Callable[[str, int], Stepper]] = {
    "Environments (the agent's, in turn)": agent_environments,
    "gymnasium SyncVectorEnv": functools.partial(gymnasium_vector, gym.vector.SyncVectorEnv),
    "gymnasium AsyncVectorEnv": functools.partial(gymnasium_vector, gym.vector.AsyncVectorEnv),
    "ale-py AtariVectorEnv": ale_vector,  # Atari only
}


def first_difference(env_name: str, seed: int, noop_max: int, fire: bool) -> int | None:
    """The first of up to FRAME_STEPS random-action steps (1, 2, ...; 0: the reset) after a reset
    with `seed` whose newest frame differs between gymnasium's `AtariPreprocessing` and
    AtariVectorEnv, or None if every frame is equal to the first episode's end."""
    env: gym.Env = gym.wrappers.AtariPreprocessing(gym.make(env_name, frameskip=1),
                                                   noop_max=noop_max)
    if fire:
        env = FireOnReset(env)
    vector = AtariVectorEnv(ale_game(env_name), 1, noop_max=noop_max, use_fire_reset=fire)
    frame, _ = env.reset(seed=seed)
    frames, _ = vector.reset(seed=seed)
    rng = np.random.default_rng(seed)
    try:
        if not np.array_equal(frame, frames[0, -1]):
            return 0
        for step in range(1, FRAME_STEPS + 1):
            action = int(rng.integers(env.action_space.n))
            frame, _, terminated, truncated, _ = env.step(action)
            frames, *_ = vector.step(np.array([action]))
            if not np.array_equal(frame, frames[0, -1]):
                return step
            if terminated or truncated:  # the vector would start another episode
                return None
        return None
    finally:
        env.close()
        vector.close()


def compare_frames(env_name: str) -> dict[str, Any]:
    """`first_difference` for FRAME_SEEDS with and without no-ops and FIRE on reset, and how
    each starts its first episode's stack."""
    settings = [{"noop_max": noop_max, "fire_on_reset": fire,
                 "first_difference": [first_difference(env_name, seed, noop_max, fire)
                                      for seed in FRAME_SEEDS]}
                for noop_max in (0, 30) for fire in (False, True)]
    env, vector = games.make_env(env_name), AtariVectorEnv(ale_game(env_name), 1)
    (ours, _), (theirs, _) = env.reset(seed=SEED), vector.reset(seed=SEED)
    env.close()
    vector.close()
    return {"seeds": list(FRAME_SEEDS), "steps": FRAME_STEPS, "settings": settings,
            "agent_first_stack_repeats_first_frame": all(
                np.array_equal(ours[..., i], ours[..., -1]) for i in range(ours.shape[-1] - 1)),
            "ale_first_stack_older_frames_blank": bool(not theirs[0, :-1].any())}


def time_window(stepper: Stepper, batches: np.ndarray) -> float:
    """Env steps per second over the vector steps of `batches`' actions, (steps / n, n)."""
    start = time.perf_counter()
    for batch in batches:
        stepper.step(batch)
    return batches.size / (time.perf_counter() - start)


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0],
                                     formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    parser.add_argument("--env-name", default=ENV_NAME,
                        help="the game (PongNoFrameskip-v4, MinAtar/Breakout-v1, CartPole-v1 ...)")
    parser.add_argument("--n-envs", type=int, nargs="+", default=list(N_ENVS),
                        help="the numbers of environments to measure side by side")
    parser.add_argument("--steps", type=int, default=None,
                        help="timed env steps per window, stepper and N (rounded up to a "
                             "multiple of every N); default by family: " + ", ".join(
                                 f"{family} {steps:,}" for family, steps in STEPS.items()))
    timing.add_rounds_argument(parser)
    provenance.add_results_argument(parser, __file__)
    return parser.parse_args(argv)


def check(args: argparse.Namespace) -> int:
    """The game's number of actions; ValueError naming a bad flag's value."""
    check_n_envs(args.n_envs)
    if args.steps is not None and args.steps < 1:
        raise ValueError(f"--steps must be positive, got {args.steps}")
    env = games.make_env(args.env_name)  # an unknown id: ValueError naming it
    env.close()
    return int(env.action_space.n)


def main(argv: list[str] | None = None) -> int:
    """Measure; 2 after one `error:` line for a bad flag, before any timing."""
    args = parse_args(argv)
    timing.check_rounds(args.rounds)
    try:
        actions = check(args)
    except ValueError as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    command = provenance.command_line(None if argv is None else [__file__, *argv])
    atari = is_atari(args.env_name)
    kinds = [kind for kind in STEPPERS if atari or kind != "ale-py AtariVectorEnv"]
    window = STEPS[games.family(args.env_name).name] if args.steps is None else args.steps
    lcm = int(np.lcm.reduce(args.n_envs))
    steps = -(-window // lcm) * lcm
    steppers = {(kind, n): STEPPERS[kind](args.env_name, n) for kind in kinds
                for n in sorted(args.n_envs)}
    provenance.time_alone()  # no other timing shares the cores
    print(f"command: {command}\n{args.env_name}: {args.rounds} rounds of {steps:,} env steps "
          f"per stepper and N")
    rng = np.random.default_rng(SEED)
    speeds: dict[str, dict[str, list[float]]] = {kind: {str(n): [] for n in sorted(args.n_envs)}
                                                 for kind in kinds}
    try:
        for round_number in range(-1, args.rounds):  # round -1: untimed (first episodes, caches)
            for n in sorted(args.n_envs):
                batches = rng.integers(actions, size=(steps // n, n))  # the same for each stepper
                for kind in kinds:
                    speed = time_window(steppers[kind, n], batches)
                    if round_number >= 0:
                        speeds[kind][str(n)].append(speed)
            if round_number >= 0:
                print(f"round {round_number + 1} done")
    finally:
        for stepper in steppers.values():
            stepper.close()
    for kind, by_n in speeds.items():
        print(f"{kind:>40}: " + ", ".join(f"N = {n} {statistics.median(values):,.0f}"
                                          for n, values in by_n.items()) + " env steps/s")
    found: dict[str, Any] = {"env_name": args.env_name, "n_envs": sorted(args.n_envs),
                             "steps": steps, "rounds": args.rounds,
                             "env_steps_per_second": speeds}
    if atari:
        found["frames"] = compare_frames(args.env_name)
        print(f"frames: {found['frames']}")
    provenance.write_results(args.results, found, command=command)
    return 0


if __name__ == "__main__":
    sys.exit(main())
