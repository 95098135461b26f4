"""The promises to a reader of the tutorial: the core files stay at its scale, a CartPole run
loads no Atari or MinAtar package, and the rewrite to the tutorial's shape did not change what
the agent learns (its log is the same as the code's before it, side by side)."""

import ast
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "benchmarks"))
import same_log  # noqa: E402


@pytest.mark.parametrize(("name", "most"), [("d3qn_agent.py", 575), ("PER.py", 350)])
def test_the_core_files_stay_at_the_tutorials_scale(name, most):
    lines = len((ROOT / name).read_text().splitlines())
    assert lines <= most, f"{name} has {lines} lines, more than {most}"


def function_source(path: Path, name: str) -> str:
    """The source text of the first function called `name` in `path`."""
    text = path.read_text()
    node = next(node for node in ast.walk(ast.parse(text))
                if isinstance(node, ast.FunctionDef) and node.name == name)
    return ast.get_source_segment(text, node)


def test_run_shows_where_the_first_episode_starts():
    run = function_source(ROOT / "d3qn_agent.py", "run")
    assert run.index("self.start_episode()") < run.index("self.report.start")


def test_no_helper_takes_the_agent():
    # The agent gives its parts what they need; none of d3qn_utils/ gets the agent to reach into.
    for path in (ROOT / "d3qn_utils").glob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
                names = [argument.arg for argument in (*node.args.posonlyargs, *node.args.args,
                                                       *node.args.kwonlyargs)]
                assert "agent" not in names, f"{path.name}: {node.name} takes the agent"


def test_no_module_hands_over_a_name_it_does_not_define():
    # A module __getattr__ would put a name where the pages cannot point to its definition.
    for path in [*ROOT.glob("*.py"), *(ROOT / "d3qn_utils").glob("*.py")]:
        names = {node.name for node in ast.parse(path.read_text()).body
                 if isinstance(node, ast.FunctionDef)}
        assert "__getattr__" not in names, path.name


def test_the_root_shows_the_tutorials_files_and_the_programs_a_user_runs():
    assert sorted(path.name for path in ROOT.glob("*.py")) == [
        "PER.py", "apex.py", "atari_wrappers.py", "blind_cliffwalk.py", "d3qn_agent.py",
        "rank_based.py"]


GAME_PACKAGES = ("ale_py", "atari_wrappers", "minatar")  # not d3qn_utils.minatar_wrappers: light


def game_packages_imported(*steps: str) -> list[list[str]]:
    """Which of GAME_PACKAGES a fresh Python process has imported after each of `steps`, run one
    after the other in it (one process: each start imports TensorFlow, seconds of it)."""
    report = f"print(sorted(set({GAME_PACKAGES!r}) & set(sys.modules)))"
    script = "\n".join(["import sys", *(f"{step}\n{report}" for step in steps)])
    result = subprocess.run([sys.executable, "-c", script], cwd=ROOT, capture_output=True,
                            text=True, check=True)
    return [ast.literal_eval(line) for line in result.stdout.strip().splitlines()[-len(steps):]]


@pytest.fixture(scope="module")
def imported(tmp_path_factory) -> list[list[str]]:
    """The game packages imported by a CartPole agent, then by a Pong environment besides."""
    tmp_path = tmp_path_factory.mktemp("agent")
    return game_packages_imported(
        f"import d3qn_agent; d3qn_agent.DQNAgent('CartPole-v1', model_dir={str(tmp_path)!r}, "
        f"plot_dir={str(tmp_path)!r})",
        "from d3qn_utils import games; games.make_env('PongNoFrameskip-v4')")


def test_a_cartpole_agent_imports_no_atari_or_minatar_package(imported):
    assert imported[0] == []


def test_a_pong_agent_imports_the_atari_wrappers_alone(imported):
    assert imported[1] == ["ale_py", "atari_wrappers"]


@pytest.mark.slow  # two trainings, one of them on the code before the rewrite
def test_a_short_cartpole_run_logs_as_the_code_before_the_rewrite(capsys):
    known = subprocess.run(["git", "-C", str(ROOT), "cat-file", "-e",
                            f"{same_log.REFERENCE_COMMIT}^{{commit}}"], capture_output=True)
    if known.returncode != 0:
        pytest.skip(f"commit {same_log.REFERENCE_COMMIT} is not in this clone")
    # 1,000 steps of collecting, then 500 gradient steps: the episodes after step 1,000 and the
    # greedy evaluation at 2,000 show what was learned.
    flags = ["--total-steps", "2000", "--eval-every", "1000", "--eval-episodes", "5"]
    assert same_log.compare(same_log.REFERENCE_COMMIT, {"cartpole": flags}), capsys.readouterr().out
    assert "identical" in capsys.readouterr().out
