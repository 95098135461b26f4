"""Replay variants are entries of d3qn_agent.REPLAY_MEMORIES, named once (a memory's `kind`): the
flags pick the shipped ones, and a new variant is one module plus one entry. Shown here with a
reservoir-sampling memory defined in this file, picked for a short run of the agent: its name
reaches the run's files, its log and its checkpoint with nothing else changed."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest
from conftest import small_agent
from memory_helpers import experience

import d3qn_agent
from d3qn_utils import settings
from d3qn_utils.checks import check_transition
from d3qn_utils.replay_storage import FrameStackStorage, SlotStorage, TransitionStorage
from d3qn_utils.reporting import TrainingReport
from PER import Memory, UniformMemory
from rank_based import RankBasedMemory


class ReservoirMemory(UniformMemory):
    """Uniform replay over a reservoir (Vitter's Algorithm R): once full, the i-th transition
    replaces a uniformly drawn slot with probability capacity / i, so the memory holds a uniform
    sample of every transition given to it instead of the newest ones."""

    kind = "reservoir"
    RUN_SUFFIX = "_reservoir"

    def __init__(self, capacity: int, storage: SlotStorage | None = None, **options) -> None:
        super().__init__(capacity, storage, **options)
        if not isinstance(self.storage, SlotStorage):
            raise ValueError("a reservoir writes the slots it draws: it needs a SlotStorage")
        self.seen = 0

    def store(self, experience: tuple) -> int | None:
        """The transition's slot, or None when the draw drops it (`ReplayMemory.store`)."""
        self.seen += 1
        if self.seen <= self.capacity:
            return super().store(experience)
        slot = int(self.rng.integers(self.seen))
        if slot >= self.capacity:
            return None
        self.storage.put(slot, check_transition(experience))
        return slot

    def state_dict(self) -> dict[str, np.ndarray]:
        """The memory's state and how many transitions it was given (the draws' odds)."""
        return {**super().state_dict(), "seen": np.array(self.seen)}

    def load_state_dict(self, arrays: dict[str, np.ndarray]) -> None:
        self.check_state(arrays, ("seen",))
        super().load_state_dict(arrays)
        self.seen = int(arrays["seen"])


def test_the_flags_pick_the_shipped_variants_by_name():
    assert list(d3qn_agent.REPLAY_MEMORIES.items()) == [
        ("uniform", UniformMemory), ("proportional", Memory), ("rank-based", RankBasedMemory)]
    picks = {(use_per, rank_based): d3qn_agent.replay_variant(use_per, rank_based)
             for use_per in (True, False) for rank_based in (True, False)}
    assert picks == {(True, False): "proportional", (True, True): "rank-based",
                     (False, False): "uniform", (False, True): "uniform"}
    memories = d3qn_agent.REPLAY_MEMORIES.values()
    # Each variant names its run's files apart, and says in the log what it is.
    assert [memory.RUN_SUFFIX for memory in memories] == ["", "_PER", "_PERrank"]
    assert [memory.title() for memory in memories] == [
        "uniform replay", "proportional PER", "rank-based PER"]


def test_the_reservoir_keeps_a_uniform_sample_of_everything_it_was_given():
    memory = ReservoirMemory(100, rng=0)
    slots = [memory.store(experience(i)) for i in range(10_000)]
    assert slots[:100] == list(range(100)) and None in slots
    kept = np.sort(memory.storage.get(np.arange(100))[0][:, 0])
    # A ring would hold 9,900..9,999; a uniform sample of 0..9,999 has about 50 below 5,000.
    assert 35 <= np.count_nonzero(kept < 5_000) <= 65
    assert len(memory) == 100 and len(set(kept.tolist())) == 100
    indices, (states, *_), _ = memory.sample(8)
    np.testing.assert_array_equal(states, memory.storage.get(memory.slots_of(indices))[0])
    with pytest.raises(ValueError, match="needs a SlotStorage"):
        ReservoirMemory(8, storage=FrameStackStorage(8))  # frames are written in order only


def test_a_reservoir_resumed_from_its_state_dict_draws_as_the_one_that_ran_on():
    # 4 slots given 6 transitions: 4 stored, then each kept with odds 4 / seen, so the draws
    # after a resume depend on `seen` as well as on the rng.
    memory = ReservoirMemory(4, rng=0)
    for i in range(6):
        memory.store(experience(i))
    resumed = ReservoirMemory(4, rng=1)
    resumed.load_state_dict(memory.state_dict())
    assert resumed.seen == 6
    later = [experience(i) for i in range(6, 40)]
    assert [resumed.store(t) for t in later] == [memory.store(t) for t in later]
    np.testing.assert_array_equal(resumed.storage.get(np.arange(4))[0],
                                  memory.storage.get(np.arange(4))[0])
    np.testing.assert_array_equal(resumed.sample(8)[0], memory.sample(8)[0])
    with pytest.raises(ValueError, match="seen"):
        ReservoirMemory(4).load_state_dict(
            {key: value for key, value in memory.state_dict().items() if key != "seen"})


def test_a_new_variant_is_one_module_and_one_entry(tmp_path: Path, monkeypatch, capsys):
    monkeypatch.setitem(d3qn_agent.REPLAY_MEMORIES, ReservoirMemory.kind, ReservoirMemory)
    # The flags pick it (a real variant would get its own flag in settings.D3QN_FLAGS).
    monkeypatch.setattr(d3qn_agent, "replay_variant", lambda use_per, rank_based: "reservoir")
    # 100 slots given 300 transitions: once full, the reservoir drops some, and the priority
    # figure counts only those it stored.
    agent = small_agent(tmp_path, memory_size=100, total_steps=300, learning_starts=100,
                        gradient_steps_per_call=4, eval_every=300, eval_episodes=1)
    assert isinstance(agent.MEMORY, ReservoirMemory) and isinstance(agent.MEMORY.storage,
                                                                    TransitionStorage)
    assert agent.name == "DDQN_CartPole-v1_Dueling_reservoir"
    agent.run()
    first_line = capsys.readouterr().out.splitlines()[0]
    assert "double DQN, dueling, reservoir replay, 3-step returns" in first_line
    assert int(agent.optimizer.iterations) > 0 and agent.MEMORY.seen == 300
    assert len(agent.MEMORY) == 100 < agent.report.priority_figure.stores < 300
    assert (tmp_path / "models" / f"{agent.name}.keras").is_file()
    assert agent.state_dict()["memory"]["kind"] == "reservoir"


@pytest.mark.parametrize("prioritized", [False, True])
def test_the_memory_not_use_per_decides_whether_beta_is_logged(prioritized):
    # USE_PER is on, as when the reservoir above is picked: only a PRIORITIZED memory's beta
    # and importance-sampling weights go to TensorBoard.
    config, _ = settings.resolve(d3qn_agent, settings.D3QN_FLAGS, settings.d3qn_presets,
                                 {"env_name": "CartPole-v1", "use_per": True, "memory_size": 8,
                                  "batch_size": 2, "train_frequency": 1, "tensorboard_every": 1})
    report = TrainingReport(config, "plot.png", "priorities.png", replay="some replay",
                            prioritized=prioritized, tensorboard_dir=None, image_states=False,
                            warning=None)
    report.stored(0)
    report.stored(1)
    written = []
    report.tensorboard = SimpleNamespace(write=lambda step, scalars: written.append(scalars))
    report.gradient_steps(5, np.array([0, 1]), 8, np.array([0.5]), np.array([[0.1, 0.2]]),
                          np.ones((1, 2), np.float32), epsilon=0.5, beta=0.4)
    assert len(written) == 1 and ("replay/beta" in written[0]) == prioritized
