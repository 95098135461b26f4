"""The promises to a reader of the tutorial: its classes and methods in its order, each method
of PER.py's sum tree used by a training run, a CartPole run that loads no Atari or MinAtar
package, and the rewrite to the tutorial's shape did not change what the agent learns (its log is
the same as the code's before it, side by side)."""

import ast
import functools
import subprocess
import sys
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import pytest
from conftest import ROOT, small_agent

import PER
from benchmarks import same_log
from d3qn_utils import games


def defined(body: Sequence[ast.stmt]) -> list[str]:
    """The names of the classes and functions in `body`, in order."""
    return [node.name for node in body
            if isinstance(node, ast.ClassDef | ast.FunctionDef | ast.AsyncFunctionDef)]


def class_body(path: Path, name: str) -> list[ast.stmt]:
    return next(node.body for node in ast.parse(path.read_text()).body
                if isinstance(node, ast.ClassDef) and node.name == name)


def in_order(names: list[str], within: list[str]) -> bool:
    """Whether `names` all come in `within`, in this order (others may come between)."""
    rest = iter(within)
    return all(name in rest for name in names)


@pytest.mark.parametrize(("file", "owner", "names"), [
    ("d3qn_agent.py", None, ["OurModel", "DQNAgent"]),
    ("d3qn_agent.py", "DQNAgent", ["__init__", "update_target_model", "remember", "act",
                                   "replay", "load", "save", "PlotModel", "run", "test"]),
    ("PER.py", None, ["SumTree", "Memory"]),
    # The tutorial's add is Memory.store's; get_leaves is its get_leaf for k values.
    ("PER.py", "SumTree", ["__init__", "update", "get_leaves", "total_priority"]),
    ("PER.py", "Memory", ["__init__", "store", "sample", "batch_update"]),
])
def test_the_tutorials_classes_and_methods_come_in_its_order(file, owner, names):
    path = ROOT / file
    body = ast.parse(path.read_text()).body if owner is None else class_body(path, owner)
    assert in_order(names, defined(body)), (names, defined(body))


def test_a_training_run_uses_every_method_of_the_sum_tree(tmp_path, monkeypatch):
    # Nothing in the SumTree a learner reads is there for show.
    used = set()

    def counted(name: str, method: Callable) -> Callable:
        @functools.wraps(method)
        def counting(*args: Any, **kwargs: Any) -> Any:
            used.add(name)
            return method(*args, **kwargs)
        return counting

    methods = {}
    for name, member in vars(PER.SumTree).items():
        if isinstance(member, property):
            methods[name] = property(counted(name, member.fget))
        elif callable(member) and (name == "__init__" or not name.startswith("__")):
            methods[name] = counted(name, member)
    for name, method in methods.items():
        monkeypatch.setattr(PER.SumTree, name, method)
    agent = small_agent(tmp_path, total_steps=120, learning_starts=60, eval_every=120,
                        eval_episodes=1)
    agent.begin()
    agent.run()
    assert used == set(methods)


def function_source(path: Path, name: str) -> str:
    """The source text of the first function called `name` in `path`."""
    text = path.read_text()
    node = next(node for node in ast.walk(ast.parse(text))
                if isinstance(node, ast.FunctionDef) and node.name == name)
    return ast.get_source_segment(text, node)


def test_run_shows_where_the_first_episode_starts():
    run = function_source(ROOT / "d3qn_agent.py", "run")
    assert run.index("self.start_episodes()") < run.index("self.report.start")


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


# Each game family's own packages (not d3qn_utils.minatar_wrappers: light).
GAME_PACKAGES = tuple(package for family in games.FAMILIES for package in family.packages)


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
    assert imported[1] == sorted(games.ATARI.packages) == ["ale_py", "atari_wrappers"]


@pytest.mark.slow  # two trainings, one of them on the code before the rewrite
def test_a_short_cartpole_run_logs_as_the_code_before_the_rewrite(capsys):
    known = subprocess.run(["git", "-C", str(ROOT), "cat-file", "-e",
                            f"{same_log.REFERENCE_COMMIT}^{{commit}}"], capture_output=True)
    if known.returncode != 0:
        pytest.skip(f"commit {same_log.REFERENCE_COMMIT} is not in this clone")
    # 1,000 steps of collecting, then 500 gradient steps: the episodes after step 1,000 and the
    # greedy evaluation at 2,000 show what was learned.
    flags = ["--total-steps", "2000", "--eval-every", "1000", "--eval-episodes", "5"]
    compared = same_log.compare(same_log.REFERENCE_COMMIT, {"cartpole": flags})
    assert compared["cartpole"]["verdict"] == "identical", capsys.readouterr().out
    assert "cartpole: " in capsys.readouterr().out
