"""The line under each committed figure on the pages: the command, machine and commit it came
from, rendered from its results files as the tables are (`render_docs.RENDERERS` names each).

Some figures are drawn from one results file alone: the Blind Cliffwalk's (FILE_FIGURES).
`blind_cliffwalk.py` writes the name of the results file it wrote (or, with `--replot FILE`, the
one it drew from again) into the PNG (a "Source" text chunk); their stamp is rendered only while
the PNG names the newest file of their command, so a figure older than its table fails
`render_docs.py --check`, naming it.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from PIL import Image

from benchmarks import provenance, study
from benchmarks.benchmark_tables import newest_results, newest_results_file
from benchmarks.learning_tables import BLIND_CLIFFWALK, BLIND_CLIFFWALK_EPSILON, PONG_LOGS


@dataclass(frozen=True)
class FileFigure:
    """A figure drawn from the newest results file of `command` (a `blind_cliffwalk.py` run)."""

    path: str  # repository-relative, where the page shows it
    command: str


FILE_FIGURES = [FileFigure("plots/blind_cliffwalk.png", BLIND_CLIFFWALK),
                FileFigure("plots/blind_cliffwalk_priority_epsilon.png", BLIND_CLIFFWALK_EPSILON)]


def made_on(run: dict[str, Any]) -> str:
    """"on MACHINE, commit C, DATE" from a results file's stamp."""
    return (f"on {provenance.machine_label(run)}, commit {provenance.commit_label(run)}"
            + (f", {run['date'][:10]}" if "date" in run else ""))


def drawn_from(png: Path) -> str | None:
    """The results file a figure's PNG names, None if it names none."""
    with Image.open(png) as image:
        return image.text.get(provenance.FIGURE_SOURCE)


def file_figure(figure: FileFigure, results: Path) -> str:
    """The stamp of a figure drawn from one results file; ValueError if its PNG names another
    file than the newest of its command (or none)."""
    path, run = newest_results_file(results, "blind_cliffwalk", figure.command)
    newest = provenance.results_name(path, results)
    found = drawn_from(provenance.ROOT / figure.path)
    if found != newest:
        raise ValueError(f"{figure.path} was drawn from {found or 'no named results file'}, not "
                         f"from {newest}, the newest of `{figure.command}`: `python "
                         f"blind_cliffwalk.py --replot {newest} --plot-path {figure.path}` "
                         "draws it again")
    return (f"The figure: drawn from the table's results file `{newest}`, `{run['command']}` "
            f"{made_on(run)}; `python blind_cliffwalk.py --replot FILE` draws it again from a "
            "file.\n")


def study_figures(name: str, figures: int, results: Path) -> str:
    """The stamp of a study's figures: `study.py report` draws them from the table's result
    files, whose commits and machines it names."""
    found = study.load_results(name, results)
    runs = sorted((run for variants in found.values() for runs in variants.values()
                   for run in runs), key=lambda run: run.get("date", ""))
    commits = list(dict.fromkeys(provenance.commit_label(run) for run in runs))
    machines = list(dict.fromkeys(provenance.machine_label(run) for run in runs))
    which = {1: "The figure", 2: "The two figures"}.get(figures, f"The {figures} figures")
    where = (f"on {machines[0]}" if len(machines) == 1
             else f"on these machines: {'; '.join(machines)}")
    return (f"{which}: drawn by `python benchmarks/study.py report {name}` from the "
            f"study's {len(runs)} result files (`benchmarks/results/{name}/`, its table's rows), "
            f"run at commit{'s' if len(commits) > 1 else ''} {', '.join(commits)} {where}.\n")


def pong_logs_figure(figure: str, results: Path) -> str:
    """The stamp of the committed Pong logs' figure: the pong_logs.py command that drew it,
    which must name it (`--plot`)."""
    run = json.loads((results / PONG_LOGS).read_text())
    if f"--plot {figure}" not in run["command"]:
        logs = provenance.results_name(results / PONG_LOGS, results)
        raise ValueError(f"{logs} was not written by the command that drew {figure}")
    return (f"The figure: drawn by the `benchmarks/pong_logs.py` command of the tables above "
            f"(its `--plot {figure}`), from the same logs, {made_on(run)}.\n")


def default_run_figure(results: Path) -> str:
    """The stamp of a figure of the default run: the run of the table above."""
    run = newest_results(results, "default_run")
    return (f"The figure: drawn by the default run of the table above, `{run['command']}`, which "
            f"`python benchmarks/default_run.py` ran and copied it from, {made_on(run)}.\n")
