"""Checkpoint formats: a checkpoint of every format this code has written loads to exactly the
state its files hold and resumes; a new field is one migration and one line in the part that owns
it; a format this version cannot read is refused, naming it.

tests/data/checkpoint_format_<N>/step-0000000400 is the step-400 checkpoint of `python
d3qn_agent.py --total-steps 800 --learning-starts 200 --memory-size 500 --batch-size 16
--hidden-units 16 16 --checkpoint-every 400 --eval-every 400 --eval-episodes 2 --seed 5` at commit
58876ad (format 1, before checkpoints had a version), at commit 619b399 (format 2) and at commit
cdcca1c (format 3: an open episode per environment, N_ENVS), at commit 04a9d3b (format 4: the
ends of episodes recorded in the memory, the environments' state under its own key) and at commit
64fc919 (format 5: a prioritized memory's growth of beta).
tests/data/checkpoint_format_3_minatar/step-0000000200, a frame memory's (`FrameStackStorage`:
one stream, its pending and next slots saved as scalars), is the step-200 checkpoint of `python
d3qn_agent.py --env-name MinAtar/Breakout-v1 --memory-size 100 --total-steps 400
--checkpoint-every 200 --learning-starts 100 --batch-size 16 --eval-every 400 --eval-episodes 1
--seed 5` at commit bd022cb (format 3); no gradient step came before it (the first is due at
step 256), so its optimizer holds zeros.
tests/data/checkpoint_format_3_n_envs/step-0000000300, three environments' (N_ENVS 3: three
streams, each episode open), is the step-300 checkpoint of `python d3qn_agent.py --n-envs 3
--total-steps 600 --learning-starts 150 --memory-size 300 --batch-size 16 --hidden-units 16 16
--checkpoint-every 300 --eval-every 300 --eval-episodes 1 --seed 5` at commit bd022cb (format 3).

The networks a run reaches depend on the CPU's kernels: a run resumed from a fixture is compared
with one resumed, on this machine, from the checkpoint the first wrote as soon as it had loaded.
"""

import json
import shutil
from pathlib import Path
from typing import Any, ClassVar

import h5py
import numpy as np
import pytest
from conftest import DATA, small_agent
from memory_helpers import experience

from d3qn_agent import REPLAY_MEMORIES, DQNAgent
from d3qn_utils import agent_checkpoint
from d3qn_utils.atomic_files import read_arrays
from d3qn_utils.checks import added_keys, with_added_keys
from d3qn_utils.priority_figure import PriorityFigure
from PER import Memory, UniformMemory
from rank_based import RankBasedMemory

FORMATS = range(1, agent_checkpoint.FORMAT + 1)
STEP = "step-0000000400"
FLAGS = {"total_steps": 800, "learning_starts": 200, "memory_size": 500, "batch_size": 16,
         "hidden_units": (16, 16), "checkpoint_every": 400, "eval_every": 400,
         "eval_episodes": 2, "seed": 5}

# A frame memory's checkpoint of format 3 (the module's docstring), and the flags it was made with.
MINATAR = "checkpoint_format_3_minatar"
MINATAR_FLAGS = {"env_name": "MinAtar/Breakout-v1", "total_steps": 400, "memory_size": 100,
                 "checkpoint_every": 200, "learning_starts": 100, "batch_size": 16,
                 "hidden_units": (256, 256), "eval_every": 400, "eval_episodes": 1, "seed": 5}
# Three environments' checkpoint of format 3 (the module's docstring), and its flags.
N_ENVS_3 = "checkpoint_format_3_n_envs"
N_ENVS_3_FLAGS = {"n_envs": 3, "total_steps": 600, "learning_starts": 150, "memory_size": 300,
                  "batch_size": 16, "hidden_units": (16, 16), "checkpoint_every": 300,
                  "eval_every": 300, "eval_episodes": 1, "seed": 5}
RESUMED = [*(pytest.param(f"checkpoint_format_{version}/{STEP}", FLAGS, id=f"format-{version}")
             for version in FORMATS),
           pytest.param(f"{MINATAR}/step-0000000200", MINATAR_FLAGS, id=MINATAR),
           pytest.param(f"{N_ENVS_3}/step-0000000300", N_ENVS_3_FLAGS, id=N_ENVS_3)]


def fixture(version: int) -> Path:
    return DATA / f"checkpoint_format_{version}" / STEP


def agent_in(directory: Path, **flags: Any) -> DQNAgent:
    """An agent with the fixtures' flags (no XLA: a resumed run may turn it off)."""
    return small_agent(directory, **{**FLAGS, **flags})


def keras_weights(path: Path) -> list[np.ndarray]:
    """The arrays of a Keras `.weights.h5` file, read with h5py, in its layers' order (dense,
    dense_1, ...: `get_weights`' order for these networks)."""
    with h5py.File(path) as file:
        layers = sorted(file["layers"], key=lambda name: (len(name), name))
        return [np.array(file["layers"][layer]["vars"][str(i)]) for layer in layers
                for i in range(len(file["layers"][layer]["vars"]))]


def state_in_files(version: int) -> dict[str, Any]:
    """What the fixture of `version` holds, read from its files: progress.json's counters, each
    part's arrays and the two networks' weights; a key added to a part after the fixture's format
    (its `added_keys`) at the value that means what the fixture did, as loading gives it."""
    directory = fixture(version)
    saved = json.loads((directory / "progress.json").read_text())
    arrays = {path.stem: read_arrays(path) for path in directory.glob("*.npz")}
    if version == 1:  # the counters at the top; the priority figure's over two files
        figure = {key: arrays["memory"].pop(key) for key in list(arrays["memory"])
                  if key.startswith("stats.")}
        figure["history"] = np.array(saved.pop("priority_history")).reshape(-1, 4)
        figure["recent_is_weights"] = np.array(saved.pop("recent_is_weights"), np.float32)
        figure["recent_batches"] = np.array(saved.pop("recent_batches"))
        arrays["priority_figure"] = figure
        saved = {"progress": {key: value for key, value in saved.items()
                              if key not in ("run", "fingerprint")}}
    if version <= 2:  # one episode in progress, numbered by the episodes finished before it
        counters = saved["progress"]
        counters["open_episodes"] = [{
            "number": counters["episode"], "actions": counters.pop("episode_actions"),
            "score": counters.pop("episode_score"), "state_sha256": counters.pop("state_sha256")}]
        counters["episodes_started"] = counters["episode"] + 1
    if version <= 3:  # the environments' state under its own key; the ends of the episodes
        counters = saved["progress"]
        counters["environments"] = {"steps_taken": counters["step"], **{
            key: counters.pop(key) for key in ("episodes_started", "open_episodes")}}
        # Every episode of these 400 CartPole steps ended terminated (done), none truncated,
        # and the newest transition's episode is still open: the ends are the dones.
        assert saved["progress"]["environments"]["open_episodes"][0]["actions"]
        arrays["memory"]["storage.episode_ends"] = arrays["memory"]["storage.done"]
    owners = {"progress": DQNAgent, "priority_figure": PriorityFigure,  # the optimizer's: Keras'
              "memory": REPLAY_MEMORIES[arrays["memory"]["kind"].item()]}
    state = {"progress": saved["progress"], **arrays}
    state = {name: with_added_keys(value, added_keys(owners[name])) if name in owners else value
             for name, value in state.items()}
    networks = {name: keras_weights(directory / name) for name in agent_checkpoint.NETWORK_FILES}
    return {**state, **networks}


def agent_state(agent: DQNAgent) -> dict[str, Any]:
    """`state_in_files`' view of an agent: its `state_dict`, counters as JSON holds them."""
    state = agent.state_dict()
    return {**state, "progress": json.loads(json.dumps(state["progress"])),
            "online.weights.h5": agent.model.get_weights(),
            "target.weights.h5": agent.target_model.get_weights()}


def assert_same_state(got: dict[str, Any], expected: dict[str, Any]) -> None:
    assert got.keys() == expected.keys()
    assert got["progress"] == expected["progress"]
    for part in set(expected) - {"progress"}:
        if isinstance(expected[part], dict):
            assert got[part].keys() == expected[part].keys(), part
        for key, array in (expected[part].items() if isinstance(expected[part], dict)
                           else enumerate(expected[part])):
            np.testing.assert_array_equal(got[part][key], array, err_msg=f"{part} {key}")


def test_there_is_a_checkpoint_of_every_format_and_a_migration_from_each_older_one():
    # One of each format; MINATAR, a frame memory's of format 3; N_ENVS_3, three streams'.
    assert sorted(path.name for path in DATA.glob("checkpoint_format_*")) == sorted(
        [*(f"checkpoint_format_{version}" for version in FORMATS), MINATAR, N_ENVS_3])
    assert sorted(agent_checkpoint.MIGRATIONS) == list(FORMATS)[:-1]


@pytest.mark.parametrize("version", FORMATS)
def test_a_checkpoint_of_each_format_loads_to_exactly_the_state_its_files_hold(tmp_path, version,
                                                                               capsys):
    agent = agent_in(tmp_path)
    agent.begin(str(fixture(version)))
    run = json.loads((fixture(version) / "progress.json").read_text())["run"]
    assert capsys.readouterr().out.splitlines()[1].startswith(f"continuing {run['id']}, started ")
    assert agent.step == 400 and agent.report.priority_figure.recent_batches > 0
    expected = state_in_files(version)
    if np.isnan(expected["memory"]["beta_increment"]):  # not saved (format 4 or older): the
        # memory keeps the growth the agent gave it for the run's budget, the fixture's
        expected["memory"]["beta_increment"] = np.array(
            agent.beta_increment(agent.config.per_beta, 0))
    assert_same_state(agent_state(agent), expected)


@pytest.mark.parametrize(("checkpoint", "flags"), RESUMED)
def test_a_checkpoint_of_each_format_resumes_as_the_newest_format_it_becomes(tmp_path, checkpoint,
                                                                            flags):
    # One run resumes from the fixture, writing it in the newest format first; another resumes
    # from what it wrote. Both train to the end of the fixture's run, and must end alike.
    first = agent_in(tmp_path / "first", **flags)
    first.begin(str(DATA / checkpoint))
    loaded = first.model.get_weights()
    rewritten = shutil.copytree(first.save_checkpoint(),
                                tmp_path / "rewritten" / Path(checkpoint).name)
    assert agent_checkpoint.read_state(rewritten)[0]["format"] == agent_checkpoint.FORMAT
    first.run()
    second = agent_in(tmp_path / "second", **flags)
    second.begin(str(rewritten))
    second.run()
    assert first.step == second.step == flags["total_steps"]
    assert_same_state(agent_state(second), agent_state(first))
    trained = agent_state(first)["online.weights.h5"]
    assert any((weights != saved).any() for weights, saved in zip(trained, loaded, strict=True))


def test_a_new_field_is_one_migration_and_one_line_in_the_part_that_owns_it(tmp_path,
                                                                            monkeypatch):
    # The format after FORMAT gives the priority figure a counter, "resumptions"; a checkpoint
    # of FORMAT, written before it, means 7.
    newest = fixture(agent_checkpoint.FORMAT)
    monkeypatch.setattr(agent_checkpoint, "FORMAT", agent_checkpoint.FORMAT + 1)
    monkeypatch.setattr(PriorityFigure, "COUNTERS", (*PriorityFigure.COUNTERS, "resumptions"))
    monkeypatch.setattr(PriorityFigure, "resumptions", 0, raising=False)
    with pytest.raises(ValueError, match=f"has format {agent_checkpoint.FORMAT - 1}, which this "
                                         "version cannot read"):
        agent_in(tmp_path / "refused").resume(str(newest))

    # The migration (the layout stays as it was) and the line in the priority figure:
    monkeypatch.setitem(agent_checkpoint.MIGRATIONS, agent_checkpoint.FORMAT - 1,
                        lambda progress, arrays: (progress, arrays))
    monkeypatch.setattr(PriorityFigure, "ADDED_KEYS", {"stats.resumptions": np.array(7)})
    agent = agent_in(tmp_path / "migrated")
    agent.begin(str(newest))
    figure = agent.report.priority_figure
    assert figure.resumptions == 7
    # The fixture's files with the default for the key they lack, as state_in_files reads them.
    assert_same_state(agent_state(agent), state_in_files(agent_checkpoint.FORMAT - 1))

    figure.resumptions = 8
    agent.run()  # checkpoints at step 800, in the format after FORMAT
    written = sorted((tmp_path / "migrated").rglob("step-0000000800"))[-1]
    progress, arrays = agent_checkpoint.read_state(written)
    assert progress["format"] == agent_checkpoint.FORMAT
    assert arrays["priority_figure"]["stats.resumptions"] == 8
    resumed = agent_in(tmp_path / "resumed", total_steps=900)
    resumed.begin(str(written))
    assert resumed.report.priority_figure.resumptions == 8  # read back, not the default


@pytest.mark.parametrize(("memory_class", "field", "default", "value_of"), [
    (Memory, "max_priority", np.array(2.5), lambda memory: memory.max_priority),
    (RankBasedMemory, "beta", np.array(0.7), lambda memory: memory.beta),
    (UniformMemory, "rng", np.array(json.dumps(np.random.default_rng(9).bit_generator.state)),
     lambda memory: json.dumps(memory.rng.bit_generator.state)),
])
def test_each_memory_gives_a_key_it_lacks_the_value_in_its_added_keys(
        monkeypatch, memory_class, field, default, value_of):
    memory = memory_class(8, rng=0)
    for i in range(5):
        memory.store(experience(i))
    older = {name: array for name, array in memory.state_dict().items() if name != field}
    with pytest.raises(ValueError, match=field):
        memory_class(8, rng=1).load_state_dict(older)
    monkeypatch.setattr(memory_class, "ADDED_KEYS", {field: default})
    restored = memory_class(8, rng=1)
    restored.load_state_dict(older)
    assert value_of(restored) == default.item()
    assert len(restored) == 5


def test_a_subclass_s_added_keys_add_to_its_base_s_and_override_them():
    class Base:
        ADDED_KEYS: ClassVar[dict[str, int]] = {"a": 1, "b": 2}

    class Middle(Base):  # adds none
        pass

    class Child(Middle):
        ADDED_KEYS: ClassVar[dict[str, int]] = {"b": 3, "c": 4}

    assert added_keys(Child) == {"a": 1, "b": 3, "c": 4}
    assert added_keys(Middle) == added_keys(Base) == {"a": 1, "b": 2}
    assert added_keys(int) == {}


def test_the_agent_gives_a_counter_it_lacks_the_value_in_its_added_keys(tmp_path, monkeypatch):
    directory = shutil.copytree(fixture(agent_checkpoint.FORMAT), tmp_path / STEP)
    saved = json.loads((directory / "progress.json").read_text())
    del saved["progress"]["steps_to_solve"]
    (directory / "progress.json").write_text(json.dumps(saved))
    with pytest.raises(ValueError, match="steps_to_solve"):
        agent_in(tmp_path / "refused").resume(str(directory))
    monkeypatch.setattr(DQNAgent, "ADDED_KEYS", {"steps_to_solve": 123})
    agent = agent_in(tmp_path / "resumed")
    agent.resume(str(directory))
    assert agent.steps_to_solve == 123 and agent.step == 400


@pytest.mark.parametrize(("edit", "said"), [
    (lambda progress: {**progress, "format": agent_checkpoint.FORMAT + 1},
     f"has format {agent_checkpoint.FORMAT + 1}, which this version cannot read"),
    (lambda progress: {key: value for key, value in progress.items() if key != "fingerprint"},
     "has format None, which this version cannot read"),
    (lambda progress: {key: value for key, value in progress.items()
                       if key != "priority_history"},
     "is not of format 1 \\(it lacks 'priority_history'\\)"),
])
def test_a_checkpoint_of_another_format_is_refused_naming_it(tmp_path, edit, said):
    directory = shutil.copytree(fixture(1), tmp_path / STEP)
    progress_file = directory / "progress.json"
    progress_file.write_text(json.dumps(edit(json.loads(progress_file.read_text()))))
    agent = agent_in(tmp_path)
    with pytest.raises(ValueError, match=said):
        agent.resume(str(directory))
    assert agent.step == 0  # nothing was loaded


@pytest.mark.parametrize("changed", [{"total_steps": 600}, {"total_steps": 1000},
                                     {"gradient_steps_per_call": 8}])
def test_beta_reaches_1_at_the_end_of_a_resumed_run_whatever_its_new_budget(tmp_path, changed):
    agent = agent_in(tmp_path, **{"eval_every": 1000, "checkpoint_every": 0, **changed})
    agent.begin(str(fixture(agent_checkpoint.FORMAT)))
    beta = agent.MEMORY.beta
    assert 0.4 < beta < 1.0
    agent.run()
    assert agent.MEMORY.beta == pytest.approx(1.0)


def test_a_second_resume_keeps_the_growth_of_beta_the_first_resume_set(tmp_path):
    # The first resume changes the budget: beta's growth is set anew to reach 1 at step 1000.
    # A second resume of that run, with its flags, takes that growth from the checkpoint.
    flags = {"total_steps": 1000, "eval_every": 1000, "checkpoint_every": 100}
    first = agent_in(tmp_path / "first", **flags)
    first.begin(str(fixture(agent_checkpoint.FORMAT)))
    first.run()
    at_900 = sorted((tmp_path / "first").rglob("step-*"))[-2]
    assert at_900.name == "step-0000000900"
    second = agent_in(tmp_path / "second", **flags)
    second.begin(str(at_900))
    assert second.MEMORY.beta_increment == first.MEMORY.beta_increment
    second.run()
    assert second.MEMORY.beta == pytest.approx(first.MEMORY.beta) == pytest.approx(1.0)


def test_format_3_s_memory_gets_the_episode_ends_format_3_s_code_inferred():
    # Format 3 recorded no ends: its code took a transition to go on into the next slot's when
    # that slot's state was its next_state, and the newest into the transition stored after the
    # resume, which starts from its environment's observation (the open episode's digest).
    directory = fixture(3)
    progress = json.loads((directory / "progress.json").read_text())
    memory = read_arrays(directory / "memory.npz")

    def ends(edit_memory=lambda arrays: None, digest: str | None = "unchanged") -> np.ndarray:
        saved = json.loads(json.dumps(progress))
        arrays = {"memory": {key: np.array(value) for key, value in memory.items()}}
        edit_memory(arrays["memory"])
        if digest != "unchanged":
            saved["progress"]["open_episodes"][0]["state_sha256"] = digest
        saved, arrays = agent_checkpoint.MIGRATIONS[3](saved, arrays)
        assert "open_episodes" not in saved["progress"]
        assert saved["progress"]["environments"]["steps_taken"] == 400
        return arrays["memory"]["storage.episode_ends"]

    dones = memory["storage.done"]
    assert dones.sum() == 14 and not dones[-1]  # 14 episodes ended; the 15th is open
    np.testing.assert_array_equal(ends(), dones)
    # No episode open (its reset failed): the newest transition ended its episode.
    np.testing.assert_array_equal(ends(digest=None)[-1], True)
    first_end = int(np.flatnonzero(dones)[0])

    def truncated(arrays: dict) -> None:  # the first episode cut, not done: its end stays
        arrays["storage.done"][first_end] = False

    np.testing.assert_array_equal(ends(truncated), dones)

    def reset_to_its_last_state(arrays: dict) -> None:  # format 3 took it to go on
        truncated(arrays)
        arrays["storage.state"][first_end + 1] = arrays["storage.next_state"][first_end]

    expected = dones.copy()
    expected[first_end] = False
    np.testing.assert_array_equal(ends(reset_to_its_last_state), expected)


def test_format_3_s_memory_of_three_environments_gets_the_ends_stream_by_stream():
    # Every episode of these CartPole streams that ended terminated, and each stream's newest
    # transition is its open episode's (that episode's observation, its digest, goes on from
    # it): the ends are the dones, stream by stream. A stream told by another's digest would
    # end its newest transition.
    directory = DATA / N_ENVS_3 / "step-0000000300"
    progress = json.loads((directory / "progress.json").read_text())
    memory = read_arrays(directory / "memory.npz")
    assert int(memory["storage.streams"]) == 3
    assert all(episode["actions"] for episode in progress["progress"]["open_episodes"])
    _, arrays = agent_checkpoint.MIGRATIONS[3](progress, {"memory": dict(memory)})
    np.testing.assert_array_equal(arrays["memory"]["storage.episode_ends"], memory["storage.done"])
