"""Checkpoints are never stale, never poisoned, never silent: a resume from an older checkpoint
replaces the steps it reaches again, a state holding NaN or inf is never written, and a resume
refuses what cannot work (an empty --resume, a budget already spent) and says
what differs from the run that wrote the checkpoint (its best network, its flags).

Every run is `d3qn_agent.main` on CartPole with a tiny network, in this process: each checks the
exit code, the one `error:` line where there is one, and the files left on disk.
"""

from __future__ import annotations

import contextlib
import hashlib
import io
import json
import re
import shutil
from pathlib import Path

import numpy as np
import pytest
from conftest import command_line, small_agent, small_flags, the_error_line

from d3qn_utils import atomic_files, run_files, training_session

RUN_NAME = "DDQN_CartPole-v1_Dueling_PER"
# Gradient steps from step 64 on; an evaluation (it saves the best network) and a checkpoint
# every 50 steps.
TINY = small_flags(None, learning_starts=64, memory_size=400, batch_size=32, train_frequency=1,
                   target_update=50, exploration_steps=300, eval_every=50, eval_episodes=1,
                   checkpoint_every=50, seed=3)


def run_main(directory: Path, capsys: pytest.CaptureFixture, *flags: str) -> tuple[int, str, str]:
    """`python d3qn_agent.py` with TINY's flags writing under `directory`, in this process:
    (exit code, stdout, stderr)."""
    import d3qn_agent

    capsys.readouterr()
    code = d3qn_agent.main([*command_line(TINY), "--model-dir", str(directory / "models"),
                            "--plot-dir", str(directory / "plots"), *flags])
    out, err = capsys.readouterr()
    return code, out, err


def checkpoints(directory: Path) -> list[Path]:
    """The complete checkpoints of every run under `directory`, by run, then by step."""
    root = directory / "models" / f"{RUN_NAME}.checkpoints"
    return sorted(root.glob(f"{run_files.RUN_PREFIX}*/{run_files.PREFIX}*"))


def snapshot(directory: Path) -> dict[str, str]:
    """Every file under `directory` with a hash of its bytes."""
    return {str(path.relative_to(directory)): hashlib.sha256(path.read_bytes()).hexdigest()
            for path in sorted(directory.rglob("*")) if path.is_file()}


def progress(step_directory: Path) -> dict:
    return json.loads((step_directory / "progress.json").read_text())


@pytest.fixture(scope="module")
def trained(tmp_path_factory) -> Path:
    """A finished 150-step run: evaluations at 50, 100 and 150, checkpoints 100 and 150 kept."""
    import d3qn_agent

    directory = tmp_path_factory.mktemp("trained")
    errors = io.StringIO()
    with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(errors):
        code = d3qn_agent.main([*command_line(TINY), "--total-steps", "150", "--model-dir",
                                str(directory / "models"), "--plot-dir", str(directory / "plots")])
    assert code == 0, errors.getvalue()
    return directory


@pytest.fixture
def copy_of_trained(trained: Path, tmp_path: Path) -> Path:
    shutil.copytree(trained, tmp_path, dirs_exist_ok=True)
    assert [path.name for path in checkpoints(tmp_path)] == ["step-0000000100", "step-0000000150"]
    return tmp_path


# ---- A resume from an older checkpoint branches off ------------------------------------------
@pytest.mark.parametrize("newer", ["intact", "corrupt"])
def test_a_resume_from_an_older_checkpoint_replaces_the_step_it_reaches_again(
        copy_of_trained, capsys, newer):
    step_100, step_150 = checkpoints(copy_of_trained)
    if newer == "corrupt":
        (step_150 / "progress.json").write_text("{not json")
    (step_150 / "left-branch.txt").write_text("only in the checkpoint of the branch left")
    # The branch evaluates every 25 steps: its step-150 checkpoint holds one at step 125.
    code, out, err = run_main(copy_of_trained, capsys, "--total-steps", "150", "--eval-every",
                              "25", "--resume", str(step_100))
    assert code == 0, err
    assert (f"note: {step_150.parent} holds checkpoints after step 100 (step-0000000150), of "
            "the branch this resume leaves: this run's next checkpoint replaces them") in out
    assert f"checkpoint: {step_150}\n" in out
    assert [path.name for path in checkpoints(copy_of_trained)] == [
        "step-0000000100", "step-0000000150"]
    assert not (step_150 / "left-branch.txt").exists()
    assert [evaluation[0] for evaluation in progress(step_150)["progress"]["evaluations"]] == [
        50, 100, 125, 150]
    assert not list(step_150.parent.glob(atomic_files.TEMPORARY_PREFIX + "*"))
    # --resume continues the branch's step 150.
    code, out, err = run_main(copy_of_trained, capsys, "--total-steps", "160", "--resume")
    assert code == 0, err
    assert f"resuming from {step_150} at step 150" in out


def test_the_first_checkpoint_of_a_branch_removes_the_later_steps_of_the_one_it_left(
        copy_of_trained, capsys):
    step_100 = checkpoints(copy_of_trained)[0]
    code, out, err = run_main(copy_of_trained, capsys, "--total-steps", "125",
                              "--checkpoint-every", "25", "--resume", str(step_100))
    assert code == 0, err
    step_125 = step_100.parent / "step-0000000125"
    assert f"checkpoint: {step_125}\n" in out
    assert checkpoints(copy_of_trained) == [step_100, step_125]
    code, out, err = run_main(copy_of_trained, capsys, "--total-steps", "150", "--resume")
    assert code == 0, err
    assert f"resuming from {step_125} at step 125" in out


# ---- A state holding NaN or inf is never written --------------------------------------------
def test_a_nan_stop_with_non_finite_weights_names_the_newest_intact_checkpoint(tmp_path, capsys):
    # An update that turns the weights NaN (as --grad-clip inf or --learning-rate inf do), here
    # the last layer's bias: the next gradient step's loss is NaN, the run stops, and the state
    # is not written.
    agent = small_agent(tmp_path, **{**TINY, "eval_every": 10**6, "total_steps": 300})
    replay = agent.replay

    def replay_after_a_poisoned_update(due):
        if agent.step > 150:
            agent.model.weights[-1].assign(np.full(agent.model.weights[-1].shape, np.nan))
        return replay(due)

    agent.replay = replay_after_a_poisoned_update
    assert training_session.exit_code(agent.run) == 3
    out, err = capsys.readouterr()
    step_150 = checkpoints(tmp_path)[-1]
    assert step_150.name == "step-0000000150"
    assert re.fullmatch(
        r"error: training at env step (\d+) gave a non-finite loss or gradient .*; the state at "
        r"step \1 holds NaN or inf \(the online network's weights\), "
        rf"so it was not saved; the newest intact checkpoint of this run is {step_150} \(--resume "
        rf"{step_150} continues from it\)", the_error_line(err))
    assert [path.name for path in checkpoints(tmp_path)] == ["step-0000000100", "step-0000000150"]
    assert "Last good state saved" not in err and out.count("checkpoint: ") == 3  # 50, 100, 150


def test_a_checkpoint_of_non_finite_weights_is_not_written_nor_announced(tmp_path, capsys):
    # Before any gradient step (none until step 1000) or target update (none until step 1000),
    # the target network turns infinite at step 99: the checkpoint of step 100 would hold it.
    agent = small_agent(tmp_path, **{**TINY, "learning_starts": 1000, "target_update": 1000,
                                     "total_steps": 300, "checkpoint_every": 100})
    env_step = agent.env.step

    def step_then_poison(action):
        if agent.step == 99:
            agent.target_model.weights[0].assign(np.full(agent.target_model.weights[0].shape,
                                                         np.inf))
        return env_step(action)

    agent.env.step = step_then_poison
    assert training_session.exit_code(agent.run) == 3
    out, err = capsys.readouterr()
    assert the_error_line(err) == (
        "error: the state at step 100 holds NaN or inf (the target network's weights), so it was "
        "not saved; there is no intact checkpoint of this run to resume from")
    assert "checkpoint: " not in out and checkpoints(tmp_path) == []


def test_a_non_finite_optimizer_state_is_not_written(tmp_path):
    agent = small_agent(tmp_path)
    variable = agent.optimizer.variables[-1]
    variable.assign(np.full(variable.shape, np.nan))
    with pytest.raises(training_session.PoisonedStateError,
                       match=r"holds NaN or inf \(the optimizer's variables\)"):
        agent.save_checkpoint()
    assert checkpoints(tmp_path) == []


# ---- Refused before anything is read or written ---------------------------------------------
@pytest.mark.parametrize(("flags", "said"), [
    (["--resume", ""], "error: --resume '' names no checkpoint: give a step-* directory, or "
                       "--resume alone for the newest"),
    *((["--resume", "--total-steps", total_steps], f"error: --total-steps {total_steps} leaves "
       "nothing to do from checkpoint {step_150} at step 150: a resumed run trains on to "
       "--total-steps, so give more than 150") for total_steps in ("150", "100")),
], ids=["empty resume", "budget spent and evaluated", "budget below the step"])
def test_a_resume_that_cannot_work_is_refused_and_changes_nothing(
        copy_of_trained, capsys, flags, said):
    before = snapshot(copy_of_trained)
    code, _, err = run_main(copy_of_trained, capsys, *flags)
    assert code == 2
    assert the_error_line(err) == said.format(step_150=checkpoints(copy_of_trained)[-1])
    assert snapshot(copy_of_trained) == before


def test_a_corrupt_newest_checkpoint_names_the_newest_intact_one(copy_of_trained, capsys):
    step_100, step_150 = checkpoints(copy_of_trained)
    weights = step_150 / "online.weights.h5"
    weights.write_bytes(weights.read_bytes()[:1000])
    before = snapshot(copy_of_trained)
    code, _, err = run_main(copy_of_trained, capsys, "--total-steps", "200", "--resume")
    assert code == 2
    error = the_error_line(err)
    assert error.startswith(f"error: checkpoint file {weights} is missing or does not fit")
    assert error.endswith(f"; the newest intact checkpoint here is {step_100} (--resume "
                          f"{step_100} continues from it)")
    assert snapshot(copy_of_trained) == before
    # One holding NaN is not intact either.
    optimizer = atomic_files.read_arrays(step_100 / "optimizer.npz")
    atomic_files.write_arrays(step_100 / "optimizer.npz", {
        key: np.full_like(array, np.nan) if array.dtype.kind == "f" else array
        for key, array in optimizer.items()})
    before = snapshot(copy_of_trained)
    code, _, err = run_main(copy_of_trained, capsys, "--total-steps", "200", "--resume")
    assert code == 2
    assert the_error_line(err).endswith("; there is no intact checkpoint here to resume from")
    assert snapshot(copy_of_trained) == before


# ---- What differs from the run that wrote the checkpoint ------------------------------------
def test_a_resume_says_when_another_run_replaced_its_best_network(copy_of_trained, capsys):
    best = copy_of_trained / "models" / f"{RUN_NAME}.keras"
    best_before = progress(checkpoints(copy_of_trained)[-1])["progress"]["best_evaluation"]
    best.write_bytes(b"another run's network")  # as a run of the same name into this directory
    code, out, err = run_main(copy_of_trained, capsys, "--total-steps", "160", "--eval-every",
                              "10", "--resume")
    assert code == 0, err
    assert (f"note: {best} is not the network this run saved as its best (mean "
            f"{best_before:.1f}): another run replaced it; the resumed run saves its next "
            "evaluated network there and counts its best from it\n") in out
    # Its first evaluation saves the best network; the summary's best is one it made.
    assert re.search(rf"^evaluation at step 160: .*best so far: saved {re.escape(str(best))}$",
                     out, flags=re.MULTILINE), out
    assert best.read_bytes()[:2] == b"PK"  # a .keras file (a zip archive)
    final = re.search(r"final evaluation ([0-9.]+), best ([0-9.]+);", out)
    assert final and final[1] == final[2], out


def test_a_resume_says_when_its_best_network_is_missing(copy_of_trained, capsys):
    best = copy_of_trained / "models" / f"{RUN_NAME}.keras"
    best_before = progress(checkpoints(copy_of_trained)[-1])["progress"]["best_evaluation"]
    best.unlink()
    code, out, err = run_main(copy_of_trained, capsys, "--total-steps", "160", "--resume")
    assert code == 0, err
    assert (f"note: {best}, the network this run saved as its best (mean {best_before:.1f}), is "
            f"missing: the resumed run saves one there when an evaluation reaches "
            f"{best_before:.1f}\n") in out
    final = re.search(r"final evaluation ([0-9.]+), best ([0-9.]+);", out)
    assert final and float(final[2]) == max(best_before, float(final[1])), out
    assert best.exists() == (float(final[1]) >= best_before)
    # The summary names the model file only where one is.
    assert (f"; model {best}, " in out) == best.exists(), out
    assert (f"; no model at {best} (the best network's file was missing), " in out) == (
        not best.exists()), out


def test_a_resume_with_its_own_best_network_and_flags_says_nothing_more(copy_of_trained, capsys):
    code, out, err = run_main(copy_of_trained, capsys, "--total-steps", "160", "--resume")
    assert code == 0, err
    # (A copy of the trained run: its --model-dir and --plot-dir changed too.)
    assert "; changed flags: total_steps 150 -> 160, model_dir " in out.splitlines()[1]
    # No note but the one saying what it replayed of the episode the run stopped in.
    notes = [line for line in out.splitlines() if "note: " in line]
    assert notes == [line for line in notes if line.startswith("note: replayed 1 open episode (")]
    assert "flags the checkpoint does not record" not in out


def test_a_resume_names_the_flags_its_checkpoint_does_not_record(copy_of_trained, capsys):
    step_150 = checkpoints(copy_of_trained)[-1]
    saved = progress(step_150)
    del saved["run"]["flags"]["adam_epsilon"], saved["run"]["flags"]["tensorboard_every"]
    (step_150 / "progress.json").write_text(json.dumps(saved))
    code, out, err = run_main(copy_of_trained, capsys, "--total-steps", "160", "--resume")
    assert code == 0, err
    assert out.splitlines()[1].endswith(
        "; flags the checkpoint does not record (made before they were), at this run's value: "
        "adam_epsilon 1e-07, tensorboard_every 100")
