"""Tests for playing saved networks: the committed pretrained networks (`--test --model`), and
recording an episode as a GIF (`--test --record`), with its limits and its input checks."""

from __future__ import annotations

import io
import re
import subprocess
from pathlib import Path

import keras
import numpy as np
import pytest
from conftest import ROOT, small_agent, unwritable_directory
from PIL import Image

import atari_wrappers
import d3qn_agent
from d3qn_agent import DQNAgent, main
from d3qn_utils import recording
from d3qn_utils.recording import GifRecorder

PRETRAINED_DIR = ROOT / "models" / "pretrained"
# Every network committed to models/pretrained/: file name -> (environment id, greedy test
# episodes, the mean score it must reach). An entry's test runs once its file is there.
PRETRAINED = {
    "CartPole-v1.keras": ("CartPole-v1", 5, 475.0),
    "PongNoFrameskip-v4.keras": ("PongNoFrameskip-v4", 3, 18.0),
    "Acrobot-v1.keras": ("Acrobot-v1", 5, -100.0),
    "LunarLander-v3.keras": ("LunarLander-v3", 10, 150.0),
    "MountainCar-v0.keras": ("MountainCar-v0", 5, -110.0),
    # MinAtar: the study's PER seed-0 networks, each held to ~10x random play's score.
    "MinAtar-Asterix-v1.keras": ("MinAtar/Asterix-v1", 5, 5.0),
    "MinAtar-Breakout-v1.keras": ("MinAtar/Breakout-v1", 5, 3.0),
    "MinAtar-Freeway-v1.keras": ("MinAtar/Freeway-v1", 5, 20.0),
    "MinAtar-Seaquest-v1.keras": ("MinAtar/Seaquest-v1", 5, 2.0),
    "MinAtar-SpaceInvaders-v1.keras": ("MinAtar/SpaceInvaders-v1", 5, 30.0),
}
REQUIRED = ["CartPole-v1.keras"]  # must be in the repository
PRETRAINED_MAX_BYTES = 11_000_000  # all of them together, so that they can stay in git


def committed_networks() -> list[str]:
    return sorted(path.name for path in PRETRAINED_DIR.glob("*.keras"))


def scores_printed(output: str) -> list[float]:
    return [float(score) for score in re.findall(r"^episode: \d+/\d+, score: (\S+)$", output,
                                                  flags=re.MULTILINE)]


# --- the committed networks ------------------------------------------------------------------


def test_committed_networks_are_the_known_ones_and_small():
    names = committed_networks()
    assert set(REQUIRED) <= set(names)
    assert set(names) <= set(PRETRAINED), "add a new network's threshold to PRETRAINED"
    assert sum((PRETRAINED_DIR / name).stat().st_size for name in names) <= PRETRAINED_MAX_BYTES


def test_training_output_is_ignored_by_git_but_not_the_pretrained_networks():
    def ignored(path: str) -> bool:
        try:  # --no-index: by the .gitignore rules alone, whether the file is tracked or not
            done = subprocess.run(["git", "check-ignore", "--no-index", "-q", path], cwd=ROOT,
                                  capture_output=True, text=True, timeout=60)
        except FileNotFoundError:
            pytest.skip("git is not installed")
        if done.returncode not in (0, 1):
            pytest.skip(f"not a git work tree: {done.stderr.strip()}")
        return done.returncode == 0

    assert ignored("models/DDQN_CartPole-v1_Dueling_PER.keras")
    assert ignored("models/DDQN_CartPole-v1_Dueling_PER.checkpoints/step-0000000100/memory.npz")
    assert not ignored("models/pretrained/CartPole-v1.keras")
    assert not ignored("models/pretrained/PongNoFrameskip-v4.keras")


@pytest.mark.parametrize("name", committed_networks())
def test_committed_network_loads_in_safe_mode_and_fits_its_environment(name):
    env_name = PRETRAINED[name][0]
    model = keras.models.load_model(PRETRAINED_DIR / name, safe_mode=True)
    assert not any(isinstance(layer, keras.layers.Lambda) for layer in model.layers)
    env = d3qn_agent.make_env(env_name)
    assert model.input_shape == (None, *env.observation_space.shape)
    assert model.output_shape == (None, env.action_space.n)


def playing(name: str) -> object:
    """Pong's 3 games are thousands of steps of its network: the slow tier."""
    return pytest.param(name, marks=[pytest.mark.slow] if name.startswith("Pong") else [])


@pytest.mark.parametrize("name", [playing(name) for name in committed_networks()])
def test_committed_network_plays_greedily_above_its_threshold(name, tmp_path, capsys):
    env_name, episodes, threshold = PRETRAINED[name]
    # The documented command, in-process: --test --model models/pretrained/<name>.
    argv = ["--test", "--model", str(PRETRAINED_DIR / name), "--env-name", env_name,
            "--test-episodes", str(episodes), "--model-dir", str(tmp_path)]
    assert main(argv) == 0
    scores = scores_printed(capsys.readouterr().out)
    assert len(scores) == episodes
    assert np.mean(scores) >= threshold, scores
    assert list(tmp_path.iterdir()) == []  # playing writes nothing


def test_model_for_another_game_gives_one_error_line(tmp_path, capsys):
    model = str(PRETRAINED_DIR / "CartPole-v1.keras")
    argv = ["--test", "--model", model, "--env-name", "Acrobot-v1", "--model-dir", str(tmp_path)]
    assert main(argv) == 2
    captured = capsys.readouterr()
    assert captured.err.startswith(f"error: model {model!r} maps (None, 4) -> (None, 2), but "
                                   "Acrobot-v1 needs (None, 6) -> 3 actions")
    assert captured.err.count("\n") == 1 and "episode" not in captured.out


@pytest.mark.parametrize("name", committed_networks())
def test_usage_guide_shows_each_committed_networks_gif_under_watch_a_trained_agent(name):
    gif = f"plots/{Path(name).stem}.gif"
    usage = (ROOT / "docs" / "usage.md").read_text()
    assert f"../{gif}" in usage.split("\n## Watch a trained agent\n")[1].split("\n## ")[0]
    with Image.open(ROOT / gif) as image:
        assert image.format == "GIF" and image.n_frames > 1
        assert image.width <= recording.GIF_MAX_WIDTH
    assert (ROOT / gif).stat().st_size <= recording.GIF_MAX_BYTES


# --- recording -------------------------------------------------------------------------------


def saved_small_agent(tmp_path: Path) -> DQNAgent:
    """An untrained CartPole agent with 8 hidden units, its network saved to `Model_name`."""
    agent = small_agent(tmp_path, hidden_units=(8,), test_episodes=2)
    agent.save(agent.Model_name)
    return agent


def test_record_writes_the_first_episode_as_a_real_time_gif(tmp_path, capsys):
    agent = saved_small_agent(tmp_path)
    gif = tmp_path / "cartpole.gif"
    scores_unrecorded = agent.test(agent.Model_name)
    capsys.readouterr()
    assert main(["--test", "--model", agent.Model_name, "--test-episodes", "2",
                 "--model-dir", str(tmp_path), "--record", str(gif)]) == 0
    output = capsys.readouterr().out
    assert scores_printed(output) == scores_unrecorded  # filming does not change the play
    assert f"recorded episode 1 to {gif}" in output
    # CartPole: 50 steps/s and a reward of 1 per step. The screens after reset and after
    # every 2nd step (25 per second, 40 ms each), plus the last one if the length is odd.
    steps = int(scores_unrecorded[0])
    with Image.open(gif) as image:
        assert image.is_animated
        assert image.n_frames == steps // 2 + 1 + steps % 2
        assert image.size == (recording.GIF_MAX_WIDTH, 213)  # 600x400 shrunk
        assert image.info["duration"] == 40 and image.info["loop"] == 0
    assert gif.stat().st_size <= recording.GIF_MAX_BYTES
    assert [path.name for path in tmp_path.iterdir() if path.suffix == ".gif"] == [gif.name]


def test_record_films_atari_screens_in_colour_at_15_steps_per_second(tmp_path):
    env = atari_wrappers.make_env("PongNoFrameskip-v4", render_mode="rgb_array")
    env.reset(seed=0)
    assert env.metadata["render_fps"] == 15  # 60 frames/s, 4 per step
    assert env.render().shape == (210, 160, 3)
    agent = small_agent(tmp_path, "PongNoFrameskip-v4", memory_size=100, batch_size=8,
                        test_episodes=1, max_episode_steps=12)
    agent.save(agent.Model_name)
    gif = tmp_path / "pong.gif"
    agent.test(record=str(gif))
    with Image.open(gif) as image:
        assert image.size == (160, 210)
        # Every step is kept (15 <= GIF_MAX_FPS), 67 ms each; Pillow merges identical
        # screens, so there are at most 13 frames.
        assert 1 < image.n_frames <= 13
        image.seek(image.n_frames - 1)
        colours = sorted(image.convert("RGB").getcolors(256))  # (count, colour), few colours
        assert colours[-1][1] == (144, 72, 17)  # the full-colour screen: Pong's brown field


def test_recorder_caps_frames_and_bytes_and_keeps_the_speed(monkeypatch):
    monkeypatch.setattr(recording, "GIF_MAX_FRAMES", 8)
    rng = np.random.default_rng(0)
    recorder = GifRecorder(steps_per_second=50)
    assert recorder.every == 2 and recorder.frame_ms == 40
    for step in range(40):
        if recorder.wants(step):
            recorder.add(step, rng.integers(0, 256, (400, 600, 3), dtype=np.uint8))
    assert len(recorder.frames) == 8 and not recorder.wants(40)
    assert recorder.frames[0].size == (320, 213) and recorder.frames[0].mode == "P"
    data, frames = recorder.encode()
    assert frames == 8
    # Noise does not compress: half the bytes leave room for at most half the frames, each
    # shown twice as long.
    smaller, fewer = recorder.encode(max_bytes=len(data) // 2)
    assert len(smaller) <= len(data) // 2 and fewer <= 4
    with Image.open(io.BytesIO(smaller)) as image:
        assert image.n_frames == fewer and image.info["duration"] == 40 * 8 // fewer


def test_recorder_refuses_a_frame_that_is_not_rgb():
    recorder = GifRecorder(steps_per_second=50)
    with pytest.raises(ValueError, match="no RGB frame"):
        recorder.add(0, None)
    with pytest.raises(ValueError, match="no RGB frame"):
        recorder.add(0, np.zeros((84, 84), np.uint8))


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--test", "--record", "{tmp}/episode.mp4"], "'{tmp}/episode.mp4': the file name must"),
        (["--test", "--record", "{tmp}/no/episode.gif"],
         "'{tmp}/no/episode.gif': cannot write in '{tmp}/no' (No such file or directory)"),
        (["--test", "--record", "{model}/episode.gif"], "'{model}' (Not a directory)"),
        (["--test", "--record", "{tmp}"], "'{tmp}': the file name must end in .gif"),
        (["--test", "--record", "{unwritable}/episode.gif"], "cannot write in '{unwritable}' ("),
        (["--record", "{tmp}/episode.gif"], "--record '{tmp}/episode.gif' needs --test"),
        (["--model", "{model}"], "--model '{model}' needs --test"),
    ],
    ids=["extension", "no-directory", "file-as-directory", "directory",
         "unwritable", "record-without-test", "model-without-test"],
)
def test_bad_record_input_gives_one_error_line_before_any_episode(tmp_path, capfd, argv,
                                                                  message):
    model = tmp_path / "model.keras"
    model.write_bytes(b"checked only by --test")
    unwritable = unwritable_directory(tmp_path) if "{unwritable}" in " ".join(argv) else None
    values = {"tmp": tmp_path, "model": model, "unwritable": unwritable}
    argv = [part.format(**values) for part in argv]
    before = sorted(tmp_path.rglob("*"))
    # Were the input accepted, 10 training steps or a failing load would follow.
    assert main([*argv, "--hidden-units", "8", "--model-dir", str(tmp_path / "models"),
                 "--total-steps", "10", "--learning-starts", "5"]) == 2
    out, err = capfd.readouterr()
    assert err.startswith("error: ") and err.count("\n") == 1, err
    assert message.format(**values) in err  # names the bad value
    assert "episode" not in out  # nothing played, nothing trained
    assert sorted(tmp_path.rglob("*")) == before


def test_record_into_a_directory_named_like_a_gif_is_refused(tmp_path):
    (tmp_path / "film.gif").mkdir()
    with pytest.raises(ValueError, match=r"film\.gif': it is a directory"):
        recording.check_gif_path(str(tmp_path / "film.gif"))


def test_record_path_check_accepts_a_writable_directory(tmp_path, monkeypatch):
    assert recording.check_gif_path(str(tmp_path / "a.GIF")) == tmp_path / "a.GIF"
    assert list(tmp_path.iterdir()) == []  # the probe file is gone
    monkeypatch.chdir(tmp_path)  # a bare file name goes to the working directory
    assert recording.check_gif_path("b.gif") == Path("b.gif")
