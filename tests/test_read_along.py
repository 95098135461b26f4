"""The promises to a reader of the tutorial: the core files stay at its scale, a CartPole run
loads no Atari or MinAtar package, and the rewrite to the tutorial's shape did not change what
the agent learns (its log is the same as the code's before it, side by side)."""

import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "benchmarks"))
import same_log  # noqa: E402


@pytest.mark.parametrize(("name", "most"), [("d3qn_agent.py", 450), ("PER.py", 350)])
def test_the_core_files_stay_at_the_tutorials_scale(name, most):
    lines = len((ROOT / name).read_text().splitlines())
    assert lines <= most, f"{name} has {lines} lines, more than {most}"


def test_a_cartpole_agent_imports_no_atari_or_minatar_package(tmp_path):
    script = (
        "import sys, d3qn_agent\n"
        f"d3qn_agent.DQNAgent('CartPole-v1', model_dir={str(tmp_path)!r}, "
        f"plot_dir={str(tmp_path)!r})\n"
        "print(sorted(name for name in ('ale_py', 'atari_wrappers', 'minatar', "
        "'minatar_wrappers') if name in sys.modules))\n")
    result = subprocess.run([sys.executable, "-c", script], cwd=ROOT, capture_output=True,
                            text=True, check=True)
    assert result.stdout.strip().splitlines()[-1] == "[]"


def test_a_pong_agent_imports_the_atari_wrappers(tmp_path):
    script = (
        "import sys, games\n"
        "games.make_env('PongNoFrameskip-v4')\n"
        "print('ale_py' in sys.modules, 'minatar' in sys.modules)\n")
    result = subprocess.run([sys.executable, "-c", script], cwd=ROOT, capture_output=True,
                            text=True, check=True)
    assert result.stdout.strip().splitlines()[-1] == "True False"


def test_a_short_cartpole_run_logs_as_the_code_before_the_rewrite(capsys):
    known = subprocess.run(["git", "-C", str(ROOT), "cat-file", "-e",
                            f"{same_log.REFERENCE_COMMIT}^{{commit}}"], capture_output=True)
    if known.returncode != 0:
        pytest.skip(f"commit {same_log.REFERENCE_COMMIT} is not in this clone")
    flags = ["--total-steps", "3000", "--eval-every", "1000", "--eval-episodes", "5"]
    assert same_log.compare(same_log.REFERENCE_COMMIT, {"cartpole": flags}), capsys.readouterr().out
    assert "identical" in capsys.readouterr().out
