"""Tests that nothing is overwritten silently (d3qn_utils/run_files.py): a run names the
committed files it replaces and another run's plots, a run's lock covers its plot directory,
apex.py holds one too, and an unwritable --model-dir or --plot-dir is one `error:` line before
any training, with atomic_file's clean error shown, not its cleanup's."""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import numpy as np
import pytest
from conftest import (
    ROOT,
    command_line,
    small_agent,
    small_flags,
    the_error_line,
    unwritable_directory,
)

from d3qn_utils import atomic_files, run_files

RUN_NAME = "DDQN_CartPole-v1_Dueling_PER"
PLOTS = (f"{RUN_NAME}.png", f"{RUN_NAME}_priorities.png")  # what the default run draws
needs_git = pytest.mark.skipif(shutil.which("git") is None, reason="git is not installed")


def committed(repository: Path, *names: str) -> list[Path]:
    """Files `names` (relative paths), written and committed in a new git repository."""
    subprocess.run(["git", "init", "-q", str(repository)], check=True)
    paths = [repository / name for name in names]
    for path in paths:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(b"committed")
    subprocess.run(["git", "-C", str(repository), "add", *names], check=True)
    subprocess.run(["git", "-C", str(repository), "-c", "user.name=test", "-c",
                    "user.email=test@example.com", "commit", "-qm", "plots"], check=True)
    return paths


def agent_main(capsys: pytest.CaptureFixture, model_dir: Path, plot_dir: Path,
               *flags: str) -> tuple[int, str, str]:
    """`python d3qn_agent.py` with small flags, in-process: (exit code, stdout, stderr)."""
    import d3qn_agent

    capsys.readouterr()
    code = d3qn_agent.main([*command_line(small_flags(None)), "--model-dir", str(model_dir),
                            "--plot-dir", str(plot_dir), *flags])
    out, err = capsys.readouterr()
    return code, out, err


def test_the_default_runs_plots_are_found_committed_by_their_relative_paths(monkeypatch):
    monkeypatch.chdir(ROOT)
    plots = [f"plots/{name}" for name in PLOTS]
    found, by_git = run_files.shipped(plots)
    assert found == plots
    if by_git:  # a git checkout: the note the default run prints first
        assert run_files.earlier_runs("models/absent.keras", None, plots) == [
            f"replaces {plots[0]} and {plots[1]} (committed in git; `git checkout {plots[0]} "
            f"{plots[1]}` brings them back)"]


def test_without_git_a_file_in_the_repository_counts_as_shipped_and_one_elsewhere_not(
        tmp_path, monkeypatch):
    monkeypatch.setenv("PATH", str(tmp_path))  # no git on it
    plot = str(ROOT / "plots" / PLOTS[0])
    assert run_files.git_tracked([plot]) is None
    assert run_files.shipped([plot]) == ([plot], False)
    assert "may have come with it (git is not here to tell" in run_files.shipped_note(
        *run_files.shipped([plot]))
    elsewhere = tmp_path / "plot.png"
    elsewhere.write_bytes(b"mine")
    assert run_files.shipped([str(elsewhere)]) == ([], False)


@needs_git
def test_a_run_names_the_committed_plots_it_replaces_and_nothing_in_a_fresh_directory(
        tmp_path, capsys):
    plots = committed(tmp_path / "repository", *(f"plots/{name}" for name in PLOTS))
    agent = small_agent(tmp_path)  # models and plots under tmp_path: nothing there yet
    agent.begin()
    agent.training_run.lock.release()
    assert capsys.readouterr().out == ""  # as benchmarks/same_log.py runs: no note
    agent = small_agent(tmp_path, plot_dir=str(plots[0].parent))
    agent.begin()
    agent.training_run.lock.release()
    assert capsys.readouterr().out == (
        f"note: replaces {plots[0]} and {plots[1]} (committed in git; `git checkout {plots[0]} "
        f"{plots[1]}` brings them back)\n")
    # An untracked plot in the repository is another run's, not a committed file.
    subprocess.run(["git", "-C", str(plots[0].parent), "rm", "-q", "--cached", PLOTS[1]],
                   check=True)
    assert run_files.shipped([str(path) for path in plots]) == ([str(plots[0])], True)


def test_a_run_into_another_model_directory_names_the_plots_it_replaces(tmp_path, capsys):
    plots = tmp_path / "shared-plots"
    plots.mkdir()
    for name in PLOTS:
        (plots / name).write_bytes(b"run A's plot")
    agent = small_agent(tmp_path / "b", plot_dir=str(plots))
    agent.begin()
    agent.training_run.lock.release()
    [note] = capsys.readouterr().out.splitlines()
    assert note.startswith(f"note: {plots / PLOTS[0]} and {plots / PLOTS[1]} hold the files of "
                           "another run (saved ")
    assert note.endswith("this new run replaces them (another --model-dir or --plot-dir keeps "
                         "them)")
    assert all((plots / name).read_bytes() == b"run A's plot" for name in PLOTS)


def test_a_second_run_into_the_same_plot_directory_is_refused_naming_the_plot_lock(
        tmp_path, capsys):
    plots = tmp_path / "shared-plots"
    first = small_agent(tmp_path / "a", plot_dir=str(plots))
    first.begin()
    try:
        code, out, err = agent_main(capsys, tmp_path / "b" / "models", plots,
                                    "--total-steps", "10")
        assert code == 2 and "training on" not in out
        error = the_error_line(err)
        assert f"(lock {plots / RUN_NAME}.lock)" in error and f"pid {os.getpid()} on " in error
        assert error.endswith("or give this run another --plot-dir")
        # Refused before it wrote anything, its model directory's lock let go.
        assert not (tmp_path / "b" / "models" / f"{RUN_NAME}.lock").exists()
    finally:
        first.training_run.lock.release()
    assert not list(plots.iterdir())  # the first run's lock of it is gone too


@pytest.mark.parametrize("flag", ["--model-dir", "--plot-dir"])
@pytest.mark.parametrize("kind", ["a file", "read-only", "under a file"])
def test_an_unwritable_directory_is_one_error_before_training(tmp_path, capsys, flag, kind):
    if kind == "read-only":
        bad = unwritable_directory(tmp_path) / "dir"
    else:
        (tmp_path / "file").write_bytes(b"a file the user had")
        bad = tmp_path / "file" if kind == "a file" else tmp_path / "file" / "dir"
    good = tmp_path / "good"
    dirs = {"--model-dir": good, "--plot-dir": good, flag: bad}
    code, out, err = agent_main(capsys, dirs["--model-dir"], dirs["--plot-dir"],
                                "--total-steps", "10")
    assert code == 2 and "training on" not in out
    error = the_error_line(err)
    assert error.startswith(f"error: {flag} {bad} cannot be written: ")
    if kind != "read-only":
        assert error.endswith(f"{tmp_path / 'file'} is a file, not a directory")
        assert (tmp_path / "file").read_bytes() == b"a file the user had"
    assert not any(good.rglob("*")), list(good.rglob("*"))  # no lock, no model, no plot


def test_a_write_into_a_file_as_directory_raises_the_clean_write_error(tmp_path):
    (tmp_path / "file").write_bytes(b"a file the user had")
    with (pytest.raises(atomic_files.WriteError,
                        match=r"cannot write .*file/plot\.png: .*nothing was written"),
          atomic_files.atomic_file(tmp_path / "file" / "plot.png") as temporary):
        temporary.write_bytes(b"plot")
    assert (tmp_path / "file").read_bytes() == b"a file the user had"


def test_check_writable_takes_files_and_refuses_a_directory_as_a_file(tmp_path):
    run_files.check_writable("--results", tmp_path / "new" / "deeper" / "results.json",
                             directory=False)
    assert not (tmp_path / "new").exists()  # checked, nothing made
    with pytest.raises(ValueError, match=rf"^--results {tmp_path} is a directory; give a file"):
        run_files.check_writable("--results", tmp_path, directory=False)


# ---- apex.py ----
APEX_FLAGS = ["--hidden-units", "16", "16", "--memory-size", "1000", "--batch-size", "16",
              "--block-size", "20", "--eval-episodes", "1"]


def apex_main(capsys: pytest.CaptureFixture, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
              ) -> tuple[int, str, str]:
    """apex.main with small flags into tmp_path, in-process, with Ray and the run stubbed (a
    run that gets that far returns 0 at once): (exit code, stdout, stderr)."""
    import apex

    monkeypatch.setattr(apex, "connect_ray", lambda config, address: None)
    monkeypatch.setattr(apex, "run_until_stopped", lambda learner: 0)
    capsys.readouterr()
    code = apex.main([*APEX_FLAGS, "--model-dir", str(tmp_path / "models"), "--plot-dir",
                      str(tmp_path / "plots")])
    out, err = capsys.readouterr()
    return code, out, err


def test_apex_holds_a_run_lock_and_names_the_best_network_it_replaces(
        tmp_path, capsys, monkeypatch):
    models, plots = tmp_path / "models", tmp_path / "plots"
    outputs = [str(models / "apex_CartPole-v1.keras"), str(models / "apex_CartPole-v1_last.keras"),
               str(plots / "apex_CartPole-v1.png")]
    lock = run_files.take_lock(outputs)  # a first run, writing these files
    try:
        code, out, err = apex_main(capsys, tmp_path, monkeypatch)
    finally:
        lock.release()
    assert code == 2
    error = the_error_line(err)
    assert f"(lock {models / 'apex_CartPole-v1.lock'})" in error
    assert f"pid {os.getpid()} on " in error

    Path(outputs[0]).write_bytes(b"the first run's best network")
    Path(outputs[2]).parent.mkdir(exist_ok=True)
    Path(outputs[2]).write_bytes(b"the first run's plot")
    code, out, err = apex_main(capsys, tmp_path, monkeypatch)
    assert code == 0, err
    note = out.splitlines()[0]
    assert note.startswith(f"note: {outputs[0]} holds the best network of an earlier run (saved ")
    assert f"(with {outputs[2]}, replaced too); this new run replaces it" in note
    assert Path(outputs[0]).read_bytes() == b"the first run's best network"  # the stub's run
    assert not list(tmp_path.rglob("*.lock"))  # let go when the run ended


@needs_git
def test_a_recording_names_the_committed_gif_it_replaces(tmp_path, capsys):
    from d3qn_utils.recording import GifRecorder

    [gif] = committed(tmp_path, "plots/film.gif")
    recorder = GifRecorder(30.0)
    recorder.add(0, np.zeros((8, 8, 3), np.uint8))
    recorder.finish(gif)
    note, recorded = capsys.readouterr().out.splitlines()
    assert note == (f"note: replaces {gif} (committed in git; `git checkout {gif}` brings it "
                    "back)")
    assert recorded.startswith(f"recorded episode 1 to {gif}: 1 frames")
    recorder.finish(tmp_path / "elsewhere.gif")  # not in git: no note
    assert capsys.readouterr().out.startswith("recorded episode 1 to ")
