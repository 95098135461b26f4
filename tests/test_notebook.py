"""notebooks/prioritized_replay.ipynb, the read-along notebook: committed without outputs, its
imports and links resolve, its first cell finds the project where it is not cloned (from a
folder or a git URL it is told, a local clone standing in for the remote; never the tutorial's
own PER.py) or says in one line what to set, and (slow tier) it runs top to bottom without
writing into the repository, its memories drawing each transition as often as P(i) says."""

from __future__ import annotations

import ast
import importlib
import json
import os
import re
import subprocess
from pathlib import Path

import nbformat
import numpy as np
import pytest
from conftest import ROOT

from PER import Memory

NOTEBOOK = ROOT / "notebooks" / "prioritized_replay.ipynb"
# The project's modules the notebook must run (never copies of them).
PROJECT_MODULES = {"PER", "rank_based", "blind_cliffwalk", "d3qn_agent", "atari_wrappers"}
# The largest |measured frequency - P(i)| accepted. The notebook draws 64,000 transitions per
# memory: a multinomial frequency's standard error is then at most sqrt(0.25 / 64,000) < 0.002,
# and stratified draws vary less; a memory drawing by the wrong exponent misses by far more.
SAMPLING_TOLERANCE = 0.01
LINK = re.compile(r"\]\((?P<target>[^)\s]+)\)")
# Appended to the notebook before it runs: what it computed, as one JSON line.
READOUT = """
import json
print(json.dumps({
    "abs_errors": abs_errors.tolist(),
    "sampling": [{"kind": result["kind"], "alpha": float(result["alpha"]),
                  "measured": result["measured"].tolist()} for result in sampling],
    "cliffwalk_speedup": cliffwalk_speedup,
    "steps": agent.step, "total_steps": agent.config.total_steps,
    "plots": [agent.Plot_name, agent.Priority_plot_name],
    "pretrained_scores": pretrained_scores,
    "work": str(WORK),
}))
"""


def read_notebook() -> nbformat.NotebookNode:
    notebook = nbformat.read(NOTEBOOK, as_version=4)
    nbformat.validate(notebook)
    return notebook


def cells_of(notebook: nbformat.NotebookNode, kind: str) -> list[nbformat.NotebookNode]:
    return [cell for cell in notebook.cells if cell.cell_type == kind]


def test_the_notebook_is_committed_without_outputs():
    notebook = read_notebook()
    code = cells_of(notebook, "code")
    assert code, "the notebook has no code cells"
    for number, cell in enumerate(code):
        assert cell.outputs == [], f"code cell {number} has outputs"
        assert cell.execution_count is None, f"code cell {number} has an execution count"


def test_its_imports_resolve():
    imported: dict[str, set[str]] = {}  # module -> the names taken from it
    for cell in cells_of(read_notebook(), "code"):
        for node in ast.walk(ast.parse(cell.source)):  # no magics: plain Python
            if isinstance(node, ast.Import):
                for alias in node.names:
                    imported.setdefault(alias.name, set())
            elif isinstance(node, ast.ImportFrom):
                names = imported.setdefault(node.module, set())
                names.update(alias.name for alias in node.names)
    assert set(imported) >= PROJECT_MODULES
    for module_name, names in imported.items():
        module = importlib.import_module(module_name)
        missing = sorted(name for name in names if not hasattr(module, name))
        assert not missing, f"{module_name} has no {missing}"


def test_its_links_find_their_files():
    targets = [match.group("target") for cell in cells_of(read_notebook(), "markdown")
               for match in LINK.finditer(cell.source)]
    local = [target.split("#")[0] for target in targets if "://" not in target]
    assert local, "the notebook links no page of the project"
    for target in local:
        assert (NOTEBOOK.parent / target).is_file(), target


# Run in a kernel before the first cell is told a URL: git clones as it is, and a pip install
# is recorded instead of run (it would take minutes, and the network).
PIP_RECORDED = """
import json
import subprocess

pip_calls = []
run = subprocess.run


def run_but_pip(command, **options):
    if command[1:3] == ["-m", "pip"]:
        pip_calls.append(command)
        return subprocess.CompletedProcess(command, 0, "", "")
    return run(command, **options)


subprocess.run = run_but_pip
"""


def first_cell(repository: str) -> str:
    """The notebook's first code cell, its REPOSITORY set to `repository`."""
    source = cells_of(read_notebook(), "code")[0].source
    assert source.count('REPOSITORY = ""') == 1, "the first cell has no empty REPOSITORY"
    return source.replace('REPOSITORY = ""', f"REPOSITORY = {repository!r}")


def run_in_a_kernel(sources: list[str], folder: Path) -> list[nbformat.NotebookNode]:
    """Each source run in turn as a cell of one fresh kernel working in `folder`, errors and
    all; the cells with their outputs."""
    from nbclient import NotebookClient

    notebook = nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell(source)
                                               for source in sources])
    NotebookClient(notebook, timeout=120, kernel_name="python3", allow_errors=True,
                   resources={"metadata": {"path": str(folder)}}).execute()
    return notebook.cells


def printed(cell: nbformat.NotebookNode) -> str:
    return "".join(output.get("text", "") for output in cell.outputs)


def test_the_first_cell_finds_the_project_it_is_told_or_says_what_to_set(tmp_path,
                                                                           monkeypatch):
    # A folder outside any clone, where the kernel cannot import the project, holding the
    # tutorial's own PER.py (importable there, and not the project); a local clone of this
    # repository stands in for the remote.
    monkeypatch.delenv("PYTHONPATH", raising=False)
    elsewhere, remote = tmp_path / "elsewhere", tmp_path / "remote"
    elsewhere.mkdir()
    (elsewhere / "PER.py").write_text("class SumTree:  # the tutorial's\n    pass\n")
    subprocess.run(["git", "clone", "--quiet", str(ROOT), str(remote)], check=True, timeout=120)

    untold, told_the_tutorial, told_a_folder = run_in_a_kernel(
        [first_cell(""), first_cell(str(elsewhere)), first_cell(str(remote))], elsewhere)
    [error] = untold.outputs
    assert error.output_type == "error" and error.traceback == [f"error: {error.evalue}"]
    assert "set REPOSITORY at the top of this cell" in error.evalue
    [error] = told_the_tutorial.outputs
    assert error.output_type == "error" and error.traceback == [f"error: {error.evalue}"]
    assert "holds no d3qn_utils/" in error.evalue and "the tutorial's own PER.py" in error.evalue
    assert f"project: {remote}\n" in printed(told_a_folder)

    *_, told_a_url, pip = run_in_a_kernel(
        [PIP_RECORDED, first_cell(remote.as_uri()), "print(json.dumps(pip_calls))"], elsewhere)
    cloned = elsewhere / "remote"
    assert f"project: {cloned}\n" in printed(told_a_url)
    assert (cloned / ".git").is_dir() and (cloned / "PER.py").is_file()
    [install] = json.loads(printed(pip))
    assert install[-2:] == ["-r", str(cloned / "requirements.txt")]


def expected_probabilities(kind: str, alpha: float, abs_errors: np.ndarray) -> np.ndarray:
    """The paper's P(i) = p_i^alpha / sum_k p_k^alpha, computed here from the errors alone."""
    if kind == "proportional":
        defaults = Memory(1)  # PER.Memory's epsilon and cap, which the notebook keeps
        priorities = np.minimum(abs_errors + defaults.epsilon, defaults.abs_err_upper)
    else:  # rank-based: p_i = 1 / rank(i), rank 1 the largest error
        priorities = 1.0 / (np.argsort(np.argsort(-abs_errors)) + 1.0)
    weights = priorities**alpha
    return weights / weights.sum()


def files_under(*folders: Path) -> dict[str, tuple[int, int]]:
    """(size, modification time) of every file under `folders`, ignored ones included."""
    return {str(path): (path.stat().st_size, path.stat().st_mtime_ns)
            for folder in folders for path in folder.rglob("*") if path.is_file()}


@pytest.mark.slow  # executes the whole notebook: a short CartPole training and TensorFlow's start
def test_the_notebook_runs_top_to_bottom_and_samples_by_p_i(tmp_path, monkeypatch):
    from nbclient import NotebookClient

    notebook = read_notebook()
    notebook.cells.append(nbformat.v4.new_code_cell(READOUT))
    # The kernel imports the project from this checkout, writes its temporary files under
    # tmp_path and draws its figures into the cells' outputs.
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join(
        filter(None, [str(ROOT), os.environ.get("PYTHONPATH")])))
    monkeypatch.setenv("TMPDIR", str(tmp_path))
    monkeypatch.setenv("MPLBACKEND", "module://matplotlib_inline.backend_inline")
    # Where the agent writes by default, and the notebook's own folder: untouched by the run.
    watched = (ROOT / "notebooks", ROOT / "models", ROOT / "plots")
    before = files_under(*watched)
    NotebookClient(notebook, timeout=600, kernel_name="python3",
                   resources={"metadata": {"path": str(tmp_path)}}).execute()
    assert files_under(*watched) == before

    readout = json.loads("".join(output.get("text", "")
                                 for output in notebook.cells[-1].outputs))
    abs_errors = np.array(readout["abs_errors"])
    measured = {(entry["kind"], entry["alpha"]): np.array(entry["measured"])
                for entry in readout["sampling"]}
    assert set(measured) == {("proportional", 0.0), ("proportional", 0.6),
                             ("proportional", 1.0), ("rank-based", 0.7)}
    for (kind, alpha), frequencies in measured.items():
        expected = expected_probabilities(kind, alpha, abs_errors)
        gap = np.abs(frequencies[:len(abs_errors)] - expected).max()
        assert gap <= SAMPLING_TOLERANCE, (kind, alpha, frequencies, expected)
        assert frequencies[len(abs_errors):].sum() == 0  # empty slots are never drawn

    # The Blind Cliffwalk answers as the paper does: prioritized replay needs fewer updates.
    assert all(speedup > 1 for speedup in readout["cliffwalk_speedup"].values())
    # The CartPole run used its whole budget and drew its plots outside the repository.
    assert readout["steps"] == readout["total_steps"]
    work = Path(readout["work"])
    assert work.is_relative_to(tmp_path)
    assert all(Path(plot).is_file() and Path(plot).is_relative_to(work)
               for plot in readout["plots"])
    # The committed network balances the pole (CartPole-v1 counts 475 as solved).
    assert min(readout["pretrained_scores"]) >= 475
    # Every cell that shows a figure or a GIF shows one.
    for cell in cells_of(notebook, "code"):
        if "plt.show()" in cell.source or "display(Image" in cell.source:
            images = [output for output in cell.outputs
                      if any(mime.startswith("image/") for mime in output.get("data", {}))]
            assert images, cell.source[:80]
