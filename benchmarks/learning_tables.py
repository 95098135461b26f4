"""The pages' tables of learning results outside the studies, each rendered from the newest
results file its script wrote (`render_docs.RENDERERS` names them): the Blind Cliffwalk
(`blind_cliffwalk.py`), the committed networks played (`benchmarks/play_pretrained.py`) and the
committed Pong logs read (`benchmarks/pong_logs.py --results`, one file kept by name).
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np

from benchmarks import provenance
from benchmarks.benchmark_tables import markdown_table, newest_results, stamp_cells

BLIND_CLIFFWALK = "python blind_cliffwalk.py"  # the page's first command
BLIND_CLIFFWALK_EPSILON = ("python blind_cliffwalk.py --methods uniform,proportional,rank "
                           "--priority-epsilon 1e-2 1e-4 1e-6 --plot-path "
                           "plots/blind_cliffwalk_priority_epsilon.png")
PONG_LOGS = Path("pong_logs") / "committed_runs.json"  # under the results root (docs/atari.md)
MINUS = "\N{MINUS SIGN}"


def stamp_table(found: dict, *extra: tuple[str, str]) -> str:
    """The file's command, machine and commit (and `extra` columns) as a one-row table."""
    command, machine, commit = stamp_cells(found)
    return markdown_table(["command", *(name for name, _ in extra), "machine", "commit"],
                          [[command, *(value for _, value in extra), machine, commit]])


def signed(value: float, digits: int = 1) -> str:
    return f"{value:,.{digits}f}".replace("-", MINUS)


def score(value: float) -> str:
    """An episode's score: whole as a whole number, else to one decimal."""
    return signed(value, 0 if value == int(value) else 1)


def updates_cell(updates: list[int | None], budget: int) -> str:
    """Median (min to max) updates; a failed run counts as the budget, and says so."""
    counts = np.array([budget if count is None else count for count in updates])
    failed = updates.count(None)
    return (f"{np.median(counts):.0f} ({counts.min()}\N{EN DASH}{counts.max()})"
            + (f", {failed} failed" if failed else ""))


def blind_cliffwalk(command: str, results: Path) -> str:
    """Median (min to max) updates to converge per chain length and column, the ratio of uniform
    replay's median to each column's at the longest chain, and the file's stamp."""
    found = newest_results(results, "blind_cliffwalk", command)
    measured, settings = found["results"], found["results"]["settings"]
    columns = measured["columns"]
    rows: dict[tuple[int, int], dict[str, str]] = {}
    last: dict[str, float] = {}
    for run in measured["runs"]:
        budget = int(settings["budget_per_transition"] * run["memory"])
        rows.setdefault((run["n"], run["memory"]), {})[run["column"]] = updates_cell(
            run["updates"], budget)
        if run["n"] == settings["max_n"]:
            last[run["column"]] = float(np.median([budget if count is None else count
                                                   for count in run["updates"]]))
    lines = [f"| n | memory | {' | '.join(columns)} |", "|---" * (2 + len(columns)) + "|"]
    lines += [f"| {n} | {memory:,} | {' | '.join(cells[name] for name in columns)} |"
              for (n, memory), cells in sorted(rows.items())]
    if "uniform" in last:
        ratios = [f"{last['uniform'] / last[name]:.1f}\N{MULTIPLICATION SIGN}" for name in columns]
        lines.append(f"| n = {settings['max_n']}: uniform's median over this one | | "
                     f"{' | '.join(ratios)} |")
    seeds = f"{settings['seed']}\N{EN DASH}{settings['seed'] + settings['seeds'] - 1}"
    return "\n".join(lines) + "\n\n" + stamp_table(found, ("seeds", seeds))


def size(count: int) -> str:
    return f"{count / 1e6:.1f} MB" if count >= 1e6 else f"{count / 1e3:.0f} KB"


def pretrained(results: Path) -> str:
    """Each committed network's size and greedy scores, by the command that played it."""
    found = newest_results(results, "play_pretrained")
    rows = [[f"`{network['file']}`", size(network["bytes"]), f"`{network['command']}`",
             ", ".join(score(s) for s in network["scores"]),
             signed(float(np.mean(network["scores"])))] for network in found["results"]["networks"]]
    return markdown_table(["file", "size", "command", "scores, episode by episode", "mean"],
                          rows) + "\n" + stamp_table(found)


def pong_runs(results: Path) -> str:
    """Per committed Pong log: where its 100-episode mean first reached 18, the greedy
    evaluations, read by pong_logs.py."""
    found = json.loads((results / PONG_LOGS).read_text())
    runs = found["results"]["runs"]
    steps = sorted({step for run in runs for step in run["evaluations"]}, key=int)
    header = [f"{runs[0]['solved_window']}-episode mean of {runs[0]['solved_mean']:g} at step "
              "(episode)", f"greedy evaluation at {' / '.join(f'{int(s):,}' for s in steps)}"]
    lines = [f"| run | {' | '.join(header)} | machine | log |", "|---" * 5 + "|"]
    for run in runs:
        solved = (f"{run['solved_at_step']:,} ({run['solved_at_episode']})"
                  if run["solved_at_step"] is not None else f"not by step {run['reached']:,}")
        evaluations = " / ".join(
            f"{signed(run['evaluations'][s][0])} ± {run['evaluations'][s][1]:.1f}"
            if s in run["evaluations"] else "—" for s in steps)
        lines.append(f"| {run['name']} | {solved} | {evaluations} | "
                     f"{provenance.machine_label(run)} | `{run['log']}` |")
    return "\n".join(lines) + "\n\nRead from the logs by:\n\n" + stamp_table(found)


def pong_means(results: Path) -> str:
    """The training scores' moving means at each reported step, a column per committed log."""
    found = json.loads((results / PONG_LOGS).read_text())
    windows, runs = found["results"]["windows"], found["results"]["runs"]
    lines = [f"| at step ({' / '.join(f'{w}-' for w in windows)}episode means) | "
             + " | ".join(run["name"] for run in runs) + " |", "|---" * (1 + len(runs)) + "|"]
    for step in runs[0]["means"]:
        cells = [" / ".join("—" if mean is None else signed(mean) for mean in run["means"][step])
                 for run in runs]
        lines.append(f"| {int(step):,} | {' | '.join(cells)} |")
    return "\n".join(lines) + "\n"
