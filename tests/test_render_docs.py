"""The pages' results tables are rendered from the results files (benchmarks/render_docs.py),
and every results file carries the stamp of how it was made (benchmarks/provenance.py)."""

import json
import shutil
import sys
from functools import partial
from pathlib import Path

import numpy as np
import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "benchmarks"))
import learning_tables
import provenance
import render_docs
import study

ROOT = render_docs.ROOT


def block_names(text: str) -> list[str]:
    return [match.group("name") for match in render_docs.BLOCK.finditer(text)]


def test_the_committed_pages_and_reports_are_what_the_result_files_render(capsys):
    assert render_docs.main(["--check"]) == 0, capsys.readouterr().out


def test_every_renderer_has_a_block_and_every_block_a_renderer():
    on_pages = [name for page in render_docs.pages(ROOT) for name in block_names(page.read_text())]
    assert sorted(on_pages) == sorted(render_docs.RENDERERS)


def test_a_number_typed_into_a_block_fails_the_check_naming_the_block(tmp_path, capsys):
    shutil.copy(ROOT / "README.md", tmp_path)
    shutil.copytree(ROOT / "docs", tmp_path / "docs")
    page = tmp_path / "docs" / "classic_control.md"
    text = page.read_text()
    start = text.index("<!-- rendered: cartpole_jax -->")
    row = text.index("| cartpole_jax | 10 | ", start)
    typed = text[:row] + text[row:].replace("| cartpole_jax | 10 | ", "| cartpole_jax | 11 | ", 1)
    page.write_text(typed)
    assert render_docs.main(["--check", "--root", str(tmp_path)]) == 1
    differs = capsys.readouterr().out.splitlines()
    assert len(differs) == 1 and differs[0].endswith(
        "docs/classic_control.md: block cartpole_jax differs from what its files render")
    assert page.read_text() == typed  # --check writes nothing


def test_an_unknown_or_unterminated_block_is_an_error_naming_it(tmp_path, capsys):
    (tmp_path / "docs").mkdir()
    (tmp_path / "README.md").write_text("<!-- rendered: no_such_table -->\n<!-- end rendered -->\n")
    assert render_docs.main(["--check", "--root", str(tmp_path)]) == 2
    assert "block 'no_such_table' has no renderer" in capsys.readouterr().err
    (tmp_path / "README.md").write_text("<!-- rendered: pong -->\n| a typed table |\n")
    assert render_docs.main(["--check", "--root", str(tmp_path)]) == 2
    assert "without its `<!-- end rendered -->`" in capsys.readouterr().err


def write_screen_run(results: Path, seed: int, score: float, **fields) -> None:
    """A screen's result file with made-up numbers: training episodes at half its score."""
    path = study.Run("screens/handmade", "Game-v0", "per", seed).result_path(results)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps({
        "game": "Game-v0", "variant": "per", "seed": seed,
        "command": f"python d3qn_agent.py --env-name Game-v0 --seed {seed} --flag",
        "target": None, "evaluation": {"steps": [1000, 2000], "means": [score + 1, score]},
        "solved_score": None, "steps_to_solve": None, "final_score": score,
        "training_scores_last_100": [score / 2 - 1, score / 2 + 1], "wall_seconds": 1234.4,
        "steps_per_second": 100.0, "load_average": [2.25, 2.0, 1.5],
        "settings": {"total_steps": 2000}, **fields}))


def test_a_block_renders_from_hand_made_results_with_command_machine_and_commit(tmp_path,
                                                                               monkeypatch):
    stamped = {"cpu": "Some CPU", "architecture": "x86_64", "cores": 2,
               "cpu_features": ["AVX2", "AVX-512"], "gpus": []}
    write_screen_run(tmp_path, 100, 10.0, commit="abc1234", uncommitted_changes=True,
                     machine=stamped)
    write_screen_run(tmp_path, 101, 20.0, commit="def5678", machine="x86_64, 2 cores")
    monkeypatch.setitem(render_docs.RENDERERS, "handmade", partial(
        render_docs.screens_table, [render_docs.Screen("handmade", "Game-v0", "`--flag`")], 1))
    page = ("Before.\n\n<!-- rendered: handmade -->\n| 99 | typed |\n<!-- end rendered -->\n\n"
            "After.\n")
    text, changed = render_docs.render_text(page, tmp_path, "page.md")
    assert changed == ["handmade"]
    assert text == (
        "Before.\n\n<!-- rendered: handmade -->\n"
        "| game | setting (flags on today's preset) | study (`screens/…`) | seeds | last network "
        "| mean | last 100 training episodes | best evaluation (at step) | wall time (s) | load "
        "average | command | machine | commit |\n" + "|---" * 13 + "|\n"
        "| Game-v0 | `--flag` | `handmade` | 100, 101 | 10.0, 20.0 | 15.0 | 5.0, 10.0 | "
        "11.0 at 1,000, 21.0 at 1,000 | 1,234, 1,234 | 2.2, 2.2 "
        "| `python d3qn_agent.py --env-name Game-v0 --seed N --flag` "
        "| Some CPU, 2 cores (AVX2 AVX-512) (seeds 100); machine not recorded (seeds 101) "
        "| abc1234 (with uncommitted changes) (seeds 100); def5678 (seeds 101) |\n"
        "<!-- end rendered -->\n\nAfter.\n")
    assert render_docs.render_text(text, tmp_path, "page.md") == (text, [])


def test_a_machine_named_by_a_log_and_a_span_of_seeds_render_as_such():
    runs = [{"seed": seed, "command": f"python d3qn_agent.py --seed {seed}", "commit": "abc1234",
             **({"machine_from_log": {"name": "EPYC BF16", "log": "a commit message"}}
                if seed < 2 else {})} for seed in range(5)]
    assert study.provenance_cells(runs) == [
        "`python d3qn_agent.py --seed N`",
        "EPYC BF16 (seeds 0\N{EN DASH}1); machine not recorded (seeds 2\N{EN DASH}4)", "abc1234"]


def test_intervals_are_kept_by_their_inputs_and_computed_afresh_when_those_change(tmp_path,
                                                                                 monkeypatch):
    computed = []

    def counting_bootstrap(scores, metric, reps):
        computed.append(scores)
        return {name: np.array([1.5]) for name in scores}, {
            name: np.array([[1.0], [2.0]]) for name in scores}

    monkeypatch.setattr(study, "bootstrap", counting_bootstrap)
    path = tmp_path / "intervals.json"
    cache = study.IntervalCache(path)
    with study.cached_intervals(cache):
        study.iqm_interval({"per": [1.0, 2.0]}, reps=10)
        study.iqm_interval({"per": [1.0, 2.0]}, reps=10)
    assert len(computed) == 1
    cache.save()
    again = study.IntervalCache(path)
    with study.cached_intervals(again):
        points, intervals = study.iqm_interval({"per": [1.0, 2.0]}, reps=10)
        study.iqm_interval({"per": [1.0, 3.0]}, reps=10)  # a changed score
    assert len(computed) == 2
    assert points == {"per": 1.5} and intervals["per"] == pytest.approx([1.0, 2.0])
    assert len(again.used) == 2 and study.INTERVAL_CACHE is None


def test_the_command_line_names_the_script_from_the_root_with_the_variables_that_matter(
        monkeypatch):
    for name in provenance.COMMAND_ENVIRONMENT:
        monkeypatch.delenv(name, raising=False)
    script = str(ROOT / "benchmarks" / "bench_per.py")
    assert provenance.command_line([script, "--capacity", "8"]) == (
        "python benchmarks/bench_per.py --capacity 8")
    monkeypatch.setenv("TF_ENABLE_ONEDNN_OPTS", "1")
    assert provenance.command_line([script]) == (
        "TF_ENABLE_ONEDNN_OPTS=1 python benchmarks/bench_per.py")


def test_a_results_file_carries_the_stamp_beside_what_was_measured(tmp_path, capsys):
    path = provenance.write_results(tmp_path / "bench" / "run.json",
                                    {"microseconds": np.array([1.5, 2.5]), "calls": np.int64(3)})
    written = json.loads(path.read_text())
    assert written["results"] == {"microseconds": [1.5, 2.5], "calls": 3}
    assert {"command", "commit", "uncommitted_changes", "date", "machine", "backend",
            "versions"} <= set(written)
    machine = written["machine"]
    assert machine["cores"] >= 1 and machine["cpu"]
    assert set(machine["cpu_features"]) <= set(provenance.CPU_FEATURES.values())
    assert set(written["versions"]) == set(provenance.PACKAGES)
    assert provenance.machine_label(written).startswith(f"{machine['cpu']}, {machine['cores']} ")
    assert "results: " in capsys.readouterr().out


# --- the learning tables outside the studies (benchmarks/learning_tables.py) -----------------

STAMP = {"commit": "abc1234", "uncommitted_changes": False,
         "machine": {"cpu": "Some CPU", "architecture": "x86_64", "cores": 2,
                     "cpu_features": ["AVX2"], "gpus": []}}
STAMP_ROW = "| Some CPU, 2 cores (AVX2) | abc1234 |\n"


def write_result(path: Path, command: str, results: dict) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps({"command": command, **STAMP, "results": results}))


def test_blind_cliffwalk_renders_medians_failures_ratios_and_the_stamp(tmp_path):
    runs = [(2, 6, "uniform", [10, 20]), (2, 6, "oracle", [5, 5]),
            (3, 14, "uniform", [40, None]), (3, 14, "oracle", [7, 9])]
    write_result(tmp_path / "blind_cliffwalk" / "20260101T000000Z.json",
                 learning_tables.BLIND_CLIFFWALK, {
                     "settings": {"seed": 0, "seeds": 2, "max_n": 3, "budget_per_transition": 100},
                     "columns": ["uniform", "oracle"], "wall_seconds": 12.4,
                     "runs": [{"n": n, "memory": memory, "column": column, "updates": updates}
                              for n, memory, column, updates in runs]})
    # A newer file of another command is not this table's.
    write_result(tmp_path / "blind_cliffwalk" / "20270101T000000Z.json",
                 learning_tables.BLIND_CLIFFWALK_EPSILON, {})
    assert render_docs.RENDERERS["blind_cliffwalk"](tmp_path) == (
        "| n | memory | uniform | oracle |\n|---|---|---|---|\n"
        "| 2 | 6 | 15 (10\N{EN DASH}20) | 5 (5\N{EN DASH}5) |\n"
        "| 3 | 14 | 720 (40\N{EN DASH}1400), 1 failed | 8 (7\N{EN DASH}9) |\n"
        "| n = 3: uniform's median over this one | | 1.0\N{MULTIPLICATION SIGN} "
        "| 90.0\N{MULTIPLICATION SIGN} |\n\n"
        "| command | seeds | wall time | machine | commit |\n|---|---|---|---|---|\n"
        "| `python blind_cliffwalk.py` | 0\N{EN DASH}1 | 12 s " + STAMP_ROW)


def test_the_committed_networks_render_with_size_command_and_scores(tmp_path):
    command = "python d3qn_agent.py --test --model models/pretrained/Game-v0.keras"
    write_result(tmp_path / "play_pretrained" / "20260101T000000Z.json",
                 "python benchmarks/play_pretrained.py", {"networks": [
                     {"file": "models/pretrained/Game-v0.keras", "bytes": 6_800_000,
                      "command": command, "scores": [-1.5, 2.0]}]})
    assert render_docs.RENDERERS["pretrained"](tmp_path) == (
        "| file | size | command | scores, episode by episode | mean |\n|---|---|---|---|---|\n"
        f"| `models/pretrained/Game-v0.keras` | 6.8 MB | `{command}` | \N{MINUS SIGN}1.5, 2 "
        "| 0.2 |\n\n| command | machine | commit |\n|---|---|---|\n"
        "| `python benchmarks/play_pretrained.py` " + STAMP_ROW)


def test_the_pong_logs_render_a_row_per_run_and_a_column_per_run(tmp_path):
    run = {"name": "preset", "log": "benchmarks/logs/preset.log", "solved_mean": 18.0,
           "solved_window": 100, "solved_at_step": 398_076, "solved_at_episode": 205,
           "reached": 500_000, "evaluations": {"250000": [17.8, 2.7], "500000": [20.8, 0.4]},
           "chunks": [[0, 374_790, 40.0], [374_790, 500_000, 37.0]], "seconds": 5400.0,
           "means": {"100000": [-18.0, -17.1], "600000": [None, None]}}
    unsolved = {**run, "name": "short", "solved_at_step": None, "reached": 450_000,
                "evaluations": {"250000": [-20.0, 1.0]}}
    write_result(tmp_path / learning_tables.PONG_LOGS, "python benchmarks/pong_logs.py ...",
                 {"windows": [100, 50], "runs": [run, unsolved]})
    assert render_docs.RENDERERS["pong_runs"](tmp_path) == (
        "| run | 100-episode mean of 18 at step (episode) | greedy evaluation at 250,000 / "
        "500,000 | agent steps/s, chunk by chunk | training time (sum of chunks) | machine | log "
        "|\n" + "|---" * 7 + "|\n"
        "| preset | 398,076 (205) | 17.8 ± 2.7 / 20.8 ± 0.4 | 40, 37 | 1.5 h | machine not "
        "recorded | `benchmarks/logs/preset.log` |\n"
        "| short | not by step 450,000 | \N{MINUS SIGN}20.0 ± 1.0 / — | 40, 37 | 1.5 h | machine "
        "not recorded | `benchmarks/logs/preset.log` |\n\nRead from the logs by:\n\n"
        "| command | machine | commit |\n|---|---|---|\n"
        "| `python benchmarks/pong_logs.py ...` " + STAMP_ROW)
    assert render_docs.RENDERERS["pong_means"](tmp_path) == (
        "| at step (100- / 50-episode means) | preset | short |\n|---|---|---|\n"
        "| 100,000 | \N{MINUS SIGN}18.0 / \N{MINUS SIGN}17.1 | \N{MINUS SIGN}18.0 / "
        "\N{MINUS SIGN}17.1 |\n| 600,000 | — / — | — / — |\n")
