"""The environments a training run steps together (N_ENVS), each with its episode in progress,
and `crossed`, which tells a schedule that counts environment steps N at a time when it is due.

`Environments.step(actions)` steps them all on a list of actions, one each (as a vectorized
environment does, e.g. gymnasium's `SyncVectorEnv`), but an episode that ends stays as it ended
until `start_episodes` resets its environment: the agent stores its last transition and reports
it first. Every episode starts from `reset(seed=)` with its number's own seed, numbered in the
order episodes start, and each open episode's actions and score are kept, so a checkpoint
replays every open episode exactly (`state_dict`).
It counts the environment steps it has taken, which `NonFiniteGuard` names in its messages.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import gymnasium as gym
import numpy as np

from d3qn_utils.training_session import NonFiniteGuard, state_digest


def crossed(before: int, after: int, period: int) -> range:
    """The multiples of `period` the step count passed going from `before` to `after` (those in
    (before, after]): when a schedule of that period is due after a step of N environments, at
    the first step past each multiple, none skipped. With one environment (after = before + 1)
    [after] where `after % period == 0`, else none."""
    return range((max(before, 0) // period + 1) * period, after + 1, period)


class Environments:
    """N environments of one game, each wrapped in `NonFiniteGuard` (NaN or inf stops the run): the
    `first`, made by the caller, and N - 1 more from `make()`. `steps_taken`: the environment
    steps of all of them before this vector step (one step of every environment); environment i
    takes env step steps_taken + i + 1. `seed_of(number)`: the reset seed of the episode of that
    number (0, 1, ...)."""

    def __init__(self, first: gym.Env, count: int, make: Callable[[], gym.Env],
                 seed_of: Callable[[int], int]) -> None:
        made = [first, *(make() for _ in range(1, count))]
        self.envs = [NonFiniteGuard(env, lambda: self.steps_taken, position=i)
                     for i, env in enumerate(made)]
        self.seed_of = seed_of
        self.steps_taken = 0
        self.episodes_started = 0
        # Each environment's episode in progress: its number (None until its first), its state,
        # actions and score (the sum of the rewards as the environment gave them).
        self.numbers: list[int | None] = [None] * count
        self.states: list[np.ndarray | None] = [None] * count
        self.actions: list[list[int]] = [[] for _ in range(count)]
        self.scores = [0.0] * count

    def step(self, actions: Sequence[int]) -> tuple[list, list, list, list, list]:
        """Step environment i with actions[i]: (next_states, rewards, terminated, truncated,
        infos), each a list with one entry per environment as it returned it. The open episodes
        take their actions and rewards, and `steps_taken` its N steps, once every environment
        has stepped, so a NaN that stops the run leaves them as they were before this step."""
        results = [env.step(action) for env, action in zip(self.envs, actions, strict=True)]
        next_states, rewards, terminated, truncated, infos = (list(part) for part in
                                                              zip(*results, strict=True))
        for i, (action, reward) in enumerate(zip(actions, rewards, strict=True)):
            self.actions[i].append(action)
            self.scores[i] += reward
        self.steps_taken += len(self.envs)
        self.states = list(next_states)  # its own list: a reset replaces an entry
        return next_states, rewards, terminated, truncated, infos

    def end_episode(self, i: int) -> None:
        """Environment i's episode ended: `start_episodes` resets it."""
        self.numbers[i] = None

    def start_episodes(self) -> None:
        """Start the next episode in each environment without one open (at first, all): numbered
        in the environments' order, then each reset with its number's seed. All are numbered and
        cleared before the first reset, so a reset that fails (NaN) leaves each of them an open
        episode of no steps, which a resumed run resets again."""
        starting = [i for i, number in enumerate(self.numbers) if number is None]
        for i in starting:
            self.numbers[i] = self.episodes_started
            self.episodes_started += 1
            self.states[i], self.actions[i], self.scores[i] = None, [], 0.0
        for i in starting:
            self.states[i], _ = self.envs[i].reset(seed=self.seed_of(self.numbers[i]))

    def state_dict(self) -> dict[str, Any]:
        """The open episodes, one per environment, as JSON holds them: each one's number,
        actions, score and the digest of its observation; the episodes started and the
        environment steps taken so far."""
        return {"steps_taken": self.steps_taken, "episodes_started": self.episodes_started,
                "open_episodes": [
            {"number": number, "actions": actions, "score": score,
             "state_sha256": state_digest(state)}
            for number, actions, score, state in zip(self.numbers, self.actions, self.scores,
                                                     self.states, strict=True)]}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Take back what `state_dict` gave (a checkpoint's progress holds it under
        "environments") and replay each open episode: reset with its number's seed, then its
        actions, each at the count of steps it was taken after, so that NaN met in the replay
        names the env step the run took it at. ValueError for a count of episodes other than
        the environments' or an episodes_started not past every open episode's number (both
        before anything changes), or an observation the replay does not reproduce."""
        episodes = state["open_episodes"]
        if len(episodes) != len(self.envs):
            raise ValueError(f"it holds {len(episodes)} open episodes, one per environment, "
                             f"but this run steps {len(self.envs)} (N_ENVS)")
        steps_taken = int(state["steps_taken"])
        # An episode's number is the count of episodes started before it: a later one's number
        # (and seed) would be an open episode's again.
        numbers = [int(episode["number"]) for episode in episodes if episode["number"] is not None]
        if numbers and int(state["episodes_started"]) <= max(numbers):
            raise ValueError(f"saved episodes_started {state['episodes_started']} is not more "
                             f"than the open episodes' numbers {numbers}: the next episode "
                             "would reuse one's seed")
        self.episodes_started = int(state["episodes_started"])
        for i, episode in enumerate(episodes):
            number = episode["number"]
            self.numbers[i] = None if number is None else int(number)
            self.actions[i] = [int(action) for action in episode["actions"]]
            self.scores[i] = float(episode["score"])
            if number is None:  # none open: `start_episodes` starts one
                continue
            # Every environment steps in each vector step, so an open episode's actions are
            # those of the last len(actions) vector steps.
            self.steps_taken = steps_taken - len(self.actions[i]) * len(self.envs)
            self.states[i], _ = self.envs[i].reset(seed=self.seed_of(self.numbers[i]))
            for action in self.actions[i]:
                self.states[i], *_ = self.envs[i].step(action)
                self.steps_taken += len(self.envs)
            if episode["state_sha256"] not in (None, state_digest(self.states[i])):
                raise ValueError("replaying the episode in progress did not reproduce its "
                                 "observation: does reset(seed=) replay an episode? (its "
                                 "family's `seeding`, d3qn_utils/games.py)")
        self.steps_taken = steps_taken

    def replayed(self) -> str:
        """What `load_state_dict` replayed (asked right after it), for a resume to say:
        "replayed N open episodes (M env steps) ...", or "" when no open episode had a step."""
        stepped = [len(actions) for number, actions in zip(self.numbers, self.actions,
                                                            strict=True)
                   if number is not None and actions]
        if not stepped:
            return ""
        return (f"replayed {plural(len(stepped), 'open episode')} "
                f"({plural(sum(stepped), 'env step')}) from their seeds and actions, to go on "
                "mid-episode")


def check_steps_taken(step: int, state: dict[str, Any]) -> None:
    """ValueError naming both unless a checkpoint's progress `step` is the `steps_taken` of its
    environments' `state` (`Environments.state_dict`): one count of env steps, saved twice."""
    if int(state["steps_taken"]) != step:
        raise ValueError(f"progress step {step} != environments' steps_taken "
                         f"{state['steps_taken']}: the env steps taken, counted twice, disagree")


def plural(count: int, noun: str) -> str:
    """`count` of `noun`, plural unless one: "1 env step", "2,000 env steps"."""
    return f"{count:,} {noun}{'' if count == 1 else 's'}"
