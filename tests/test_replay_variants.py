"""Replay variants are entries of d3qn_agent.REPLAY_MEMORIES, named once (a memory's `kind`): the
flags pick the shipped ones, through one selector that the presets and the study ask too, and a
new variant is one module plus one entry (and the flags it takes over). Shown here with the
reservoir-sampling memory of tests/memory_helpers.py, picked for a short run of the agent: its
name reaches the run's files, its log and its checkpoint with nothing else changed. A variant
that lacks part of the interface fails when it is made."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest
from conftest import small_agent
from memory_helpers import ReservoirMemory, experience, picked

import d3qn_agent
from benchmarks import study
from d3qn_utils import replay_memory, settings
from d3qn_utils.replay_storage import FrameStackStorage, TransitionStorage
from d3qn_utils.reporting import TrainingReport
from PER import Memory, UniformMemory
from rank_based import RankBasedMemory


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


def resolve(**flags) -> tuple[object, list[str]]:
    return settings.resolve(d3qn_agent, settings.D3QN_FLAGS, settings.d3qn_presets,
                            {"env_name": "CartPole-v1", **flags})


@pytest.mark.parametrize(("use_per", "rank_based"), [(True, False), (True, True), (False, False),
                                                     (False, True)])
def test_the_presets_and_the_study_ask_the_agent_s_selector(monkeypatch, use_per, rank_based):
    config, notes = resolve(use_per=use_per, per_rank_based=rank_based)
    picked = d3qn_agent.replay_variant(use_per, rank_based)
    # The rank-based preset applies where the flags pick that memory, and only there.
    rank_based_preset = [note for note in notes if note.endswith("(rank-based preset)")]
    assert bool(rank_based_preset) == (picked == "rank-based")
    assert (config.per_alpha, config.per_beta) == ((0.7, 0.5) if picked == "rank-based"
                                                   else (0.6, 0.4))
    # A variant taking over the pair takes the preset with it.
    monkeypatch.setitem(replay_memory.VARIANT_PICKS, (use_per, rank_based), ReservoirMemory.kind)
    assert not any(note.endswith("(rank-based preset)") for note in resolve(
        use_per=use_per, per_rank_based=rank_based)[1])


def test_each_study_variant_s_flags_pick_its_memory():
    kinds = []
    for variant, (_, kind) in study.VARIANTS.items():
        run = study.Run("classic_control", "CartPole-v1", variant, 0)
        flags = settings.explicit_flags(run.arguments(), settings.d3qn_parser(d3qn_agent))
        config, _ = resolve(**flags)
        assert d3qn_agent.replay_variant(config.use_per, config.per_rank_based) == kind, variant
        kinds.append(kind)
    assert sorted(kinds) == sorted(d3qn_agent.REPLAY_MEMORIES)
    assert study.variant_options("rank-based") == ["--rank-based"]
    assert study.variant_options("uniform") == ["--no-per"]
    with pytest.raises(ValueError, match="no flags pick replay variant 'reservoir'"):
        study.variant_options("reservoir")


@pytest.mark.parametrize("missing", ["store", "sample", "batch_update", "sampling_probabilities"])
def test_a_variant_without_a_method_of_the_interface_fails_when_it_is_made(missing):
    # Python's abc names the method: it would otherwise fail late, in training or a figure.
    methods = {name: getattr(UniformMemory, name) for name in (
        "store", "sample", "batch_update", "sampling_probabilities") if name != missing}
    lacking = replay_memory.ReplayMemoryType("Lacking", (replay_memory.ReplayMemory,), {
        "kind": "lacking", "alpha": 0.0, "beta": 0.0, **methods})
    with pytest.raises(TypeError, match=f"abstract class Lacking .*{missing}'?$"):
        lacking(8)


def test_a_variant_without_an_attribute_of_the_interface_fails_when_it_is_made():
    class NoExponents(replay_memory.ReplayMemory):  # a whole variant that forgot alpha and beta
        kind = "no exponents"
        store, sample, batch_update = (UniformMemory.store, UniformMemory.sample,
                                       UniformMemory.batch_update)
        sampling_probabilities = UniformMemory.sampling_probabilities

    with pytest.raises(TypeError, match="replay memory NoExponents lacks alpha, beta: every "
                                        "variant has alpha, beta and a kind"):
        NoExponents(8)
    NoExponents.alpha, NoExponents.beta = 0.0, 0.0
    assert len(NoExponents(8)) == 0  # complete: it is made
    NoExponents.kind = ""
    with pytest.raises(TypeError, match="NoExponents lacks a kind"):
        NoExponents(8)


def test_a_new_variant_is_one_module_and_one_entry(tmp_path: Path, capsys):
    # 100 slots given 300 transitions: once full, the reservoir drops some, and the priority
    # figure counts only those it stored.
    with picked(ReservoirMemory.kind):  # one entry in REPLAY_MEMORIES, the flags pick it
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
