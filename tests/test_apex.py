"""Tests for apex.py and its parts (ape_x/): the actors' exploration schedule and
priorities, the replay's contents and pacing, the progress lines, Ape-X learning CartPole in a
fixed order without Ray, a run on Ray stopped by SIGTERM, one that finishes with its outputs, an
actor killed and restarted mid-run, and the flag errors.

One local Ray serves every test that needs it in this process (the session fixture below); those
tests are in the slow tier (`python -m pytest -m slow`): Ray's processes and each actor's Python
with TensorFlow take a while to start. The others build the actor, the replay and the learner in
this process, without Ray. How fast a run collects and updates (and so its ratio of updates to
env steps, which Ray's scheduling decides) is benchmarks/bench_apex.py's to measure.
"""

from __future__ import annotations

import concurrent.futures
import dataclasses
import http.server
import os
import re
import signal
import socket
import threading
from pathlib import Path

import grpc
import gymnasium as gym
import keras
import numpy as np
import pytest
import ray
from conftest import small_agent
from tensorboard_helpers import read_events

import ape_x.actor
import ape_x.connection
import ape_x.learner
import ape_x.replay
import apex
import d3qn_agent
from ape_x.report import ApexReport
from d3qn_utils import games
from d3qn_utils.gradient_steps import Batches

LEARNED = 100  # a greedy mean on CartPole-v1 that random play (about 22) does not reach


def small_config(tmp_path: Path, **flags) -> object:
    """CartPole settings small enough for a test, writing only under tmp_path."""
    settings = {"hidden_units": [32, 32], "memory_size": 5_000, "batch_size": 32,
                "block_size": 20, "learning_starts": 200, "eval_episodes": 5, "log_every": 1e6,
                "model_dir": str(tmp_path / "models"), "plot_dir": str(tmp_path / "plots"),
                "object_store_mb": 300}
    settings.update(flags)
    config, _ = apex.resolve_config(settings)
    return config


@pytest.fixture(scope="session")
def local_ray(tmp_path_factory):
    """One local Ray for the whole test session (2 actors and the replay fit in it)."""
    ape_x.connection.connect_ray(small_config(tmp_path_factory.mktemp("ray")), address=None)
    yield
    ray.shutdown()


def test_actor_exploration_rates_follow_the_papers_schedule():
    rates = [ape_x.actor.actor_epsilon(i, 8, 0.4, 7.0) for i in range(8)]
    np.testing.assert_allclose(rates, [0.4 ** (1 + 7 * i / 7) for i in range(8)])
    assert rates[0] == 0.4 and rates[-1] == pytest.approx(0.4**8)
    assert ape_x.actor.actor_epsilon(0, 1, 0.4, 7.0) == 0.4


def test_actor_priorities_equal_the_learners_td_errors(tmp_path):
    config = small_config(tmp_path)
    learner = ape_x.learner.Learner(config)
    # A target network unlike the online one, so the double-DQN choice and evaluation differ.
    learner.target_model.set_weights([w * 0.5 for w in learner.model.get_weights()])
    actor = ape_x.actor.Actor(1, config)
    actor.set_weights(learner.weights())
    replay = ape_x.replay.Replay(config)
    transitions, abs_errors, context, _, _ = actor.collect_block()
    slots = replay.memory.store_block(transitions, abs_errors, context)
    # The batch the learner would get for these transitions, read back from the replay.
    batch = replay.memory.n_step_batch(slots[:len(abs_errors)])
    is_weights = np.ones(len(abs_errors), np.float32)
    (learner_errors,), _ = learner.learn(Batches.dealt(batch, is_weights, 1), 0)
    np.testing.assert_allclose(abs_errors, learner_errors, rtol=1e-5, atol=1e-6)
    assert abs_errors.std() > 0  # not a degenerate batch


def test_actor_reports_an_episodes_unclipped_score_as_the_agent_does(tmp_path, monkeypatch):
    # CartPole's rewards doubled, recorded (RecordEpisodeStatistics), then clipped to their sign
    # (as atari_wrappers.SignReward): the Atari wrappers' order; each raw reward 2, clipped 1.
    def doubled_then_clipped(env_name, max_episode_steps=None):
        env = gym.wrappers.TransformReward(gym.make(env_name), lambda reward: 2.0 * reward)
        return gym.wrappers.TransformReward(gym.wrappers.RecordEpisodeStatistics(env), np.sign)

    monkeypatch.setattr(ape_x.actor, "make_env", doubled_then_clipped)
    config = small_config(tmp_path, block_size=600)  # longer than an episode (500 steps at most)
    actor = ape_x.actor.Actor(0, config)
    transitions, _, context, new_steps, returns = actor.collect_block()
    assert context == 0 and new_steps == actor.steps > 1  # one whole episode
    np.testing.assert_array_equal(transitions[2], np.ones(actor.steps))  # replayed: clipped
    assert returns == [2.0 * actor.steps]  # reported: the raw score


def test_learner_evaluations_are_seeded_as_the_agents(tmp_path, monkeypatch):
    seeds = []

    def record_seeds(envs, policy, episode_seeds, stop=None):
        seeds.append(episode_seeds)
        return np.zeros(len(episode_seeds))

    monkeypatch.setattr(ape_x.learner, "play_greedy", record_seeds)
    monkeypatch.setattr(d3qn_agent, "play_greedy", record_seeds)
    learner = ape_x.learner.Learner(small_config(tmp_path, eval_episodes=3, seed=5))
    learner.evaluate()
    learner.evaluate()
    agent = small_agent(tmp_path / "agent", seed=5)
    agent.evaluate(3, 0)
    agent.evaluate(3, 1)
    assert seeds[:2] == seeds[2:] and seeds[0] != seeds[1]


def test_replay_holds_the_blocks_with_their_priorities_and_drops_stale_updates(tmp_path):
    config = small_config(tmp_path, n_step=3, num_actors=1, block_size=5)  # shorter than episodes
    actor = ape_x.actor.Actor(0, config)
    replay = ape_x.replay.Replay(config)
    sent, sampleable, context_slots, returns = [], [], [], []
    for _ in range(6):
        transitions, abs_errors, context, new_steps, finished = actor.collect_block()
        assert replay.add_block(0, transitions, abs_errors, context, new_steps, finished) == "go"
        slots = np.arange(replay.inserted - len(abs_errors) - context, replay.inserted)
        sent.append(transitions)
        sampleable.append((slots[:len(abs_errors)], abs_errors))
        context_slots.append(slots[len(abs_errors):])
        returns += finished
    memory = replay.memory
    stored = np.concatenate([t[0] for t in sent])
    np.testing.assert_array_equal(memory.storage.get(np.arange(len(stored)))[0], stored)
    # Context transitions are sent twice (as context, then at the head of the next block), but
    # their env steps count once.
    assert replay.env_steps[0] == actor.steps < len(memory) == len(stored)
    assert [score for _, _, score in replay.episodes] == returns
    tree = memory.tree
    for slots, errors in sampleable:
        np.testing.assert_allclose(tree.tree[tree.leaf_index(slots)],
                                   np.minimum(errors + 0.01, 1.0) ** 0.6)
    context = np.concatenate(context_slots)
    assert len(context) > 0 and not tree.tree[tree.leaf_index(context)].any()
    tree_idx, stamps, _, is_weights, collected = replay.sample(256)
    assert collected == actor.steps and is_weights.max() == pytest.approx(1.0)
    assert not set(tree.slot(tree_idx).tolist()) & set(context.tolist())
    # An update for a transition overwritten since it was sampled must not land on its successor.
    before = tree.tree[tree_idx[0]]
    replay.update_priorities(tree_idx[:1], stamps[:1] - 1, np.array([0.5]))
    assert tree.tree[tree_idx[0]] == before
    replay.update_priorities(tree_idx[:1], stamps[:1], np.array([0.5]))
    assert tree.tree[tree_idx[0]] == pytest.approx(0.51**0.6)


def test_replay_paces_the_actors_to_the_learners_update_rate(tmp_path):
    config = small_config(tmp_path, updates_per_step=0.5, learning_starts=100, block_size=10,
                          num_actors=1)
    replay = ape_x.replay.Replay(config)
    replay.env_steps[0] = 100 + 2 * 10  # the margin: learning_starts + 2 blocks per actor
    assert replay.pace() == "go"
    replay.env_steps[0] += 1
    assert replay.pace() == "wait"
    replay.updates = 1
    assert replay.pace() == "go"
    replay.stop()
    assert replay.pace() == "stop"


def test_progress_line_and_plot_name_eight_of_many_actors(tmp_path, capsys):
    config = small_config(tmp_path, num_actors=20)
    report = ApexReport(config, [0.4] * 20, str(tmp_path / "apex.png"), tensorboard_dir=None)
    episodes = [(actor, 100 * actor, float(actor)) for actor in range(20)]
    report.status({"env_steps": [100] * 20, "size": 2_000, "starts": [1] * 19 + [3],
                   "episodes": episodes})
    report.progress(env_steps=2_000, updates=0)
    line = capsys.readouterr().out
    named = [int(part.split()[0]) for part in line.split("actor ")[1:]]
    assert named[:8] == [0, 3, 5, 8, 11, 14, 16, 19] and "restarted: actor 19 2x" in line
    assert "replay 2,000/5,000" in line and "actor 19 (e 0.4) 19.0" in line
    report.draw(updates=0, evaluations=[(1_000, 0, 20.0, 1.0)])
    assert Path(report.plot_path).read_bytes()[:4] == b"\x89PNG"


def test_progress_line_after_the_estimate_carries_the_time_left(tmp_path, capsys):
    report = ApexReport(small_config(tmp_path, total_steps=50_000), [0.4, 0.4],
                        str(tmp_path / "apex.png"), tensorboard_dir=None)
    start = report.start_time
    report.forecast.begin(0, start)  # the first update
    report.progress(env_steps=2_000, updates=0, now=start + 100.0)
    # 2,000 env steps in 100 s: 20 a second; 48,000 left take 2,400 s.
    estimate, line = capsys.readouterr().out.splitlines()
    assert estimate == "estimate: about 40 min to env step 50,000 at 20 env steps/s"
    assert line.startswith("[  100 s] env steps 2,000 (20/s, 40 min left), updates 0 (0/s)")


def learn_without_ray(config) -> ape_x.learner.Learner:
    """Ape-X's learning in this process, in a fixed order: each actor in turn sends a block,
    taking the learner's weights every WEIGHT_SYNC_EVERY of its env steps; then the learner's
    own loop body (`Learner.train_step`: the update, the new priorities, the evaluations) runs
    UPDATES_PER_STEP times per env step collected, each on a batch the replay samples."""
    learner = ape_x.learner.Learner(config)
    actors = [ape_x.actor.Actor(i, config) for i in range(config.num_actors)]
    replay = ape_x.replay.Replay(config)
    next_sync = [0] * len(actors)
    while learner.env_steps < config.total_steps:
        for actor in actors:
            if actor.steps >= next_sync[actor.index]:
                actor.set_weights(learner.weights())
                next_sync[actor.index] = actor.steps + config.weight_sync_every
            replay.add_block(actor.index, *actor.collect_block())
        learner.env_steps = replay.collected()
        while (len(replay.memory) >= config.learning_starts
               and learner.updates < config.updates_per_step * learner.env_steps):
            *sampled, _ = replay.sample(config.batch_size)
            if learner.train_step(sampled, replay.update_priorities):
                return learner
    return learner


@pytest.mark.slow  # 8,000 env steps and 4,000 updates of a 256x256 network
def test_apex_learns_cartpole_in_a_fixed_order_without_ray(tmp_path):
    # Without Ray the order of blocks, updates and weight pulls is fixed, so a run repeats on
    # one machine; another machine's rounding makes it another run, as another seed does. Seeds
    # 0 to 6 each passed LEARNED by half of it or more, with apex.py's learning rate, targets
    # and replay (a run's best evaluation, as the saved network is).
    config = small_config(tmp_path, hidden_units=[256, 256], total_steps=8_000,
                          eval_every=2_000, eval_episodes=10, batch_size=128,
                          memory_size=10_000, learning_starts=1_000)
    learner = learn_without_ray(config)
    assert learner.best >= LEARNED, learner.evaluations
    assert Path(learner.model_path).is_file()


@pytest.mark.slow  # a local Ray and a Python with TensorFlow for the actor
def test_sigterm_stops_the_run_cleanly_with_the_last_network_and_the_plot(
        local_ray, tmp_path, capsys):
    # One actor: each starts a Python with TensorFlow, and one is enough to stop.
    learner = ape_x.learner.Learner(small_config(tmp_path, total_steps=10**6, eval_every=500,
                                                eval_episodes=1, num_actors=1))
    first_evaluation = learner.evaluate

    def evaluate_then_sigterm() -> None:  # `kill PID` right after the first evaluation
        first_evaluation()
        os.kill(os.getpid(), signal.SIGTERM)

    learner.evaluate = evaluate_then_sigterm
    handler = signal.getsignal(signal.SIGTERM)
    assert apex.run_until_stopped(learner) == 0
    assert signal.getsignal(signal.SIGTERM) is handler
    lines = capsys.readouterr().out.splitlines()
    assert lines[-2].startswith("evaluation at env step"), lines
    last_model, plot = Path(learner.last_model_path), Path(learner.report.plot_path)
    assert lines[-1].startswith("interrupted by SIGTERM at env step ")
    assert f"last network {last_model}" in lines[-1] and f"plot {plot}" in lines[-1]
    assert last_model.is_file() and Path(learner.model_path).is_file()
    assert plot.read_bytes()[:4] == b"\x89PNG"


@pytest.mark.slow  # a local Ray and two Pythons with TensorFlow for the actors
def test_a_run_on_ray_collects_with_every_actor_and_leaves_its_outputs(local_ray, tmp_path):
    config = small_config(tmp_path, total_steps=2_000, eval_every=1_000, eval_episodes=2,
                          log_every=0.5, tensorboard=str(tmp_path / "tb"))
    learner = ape_x.learner.Learner(config)
    learner.run()
    assert learner.env_steps >= 2_000 and learner.updates > 0
    assert all(steps > 0 for steps in learner.report.actor_steps)
    # TensorBoard: every evaluation at its env step, and the progress lines' rates.
    events = read_events(tmp_path / "tb")
    evaluations = [(steps, mean) for steps, _, mean, _ in learner.evaluations]
    assert [(step, pytest.approx(value)) for step, value in
            events["eval/greedy_mean_score"]] == evaluations
    assert {"train/updates_per_second", "train/loss", "replay/size"} <= set(events)
    assert Path(learner.model_path).is_file() and Path(learner.last_model_path).is_file()
    assert Path(learner.report.plot_path).read_bytes()[:4] == b"\x89PNG"


@pytest.mark.slow  # two actor processes start, the second after the kill
def test_killed_actor_is_restarted_and_the_run_finishes(local_ray, tmp_path):
    # The only actor is killed at the first evaluation (env step 500): the run can reach its
    # budget only through the restarted actor, however long Ray takes to restart it.
    config = small_config(tmp_path, num_actors=1, total_steps=1_500, eval_every=500,
                          eval_episodes=2)
    learner = ape_x.learner.Learner(config)
    evaluate, killed_at = learner.evaluate, []

    def evaluate_then_kill_the_actor() -> None:
        evaluate()
        if not killed_at:
            learner.fetch_status()
            killed_at.append(learner.report.actor_steps[0])
            ray.kill(learner.actors[0], no_restart=False)

    learner.evaluate = evaluate_then_kill_the_actor
    learner.run()
    assert killed_at and learner.report.starts == [2]
    assert learner.env_steps >= 1_500
    assert learner.report.actor_steps[0] > killed_at[0]  # the restarted actor collected again


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--num-actors", "0"], "error: NUM_ACTORS (--num-actors) must be >= 1, got 0"),
        (["--env-name", "NoSuchEnv-v0"], "NoSuchEnv-v0"),
        (["--env-name", "Pendulum-v1"], "error: Pendulum-v1 has action space Box("),
        (["--address", "127.0.0.1:1", "--connect-timeout", "2"],
         "error: cannot reach the Ray cluster at 127.0.0.1:1"),
        (["--address", "nowhere"], "--address must be auto, host:port or ray://host:port"),
        (["--epsilon", "1.5"], "error: EPSILON (--epsilon) must be in [0, 1], got 1.5"),
        (["--memory-size", "1000000000000"], "error: MEMORY_SIZE (--memory-size) "
         "1,000,000,000,000 needs a replay memory of 84,750.4 GiB (91 bytes per transition of "
         "(4,) float32 states, proportional replay), more than this machine's"),
    ],
)
def test_bad_flags_give_one_error_line_before_ray_starts(capsys, argv, message):
    assert apex.main([*argv, "--hidden-units", "8"]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("error: ") and "\n" not in err
    assert message in err


def test_a_keras_backend_other_than_tensorflow_gets_one_error_line_before_ray_starts(
        capsys, monkeypatch):
    monkeypatch.setattr(keras.backend, "backend", lambda: "jax")
    monkeypatch.setattr(apex, "Learner", None)  # never reached
    assert apex.main(["--hidden-units", "8"]) == 2
    assert capsys.readouterr().err == (
        "error: apex.py runs on Keras' TensorFlow backend only, not on 'jax' (KERAS_BACKEND): "
        "unset KERAS_BACKEND or set it to tensorflow\n")


def test_a_family_preset_lacking_a_learner_period_is_refused_by_name(capsys, monkeypatch):
    lacking = dataclasses.replace(games.MINATAR, preset={
        name: value for name, value in games.MINATAR.preset.items() if name != "train_frequency"})
    with pytest.raises(ValueError, match=r"^the MinAtar preset \(d3qn_utils/games.py\) lacks "
                                         r"train_frequency, which apex.py converts"):
        apex.apex_preset(lacking)
    # Any run reads every family's preset (its --help lists them): one error line, exit 2.
    monkeypatch.setattr(games, "FAMILIES", [lacking, games.ATARI, games.CLASSIC])
    assert apex.main(["--hidden-units", "8"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: the MinAtar preset") and err.count("\n") == 1


class QuietHTTPHandler(http.server.BaseHTTPRequestHandler):
    def log_message(self, *args: object) -> None:  # the test reads stderr
        pass


@pytest.fixture(params=["silent", "silent on loopback", "http", "grpc"])
def not_ray(request):
    """(port, what the error says) of a listener that is not Ray on every interface: a socket
    that accepts and says nothing, an HTTP server, a gRPC server without Ray's services; or a
    silent one on the loopback interface alone, where ray.init does not look."""
    no_handshake = "it accepts connections but does not answer as Ray does: no gRPC handshake"
    if request.param.startswith("silent"):
        host = "127.0.0.1" if request.param.endswith("loopback") else ""
        listener = socket.create_server((host, 0))  # the kernel accepts for it
        yield listener.getsockname()[1], "Connection refused" if host else no_handshake
        listener.close()
    elif request.param == "http":
        server = http.server.HTTPServer(("", 0), QuietHTTPHandler)
        threading.Thread(target=server.serve_forever, daemon=True).start()
        yield server.server_address[1], no_handshake
        server.shutdown()
        server.server_close()
    else:
        server = grpc.server(concurrent.futures.ThreadPoolExecutor(max_workers=1))
        port = server.add_insecure_port("[::]:0")
        server.start()
        yield port, "it speaks gRPC, but not as Ray does: UNIMPLEMENTED"
        server.stop(None)


def test_an_address_that_is_not_ray_is_refused_within_the_timeout(not_ray):
    # ray.init would retry for minutes there; the probe gives up after --connect-timeout, and
    # main prints its message as the `error:` line (test_bad_flags_give_one_error_line...).
    port, reason = not_ray
    with pytest.raises(ValueError) as refused:
        ape_x.connection.check_reachable(f"127.0.0.1:{port}", 1.0)
    where = f"{ray.util.get_node_ip_address()}:{port}"
    assert str(refused.value) == (f"cannot reach the Ray cluster at 127.0.0.1:{port} ({where}, "
                                  f"where Ray looks for it) within 1 s ({reason})")
    if reason != "Connection refused":  # what a ray:// address would reach: the same
        with pytest.raises(ValueError, match=re.escape(f"within 1 s ({reason})")):
            ape_x.connection.check_reachable(f"ray://{where}", 1.0)


@pytest.mark.slow  # starts the local Ray
def test_the_probe_accepts_a_ray_cluster(local_ray):
    ape_x.connection.check_reachable(ray.get_runtime_context().gcs_address, 10.0)


def test_a_stop_at_env_step_0_names_no_best_network(tmp_path, capsys):
    learner = ape_x.learner.Learner(small_config(tmp_path))
    learner.finish("interrupted by SIGTERM")
    plot = learner.report.plot_path
    assert capsys.readouterr().out.strip() == (
        f"interrupted by SIGTERM at env step 0: last network {learner.last_model_path}, no best "
        f"network (no evaluation yet), plot {plot}")
    assert Path(learner.last_model_path).is_file() and Path(plot).is_file()
    assert not Path(learner.model_path).exists()


def test_a_stop_during_the_final_evaluation_lets_the_run_finish(tmp_path, capsys, monkeypatch):
    # The run's end alone, without Ray: training is over, the actors are stopped.
    learner = ape_x.learner.Learner(small_config(tmp_path, eval_episodes=1))
    for step in ("launch", "train", "fetch_status"):
        monkeypatch.setattr(learner, step, lambda: None)
    evaluate = learner.evaluate

    def sigterm_then_evaluate() -> None:
        os.kill(os.getpid(), signal.SIGTERM)
        evaluate()

    learner.evaluate = sigterm_then_evaluate
    handler = signal.getsignal(signal.SIGTERM)
    assert apex.run_until_stopped(learner) == 0
    assert signal.getsignal(signal.SIGTERM) is handler
    lines = capsys.readouterr().out.splitlines()
    assert lines[-2].startswith("evaluation at env step 0") and lines[-1].startswith("done: 0 "), (
        lines)
    assert Path(learner.model_path).is_file() and Path(learner.last_model_path).is_file()


def test_minatar_ids_get_the_minatar_preset_and_a_replay_of_single_frames(tmp_path):
    config = small_config(tmp_path, env_name="MinAtar/Breakout-v1", block_size=10)
    assert (config.learning_rate, config.target_update) == (1e-4, 250)  # the preset's, in updates
    assert config.updates_per_step == 0.25  # the MinAtar preset's gradient step every 4 steps
    assert config.adam_epsilon == 3.125e-4  # the preset's Adam, as d3qn_agent.py's MinAtar runs
    replay = ape_x.replay.Replay(config)
    assert replay.memory.storage.stack_axis is None  # each 10x10 frame kept once, as uint8
