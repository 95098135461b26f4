"""benchmarks/same_log.py keeps what it compared in a stamped results file, and docs/reference.md
renders from the newest one which games logged the same between which commits (here with fake
trainings: the real ones take minutes)."""

import contextlib
import json
import sys
from pathlib import Path

from conftest import ROOT

from benchmarks import benchmark_tables, provenance, same_log

# Two fake games: one logs the same on both sides, the other's second line changed.
FAKE_GAMES = {"steady": ["--total-steps", "10"], "changed": ["--total-steps", "20"]}


def fake_train(code: Path, flags: list[str]) -> tuple[list[str], float]:
    """A log of two lines, the second differing in this checkout for the "changed" game."""
    changed = code == same_log.ROOT and flags == FAKE_GAMES["changed"]
    return ["episode: 1, score: 10", "done: 20 steps" if changed else "done: 10 steps"], 1.0


def test_the_comparison_is_written_stamped_and_rendered_with_each_game_s_verdict(
        tmp_path, monkeypatch, capsys):
    @contextlib.contextmanager
    def fake_checkout(revision: str):
        yield tmp_path / "before"  # never read: fake_train makes the logs

    monkeypatch.setattr(same_log, "GAMES", FAKE_GAMES)
    monkeypatch.setattr(same_log, "checkout", fake_checkout)
    monkeypatch.setattr(same_log, "train", fake_train)
    results = tmp_path / "results"
    path = results / "same_log" / "20261129T000000Z.json"
    monkeypatch.setattr(sys, "argv", [str(ROOT / "benchmarks" / "same_log.py"), "--before",
                                      "HEAD", "--results", str(path)])
    assert same_log.main() == 1  # a game's logs differ
    assert "changed: 2 lines, DIFFERENT, line 2:" in capsys.readouterr().out

    written = json.loads(path.read_text())
    head = provenance.git("rev-parse", "--short", "HEAD")
    assert written["commit"] == head and "machine" in written and "date" in written
    found = written["results"]
    assert (found["before"], found["now"]) == (head, head)
    steady, changed = found["games"]["steady"], found["games"]["changed"]
    assert (steady["lines_before"], steady["lines_now"], steady["verdict"]) == (2, 2, "identical")
    assert steady["first_difference"] is None
    assert changed["verdict"] == "different"
    assert changed["first_difference"].startswith("line 2:")

    text = benchmark_tables.same_log(results)
    assert text.startswith(f"Between commits {head} and {head}: identical logs for steady "
                           "(2 lines); different logs for changed (line 2).\n"), text
    assert f"python benchmarks/same_log.py --before HEAD --results {path}` on " in text


def test_the_block_says_not_yet_checked_without_a_results_file(tmp_path):
    assert benchmark_tables.same_log(tmp_path).startswith("Not yet checked: ")
