"""Each memory owns its state: `state_dict` / `load_state_dict` of every replay variant
(d3qn_agent.REPLAY_MEMORIES: PER.py's `Memory` and `UniformMemory`, rank_based.py's
`RankBasedMemory`; and the tests' reservoir), through an .npz file as a checkpoint
(agent_checkpoint.py) writes them."""


import numpy as np
import pytest
from memory_helpers import (
    experience,
    frame_stacks,
    holds_frames,
    registered_memories,
    save_and_load,
    snapshot,
    states_equal,
)

from d3qn_utils.replay_storage import FrameStackStorage
from PER import Memory, UniformMemory
from rank_based import RankBasedMemory

KINDS = registered_memories()
OWN_KEYS = {  # each variant's keys beside its storage's, its kind and its rng
    "uniform": (),
    "proportional": ("alpha", "beta", "beta_increment", "tree.sums", "tree.mins", "max_priority"),
    "rank-based": ("alpha", "beta", "beta_increment", "abs_errors", "ranked_slots",
                   "ranked_keys"),
    "reservoir": ("seen",),
}


def filled(kind: str, n: int, capacity: int = 8, **kwargs) -> object:
    memory = KINDS[kind](capacity, rng=kwargs.pop("rng", 0), **kwargs)
    for i in range(n):
        memory.store(experience(i))
    return memory


def assert_same_samples(memory: object, restored: object, rounds: int = 3) -> None:
    """Both memories sample alike, and go on alike through updates and stores."""
    for i in range(rounds):
        expected, got = memory.sample(8), restored.sample(8)
        np.testing.assert_array_equal(expected[0], got[0])
        for field, restored_field in zip(expected[1], got[1], strict=True):
            np.testing.assert_array_equal(field, restored_field)
        np.testing.assert_array_equal(expected[2], got[2])
        errors = np.abs(np.cos(expected[0] + i))
        memory.batch_update(expected[0], errors)
        restored.batch_update(got[0], errors)
        memory.store(experience(99 + i))
        restored.store(experience(99 + i))


@pytest.mark.parametrize("kind", list(KINDS))
def test_state_dict_has_the_keys_of_its_kind(kind):
    memory = filled(kind, 5)
    arrays = memory.state_dict()
    storage_keys = {f"storage.{key}" for key in memory.storage.state_dict()}
    assert set(arrays) == storage_keys | {"kind", "rng", *OWN_KEYS[kind]}
    assert arrays["kind"].item() == kind
    assert {key for key in arrays if key.startswith("stats.")} == set()
    loaded = save_and_load(arrays)  # plain arrays: no pickle needed
    assert loaded.keys() == arrays.keys()


@pytest.mark.parametrize("kind", list(KINDS))
def test_round_trip_continues_identically(kind):
    memory = KINDS[kind](16, rng=9)
    for i in range(20):  # wraps around
        memory.store(experience(i))
        if i % 3 == 2:
            tree_idx, _, _ = memory.sample(4)
            memory.batch_update(tree_idx, np.abs(np.sin(tree_idx + i)))
    memory.store(experience(50))  # pending: ranked first by the rank-based memory's next sample
    # The memory loaded into had a life of its own before: loading replaces all of it.
    restored = filled(kind, 11, capacity=16, rng=123)
    restored.sample(3)
    restored.store(experience(77))
    restored.load_state_dict(save_and_load(memory.state_dict()))
    assert len(restored) == len(memory)
    assert getattr(restored, "beta", None) == getattr(memory, "beta", None)
    assert states_equal(snapshot(restored), snapshot(memory))
    assert_same_samples(memory, restored)


@pytest.mark.parametrize("kind", [kind for kind, memory in KINDS.items() if memory.PRIORITIZED])
def test_beta_s_growth_is_saved_and_a_state_saved_without_it_keeps_the_memory_s_own(kind):
    memory = filled(kind, 5, beta_increment=0.03)
    restored = filled(kind, 5, beta_increment=0.002)
    restored.load_state_dict(memory.state_dict())
    assert restored.beta_increment == 0.03  # a resumed run's beta grows as it did before
    older = {key: value for key, value in memory.state_dict().items() if key != "beta_increment"}
    restored = filled(kind, 5, beta_increment=0.002)
    restored.load_state_dict(older)  # checkpoint format 4 or older
    assert restored.beta_increment == 0.002


@pytest.mark.parametrize("kind", [kind for kind, memory in KINDS.items() if holds_frames(memory)])
def test_round_trip_of_a_frame_memory(kind):
    stacks = frame_stacks(40)

    def make(seed: int) -> object:
        return KINDS[kind](16, storage=FrameStackStorage(16), rng=seed)

    memory = make(4)
    for i in range(30):
        memory.store((stacks[i], i % 3, float(i), stacks[i + 1], i == 29))
        if i % 5 == 4:
            tree_idx, _, _ = memory.sample(4)
            memory.batch_update(tree_idx, np.abs(np.sin(tree_idx + i)))
    restored = make(5)
    restored.load_state_dict(save_and_load(memory.state_dict()))
    assert states_equal(snapshot(restored), snapshot(memory))
    for _ in range(3):
        expected, got = memory.sample(8), restored.sample(8)
        for one, other in zip((expected[0], *expected[1], expected[2]),
                              (got[0], *got[1], got[2]), strict=True):
            np.testing.assert_array_equal(one, other)
    # A new episode goes to the same slots in both, freeing the same transitions.
    transition = (stacks[35], 0, 1.0, stacks[36], False)
    assert memory.store(transition) == restored.store(transition)
    assert states_equal(snapshot(restored), snapshot(memory))


@pytest.mark.parametrize("kind", list(KINDS))
def test_a_memory_loaded_without_a_file_shares_nothing_with_the_original(kind):
    memory = filled(kind, 6)
    memory.sample(4)
    before = snapshot(memory)
    restored = KINDS[kind](8, rng=1)
    restored.load_state_dict(memory.state_dict())
    for i in range(12):
        restored.store(experience(40 + i))
        tree_idx, _, _ = restored.sample(4)
        restored.batch_update(tree_idx, np.full(4, 3.0))
    assert states_equal(snapshot(memory), before)


def test_a_rank_based_state_includes_the_ranks_still_pending():
    memory = filled("rank-based", 4)
    memory.batch_update(np.arange(4), np.array([1.0, 4.0, 2.0, 3.0]))
    memory.store(experience(4))  # not ranked until the next sample, or state_dict
    arrays = save_and_load(memory.state_dict())
    np.testing.assert_array_equal(arrays["ranked_slots"], [4, 1, 3, 2, 0])
    np.testing.assert_array_equal(arrays["ranked_keys"], [-np.inf, -4, -3, -2, -1])
    np.testing.assert_array_equal(arrays["abs_errors"], [1, 4, 2, 3, np.inf, -np.inf, -np.inf,
                                                         -np.inf])


def test_load_rejects_a_mismatch_and_changes_nothing():
    arrays = save_and_load(filled("proportional", 4).state_dict())
    target = filled("proportional", 2, rng=3)
    before = snapshot(target)
    refusals = [
        (RankBasedMemory(8), "saved kind is 'proportional', but this memory has 'rank-based'"),
        (UniformMemory(8), "saved kind is 'proportional', but this memory has 'uniform'"),
        (Memory(16), "saved capacity is 8, but this memory has 16"),
        (Memory(8, alpha=0.7), r"saved alpha is 0\.6, but this memory has 0\.7"),
    ]
    for memory, message in refusals:
        with pytest.raises(ValueError, match=message):
            memory.load_state_dict(arrays)
    for key, message in (("tree.sums", r"saved proportional memory lacks \['tree.sums'\]"),
                         ("max_priority", r"lacks \['max_priority'\]"),
                         ("rng", r"lacks \['rng'\]"),
                         ("kind", r"saved replay memory lacks \['kind'\]"),
                         ("storage.capacity", r"lacks \['storage.capacity'\]")):
        with pytest.raises(ValueError, match=message):
            target.load_state_dict({k: v for k, v in arrays.items() if k != key})
        assert states_equal(snapshot(target), before), key


def test_load_rejects_a_rank_based_or_uniform_mismatch():
    ranked = save_and_load(filled("rank-based", 4).state_dict())
    with pytest.raises(ValueError, match="saved kind is 'rank-based', but this memory has "
                                         "'proportional'"):
        Memory(8).load_state_dict(ranked)
    with pytest.raises(ValueError, match=r"saved alpha is 0\.7, but this memory has 0\.5"):
        RankBasedMemory(8, alpha=0.5).load_state_dict(ranked)
    with pytest.raises(ValueError, match=r"saved rank-based memory lacks \['ranked_keys'\]"):
        RankBasedMemory(8).load_state_dict({k: v for k, v in ranked.items()
                                               if k != "ranked_keys"})
    with pytest.raises(ValueError, match=r"saved abs_errors has shape \(3,\), expected \(8,\)"):
        RankBasedMemory(8).load_state_dict({**ranked, "abs_errors": np.zeros(3)})
    uniform = save_and_load(filled("uniform", 4).state_dict())
    with pytest.raises(ValueError, match="saved kind is 'uniform', but this memory has "
                                         "'rank-based'"):
        RankBasedMemory(8).load_state_dict(uniform)
    with pytest.raises(ValueError, match="saved capacity is 8, but this memory has 4"):
        UniformMemory(4).load_state_dict(uniform)


@pytest.mark.parametrize("kind", list(KINDS))
def test_an_unusable_random_generator_state_is_refused(kind):
    arrays = save_and_load(filled(kind, 4).state_dict())
    for rng in ("not json", '{"bit_generator": "Nope"}'):
        with pytest.raises(ValueError, match="saved random generator state is unusable"):
            KINDS[kind](8).load_state_dict({**arrays, "rng": np.array(rng)})


def test_a_tree_of_another_size_is_refused():
    arrays = save_and_load(filled("proportional", 4, capacity=4).state_dict())
    for nodes in (np.zeros(9), np.zeros(8)):
        arrays["tree.sums"] = nodes
        with pytest.raises(ValueError, match=rf"saved tree.sums has shape \({len(nodes)},\), "
                                             r"expected \(7,\)"):
            Memory(4).load_state_dict(arrays)


