"""Tests for the Pong preset's bfloat16 (d3qn_utils/bfloat16_timing.py): on a CPU with bfloat16
units it is on where a timing of the torso's gradient step finds it faster, the run says so with
the figures, a choice at the top of d3qn_agent.py or on the command line skips the timing, a
timing is cached per machine, and --resume (the checkpoint's value) and --test (the saved
network's precision) time nothing. The timings here are fakes (tests/conftest.py forbids the real
one), but for one that runs the real function on a tiny torso to see it work.
"""

from __future__ import annotations

import contextlib
import io
import json
import math
import os
import shutil
from pathlib import Path

import numpy as np
import pytest
from conftest import command_line, small_agent, small_flags, the_error_line

import apex
import d3qn_agent
from d3qn_agent import DQNAgent
from d3qn_utils import agent_checkpoint, bfloat16_timing, games, settings
from d3qn_utils.run_files import LATEST

# tests/conftest.py replaces it for every test; the tiny torso's test calls it
real_time_gradient_steps = bfloat16_timing.time_gradient_steps
PONG = "PongNoFrameskip-v4"


FASTER = ([40.0, 39.0, 41.0], [60.0, 59.0, 61.0])  # rounds' ms (bfloat16, float32): ranges apart
SLOWER = ([60.0, 59.0, 61.0], [40.0, 39.0, 41.0])


class FakeTiming:
    """`time_gradient_steps` giving `milliseconds` (bfloat16 rounds, float32 rounds), recording
    its calls."""

    def __init__(self) -> None:
        self.milliseconds = FASTER
        self.calls: list[tuple] = []

    def __call__(self, torso, state_shape, state_dtype, actions, batch_size, xla):
        self.calls.append((torso, tuple(state_shape), np.dtype(state_dtype), actions, batch_size,
                           xla))
        return self.milliseconds


@pytest.fixture
def timing(monkeypatch, tmp_path) -> FakeTiming:
    """A CPU with AVX512_BF16 whose timing is a `FakeTiming`, caching in tmp_path/cache."""
    fake = FakeTiming()
    monkeypatch.setattr(bfloat16_timing, "time_gradient_steps", fake)
    monkeypatch.setattr(settings, "native_bfloat16", lambda: "AVX512_BF16")
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    return fake


def resolve(**given):
    """d3qn_agent.py's settings for these command-line flags."""
    return settings.resolve(d3qn_agent, settings.D3QN_FLAGS, settings.d3qn_presets, given)


def bfloat16_notes(notes: list[str]) -> list[str]:
    return [note for note in notes if note.startswith("bfloat16 ")]


# --- the decision ---------------------------------------------------------------------------


@pytest.mark.parametrize(("milliseconds", "on"), [
    (FASTER, True), (([56.0, 55.5, 56.5], [60.0, 59.5, 60.5]), True),
    (([58.0, 57.5, 58.5], [60.0, 59.5, 60.5]), False),
    (([40.0, 39.0, 62.0], [60.0, 39.5, 61.0]), False),  # a float32 round beat bfloat16's median
    (([72.7, 72.0, 73.0], [54.1, 54.0, 55.0]), False)],
    ids=["faster", "just-faster", "within-margin", "not-below-float32-s-fastest", "slower"])
def test_pong_gets_bfloat16_where_its_gradient_step_times_faster(timing, milliseconds, on):
    timing.milliseconds = milliseconds
    config, notes = resolve(env_name=PONG)
    assert config.bfloat16 is on
    bfloat16, float32 = (bfloat16_timing.shown(rounds) for rounds in milliseconds)
    assert bfloat16_notes(notes) == [
        f"bfloat16 {on} ({PONG} preset: bfloat16 gradient step {bfloat16} against float32 "
        f"{float32} on this CPU (3 rounds), measured at start)"]
    # Pong's torso and states, at the batch size and XLA setting of its presets
    assert timing.calls == [(games.nature_torso, (84, 84, 4), np.dtype(np.uint8), 6, 32, False)]


def test_the_timing_is_of_the_run_s_batch_size_and_xla(timing):
    resolve(env_name="ALE/Pong-v5", batch_size=64, xla=True)
    assert [call[4:] for call in timing.calls] == [(64, True)]


def test_without_bfloat16_units_nothing_is_timed(timing, monkeypatch):
    monkeypatch.setattr(settings, "native_bfloat16", lambda: None)
    config, notes = resolve(env_name=PONG)
    assert not config.bfloat16
    assert bfloat16_notes(notes) == []
    assert timing.calls == []


@pytest.mark.parametrize("env_name", ["ALE/Breakout-v5", "MinAtar/Breakout-v1", "CartPole-v1"])
def test_games_without_the_preset_are_not_timed(timing, env_name):
    config, notes = resolve(env_name=env_name)
    assert not config.bfloat16
    assert bfloat16_notes(notes) == []
    assert timing.calls == []


@pytest.mark.parametrize(("where", "bfloat16", "said"), [
    ("command line", False, "--no-bfloat16"), ("command line", True, "--bfloat16"),
    ("top", True, "BFLOAT16 at the top of d3qn_agent.py")])
def test_a_choice_wins_and_nothing_is_timed(timing, monkeypatch, where, bfloat16, said):
    timing.milliseconds = SLOWER if bfloat16 else FASTER  # a timing would differ
    if where == "top":
        monkeypatch.setattr(d3qn_agent, "BFLOAT16", bfloat16)
        config, notes = resolve(env_name=PONG)
    else:
        config, notes = resolve(env_name=PONG, bfloat16=bfloat16)
    assert config.bfloat16 is bfloat16
    assert timing.calls == []
    assert bfloat16_notes(notes) == [f"bfloat16 {bfloat16} ({said}; the {PONG} preset would time "
                                     "bfloat16 against float32 on this CPU)"]


def test_bad_flags_are_refused_before_the_timing(timing):
    with pytest.raises(ValueError, match="BATCH_SIZE"):
        resolve(env_name=PONG, batch_size=0)
    assert timing.calls == []


def test_the_pong_agent_takes_the_timed_choice_and_announces_it(timing, monkeypatch, tmp_path,
                                                                capsys):
    monkeypatch.setattr(d3qn_agent, "ENV_NAME", PONG)
    agent = DQNAgent(**small_flags(tmp_path))
    agent.report.start(agent.step, agent.settings_notes)
    settings_line = capsys.readouterr().out.splitlines()[1]
    assert settings_line.startswith("settings: ")
    assert (f"bfloat16 True ({PONG} preset: bfloat16 gradient step 40.0 ms (39.0-41.0) against "
            "float32 60.0 ms (59.0-61.0) on this CPU (3 rounds), measured at start)"
            ) in settings_line
    assert "bfloat16" in {layer.compute_dtype for layer in agent.model.layers}


def test_apex_takes_the_atari_preset_and_times_nothing(timing):
    config, notes = apex.resolve_config({"env_name": PONG})  # apex.py has no BFLOAT16: float32
    assert "bfloat16" not in vars(config)
    assert "batch_size 32 (Atari preset)" in notes
    assert timing.calls == []


# --- the cache ------------------------------------------------------------------------------


def test_a_timing_is_cached_and_read_back(timing, tmp_path):
    cache = tmp_path / "cache" / "d3qn" / "bfloat16_timings.json"
    assert bfloat16_timing.cache_path() == cache
    first = resolve(env_name=PONG)
    entries = json.loads(cache.read_text())
    assert list(entries.values()) == [{"bfloat16_ms": FASTER[0], "float32_ms": FASTER[1]}]
    key = next(iter(entries))
    assert bfloat16_timing.cpu_model() in key and PONG in key
    timing.milliseconds = SLOWER  # a second timing would turn it off
    config, notes = resolve(env_name=PONG)
    assert len(timing.calls) == 1
    assert config.bfloat16 == first[0].bfloat16
    assert bfloat16_notes(notes) == [
        f"bfloat16 True ({PONG} preset: bfloat16 gradient step 40.0 ms (39.0-41.0) against "
        f"float32 60.0 ms (59.0-61.0) on this CPU (3 rounds), cached in {cache})"]


def test_another_cpu_model_or_batch_size_is_timed_again(timing, tmp_path, monkeypatch):
    cache = tmp_path / "timings.json"
    bfloat16_timing.gradient_step_timing(PONG, 32, False, cache)
    bfloat16_timing.gradient_step_timing(PONG, 64, False, cache)
    monkeypatch.setattr(bfloat16_timing, "cpu_model", lambda: "another CPU")
    bfloat16_timing.gradient_step_timing(PONG, 32, False, cache)
    bfloat16_timing.gradient_step_timing(PONG, 32, False, cache)  # cached by now
    assert len(timing.calls) == 3
    assert len(json.loads(cache.read_text())) == 3


@pytest.mark.parametrize("content", [
    "not JSON {", "", "[1, 2]", '{"%s": {"bfloat16_ms": ["40"], "float32_ms": [60]}}',
    '{"%s": {"bfloat16_ms": [NaN], "float32_ms": [60]}}',
    '{"%s": {"bfloat16_ms": [-1], "float32_ms": [60]}}', '{"%s": [40, 60]}',
    '{"%s": {"bfloat16_ms": [], "float32_ms": [60]}}',
    '{"%s": {"bfloat16_ms": 40, "float32_ms": 60}}', b"\xff\xfe"],
    ids=["not-json", "empty", "a-list", "a-string", "nan", "negative", "a-pair", "no-rounds",
         "medians-only", "not-utf8"])
def test_a_corrupt_cache_is_timed_again_and_rewritten(timing, tmp_path, content):
    cache = tmp_path / "timings.json"
    key = bfloat16_timing.timing_key(PONG, games.nature_torso, 32, False)
    if isinstance(content, bytes):
        cache.write_bytes(content)
    else:
        cache.write_text(content.replace("%s", key))
    found = bfloat16_timing.gradient_step_timing(PONG, 32, False, cache)
    assert (found.bfloat16_ms, found.float32_ms, found.cache) == (*map(tuple, FASTER), None)
    assert len(timing.calls) == 1
    assert json.loads(cache.read_text())[key] == {"bfloat16_ms": FASTER[0],
                                                  "float32_ms": FASTER[1]}


def test_an_unwritable_cache_is_no_error_and_is_timed_again(timing, tmp_path, monkeypatch):
    blocker = tmp_path / "a_file"
    blocker.write_text("")
    monkeypatch.setenv("XDG_CACHE_HOME", str(blocker))  # d3qn/ cannot be made under a file
    for _ in range(2):
        config, notes = resolve(env_name=PONG)
        assert config.bfloat16
        assert bfloat16_notes(notes)[0].endswith("measured at start)")
    assert len(timing.calls) == 2
    assert blocker.read_text() == ""


def test_the_cache_lies_in_the_user_s_cache_directory(monkeypatch, tmp_path):
    monkeypatch.setenv("HOME", str(tmp_path))
    monkeypatch.delenv("XDG_CACHE_HOME", raising=False)
    expected = tmp_path / ".cache" / "d3qn" / "bfloat16_timings.json"
    assert bfloat16_timing.cache_path() == expected
    monkeypatch.setenv("XDG_CACHE_HOME", "relative/dir")  # the XDG rule: only an absolute path
    assert bfloat16_timing.cache_path() == expected


def test_the_cpu_model_is_read_from_cpuinfo(tmp_path):
    cpuinfo = tmp_path / "cpuinfo"
    cpuinfo.write_text("processor\t: 0\nmodel name\t: Intel(R) Xeon(R) Processor\nflags\t: fpu\n")
    assert bfloat16_timing.cpu_model(cpuinfo) == "Intel(R) Xeon(R) Processor"
    assert bfloat16_timing.cpu_model(tmp_path / "missing") == "unknown CPU"


# --- the real timing, on a tiny torso -------------------------------------------------------


def test_the_timing_runs_both_precisions_and_leaves_the_agent_s_start_alone(tmp_path,
                                                                           monkeypatch):
    monkeypatch.setattr(bfloat16_timing, "ROUNDS", 1)
    before = small_agent(tmp_path).model.get_weights()
    milliseconds = real_time_gradient_steps(games.minatar_torso, (10, 10, 4), np.uint8, 3, 4,
                                            False)
    assert [len(rounds) for rounds in milliseconds] == [1, 1]  # (bfloat16, float32), a round each
    assert all(math.isfinite(ms) and ms > 0 for rounds in milliseconds for ms in rounds)
    after = small_agent(tmp_path).model.get_weights()  # seeded as before: the same network
    assert all(np.array_equal(a, b) for a, b in zip(before, after, strict=True))


# --- --resume and --test time nothing -------------------------------------------------------


def resumed(where: str, **given):
    """d3qn_agent.py's settings for `--resume where` with these command-line flags."""
    return settings.resolve(d3qn_agent, settings.D3QN_FLAGS, settings.d3qn_presets,
                            settings.for_mode(given, False, where, d3qn_agent.REPLAY_MEMORIES))


def recorded_checkpoint(root: Path, run_id: str, written_ns: int, **given) -> Path:
    """A checkpoint of a Pong run of `given` flags, under the checkpoint root `root`, written at
    `written_ns`: its progress.json, all that is read of it before an agent is built."""
    config, _ = resolve(env_name=PONG, **given)
    directory = root / run_id / "step-0000000008"
    directory.mkdir(parents=True)
    run = {"id": run_id, "started": "2026-01-01 00:00:00", "flags": vars(config), "networks": {}}
    (directory / "progress.json").write_text(json.dumps(
        {"format": agent_checkpoint.FORMAT, "run": run, "progress": {"step": 8}}))
    os.utime(directory, ns=(written_ns, written_ns))
    return directory


@pytest.mark.parametrize("bfloat16", [True, False])
def test_a_resume_takes_the_checkpoint_s_bfloat16_and_times_nothing(timing, tmp_path, bfloat16):
    timing.milliseconds = SLOWER if bfloat16 else FASTER  # a timing would choose the other
    checkpoint = recorded_checkpoint(tmp_path, "run-1", 1, bfloat16=bfloat16)
    config, notes = resumed(str(checkpoint), env_name=PONG)
    assert config.bfloat16 is bfloat16
    assert timing.calls == []
    assert bfloat16_notes(notes) == [
        f"bfloat16 {bfloat16} ({PONG} preset: not timed: as checkpoint {checkpoint} records it)"]


def test_resume_s_newest_checkpoint_gives_bfloat16_as_it_is_chosen(timing, tmp_path):
    models = str(tmp_path / "models")
    config, _ = resolve(env_name=PONG, model_dir=models, bfloat16=False)  # where: not timed
    root = Path(settings.checkpoint_root(vars(config), d3qn_agent.REPLAY_MEMORIES))
    recorded_checkpoint(root, "run-1", 1, bfloat16=True, model_dir=models, seed=0)
    recorded_checkpoint(root, "run-2", 2, bfloat16=False, model_dir=models, seed=1)  # newest
    for seed, bfloat16 in [(0, True), (1, False), (2, False)]:  # 2: refused, as the newest's
        config, _ = resumed(LATEST, env_name=PONG, model_dir=models, seed=seed)
        assert config.bfloat16 is bfloat16
        if seed == 2:
            with pytest.raises(ValueError, match=r"\): seed 1 -> 2;") as refused:
                agent_checkpoint.choose_checkpoint(str(root), LATEST, config)
            assert "bfloat16" not in str(refused.value)
    assert timing.calls == []


def test_the_checkpoint_root_is_the_agent_s(tmp_path):
    agent = small_agent(tmp_path, use_per=False)
    assert settings.checkpoint_root(vars(agent.config), d3qn_agent.REPLAY_MEMORIES) == (
        agent.checkpoint_root)


def test_a_resume_without_a_checkpoint_times_nothing(timing, tmp_path):
    config, notes = resumed(LATEST, env_name=PONG, model_dir=str(tmp_path))
    assert not config.bfloat16
    assert timing.calls == []
    assert bfloat16_notes(notes) == [
        f"bfloat16 False ({PONG} preset: not timed: no checkpoint to resume records it)"]


def test_test_mode_times_nothing_and_a_game_without_the_preset_is_as_before(timing):
    given = settings.for_mode({"env_name": PONG}, True, None, d3qn_agent.REPLAY_MEMORIES)
    config, notes = settings.resolve(d3qn_agent, settings.D3QN_FLAGS, settings.d3qn_presets,
                                     given)
    assert not config.bfloat16 and timing.calls == []
    assert bfloat16_notes(notes) == [f"bfloat16 False ({PONG} preset: not timed: --test plays a "
                                     "saved network in the precision it was saved with)"]
    for mode in [(True, None), (False, LATEST)]:
        given = settings.for_mode({"env_name": "CartPole-v1"}, *mode, d3qn_agent.REPLAY_MEMORIES)
        assert settings.resolve(d3qn_agent, settings.D3QN_FLAGS, settings.d3qn_presets,
                                given) == resolve(env_name="CartPole-v1")


# Pong for 8 steps, no gradient step, a checkpoint and an evaluation (one 10-step episode) at
# the end.
PONG_RUN = small_flags(None, env_name=PONG, total_steps=8, learning_starts=1_000,
                       memory_size=100, batch_size=4, max_episode_steps=10, eval_every=8,
                       eval_episodes=1, checkpoint_every=8, test_episodes=1)


def pong_main(directory: Path, capsys: pytest.CaptureFixture, *flags: str
              ) -> tuple[int, str, str]:
    """`python d3qn_agent.py` with PONG_RUN's flags writing under `directory`, in this process:
    (exit code, stdout, stderr)."""
    capsys.readouterr()
    code = d3qn_agent.main([*command_line(PONG_RUN), "--model-dir", str(directory / "models"),
                            "--plot-dir", str(directory / "plots"), *flags])
    return code, *capsys.readouterr()


@pytest.fixture(scope="module")
def pong_trained(tmp_path_factory) -> Path:
    """The directory of a PONG_RUN that a timing put in bfloat16, its timing's cache gone."""
    directory = tmp_path_factory.mktemp("pong")
    fake = FakeTiming()
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(bfloat16_timing, "time_gradient_steps", fake)
        patch.setattr(settings, "native_bfloat16", lambda: "AVX512_BF16")
        patch.setenv("XDG_CACHE_HOME", str(directory / "cache"))  # removed below: lost
        log = io.StringIO()
        with contextlib.redirect_stdout(log):
            code = d3qn_agent.main([*command_line(PONG_RUN), "--model-dir",
                                    str(directory / "models"), "--plot-dir",
                                    str(directory / "plots")])
    assert code == 0 and len(fake.calls) == 1
    assert f"bfloat16 True ({PONG} preset: bfloat16 gradient step" in log.getvalue()
    shutil.rmtree(directory / "cache")
    return directory


def test_a_resume_is_not_refused_for_a_timing_it_did_not_ask_for(pong_trained, timing, tmp_path,
                                                                   capsys):
    timing.milliseconds = SLOWER  # the timing here would choose float32
    shutil.copytree(pong_trained / "models", tmp_path / "models")
    code, _, err = pong_main(tmp_path, capsys, "--resume", "--total-steps", "16",
                             "--no-bfloat16")  # a flag given is compared
    assert code == 2
    assert "bfloat16 True -> False" in the_error_line(err)
    code, out, err = pong_main(tmp_path, capsys, "--resume", "--total-steps", "16")
    assert code == 0, err
    assert f"bfloat16 True ({PONG} preset: not timed: as checkpoint " in out
    [checkpoint] = (tmp_path / "models").rglob("step-0000000016")
    assert json.loads((checkpoint / "progress.json").read_text())["run"]["flags"]["bfloat16"]
    assert timing.calls == []


def test_test_mode_plays_the_saved_network_in_its_precision_and_times_nothing(
        pong_trained, timing, monkeypatch, capsys):
    timing.milliseconds = SLOWER
    played = []
    test = DQNAgent.test
    monkeypatch.setattr(DQNAgent, "test", lambda agent, *args: played.append(agent)
                        or test(agent, *args))
    [model] = (pong_trained / "models").glob("*_last.keras")
    code, out, err = pong_main(pong_trained, capsys, "--test", "--model", str(model))
    assert code == 0, err
    assert "episode: 1/1" in out
    assert "bfloat16" in {layer.compute_dtype for layer in played[0].model.layers}
    assert timing.calls == []
