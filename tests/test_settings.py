"""Tests for settings.py: a flag edited at the top of d3qn_agent.py (or apex.py) is obeyed like the
same flag on the command line, presets fill in only the flags left as shipped, and the run says
which values a preset set.

The tests edit the scripts' constants as a reader edits the file (monkeypatch.setattr on the
module); one test edits a copy of d3qn_agent.py itself and reads what the run prints and uses.
"""

from __future__ import annotations

import re
import subprocess
import sys
import types

import keras
import numpy as np
import pytest
from conftest import ROOT, small_agent, small_flags

import apex
import d3qn_agent
from d3qn_agent import DQNAgent, main
from d3qn_utils import games, settings

native_bfloat16 = settings.native_bfloat16  # tests/conftest.py hides the CPU's from the others
# (the bfloat16 preset's timing: tests/test_bfloat16_timing.py)


def resolve(**given):
    """d3qn_agent.py's settings for these command-line flags, with the file's constants as they
    are now (the test may have edited them)."""
    return settings.resolve(d3qn_agent, settings.D3QN_FLAGS, settings.d3qn_presets, given)


# --- the shipped tables agree with the scripts ---------------------------------------------


@pytest.mark.parametrize(("script", "table"), [(d3qn_agent, settings.D3QN_FLAGS),
                                               (apex, apex.APEX_FLAGS)],
                         ids=["d3qn_agent", "apex"])
def test_every_flag_is_in_the_flag_block_with_its_shipped_value_and_a_comment(script, table):
    comments = settings.flag_comments(script)
    for name, flag in table.items():
        value = getattr(script, name.upper())
        assert value == flag.shipped, (
            f"{name.upper()} is {value!r} in {script.__name__}.py but its table records "
            f"{flag.shipped!r} as shipped: if you edited the flag block to try a setting, this "
            "is expected; if you changed a default, change it in the table too")
        assert comments.get(name), f"{name.upper()} has no comment to serve as its --help"


def test_the_flag_block_holds_only_flags():
    assert set(settings.flag_comments(d3qn_agent)) == set(settings.D3QN_FLAGS)


# --- an edit at the top is obeyed, for each kind of preset --------------------------------


def test_shipped_values_run_cartpole_with_no_preset_and_no_note():
    config, notes = resolve()
    assert (config.env_name, config.n_step, config.learning_rate) == ("CartPole-v1", 3, 1e-3)
    assert notes == []


def test_a_game_preset_fills_in_only_the_flags_left_as_shipped(monkeypatch):
    monkeypatch.setattr(d3qn_agent, "ENV_NAME", "Acrobot-v1")
    monkeypatch.setattr(d3qn_agent, "N_STEP", 1)
    config, notes = resolve()
    assert config.n_step == 1  # the edit, not the preset's 3
    assert (config.learning_rate, config.target_update) == (6.3e-4, 250)  # the preset's
    assert "learning_rate 0.00063 (Acrobot-v1 preset)" in notes
    assert "n_step 1 (N_STEP at the top of d3qn_agent.py; the Acrobot-v1 preset has 3)" in notes


def test_the_rank_based_preset_gives_way_to_an_edited_alpha(monkeypatch):
    monkeypatch.setattr(d3qn_agent, "PER_RANK_BASED", True)
    monkeypatch.setattr(d3qn_agent, "PER_ALPHA", 0.5)
    config, notes = resolve()
    assert (config.per_alpha, config.per_beta) == (0.5, 0.5)
    assert "per_beta 0.5 (rank-based preset)" in notes


def test_rank_based_without_per_is_uniform_replay_with_no_rank_based_preset(monkeypatch):
    monkeypatch.setattr(d3qn_agent, "PER_RANK_BASED", True)
    monkeypatch.setattr(d3qn_agent, "USE_PER", False)
    config, notes = resolve()
    assert d3qn_agent.replay_variant(config.use_per, config.per_rank_based) == "uniform"
    assert (config.per_alpha, config.per_beta) == (0.6, 0.4)  # as shipped, unused
    assert not any("rank-based preset" in note for note in notes)


def test_the_atari_preset_gives_way_to_an_edited_batch_size(monkeypatch):
    monkeypatch.setattr(d3qn_agent, "ENV_NAME", "PongNoFrameskip-v4")
    monkeypatch.setattr(d3qn_agent, "BATCH_SIZE", 64)
    config, notes = resolve()
    assert (config.batch_size, config.learning_rate, config.lr_decay) == (64, 1e-4, False)
    assert "lr_decay False (Atari preset)" in notes
    assert any(note.startswith("batch_size 64 (BATCH_SIZE at the top") for note in notes)


@pytest.mark.parametrize("pong", ["PongNoFrameskip-v4", "ALE/Pong-v5"])
def test_pong_at_the_top_gets_the_documented_run(monkeypatch, pong):
    monkeypatch.setattr(d3qn_agent, "ENV_NAME", pong)
    config, notes = resolve()
    assert (config.total_steps, config.train_frequency, config.xla, config.checkpoint_every) == (
        500_000, 2, False, 25_000)
    assert (config.learning_rate, config.batch_size) == (1e-4, 32)  # the Atari preset's
    for note in ("total_steps 500000", "train_frequency 2", "xla False", "checkpoint_every 25000"):
        assert f"{note} ({pong} preset)" in notes
    assert "learning_rate 0.0001 (Atari preset)" in notes


def test_other_atari_games_keep_the_literature_budget(monkeypatch):
    monkeypatch.setattr(d3qn_agent, "ENV_NAME", "ALE/Breakout-v5")
    config, notes = resolve()
    assert (config.total_steps, config.train_frequency, config.xla) == (10_000_000, 4, True)
    assert "total_steps 10000000 (Atari preset)" in notes


def test_an_edit_wins_over_the_pong_preset(monkeypatch):
    monkeypatch.setattr(d3qn_agent, "ENV_NAME", "PongNoFrameskip-v4")
    monkeypatch.setattr(d3qn_agent, "TRAIN_FREQUENCY", 4)
    config, notes = resolve(xla=True)
    assert (config.train_frequency, config.xla, config.total_steps) == (4, True, 500_000)
    assert ("train_frequency 4 (TRAIN_FREQUENCY at the top of d3qn_agent.py; the "
            "PongNoFrameskip-v4 preset has 2)") in notes
    assert "xla True (--xla; the PongNoFrameskip-v4 preset has False)" in notes


@pytest.mark.parametrize(("flags", "found"), [("fpu avx512f avx512_bf16 vaes", "AVX512_BF16"),
                                             ("avx512_bf16 amx_tile amx_bf16", "AMX_BF16"),
                                             ("fpu avx2 avx512f avx512_vnni", None)])
def test_native_bfloat16_is_read_from_the_cpus_flags(tmp_path, flags, found):
    cpuinfo = tmp_path / "cpuinfo"
    cpuinfo.write_text(f"processor\t: 0\nmodel name\t: a CPU\nflags\t\t: {flags}\n")
    expected = found if keras.backend.backend() == "tensorflow" else None  # measured on TF only
    assert native_bfloat16(cpuinfo) == expected
    assert native_bfloat16(tmp_path / "not_linux") is None


def test_the_pong_run_announces_its_preset(monkeypatch, tmp_path, capsys):
    monkeypatch.setattr(d3qn_agent, "ENV_NAME", "PongNoFrameskip-v4")
    agent = DQNAgent(**small_flags(tmp_path))  # no env_name: the edited ENV_NAME picks Pong
    agent.report.start(agent.step, agent.settings_notes)
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].startswith("training on PongNoFrameskip-v4 until step 500,000: ")
    assert lines[1].startswith("settings: total_steps 500000 (PongNoFrameskip-v4 preset), ")
    assert "train_frequency 2 (PongNoFrameskip-v4 preset)" in lines[1]


def test_bfloat16_on_vector_states_says_that_it_changes_nothing(tmp_path, capsys):
    agent = small_agent(tmp_path, bfloat16=True)
    agent.report.start(agent.step, agent.settings_notes)
    note = "note: BFLOAT16 changes only the convolutions of an image torso"
    assert note in capsys.readouterr().out
    assert {layer.compute_dtype for layer in agent.model.layers} == {"float32"}


def test_the_command_line_wins_over_an_edit_and_says_so(monkeypatch):
    monkeypatch.setattr(d3qn_agent, "N_STEP", 1)
    config, notes = resolve(env_name="MountainCar-v0", n_step=2)
    assert (config.n_step, config.gamma) == (2, 0.98)
    assert "n_step 2 (--n-step; the MountainCar-v0 preset has 3)" in notes


def test_the_agent_uses_the_edited_values(monkeypatch, tmp_path):
    monkeypatch.setattr(d3qn_agent, "ENV_NAME", "Acrobot-v1")
    monkeypatch.setattr(d3qn_agent, "N_STEP", 1)
    monkeypatch.setattr(d3qn_agent, "HIDDEN_UNITS", [8])  # a list is read as a tuple
    agent = DQNAgent(model_dir=str(tmp_path), plot_dir=str(tmp_path))
    assert (agent.env_name, agent.MEMORY.n_step, agent.config.hidden_units) == (
        "Acrobot-v1", 1, (8,))
    assert agent.MEMORY.capacity == 50_000  # the preset's, equal to the shipped value


def test_an_edit_out_of_range_names_the_constant_and_the_flag(monkeypatch, capsys):
    monkeypatch.setattr(d3qn_agent, "GAMMA", 1.5)
    assert main(["--hidden-units", "8"]) == 2
    assert capsys.readouterr().err.strip() == (
        "error: GAMMA (--gamma) must be in [0, 1], got 1.5")


@pytest.mark.parametrize(("constant", "value", "message"), [
    ("TOTAL_STEPS", "300", "TOTAL_STEPS (--total-steps) must be an integer, got '300'"),
    ("N_STEP", 1.0, "N_STEP (--n-step) must be an integer, got 1.0"),
    ("USE_PER", 1, "USE_PER (--per) must be True or False, got 1"),
    ("HIDDEN_UNITS", (64, "64"), "HIDDEN_UNITS (--hidden-units) must be a tuple of integers"),
    ("MAX_EPISODE_STEPS", "500", "MAX_EPISODE_STEPS (--max-episode-steps) must be an integer "
                                 "or None, got '500'"),
])
def test_an_edit_of_the_wrong_type_names_the_constant(monkeypatch, constant, value, message):
    monkeypatch.setattr(d3qn_agent, constant, value)
    with pytest.raises(ValueError, match=re.escape(message)):
        resolve()


def test_edits_of_the_types_the_command_line_gives_are_accepted(monkeypatch):
    for constant, value in [("LEARNING_RATE", 1), ("MAX_EPISODE_STEPS", 4000),
                            ("FAILURE_REWARD", -100), ("TENSORBOARD", True)]:
        monkeypatch.setattr(d3qn_agent, constant, value)
    config, _ = resolve(seed=np.int64(3))
    assert (config.learning_rate, config.max_episode_steps, config.failure_reward) == (
        1, 4000, -100)
    assert config.tensorboard is True and config.seed == 3


def test_help_shows_the_comments_the_edited_defaults_and_the_presets(monkeypatch, capsys):
    monkeypatch.setattr(d3qn_agent, "BATCH_SIZE", 64)
    with pytest.raises(SystemExit):
        settings.explicit_flags(["--help"], settings.d3qn_parser(d3qn_agent))
    text = " ".join(capsys.readouterr().out.split())
    assert "--batch-size BATCH_SIZE transitions per gradient step (default: 64)" in text
    for family in games.FAMILIES:
        for source, preset in ([(family.ids, family.preset)] if family.preset else []) + [
                *family.game_presets.items()]:
            assert f"{source}: {settings.format_preset(preset, settings.D3QN_FLAGS)}" in text
    assert "--no-lr-decay," in settings.format_preset(games.ATARI.preset, settings.D3QN_FLAGS)
    assert "MinAtar ids: --total-steps 2000000," in text


def test_only_explicit_flags_are_returned():
    parser = settings.d3qn_parser(d3qn_agent)
    assert settings.explicit_flags(["--no-per", "--seed", "3"], parser) == {
        "use_per": False, "seed": 3}
    assert settings.explicit_flags([], parser) == {}


def test_unknown_keyword_flag_is_a_value_error():
    with pytest.raises(ValueError, match=r"unknown flag\(s\) \['n_steps'\]"):
        resolve(n_steps=3)


def test_apex_obeys_an_edit_over_its_atari_preset(monkeypatch):
    monkeypatch.setattr(apex, "ENV_NAME", "PongNoFrameskip-v4")
    monkeypatch.setattr(apex, "BATCH_SIZE", 64)
    config, notes = apex.resolve_config({})
    assert (config.batch_size, config.learning_rate) == (64, 1e-4)
    assert "learning_rate 0.0001 (Atari preset)" in notes


# --- what a run needs: flags that agree, a replay memory that fits, a budget that trains ---


def test_an_exploration_rate_that_would_rise_is_refused(monkeypatch):
    monkeypatch.setattr(d3qn_agent, "EPSILON_MIN", 0.5)
    with pytest.raises(ValueError, match=re.escape(
            "EPSILON_MIN (0.5) must not exceed EPSILON_START (0.2)")):
        resolve(epsilon_start=0.2)
    config, _ = resolve(epsilon_start=0.5)  # a constant rate is fine
    assert (config.epsilon_start, config.epsilon_min) == (0.5, 0.5)


@pytest.mark.parametrize(("given", "first"), [
    ({"total_steps": 120, "learning_starts": 10_000}, 10_016),  # 313 calls of 2 x 16 steps
    ({"total_steps": 64, "learning_starts": 50, "batch_size": 16}, None),  # trains at its end
    ({"total_steps": 63, "learning_starts": 50, "batch_size": 16}, 64),
    ({"total_steps": 100, "learning_starts": 0, "train_frequency": 1,
      "gradient_steps_per_call": 1}, 128),  # a batch of 128 is not collected
    ({"total_steps": 128, "learning_starts": 0, "train_frequency": 1,
      "gradient_steps_per_call": 1}, None),
    # 3 environments: the step count passes 1,024 at 1,026; a batch of 128 is held at 129
    ({"total_steps": 1_023, "n_envs": 3, "learning_starts": 1_000}, 1_026),
    ({"total_steps": 1_026, "n_envs": 3, "learning_starts": 1_000}, None),
    ({"total_steps": 126, "n_envs": 3, "learning_starts": 0, "train_frequency": 1,
      "gradient_steps_per_call": 1}, 129),
])
def test_a_run_that_cannot_train_is_warned_of(given, first):
    config, _ = resolve(**given)
    step = DQNAgent.first_gradient_step(types.SimpleNamespace(config=config))  # its config alone
    warning = settings.no_training_warning(step, config.total_steps, config.learning_starts,
                                           config.n_envs)
    if first is None:
        assert warning is None
    else:
        environments = f", N_ENVS being {given['n_envs']}" if "n_envs" in given else ""
        assert warning == (
            f"warning: TOTAL_STEPS ({given['total_steps']:,}) ends before the first gradient "
            f"step (env step {first:,}, LEARNING_STARTS being {given['learning_starts']:,}"
            f"{environments}): this run will not train, and the network it saves as best is "
            "the untrained one")


def test_an_apex_run_that_cannot_train_is_warned_of(capsys):
    for total_steps, warned in (("1000", True), ("1001", False)):  # --address: stop before Ray
        argv = ["--total-steps", total_steps, "--learning-starts", "1000", "--address", "nowhere"]
        assert apex.main(argv) == 2
        err = capsys.readouterr().err
        assert ("(env step 1,001, LEARNING_STARTS being 1,000)" in err) == warned


# --- the promise end to end: edit the file, run it ------------------------------------------


@pytest.mark.slow  # a Python with TensorFlow for the copy (test_the_agent_uses_the_edited_values)
def test_an_edited_copy_of_the_file_runs_with_its_edits_and_announces_the_preset(tmp_path):
    source = (ROOT / "d3qn_agent.py").read_text()
    edits = {'ENV_NAME = "CartPole-v1"': 'ENV_NAME = "Acrobot-v1"', "N_STEP = 3": "N_STEP = 1",
             "TOTAL_STEPS = 50_000": "TOTAL_STEPS = 300",
             "HIDDEN_UNITS = (256, 256)": "HIDDEN_UNITS = (16,)"}
    for old, new in edits.items():
        assert source.count(f"\n{old}  #") == 1, old
        source = source.replace(f"\n{old}  #", f"\n{new}  #")
    script = tmp_path / "d3qn_agent.py"
    script.write_text(source)
    command = [sys.executable, str(script), "--learning-starts", "100", "--eval-every", "300",
               "--eval-episodes", "1", "--no-xla", "--model-dir", str(tmp_path), "--plot-dir",
               str(tmp_path)]  # no XLA: seconds of compiling
    done = subprocess.run(command, cwd=tmp_path, capture_output=True, text=True, timeout=300,
                          env={"PYTHONPATH": str(ROOT), "PATH": ""})
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    assert lines[0].startswith("training on Acrobot-v1 until step 300: double DQN, dueling, "
                               "proportional PER, target copy every 250 steps")  # no n-step
    assert lines[1].startswith("settings: total_steps 300 (TOTAL_STEPS at the top of "
                               "d3qn_agent.py; the Acrobot-v1 preset has 100000)")
    assert "n_step 1 (N_STEP at the top of d3qn_agent.py; the Acrobot-v1 preset has 3)" in lines[1]
    assert "learning_rate 0.00063 (Acrobot-v1 preset)" in lines[1]
    assert lines[-1].startswith("done: 300 steps")


def test_a_gpu_that_tensorflow_sees_means_no_bfloat16_timing(tmp_path, monkeypatch):
    # TensorFlow would run the timing on the GPU, not on the CPU whose flags allowed it.
    if keras.backend.backend() != "tensorflow":
        pytest.skip("the preset is measured on TensorFlow only")
    import tensorflow as tf

    cpuinfo = tmp_path / "cpuinfo"
    cpuinfo.write_text("processor\t: 0\nflags\t\t: fpu avx512_bf16\n")
    monkeypatch.setattr(tf.config, "list_physical_devices", lambda kind=None: ["a GPU"])
    assert native_bfloat16(cpuinfo) is None
    monkeypatch.setattr(tf.config, "list_physical_devices", lambda kind=None: [])
    assert native_bfloat16(cpuinfo) == "AVX512_BF16"
