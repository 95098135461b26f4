"""Tests for blind_cliffwalk.py: the environment, its exact answer, and prioritized vs uniform."""

import errno
import json
import shutil
import subprocess
from collections import Counter

import numpy as np
import pytest
from conftest import unwritable_directory

import blind_cliffwalk as bc


@pytest.mark.parametrize("n", [1, 2, 3, 5, 8])
def test_memory_holds_all_transitions_with_exactly_one_reward(n):
    transitions = bc.enumerate_transitions(n)
    assert len(transitions) == 2 ** (n + 1) - 2
    rewarded = [t for t in transitions if t[2] != 0.0]
    assert rewarded == [(n - 1, bc.right_action(n - 1), 1.0, n, True)]


def test_each_state_appears_as_often_as_a_random_policy_reaches_it():
    n = 6
    counts = Counter((state, action) for state, action, *_ in bc.enumerate_transitions(n))
    # State i is reached by the 2^(n-i) sequences that start with i right actions; half of them
    # go right there and half go wrong.
    assert counts == {(i, a): 2 ** (n - i - 1) for i in range(n) for a in (0, 1)}


def test_small_chain_transitions_by_hand():
    # n = 2: action 0 is right in state 0, action 1 is right in state 1.
    assert Counter(bc.enumerate_transitions(2)) == {
        (0, 1, 0.0, 2, True): 2,  # wrong first action, taken by sequences 01 and 11 (bit 0 = 1)
        (0, 0, 0.0, 1, False): 2,  # right first action
        (1, 0, 0.0, 2, True): 1,  # then wrong
        (1, 1, 1.0, 2, True): 1,  # then right: the one success
    }


def test_right_action_alternates_and_wrong_action_ends_the_episode():
    n = 4
    assert [bc.right_action(s) for s in range(n)] == [0, 1, 0, 1]
    assert bc.cliffwalk_step(n, 0, 0) == (1, 0.0, False)
    assert bc.cliffwalk_step(n, 1, 1) == (2, 0.0, False)
    assert bc.cliffwalk_step(n, 1, 0) == (n, 0.0, True)
    assert bc.cliffwalk_step(n, 3, 1) == (n, 1.0, True)
    assert bc.cliffwalk_step(n, 3, 0) == (n, 0.0, True)


@pytest.mark.parametrize(("state", "action", "message"), [(-1, 0, "got -1"), (4, 0, "got 4"),
                                                         (0, 2, "action must be 0 or 1, got 2")])
def test_bad_step_input_raises(state, action, message):
    with pytest.raises(ValueError, match=message):
        bc.cliffwalk_step(4, state, action)


def test_true_q_values_by_hand():
    # n = 2, gamma = 1/2: the right action in state 1 earns 1, in state 0 it earns gamma * 1.
    np.testing.assert_allclose(bc.true_q_values(2), [[0.5, 0.0], [0.0, 1.0]])
    # n = 3, gamma = 2/3: right actions are 0, 1, 0 and worth gamma^2, gamma, 1.
    np.testing.assert_allclose(bc.true_q_values(3), [[4 / 9, 0.0], [0.0, 2 / 3], [1.0, 0.0]])


def test_true_q_values_satisfy_the_bellman_optimality_equation():
    n = 7
    q = bc.true_q_values(n)
    for state, action, reward, next_state, done in set(bc.enumerate_transitions(n)):
        target = reward if done else reward + bc.discount(n) * q[next_state].max()
        assert q[state, action] == pytest.approx(target)


def test_running_squared_error_matches_a_full_recomputation():
    n = 5
    rng = np.random.default_rng(0)
    table = bc.TabularQ(rng.normal(0, 0.1, (n, 2)), bc.true_q_values(n), bc.discount(n), 0.25)
    transitions = bc.enumerate_transitions(n)
    for index in rng.integers(len(transitions), size=500):
        state, action, reward, next_state, done = transitions[index]
        table.apply(state, action, table.td_error(state, action, reward, next_state, done))
    assert table.squared_error == pytest.approx(table.exact_squared_error(), rel=1e-9)
    expected_mse = np.mean((np.array(table.q) - bc.true_q_values(n)) ** 2)
    assert table.mse() == pytest.approx(expected_mse)


@pytest.mark.parametrize("method", bc.METHODS)
def test_every_method_converges_to_the_true_q_and_is_repeatable(method):
    first = bc.updates_to_converge(4, method, seed=3)
    assert first is not None and first > 0
    assert bc.updates_to_converge(4, method, seed=3) == first


def test_run_over_budget_is_reported_as_none():
    assert bc.updates_to_converge(6, "uniform", seed=0, budget_per_transition=0.5) is None


@pytest.mark.parametrize("method", bc.METHODS)
def test_diverging_step_size_fails_cleanly_instead_of_raising(method):
    # eta = 3 moves Q past its target by twice the error, so Q blows up: a failure, not a crash.
    updates = bc.updates_to_converge(4, method, seed=0, step_size=3.0, budget_per_transition=1e4)
    assert updates is None


def test_unknown_method_raises():
    with pytest.raises(ValueError, match="sweep"):
        bc.updates_to_converge(4, "sweep", seed=0)


def test_prioritized_replay_needs_clearly_fewer_updates_than_uniform_for_every_seed():
    # The acceptance test: on the same memory and the same initial Q, both prioritized
    # variants of PER.py converge in at most half the updates of uniform replay, seed by seed.
    n = 7
    for seed in range(10):
        uniform = bc.updates_to_converge(n, "uniform", seed)
        for method in ("proportional", "rank"):
            prioritized = bc.updates_to_converge(n, method, seed)
            assert prioritized is not None and 2 * prioritized <= uniform, (method, seed)


def test_oracle_beats_every_practical_method():
    n = 7
    for seed in range(3):
        oracle = bc.updates_to_converge(n, "oracle", seed)
        for method in ("uniform", "proportional", "rank", "greedy"):
            assert oracle < bc.updates_to_converge(n, method, seed), (method, seed)


def test_table_marks_runs_over_budget():
    results = {(2, "uniform"): [10, 20, None], (2, "oracle"): [5, 6, 7]}
    table = bc.format_table(results, ["uniform", "oracle"], budget_per_transition=10)
    uniform_row = table.splitlines()[2]
    assert "20 / 10 / 60 (1 failed)" in uniform_row
    assert "6 / 5 / 7" in uniform_row
    assert "lower bound" in table


def run_main(capsys: pytest.CaptureFixture, *argv: str) -> tuple[int, str, str]:
    """blind_cliffwalk.main(argv) in-process: (exit code, stdout, stderr)."""
    capsys.readouterr()
    code = bc.main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


@pytest.mark.parametrize(("argv", "message"), [
    (["--methods", "uniform,sweep"], "--methods: unknown sweep; choose from uniform"),
    (["--min-n", "5", "--max-n", "4"], "need 1 <= --min-n <= --max-n, got 5 and 4"),
    (["--max-n", "100000"], "--max-n must be at most 16, got 100000: the memory holds"),
    (["--seeds", "0"], "--seeds must be at least 1, got 0"),
    (["--seed", "-1"], "--seed must be >= 0, got -1"),
    (["--step-size", "nan"], "--step-size must be in (0, 1], got nan: a step of 1"),
    (["--step-size", "5"], "--step-size must be in (0, 1], got 5.0"),
    (["--mse-tolerance", "nan"], "--mse-tolerance must be positive and finite, got nan"),
    (["--budget-per-transition", "inf"], "--budget-per-transition must be positive and finite"),
    (["--alpha-proportional", "nan"], "--alpha-proportional must be >= 0 and finite, got nan"),
    (["--priority-epsilon", "0.01", "0"], "--priority-epsilon must be positive and finite, got 0"),
    (["--priority-epsilon", "inf"], "--priority-epsilon must be positive and finite, got inf"),
    (["--plot-path", "{tmp}/x.xyz"], "--plot-path must end in .png, got {tmp}/x.xyz"),
    (["--plot-path", "{tmp}/file/x.png"],
     "--plot-path {tmp}/file/x.png cannot be written: {tmp}/file is a file, not a directory"),
    (["--results", "{unwritable}/results.json"],
     "--results {unwritable}/results.json cannot be written: "),
    (["--results", "{tmp}"], "--results {tmp} is a directory; give a file name"),
    (["--replot", "{tmp}/missing.json"], "--replot {tmp}/missing.json cannot be read: No such"),
    (["--replot", "{tmp}/empty.json"], "--replot {tmp}/empty.json is not a JSON results file"),
    (["--replot", "{tmp}/foreign.json"],
     "--replot {tmp}/foreign.json is not a results file of blind_cliffwalk.py"),
    (["--replot", "{tmp}/file"], "--replot {tmp}/file is not a JSON results file"),
], ids=lambda value: value if isinstance(value, str) and value.startswith("--") else None)
def test_bad_input_is_one_error_line_before_any_run(tmp_path, capsys, argv, message):
    (tmp_path / "file").write_bytes(b"\x89PNG a file the user had")
    (tmp_path / "empty.json").write_text("")
    # Another results file: the stamp, but another script's measurements.
    (tmp_path / "foreign.json").write_text(json.dumps({"commit": "abc", "results": {
        "runs": [{"n": 2, "column": "uniform", "updates": ["many"]}], "columns": ["uniform"]}}))
    unwritable = unwritable_directory(tmp_path) if "{unwritable}" in " ".join(argv) else ""
    before = sorted(tmp_path.rglob("*"))
    where = {"tmp": tmp_path, "unwritable": unwritable}
    plot_path, results = tmp_path / "cliffwalk.png", tmp_path / "results.json"
    code, out, err = run_main(capsys, "--max-n", "3", "--seeds", "1", "--plot-path",
                              str(plot_path), "--results", str(results),
                              *(word.format(**where) for word in argv))
    assert code == 2
    assert err.startswith(f"error: {message.format(**where)}"), err
    assert len(err.splitlines()) == 1 and out == ""
    assert sorted(tmp_path.rglob("*")) == before  # nothing written, nothing replaced
    assert (tmp_path / "file").read_bytes() == b"\x89PNG a file the user had"


def test_ctrl_c_stops_with_one_line_exit_130_and_nothing_written(tmp_path, capsys, monkeypatch):
    def interrupted(*args, **kwargs):
        raise KeyboardInterrupt

    monkeypatch.setattr(bc, "updates_to_converge", interrupted)
    plot_path, results = tmp_path / "cliffwalk.png", tmp_path / "results.json"
    code, out, err = run_main(capsys, "--max-n", "3", "--seeds", "1", "--plot-path",
                              str(plot_path), "--results", str(results))
    assert (code, out, err) == (130, "", "interrupted by Ctrl-C; nothing written\n")
    assert not list(tmp_path.iterdir())


def test_a_write_failing_after_the_runs_is_one_error_line(tmp_path, capsys, monkeypatch):
    def disk_full(path, measured, **stamp):
        raise OSError(errno.ENOSPC, "No space left on device", str(path))

    monkeypatch.setattr(bc.provenance, "write_results", disk_full)
    plot_path, results = tmp_path / "cliffwalk.png", tmp_path / "results.json"
    code, _, err = run_main(capsys, "--max-n", "2", "--seeds", "1", "--methods", "oracle",
                            "--plot-path", str(plot_path), "--results", str(results))
    assert code == 1
    assert err.splitlines()[-1] == f"error: [Errno 28] No space left on device: '{results}'"
    assert [line for line in err.splitlines() if line.startswith("error:")] == [
        err.splitlines()[-1]]
    assert plot_path.read_bytes().startswith(b"\x89PNG") and not results.exists()


@pytest.mark.skipif(shutil.which("git") is None, reason="git is not installed")
def test_a_run_names_the_committed_figure_it_replaces_and_nothing_else(tmp_path, capsys):
    plot_path = tmp_path / "plots" / "blind_cliffwalk.png"
    plot_path.parent.mkdir()
    plot_path.write_bytes(b"committed")
    subprocess.run(["git", "init", "-q", str(tmp_path)], check=True)
    subprocess.run(["git", "-C", str(tmp_path), "add", "plots"], check=True)
    subprocess.run(["git", "-C", str(tmp_path), "-c", "user.name=test", "-c",
                    "user.email=test@example.com", "commit", "-qm", "figure"], check=True)
    argv = ("--max-n", "2", "--seeds", "1", "--methods", "oracle", "--plot-path", str(plot_path))
    code, out, _ = run_main(capsys, *argv, "--results", str(tmp_path / "results.json"))
    assert code == 0
    assert out.splitlines()[0] == (f"note: replaces {plot_path} (committed in git; `git checkout "
                                   f"{plot_path}` brings it back)")
    assert plot_path.read_bytes().startswith(b"\x89PNG")
    # An untracked figure is this script's own to redraw: no note.
    code, out, _ = run_main(capsys, "--replot", str(tmp_path / "results.json"), "--plot-path",
                            str(tmp_path / "again.png"))
    assert code == 0 and out.startswith(f"plot: {tmp_path / 'again.png'}, drawn from ")


def test_main_prints_the_table_writes_the_plot_and_a_stamped_results_file(tmp_path, capsys):
    plot_path, results = tmp_path / "cliffwalk.png", tmp_path / "results.json"
    bc.main(["--max-n", "3", "--seeds", "2", "--methods", "uniform,oracle", "--plot-path",
             str(plot_path), "--results", str(results)])
    out = capsys.readouterr().out
    assert out.splitlines()[0].split()[:2] == ["n", "memory"]
    assert plot_path.stat().st_size > 0
    written = json.loads(results.read_text())
    assert {"command", "commit", "machine", "backend", "versions"} <= set(written)
    found = written["results"]
    assert found["columns"] == ["uniform", "oracle"] and found["settings"]["seeds"] == 2
    assert [(row["n"], row["memory"], row["column"]) for row in found["runs"]] == [
        (n, 2 ** (n + 1) - 2, column) for n in (2, 3) for column in ("uniform", "oracle")]
    assert all(len(row["updates"]) == 2 for row in found["runs"])


def test_priority_epsilon_reaches_the_memory_and_decides_the_result():
    # The page's table (n up to 12, 10 seeds) takes minutes; n = 8 shows the same effect.
    memory = bc.make_memory("proportional", 8, 0.6, 0.7, np.random.default_rng(0), 1e-6)
    assert memory.epsilon == 1e-6
    default, small = (
        [bc.updates_to_converge(8, "proportional", seed, priority_epsilon=eps) for seed in range(3)]
        for eps in (bc.PRIORITY_EPSILON, 1e-6)
    )
    # 2,174 against ~1,160 median updates: each of the 510 transitions keeps eps^alpha of the
    # probability mass, which a smaller eps frees for the few with large errors.
    assert all(2 * s < 1.5 * d for s, d in zip(small, default, strict=True)), (small, default)


def test_several_priority_epsilons_give_one_proportional_column_each(tmp_path, capsys):
    assert bc.table_columns(["uniform", "proportional"], [0.01]) == [
        ("uniform", "uniform", 0.01), ("proportional", "proportional", 0.01)]
    assert bc.table_columns(["proportional", "rank"], [0.01, 1e-6]) == [
        ("proportional eps=0.01", "proportional", 0.01),
        ("proportional eps=1e-06", "proportional", 1e-6), ("rank", "rank", 0.01)]
    bc.main(["--max-n", "3", "--seeds", "1", "--methods", "proportional",
             "--priority-epsilon", "1e-2", "1e-6", "--plot-path", str(tmp_path / "eps.png"),
             "--results", str(tmp_path / "eps.json")])
    header = capsys.readouterr().out.splitlines()[0]
    assert "proportional eps=0.01 med/min/max" in header
    assert "proportional eps=1e-06 med/min/max" in header
