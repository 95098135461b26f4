"""The pages' results tables are rendered from the results files (benchmarks/render_docs.py),
and every results file carries the stamp of how it was made (benchmarks/provenance.py)."""

import json
import shutil
import subprocess
import sys
from functools import partial
from pathlib import Path

import numpy as np
import pytest
from conftest import ROOT

import blind_cliffwalk
from benchmarks import (
    benchmark_tables,
    figure_stamps,
    learning_tables,
    provenance,
    render_docs,
    study,
    timing,
)

# What a failing check of the committed pages says: a results file newer than the pages (a
# benchmark run since) makes their blocks differ until this command renders them again.
RENDER_AGAIN = "render the pages again from the results files: python benchmarks/render_docs.py"


def block_names(text: str) -> list[str]:
    return [match.group("name") for match in render_docs.BLOCK.finditer(text)]


def test_the_committed_pages_and_reports_are_what_the_result_files_render(capsys):
    assert render_docs.main(["--check"]) == 0, f"{capsys.readouterr().out}{RENDER_AGAIN}"


def test_every_renderer_has_a_block_and_every_block_a_renderer():
    on_pages = [name for page in render_docs.pages(ROOT) for name in block_names(page.read_text())]
    assert sorted(on_pages) == sorted(render_docs.RENDERERS)


def cartpole_jax_seeds_typed(text: str) -> str:
    """The cartpole_jax row's seed count changed by hand."""
    row = text.index("| cartpole_jax | 10 | ", text.index("<!-- rendered: cartpole_jax -->"))
    return text[:row] + text[row:].replace("| cartpole_jax | 10 | ", "| cartpole_jax | 11 | ", 1)


def bench_per_loop_typed(text: str) -> str:
    """A digit typed into bench_per's store row, before the tutorial loop's microseconds."""
    row = text.index("| store | ", text.index("<!-- rendered: bench_per -->"))
    cell = text.index(" | ", row + len("| store | ")) + 3
    return text[:cell] + "1" + text[cell:]


@pytest.mark.parametrize("page_name, block, typed", [
    ("classic_control.md", "cartpole_jax", cartpole_jax_seeds_typed),
    ("benchmarks.md", "bench_per", bench_per_loop_typed),
])
def test_a_number_typed_into_a_block_fails_the_check_naming_the_block(tmp_path, capsys,
                                                                      page_name, block, typed):
    shutil.copy(ROOT / "README.md", tmp_path)
    shutil.copytree(ROOT / "docs", tmp_path / "docs")
    page = tmp_path / "docs" / page_name
    edited = typed(page.read_text())
    page.write_text(edited)
    assert render_docs.main(["--check", "--root", str(tmp_path)]) == 1
    differs = capsys.readouterr().out.splitlines()
    assert len(differs) == 1 and differs[0].endswith(
        f"docs/{page_name}: block {block} differs from what its files render"), (
        f"{differs}: another block differing means the committed pages do; {RENDER_AGAIN}")
    assert page.read_text() == edited  # --check writes nothing


def test_an_unknown_or_unterminated_block_is_an_error_naming_it(tmp_path, capsys):
    (tmp_path / "docs").mkdir()
    (tmp_path / "README.md").write_text("<!-- rendered: no_such_table -->\n<!-- end rendered -->\n")
    assert render_docs.main(["--check", "--root", str(tmp_path)]) == 2
    assert "block 'no_such_table' has no renderer" in capsys.readouterr().err
    (tmp_path / "README.md").write_text("<!-- rendered: pong -->\n| a typed table |\n")
    assert render_docs.main(["--check", "--root", str(tmp_path)]) == 2
    assert "without its `<!-- end rendered -->`" in capsys.readouterr().err


def write_screen_run(results: Path, seed: int, score: float, screen: str = "handmade",
                     **fields) -> None:
    """A screen's result file with made-up numbers: training episodes at half its score."""
    path = study.Run(f"screens/{screen}", "Game-v0", "per", seed).result_path(results)
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
        "| mean | last 100 training episodes | best evaluation (at step) | command | machine "
        "| commit |\n" + "|---" * 11 + "|\n"
        "| Game-v0 | `--flag` | `handmade` | 100, 101 | 10.0, 20.0 | 15.0 | 5.0, 10.0 | "
        "11.0 at 1,000, 21.0 at 1,000 "
        "| `python d3qn_agent.py --env-name Game-v0 --seed N --flag` "
        "| Some CPU, 2 cores (AVX2 AVX-512) (seeds 100); "
        "x86_64, 2 cores (CPU model not recorded) (seeds 101) "
        "| abc1234 (with uncommitted changes) (seeds 100); def5678 (seeds 101) |\n"
        "<!-- end rendered -->\n\nAfter.\n")
    assert render_docs.render_text(text, tmp_path, "page.md") == (text, [])


def test_a_defaults_screen_sets_each_change_against_the_defaults_on_its_seeds(tmp_path,
                                                                            monkeypatch):
    monkeypatch.setattr(study, "BOOTSTRAP_REPS", 200)  # the intervals' width is not checked
    for seed, solved in ((10, 3000), (11, 5000), (12, None)):
        write_screen_run(tmp_path, seed, 500.0, "defaults", steps_to_solve=solved,
                         solved_score=475.0)
        write_screen_run(tmp_path, seed, 100.0 * (seed - 9), "changed", steps_to_solve=None,
                         solved_score=475.0)
        write_screen_run(tmp_path, seed, 50.0, "unsolvable")  # a game with no solved score
    table = render_docs.defaults_screen_table(
        [render_docs.Screen("defaults", "Game-v0", "**none: the defaults**"),
         render_docs.Screen("changed", "Game-v0", "`--flag`"),
         render_docs.Screen("unsolvable", "Game-v0", "`--other`")], tmp_path)
    header, rule, *rows = table.splitlines()
    assert rule == "|---" * len(header.split(" | ")) + "|" and len(rows) == 3
    assert rows.pop().split(" | ")[7] == "n/a (no solved score)"
    # A row set against the first on other seeds, or on fewer than MIN_RUNS_COMPARED, shows no
    # chance: a study still running.
    for seeds, said in (((10, 11), "fewer than 3 runs"), ((10, 11, 13), "other seeds")):
        for seed in seeds:
            write_screen_run(tmp_path, seed, 20.0, f"partial{len(seeds)}{seeds[-1]}")
        partial = render_docs.defaults_screen_table(
            [render_docs.Screen("defaults", "Game-v0", "**none: the defaults**"),
             render_docs.Screen(f"partial{len(seeds)}{seeds[-1]}", "Game-v0", "`--x`")],
            tmp_path).splitlines()[-1].split(" | ")
        assert said in partial[8] and said in partial[9], partial
    header_cells = header.removeprefix("| ").removesuffix(" |").split(" | ")
    assert header_cells[8:10] == ["P(defaults run beats this run): last networks",
                                  "last 100 training episodes"]
    defaults, changed = (dict(zip(header_cells, row.removeprefix("| ").removesuffix(" |")
                                  .split(" | "), strict=True)) for row in rows)
    assert defaults["setting"] == "**none: the defaults**"
    assert defaults["seeds"] == "10, 11, 12" and defaults["last network"] == "500.0, 500.0, 500.0"
    assert defaults["IQM, last networks [95% CI]"] == "500.0 [500.0, 500.0]"
    # two of three seeds solved: the median is the later of the two; none solved: never
    assert defaults["median steps to solve"] == "5,000"
    assert defaults["P(defaults run beats this run): last networks"] == "n/a"
    assert changed["last network"] == "100.0, 200.0, 300.0" and changed["mean"] == "200.0"
    assert changed["median steps to solve"] == "not solved by 2,000"
    # every defaults run scores above every changed run, by both scores
    assert changed["P(defaults run beats this run): last networks"] == "1.00 [1.00, 1.00]"
    assert changed["last 100 training episodes"] == "1.00 [1.00, 1.00]"
    assert changed["command"] == "`python d3qn_agent.py --env-name Game-v0 --seed N --flag`"


def test_a_machine_named_by_a_log_and_a_span_of_seeds_render_as_such():
    runs = [{"seed": seed, "command": f"python d3qn_agent.py --seed {seed}", "commit": "abc1234",
             **({"machine_from_log": {"name": "EPYC BF16", "log": "a commit message"}}
                if seed < 2 else {})} for seed in range(5)]
    assert study.provenance_cells(runs) == [
        "`python d3qn_agent.py --seed N`",
        "EPYC BF16 (seeds 0\N{EN DASH}1); machine not recorded (seeds 2\N{EN DASH}4)", "abc1234"]


def test_a_study_row_gives_the_flag_its_study_now_adds_where_the_recorded_settings_agree():
    # The Pong study's float32 runs predate the bfloat16 preset: their recorded command lacks
    # --no-bfloat16, which repeats them today on a CPU where the preset would turn bfloat16 on.
    old = {"study": "pong", "seed": 3, "commit": "abc1234", "settings": {"bfloat16": False},
           "command": "python d3qn_agent.py --env-name PongNoFrameskip-v4 --seed 3"}
    given = {**old, "command": old["command"] + " --no-bfloat16"}
    for run in (old, given):
        assert study.provenance_cells([run])[0] == (
            "`python d3qn_agent.py --env-name PongNoFrameskip-v4 --seed N --no-bfloat16`")
    with pytest.raises(ValueError, match="pong seed 3: its command lacks --no-bfloat16"):
        study.reproducing_command({**old, "settings": {"bfloat16": True}})


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


def test_a_script_that_times_holds_the_machine_wide_lock_and_records_its_load(
        tmp_path, monkeypatch, capsys):
    lock_path = tmp_path / "measuring.lock"
    monkeypatch.setattr(provenance, "timed_alone", {})
    provenance.time_alone(lock_path, quiet_within=0)  # the tests' own load may be high
    other = subprocess.run([sys.executable, "-c", "import filelock, sys; "
                            f"filelock.FileLock({str(lock_path)!r}).acquire(timeout=0)"],
                           capture_output=True, text=True)
    assert other.returncode != 0 and "Timeout" in other.stderr  # a second script must wait
    written = json.loads(provenance.write_results(tmp_path / "run.json", {}).read_text())
    record = written["timed_alone"]
    assert len(record["load_average_before"]) == len(record["load_average_after"]) == 3
    provenance.timed_alone["lock"].release()


def test_a_timing_waits_for_the_load_average_to_fade_but_not_past_its_limit(monkeypatch,
                                                                            capsys):
    loads, sleeps = [3.0, 1.6, 0.9, 0.2], []
    monkeypatch.setattr(provenance.os, "cpu_count", lambda: 2)  # quiet: 1.0
    monkeypatch.setattr(provenance.os, "getloadavg", lambda: (loads.pop(0), 0.0, 0.0))
    monkeypatch.setattr(provenance.time, "sleep", sleeps.append)
    provenance.wait_for_quiet(300, poll_seconds=5)
    assert sleeps == [5, 5] and loads == [0.2]  # it stopped at the first load under 1.0
    assert "to fall to 1.0" in capsys.readouterr().out
    clock = iter([0.0, 10.0, 20.0, 31.0])  # past the limit: the timing begins anyway
    monkeypatch.setattr(provenance.time, "monotonic", lambda: next(clock))
    monkeypatch.setattr(provenance.os, "getloadavg", lambda: (1.9, 0.0, 0.0))
    sleeps.clear()
    provenance.wait_for_quiet(30, poll_seconds=10)
    assert sleeps == [10, 10]


def timed(before: float, after: float) -> dict:
    """A results file timed under the lock, with these 1-minute load averages, on 2 cores."""
    return {"command": "python benchmarks/bench_per.py", "date": "2026-11-28T00:00:00+00:00",
            **STAMP, "timed_alone": {"load_average_before": [before, 0.0, 0.0],
                                     "load_average_after": [after, 0.0, 0.0]}, "results": {}}


def test_the_pages_show_a_timings_load_and_refuse_one_taken_on_a_busy_machine():
    assert provenance.load_label(timed(0.3, 2.4)) == (
        "load average 0.3 before, 2.4 after, 2 cores")  # its own threads count after
    # A line that names the machine (whose label holds the cores) says them once.
    assert provenance.load_label(timed(0.3, 2.4), with_cores=False) == (
        "load average 0.3 before, 2.4 after")
    with pytest.raises(ValueError, match=r"load average of 2\.10 on 2 cores"):
        provenance.load_label(timed(2.1, 2.0))
    older = {"results": {"load_average_before": [1.5, 0, 0], "load_average_after": [2.5, 0, 0]}}
    assert provenance.load_label(older) == (
        "load average 1.5 before, 2.5 after (timed before the lock)")


def test_a_timing_that_began_above_the_quiet_line_is_marked_so():
    # On 2 cores the quiet line is QUIET_LOAD_PER_CORE x 2 (1.0): at the line is quiet, above
    # it the label says the load it began at.
    quiet = provenance.quiet_load(2)
    assert quiet == pytest.approx(2 * provenance.QUIET_LOAD_PER_CORE)
    assert provenance.load_label(timed(quiet, 1.5)) == (
        f"load average {quiet:.1f} before, 1.5 after, 2 cores")
    assert provenance.load_label(timed(quiet + 0.37, 1.5)) == (
        f"load average {quiet + 0.37:.1f} before, 1.5 after, 2 cores (began at load "
        f"{quiet + 0.37:.2f}, above the quiet line of {quiet:.1f})")


def test_the_quiet_rule_on_the_benchmarks_page_is_rendered_from_its_constants(monkeypatch):
    rule = render_docs.RENDERERS["quiet_rule"](Path("unused"))
    assert f"at most {provenance.QUIET_LOAD_PER_CORE:g} per core" in rule
    assert f"up to {provenance.QUIET_WITHIN:.0f} s" in rule
    monkeypatch.setattr(provenance, "QUIET_WITHIN", 120.0)
    monkeypatch.setattr(provenance, "QUIET_LOAD_PER_CORE", 0.25)
    changed = render_docs.RENDERERS["quiet_rule"](Path("unused"))
    assert "at most 0.25 per core" in changed and "up to 120 s" in changed
    assert '"began at load L, above the quiet line of Q"' in changed


def test_rounds_give_their_median_minimum_and_maximum():
    assert timing.spread([3.0, 1.0, 2.0]) == timing.Spread(2.0, 1.0, 3.0, 3)
    assert timing.spread([4.0, 1.0, 2.0, 3.0]) == timing.Spread(2.5, 1.0, 4.0, 4)
    assert timing.spread(5.0) == timing.Spread(5.0, 5.0, 5.0, 1)  # an older file's one value
    assert timing.spread([2.0, 4.0]).scaled(10) == timing.Spread(30.0, 20.0, 40.0, 2)
    with pytest.raises(ValueError, match="no rounds"):
        timing.spread([])
    assert timing.shown(timing.spread([1.25, 1.0, 2.0]), "{:.2f}".format) == (
        f"1.25 (1.00{DASH}2.00)")
    assert timing.shown(timing.spread(1.25), "{:.2f}".format) == "1.25 (1 round)"


def test_a_comparison_is_drawn_only_where_the_ranges_are_apart():
    slow, fast = timing.spread([1.0, 2.0, 2.5]), timing.spread([3.0, 4.0, 5.0])
    assert timing.ranges_apart(fast, slow) and timing.ranges_apart(slow, fast)
    assert timing.ratio(fast, slow) == f"2.00{X} (ranges apart)"
    assert timing.change(fast, slow) == "+100% (ranges apart)"
    overlapping = timing.spread([2.4, 4.0, 5.0])
    assert not timing.ranges_apart(overlapping, slow)
    assert timing.ratio(overlapping, slow) == (
        f"no clear difference (ranges overlap; medians 2.00{X})")
    touching = timing.spread([2.5, 4.0, 5.0])  # its slowest round is the other's fastest
    assert timing.ratio(touching, slow).startswith("no clear difference")
    assert timing.ratio(timing.spread(4.0), slow) == f"2.00{X} (1 round: no range to compare)"


def test_a_paired_ratio_divides_round_by_round():
    # Rounds 1-3: 3/1, 4/2, 5/2.5 = 3, 2, 2: the median 2, the range 2-3. The medians' ratio
    # (4 / 2 = 2) would hide that every round's ratio is at least 2.
    assert timing.paired_ratio([3.0, 4.0, 5.0], [1.0, 2.0, 2.5]) == (
        f"2.00{X} (2.00{X}{DASH}3.00{X})")
    assert timing.paired_ratio([3.0], [2.0]) == f"1.50{X} (1 round)"
    with pytest.raises(ValueError, match="same count, got 2 and 3"):
        timing.paired_ratio([1.0, 2.0], [1.0, 2.0, 3.0])


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
        "| command | seeds | machine | commit |\n|---|---|---|---|\n"
        "| `python blind_cliffwalk.py` | 0\N{EN DASH}1 " + STAMP_ROW)


def write_cliffwalk(results: Path, when: str, updates: list[int]) -> None:
    write_result(results / "blind_cliffwalk" / f"{when}.json", learning_tables.BLIND_CLIFFWALK, {
        "settings": {}, "columns": ["uniform"],
        "runs": [{"n": 2, "memory": 6, "column": "uniform", "updates": updates}]})


def test_a_figure_drawn_from_an_older_file_than_its_table_s_fails_until_drawn_again(tmp_path):
    results, png = tmp_path / "results", tmp_path / "plots" / "figure.png"
    figure = figure_stamps.FileFigure(str(png), learning_tables.BLIND_CLIFFWALK)

    def draw(when: str, updates: list[int]) -> None:  # as blind_cliffwalk.py draws and names it
        write_cliffwalk(results, when, updates)
        blind_cliffwalk.main(["--replot", str(results / "blind_cliffwalk" / f"{when}.json"),
                              "--plot-path", str(png)])

    png.parent.mkdir()
    draw("20260101T000000Z", [10, 20])
    assert figure_stamps.drawn_from(png) == str(
        (results / "blind_cliffwalk" / "20260101T000000Z.json").resolve())  # outside results/
    provenance.name_figure_source(png, results / "blind_cliffwalk" / "20260101T000000Z.json",
                                  results)
    assert figure_stamps.drawn_from(png) == (
        "benchmarks/results/blind_cliffwalk/20260101T000000Z.json")
    write_cliffwalk(results, "20270101T000000Z", [30, 40])  # the table moves on
    with pytest.raises(ValueError, match=r"drawn from .*20260101T000000Z\.json, not from "
                                         r".*20270101T000000Z\.json"):
        figure_stamps.file_figure(figure, results)
    provenance.name_figure_source(png, results / "blind_cliffwalk" / "20270101T000000Z.json",
                                  results)
    assert figure_stamps.file_figure(figure, results) == (
        "The figure: drawn from the table's results file "
        "`benchmarks/results/blind_cliffwalk/20270101T000000Z.json`, `python blind_cliffwalk.py` "
        "on Some CPU, 2 cores (AVX2), commit abc1234; `python blind_cliffwalk.py --replot FILE` "
        "draws it again from a file.\n")


def test_a_study_s_figures_name_the_commits_and_machines_of_its_files(tmp_path):
    write_screen_run(tmp_path, 100, 10.0, commit="abc1234", date="2026-01-01T00:00:00+00:00",
                     machine="x86_64, 2 cores")
    write_screen_run(tmp_path, 101, 20.0, commit="def5678", date="2026-01-02T00:00:00+00:00",
                     machine_from_log={"name": "EPYC BF16"})
    assert figure_stamps.study_figures("screens/handmade", 2, tmp_path) == (
        "The two figures: drawn by `python benchmarks/study.py report screens/handmade` from the "
        "study's 2 result files (`benchmarks/results/screens/handmade/`, its table's rows), run "
        "at commits abc1234, def5678 on these machines: x86_64, 2 cores (CPU model not "
        "recorded); EPYC BF16.\n")


def test_the_pong_logs_figure_must_be_the_one_its_results_file_s_command_drew(tmp_path):
    write_result(tmp_path / learning_tables.PONG_LOGS,
                 "python benchmarks/pong_logs.py a.log --plot plots/runs.png", {})
    assert figure_stamps.pong_logs_figure("plots/runs.png", tmp_path).startswith(
        "The figure: drawn by the `benchmarks/pong_logs.py` command of the tables above (its "
        "`--plot plots/runs.png`), from the same logs, on Some CPU, 2 cores (AVX2), commit "
        "abc1234.")
    with pytest.raises(ValueError, match="not written by the command that drew plots/other"):
        figure_stamps.pong_logs_figure("plots/other.png", tmp_path)


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
        "500,000 | machine | log |\n" + "|---" * 5 + "|\n"
        "| preset | 398,076 (205) | 17.8 ± 2.7 / 20.8 ± 0.4 | machine not recorded "
        "| `benchmarks/logs/preset.log` |\n"
        "| short | not by step 450,000 | \N{MINUS SIGN}20.0 ± 1.0 / — | machine not recorded "
        "| `benchmarks/logs/preset.log` |\n\nRead from the logs by:\n\n"
        "| command | machine | commit |\n|---|---|---|\n"
        "| `python benchmarks/pong_logs.py ...` " + STAMP_ROW)
    assert render_docs.RENDERERS["pong_means"](tmp_path) == (
        "| at step (100- / 50-episode means) | preset | short |\n|---|---|---|\n"
        "| 100,000 | \N{MINUS SIGN}18.0 / \N{MINUS SIGN}17.1 | \N{MINUS SIGN}18.0 / "
        "\N{MINUS SIGN}17.1 |\n| 600,000 | — / — | — / — |\n")
X = benchmark_tables.TIMES
DASH = timing.DASH
MACHINE = {"cpu": "Some CPU", "architecture": "x86_64", "cores": 2, "cpu_features": ["AVX2"],
           "gpus": []}


def write_bench(results: Path, script: str, when: str, measured: dict, command: str = "",
                commit: str = "abc1234") -> None:
    """A benchmark's results file with made-up numbers and a stamp, named by its UTC time."""
    path = results / script / f"{when}.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps({
        "command": command or f"python benchmarks/{script}.py", "commit": commit,
        "uncommitted_changes": False, "date": "2026-11-28T06:00:00+00:00", "machine": MACHINE,
        "backend": "tensorflow", "versions": {}, "results": measured, "timed_alone": {
            "load_average_before": [0.5, 0.0, 0.0], "load_average_after": [2.0, 0.0, 0.0]}}))


LOAD = "load average 0.5 before, 2.0 after"  # in a line that names the machine and its cores
LOAD_CELL = f"{LOAD}, 2 cores"  # in a table's own column


def test_a_speed_table_renders_from_the_newest_file_with_its_stamp_under_it(tmp_path):
    times = {"PER.py": 10.0, "tutorial loop": 200.0, "cpprb": 20.0}
    write_bench(tmp_path, "bench_per", "20261127T000000Z", {
        "capacity": 1024, "repeats": 5, "cpprb": "11.0.0", "microseconds": {"store": times}},
        commit="old0000")
    write_bench(tmp_path, "bench_per", "20261128T000000Z", {
        "capacity": 1024, "rounds": 3, "cpprb": "11.0.0",
        "microseconds": {"store": {"PER.py": [5.0, 4.0, 6.0],
                                   "tutorial loop": [200.0, 190.0, 210.0],
                                   "cpprb": [20.0, 19.0, 21.0]},
                         "sample(32)": {"PER.py": [40.0, 30.0, 50.0],
                                        "tutorial loop": [400.0, 390.0, 410.0],
                                        "cpprb": [45.0, 20.0, 60.0]}}})
    assert render_docs.RENDERERS["bench_per"](tmp_path) == (
        "| operation | PER.py µs | tutorial loop µs | speed-up | cpprb µs | PER.py / cpprb |\n"
        "|---|---|---|---|---|---|\n"
        f"| store | 5.0 (4.0{DASH}6.0) | 200.0 (190.0{DASH}210.0) | 40.0{X} (ranges apart) "
        f"| 20.0 (19.0{DASH}21.0) | 0.25{X} (ranges apart) |\n"
        f"| sample(32) | 40.0 (30.0{DASH}50.0) | 400.0 (390.0{DASH}410.0) | 10.0{X} (ranges apart) "
        f"| 45.0 (20.0{DASH}60.0) | no clear difference (ranges overlap; medians 0.89{X}) |\n"
        f"\nCapacity 1,024, 3 timed runs each; cpprb 11.0.0; {LOAD}. "
        "`python benchmarks/bench_per.py` on Some CPU, 2 cores (AVX2), commit abc1234, "
        "2026-11-28.\n")


def test_a_file_of_one_value_per_figure_renders_marked_as_one_round(tmp_path):
    write_bench(tmp_path, "bench_per", "20261127T000000Z", {
        "capacity": 1024, "repeats": 5, "cpprb": None,
        "microseconds": {"store": {"PER.py": 10.0, "tutorial loop": 200.0}}})
    assert render_docs.RENDERERS["bench_per"](tmp_path).splitlines()[2] == (
        f"| store | 10.0 (1 round) | 200.0 (1 round) | 20.0{X} (1 round: no range to compare) |")


def test_a_game_s_table_takes_the_newest_file_of_that_game(tmp_path):
    def bench_atari(seconds: float) -> dict:  # two rounds, the second twice as slow
        rounds = [seconds, 2 * seconds]
        parts = {"act": {"seconds": rounds, "calls": 1000},
                 "train": {"seconds": [2 * value for value in rounds], "calls": 500}}
        return {"steps_per_second": [1000 / (4 * value) for value in rounds], "steps": 1000,
                "wall_seconds": [4 * value for value in rounds], "parts": parts}

    write_bench(tmp_path, "bench_atari", "20261128T000000Z", {
        "env_name": "CartPole-v1", "before_commit": "538808e", "before": bench_atari(2.0),
        "now": bench_atari(1.0)}, command="python benchmarks/bench_atari.py --x")
    write_bench(tmp_path, "bench_atari", "20261128T010000Z", {  # newer, but Pong
        "env_name": "PongNoFrameskip-v4", "before_commit": "none", "now": bench_atari(9.0)})
    assert render_docs.RENDERERS["bench_atari_cartpole"](tmp_path) == (
        "| part | µs per agent step, 538808e (before the fast path) | µs per agent step, abc1234 "
        "| share of the time (medians), abc1234 |\n|---|---|---|---|\n"
        f"| act | 3,000 (2,000{DASH}4,000) | 1,500 (1,000{DASH}2,000) | 25% |\n"
        f"| train | 6,000 (4,000{DASH}8,000) | 3,000 (2,000{DASH}4,000) | 50% |\n"
        f"| the rest (loop, episode lines) | 3,000 (2,000{DASH}4,000) "
        f"| 1,500 (1,000{DASH}2,000) | 25% |\n"
        f"| **total** | **12,000 (8,000{DASH}16,000)** | **6,000 (4,000{DASH}8,000)** | 100% |\n"
        f"| agent steps/s | 93.8 (62.5{DASH}125) | 188 (125{DASH}250) |  |\n"
        # the ranges touch at 125 steps/s: no clear difference
        "\nCartPole, 1,000 timed agent steps; now / before no clear difference (ranges "
        f"overlap; medians 2.00{X}); {LOAD}. "
        "`python benchmarks/bench_atari.py --x` on Some CPU, 2 cores (AVX2), commit "
        "abc1234, 2026-11-28.\n")
    pong = benchmark_tables.bench_atari("PongNoFrameskip-v4", tmp_path).splitlines()
    assert pong[0] == ("| part | µs per agent step, abc1234 "
                       "| share of the time (medians), abc1234 |")
    assert pong[-1].startswith(f"Pong, 1,000 timed agent steps; {LOAD}.")
    with pytest.raises(ValueError, match=r"no results of benchmarks/bench_atari\.py with env_name "
                                         "MinAtar/Breakout-v1"):
        benchmark_tables.bench_atari("MinAtar/Breakout-v1", tmp_path)


def test_a_table_of_several_files_gives_each_row_its_stamp_and_a_failed_backend(tmp_path):
    write_bench(tmp_path, "bench_backends", "20261128T000000Z", {
        "env_name": "PongNoFrameskip-v4", "backends": {
            "tensorflow": {"device": "cpu", "step_ms": {"1": [10.0, 11.0, 9.0], "16": 9.0},
                           "act_ms": 0.5, "act_after_step_ms": 0.75},
            "jax": {"failed": "ImportError: no jax"}}})
    write_bench(tmp_path, "bench_backends", "20261128T010000Z", {
        "env_name": "CartPole-v1", "backends": {
            "tensorflow": {"device": "cpu", "step_ms": {"1": 1.0, "16": 0.5}, "act_ms": 0.01,
                           "act_after_step_ms": 0.02}}},
        command="python benchmarks/bench_backends.py --env-name CartPole-v1", commit="def5678")
    table = benchmark_tables.bench_backends(["PongNoFrameskip-v4", "CartPole-v1"], tmp_path)
    assert table.splitlines() == [
        "| game | backend | device | ms per step, 1 per call | ms per step, 16 per call "
        "| ms per greedy action | … right after a step | load | command | machine | commit |",
        "|---" * 11 + "|",
        f"| Pong | tensorflow | cpu | 10.00 (9.00{DASH}11.00) | 9.00 (1 round) | 0.50 (1 round) "
        f"| 0.75 (1 round) | {LOAD_CELL} | "
        "`python benchmarks/bench_backends.py` | Some CPU, 2 cores (AVX2) | abc1234 |",
        f"| Pong | jax | failed: ImportError: no jax |  |  |  |  | {LOAD_CELL} | "
        "`python benchmarks/bench_backends.py` | Some CPU, 2 cores (AVX2) | abc1234 |",
        "| CartPole | tensorflow | cpu | 1.00 (1 round) | 0.50 (1 round) | 0.01 (1 round) "
        f"| 0.02 (1 round) | {LOAD_CELL} | "
        "`python benchmarks/bench_backends.py --env-name CartPole-v1` "
        "| Some CPU, 2 cores (AVX2) | def5678 |"]


ONE_PER_CALL = "ours, float32, --gradient-steps-per-call 1"  # bench_vs_sb3.ONE_PER_CALL


def test_ours_against_sb3_is_the_median_of_the_rounds_over_sb3_s_faster_run(tmp_path):
    write_bench(tmp_path, "bench_vs_sb3", "20261128T000000Z", {
        "env_name": "MinAtar/Breakout-v1", "steps": 100, "warmup": 50, "rounds": 3,
        "env_steps_per_second": {"ours, float32": [900.0, 800.0, 1000.0],
                                 ONE_PER_CALL: [300.0, 85.0, 200.0],
                                 "SB3 DQN, 1 thread": [50.0, 50.0, 50.0],
                                 "SB3 DQN, 2 threads": [80.0, 90.0, 70.0]},
        "gradient_steps_per_call": {"ours, float32": 64, ONE_PER_CALL: 1},
        "versions": {"stable_baselines3": "2.9.2", "torch": "2.14.1"}})
    rows = render_docs.RENDERERS["bench_vs_sb3_minatar"](tmp_path).splitlines()
    # Only ours at one gradient step per call, as SB3's train() takes, is set against SB3.
    assert rows[2:7] == [f"| ours, float32 | 900 (800{DASH}1,000) |",
                         f"| ours, float32, `--gradient-steps-per-call 1` | 200 (85.0{DASH}300) |",
                         f"| SB3 DQN, 1 thread | 50.0 (50.0{DASH}50.0) |",
                         f"| SB3 DQN, 2 threads | 80.0 (70.0{DASH}90.0) |",
                         # ours' slowest round overlaps SB3's fastest: no speed-up claimed
                         "| **ours, float32, `--gradient-steps-per-call 1` / SB3's faster** | "
                         f"**no clear difference (ranges overlap; medians 2.50{X})** |"]
    assert rows[8].startswith("MinAtar Breakout, 100 timed env steps each after 50 untimed; "
                              "3 alternating rounds; ours at 64 and 1 gradient steps per "
                              f"compiled call, SB3's DQN at 1 per train(); {LOAD}; "
                              "Stable-Baselines3 2.9.2 on torch 2.14.1. "
                              "`python benchmarks/bench_vs_sb3.py` on Some CPU")


@pytest.mark.parametrize(("block", "env_name", "ratio"), [
    ("bench_vs_sb3_minatar", "MinAtar/Breakout-v1", False),  # the preset's 64 per call
    ("bench_vs_sb3_pong", "PongNoFrameskip-v4", True),  # the preset's 1 per call
])
def test_an_sb3_file_from_before_the_steps_per_call_were_recorded_has_its_preset_s(
        tmp_path, block, env_name, ratio):
    write_bench(tmp_path, "bench_vs_sb3", "20261128T000000Z", {
        "env_name": env_name, "steps": 100, "warmup": 50, "rounds": 3,
        "env_steps_per_second": {"ours, float32": [300.0, 250.0, 200.0],
                                 "SB3 DQN, 1 thread": [50.0, 50.0, 50.0]},
        "versions": {"stable_baselines3": "2.9.2", "torch": "2.14.1"}})
    text = render_docs.RENDERERS[block](tmp_path)
    assert ("| **ours, float32 / SB3's faster** | **5.00" in text) == ratio, text
    steps = "ours at 64 gradient steps per compiled call" if not ratio else (
        "ours at 1 gradient step per compiled call")
    assert f"{steps}, SB3's DQN at 1 per train()" in text
    assert ("no ratio against SB3: this file has no row of ours at 1 gradient step per call "
            "(timed before that row was added)" in text) == (not ratio)


def test_steps_per_call_shows_each_game_s_gain_and_whether_it_clears_the_bar(tmp_path):
    write_bench(tmp_path, "bench_steps_per_call", "20261128T000000Z", {
        "window": 4096, "rounds": 3, "gain_needed": 0.15, "games": {"CartPole-v1": {
            "tensorflow": {"preset": 16, "steps_per_second": {"1": [100.0, 90.0, 110.0],
                                                               "16": [150.0, 160.0, 140.0]}},
            "jax": {"preset": 16, "steps_per_second": {"1": [100.0, 100.0, 100.0],
                                                        "16": [110.0, 114.0, 120.0]}}},
            "Acrobot-v1": {"tensorflow": {"preset": 16, "steps_per_second": {
                "1": [100.0, 90.0, 130.0], "16": [125.0, 150.0, 140.0]}}}}})
    rows = render_docs.RENDERERS["bench_steps_per_call"](tmp_path).splitlines()
    assert rows[2:5] == [f"| CartPole | tensorflow | 16 | 100 (90.0{DASH}110) "
                         f"| 150 (140{DASH}160) | +50% (ranges apart) | yes |",
                         f"| CartPole | jax | 16 | 100 (100{DASH}100) | 114 (110{DASH}120) "
                         "| +14% (ranges apart) | **no** |",
                         # +40% at the medians, but the slowest K round is below 1's fastest
                         f"| Acrobot-v1 | tensorflow | 16 | 100 (90.0{DASH}130) "
                         f"| 140 (125{DASH}150) | no clear difference (ranges overlap; medians "
                         "+40%) | **no** |"]
    assert rows[6].startswith(f"3 alternating windows of 4,096 agent steps each; "
                              f"{LOAD}. `python benchmarks/bench_steps_per_call.py`")


def test_the_backends_ratios_are_tensorflow_over_jax_drawn_only_where_apart(tmp_path):
    def backend(step_1: list[float], step_16: list[float], act: float) -> dict:
        return {"device": "cpu", "step_ms": {"1": step_1, "16": step_16}, "act_ms": act,
                "act_after_step_ms": act}

    write_bench(tmp_path, "bench_backends", "20261128T000000Z", {
        "env_name": "CartPole-v1", "backends": {
            "tensorflow": backend([2.0, 2.1, 1.9], [1.0, 1.2, 0.9], 0.5),
            "jax": backend([1.0, 1.1, 0.9], [1.0, 0.8, 1.1], 0.25)}})
    write_bench(tmp_path, "bench_backends", "20261128T010000Z", {  # no JAX: no row
        "env_name": "PongNoFrameskip-v4", "backends": {
            "tensorflow": backend([9.0], [8.0], 1.0), "jax": {"failed": "ImportError: no jax"}}})
    table = benchmark_tables.bench_backends_ratios(["PongNoFrameskip-v4", "CartPole-v1"],
                                                   tmp_path)
    assert table.splitlines() == [
        "| game | gradient step, 1 per call | gradient step, 16 per call | greedy action |",
        "|---|---|---|---|",
        f"| CartPole | 2.00{X} (ranges apart) | no clear difference (ranges overlap; medians "
        f"1.00{X}) | 2.00{X} (1 round: no range to compare) |"]


def test_pong_s_xla_ratio_is_drawn_only_where_the_ranges_are_apart(tmp_path):
    write_bench(tmp_path, "bench_pong_kernels", "20261128T000000Z", {"gradient_step_seconds": {
        "Conv2D, XLA off": [0.020, 0.021, 0.022], "Conv2D, XLA on": [0.026, 0.025, 0.027]}})
    line = render_docs.RENDERERS["pong_xla"](tmp_path)
    assert line.startswith(f"1.24{X} (ranges apart): ")
    assert line.count(" cores") == 1 and line.endswith(f", {LOAD}.\n"), line
    write_bench(tmp_path, "bench_pong_kernels", "20261128T010000Z", {"gradient_step_seconds": {
        "Conv2D, XLA off": [0.020, 0.021, 0.026], "Conv2D, XLA on": [0.026, 0.025, 0.027]}})
    assert render_docs.RENDERERS["pong_xla"](tmp_path).startswith(
        f"no clear difference (ranges overlap; medians 1.24{X}): ")


def test_a_bad_rounds_count_is_one_error_line(capsys):
    timing.check_rounds(1)
    with pytest.raises(SystemExit) as exit_info:
        timing.check_rounds(0)
    assert exit_info.value.code == 2
    assert capsys.readouterr().err == "error: --rounds must be at least 1, got 0\n"


@pytest.mark.parametrize("name", [name for name in render_docs.RENDERERS
                                  if name.startswith("bench_")])
def test_a_speed_table_without_its_results_file_is_an_error_naming_the_script(name, tmp_path):
    script = "bench_" + name.removeprefix("bench_").split("_")[0]
    with pytest.raises(ValueError, match=f"no results of benchmarks/{script}"):
        render_docs.RENDERERS[name](tmp_path)


def test_one_quantity_sets_each_script_s_figure_side_by_side_per_gradient_step(tmp_path):
    def loop(per_call: int | None) -> dict:
        now = {"steps_per_second": 500.0, "steps": 1000, "wall_seconds": 2.0, "parts": {
            "env step": {"seconds": 0.1, "calls": 1000}, "act": {"seconds": 0.5, "calls": 1000},
            "train": {"seconds": 1.2, "calls": 50}}}
        return now if per_call is None else {**now, "gradient_steps_per_call": per_call}

    games = (("CartPole-v1", 16, "0"), ("PongNoFrameskip-v4", 1, "1"),
             ("MinAtar/Breakout-v1", None, "2"))
    for game, per_call, when in games:
        write_bench(tmp_path, "bench_atari", f"20261128T00000{when}Z",
                    {"env_name": game, "before_commit": "none", "now": loop(per_call),
                     "bfloat16": False})
        write_bench(tmp_path, "bench_backends", f"20261128T00000{when}Z", {
            "env_name": game, "backends": {"tensorflow": {
                "device": "cpu", "step_ms": {"1": 2.0, "16": 1.5}, "act_ms": 0.5,
                "act_after_step_ms": 1.0}}})
        write_bench(tmp_path, "bench_vs_sb3", f"20261128T00000{when}Z", {
            "env_name": game, "env_steps_per_second": {"ours, float32": [60.0, 70.0]}})
    write_bench(tmp_path, "default_run", "20261128T000000Z", {"training_steps_per_second": 450})
    write_bench(tmp_path, "bench_tensorboard", "20261128T000000Z", {
        "total_steps": 3000, "seconds_per_env_step": {"no TensorBoard": [0.004, 0.005, 0.002]},
        "sample_128_microseconds": {"without replay statistics": 30.0}})
    write_bench(tmp_path, "bench_apex", "20261128T000000Z", {"costs_seconds": {
        "learner_update": 0.002, "actor_step": 0.0003, "replay_sample": 0.0001}})
    preset = {"preset": 16, "steps_per_second": {"1": [100.0], "16": [300.0, 600.0, 400.0]}}
    write_bench(tmp_path, "bench_steps_per_call", "20261128T000000Z", {"games": {
        "CartPole-v1": {"tensorflow": preset}, "MinAtar/Breakout-v1": {"tensorflow": preset}}})
    write_bench(tmp_path, "bench_pong_kernels", "20261128T000000Z", {
        "gradient_step_seconds": {"Conv2D, XLA off": 0.025},
        "greedy_action_seconds": {"compiled by XLA (acting's)": 0.0008}})
    figures = [tuple(row.split(" | ")[i] for i in (0, 1, 3)) for row in
               render_docs.RENDERERS["one_quantity"](tmp_path).splitlines()[2:-2]]
    # A gradient step in the loop: the train part's seconds over calls x steps per call.
    # One value per figure is one round; the fake files' lists give ranges.
    assert figures == [
        ("| CartPole", "agent steps/s", "450 (1 round)"),
        ("| CartPole", "agent steps/s", "500 (1 round)"),
        ("| CartPole", "agent steps/s", f"250 (200{DASH}500)"),
        ("| CartPole", "agent steps/s", f"400 (300{DASH}600)"),
        ("| CartPole", "ms per gradient step", "1.50 (1 round)"),
        ("| CartPole", "ms per gradient step", "1.50 (1 round)"),
        ("| CartPole", "ms per gradient step", "2.00 (1 round)"),
        ("| CartPole", "ms per gradient step", "2.00 (1 round)"),
        ("| CartPole", "ms per env step and action", "0.600 (1 round)"),
        ("| CartPole", "ms per env step and action", "0.300 (1 round)"),
        ("| CartPole", "µs per draw of 128", "30.0 (1 round)"),
        ("| CartPole", "µs per draw of 128", "100.0 (1 round)"),
        ("| MinAtar Breakout", "agent steps/s", "500 (1 round)"),
        ("| MinAtar Breakout", "agent steps/s", f"65.0 (60.0{DASH}70.0)"),
        ("| MinAtar Breakout", "agent steps/s", f"400 (300{DASH}600)"),
        ("| Pong", "agent steps/s", "500 (1 round)"),
        ("| Pong", "agent steps/s", f"65.0 (60.0{DASH}70.0)"),
        ("| Pong", "ms per gradient step", "24.00 (1 round)"),
        ("| Pong", "ms per gradient step", "2.00 (1 round)"),
        ("| Pong", "ms per gradient step", "25.00 (1 round)"),
        ("| Pong", "ms per greedy action", "0.50 (1 round)"),
        ("| Pong", "ms per greedy action", "0.50 (1 round)"),
        ("| Pong", "ms per greedy action", "1.00 (1 round)"),
        ("| Pong", "ms per greedy action", "0.80 (1 round)")]
    write_bench(tmp_path, "bench_atari", "20261128T000009Z",
                {"env_name": "CartPole-v1", "before_commit": "none", "now": loop(None)})
    with pytest.raises(ValueError, match=r"bench_atari/20261128T000009Z\.json does not say its "
                                         "gradient steps per call"):
        render_docs.RENDERERS["one_quantity"](tmp_path)


def n_envs_measured(scale: float, train: list[float]) -> dict:
    """bench_n_envs.py's figures of one N over 3 rounds of 1,000 env steps: every part but train
    takes `scale` times a base round's seconds; train the `train` seconds."""
    def part(seconds: float) -> dict:
        return {"seconds": [scale * seconds * factor for factor in (1.0, 0.8, 1.2)],
                "calls": [100, 100, 100]}

    parts = {"env step": part(0.02), "env reset": part(0.01), "act": part(0.05),
             "store": part(0.01), "sample": part(0.015), "priorities": part(0.005),
             "train": {"seconds": train, "calls": [50, 50, 50]}, "target": part(0.0)}
    walls = [sum(found["seconds"][i] for found in parts.values()) + scale * 0.01 * factor
             for i, factor in enumerate((1.0, 0.8, 1.2))]  # and 0.01 s of "the rest"
    return {"steps": 1000, "wall_seconds": walls, "steps_per_second": [1000 / w for w in walls],
            "gradient_steps_per_call": 1, "parts": parts}


def test_the_many_environments_block_gives_each_n_s_parts_per_env_step_and_its_share(tmp_path):
    write_bench(tmp_path, "bench_n_envs", "20261128T000000Z", {
        "env_name": "MinAtar/Breakout-v1", "n_envs": [1, 8], "steps": 1000, "warmup": 5_120,
        "rounds": 3, "train_frequency": 4, "gradient_steps_per_call": 64, "batch_size": 32,
        "memory_size": 100_000,
        "ours": {"1": n_envs_measured(1.0, [0.21, 0.21, 0.21]),
                 "8": n_envs_measured(0.2, [0.21, 0.21, 0.21])},
        "sb3": {"1": {"env_steps_per_second": [700.0, 650.0, 720.0],
                      "train_freq_and_gradient_steps": [4, 1]},
                "8": {"env_steps_per_second": [900.0, 950.0, 1000.0],
                      "train_freq_and_gradient_steps": [1, 2]}},
        "sb3_threads": 2, "versions": {"stable_baselines3": "2.9.2", "torch": "2.13.0"}},
        command="python benchmarks/bench_n_envs.py")
    lines = render_docs.RENDERERS["n_envs_speed"](tmp_path).splitlines()
    # Outside the gradient step: 0.12 s of 0.33 at N = 1, 0.024 s of 0.234 at N = 8 (round 1).
    assert lines[0] == ("**CartPole**: none at this commit; `python benchmarks/bench_n_envs.py "
                        "--env-name CartPole-v1` measures it.")
    assert lines[2] == ("**MinAtar Breakout**: the gradient step takes 64% and 90% of an env step "
                        "at N = 1 and 8 (medians); the time outside the gradient step per env "
                        f"step, N = 8 over N = 1: 0.20{X} (ranges apart); env steps per second "
                        f"over N = 1: N = 8, 1.41{X} (ranges apart); round by round, N = 8 "
                        f"over N = 1 env steps per second: 1.41{X} (1.34{X}{DASH}1.48{X}); "
                        "were the gradient step "
                        f"free, N = 8 over N = 1 would run 5.0{X} the env steps per second (the "
                        "medians' arithmetic, not a timing).")
    assert lines[4:8] == [
        "| N | env steps/s | environment, µs | reset, µs | action, µs | store, µs "
        "| draw + priorities, µs | learn, µs | outside the gradient step, µs "
        "| SB3 DQN, env steps/s |", "|---" * 10 + "|",
        f"| 1 | 3,030 (2,825{DASH}3,268) | 20 (16{DASH}24) | 10 (8{DASH}12) | 50 (40{DASH}60) "
        f"| 10 (8{DASH}12) | 20 (16{DASH}24) | 210 (210{DASH}210) | 120 (96{DASH}144) "
        f"| 700 (650{DASH}720) |",
        f"| 8 | 4,274 (4,188{DASH}4,363) | 4 (3{DASH}5) | 2 (2{DASH}2) | 10 (8{DASH}12) "
        f"| 2 (2{DASH}2) | 4 (3{DASH}5) | 210 (210{DASH}210) | 24 (19{DASH}29) "
        f"| 950 (900{DASH}1,000) |"]
    assert lines[9] == (
        "3 alternating rounds of 1,000 timed env steps per N after 5,120 untimed; a gradient "
        "step every 4 env steps, 64 per call, batch 32, memory 100,000, float32 (the script "
        f"sets BFLOAT16 off); {LOAD}; "
        "Stable-Baselines3 2.9.2 on torch 2.13.0, 2 threads, train_freq/gradient_steps 4/1, 1/2 "
        "at N = 1, 8. `python benchmarks/bench_n_envs.py` on Some CPU, 2 cores (AVX2), commit "
        "abc1234, 2026-11-28.")
    assert lines[11].startswith("**Pong**: none at this commit")


def test_the_many_environments_ratio_is_drawn_only_where_the_rounds_are_apart(tmp_path):
    slower = n_envs_measured(0.9, [0.2, 0.2, 0.2])  # outside: 0.108 s, rounds 0.086-0.130
    write_bench(tmp_path, "bench_n_envs", "20261128T000000Z", {
        "env_name": "CartPole-v1", "n_envs": [1, 8], "steps": 1000, "warmup": 1_056,
        "rounds": 3, "train_frequency": 2, "gradient_steps_per_call": 16, "batch_size": 128,
        "memory_size": 50_000, "ours": {"1": n_envs_measured(1.0, [0.2, 0.2, 0.2]),
                                        "8": slower},
        "sb3": None, "sb3_threads": None, "versions": {}})
    lines = benchmark_tables.n_envs_game("CartPole-v1", tmp_path).splitlines()
    assert f"N = 8 over N = 1: no clear difference (ranges overlap; medians 0.90{X});" in lines[0]
    assert "were the gradient step free" not in lines[0]  # no clear change to build on
    # Round by round (factor f = 1, 0.8, 1.2 of the parts, train 0.2 s): walls 0.12 f + 0.2 at
    # N = 1 and 0.108 f + 0.2 at N = 8, so 0.32 / 0.308, 0.296 / 0.2864, 0.344 / 0.3296.
    assert (f"round by round, N = 8 over N = 1 env steps per second: 1.04{X} "
            f"(1.03{X}{DASH}1.04{X})") in lines[0]
    assert "SB3" not in lines[2] and lines[-1].startswith(
        f"3 alternating rounds of 1,000 timed env steps per N after 1,056 untimed; a gradient "
        "step every 2 env steps, 16 per call, batch 128, memory 50,000, float32 (the script "
        f"sets BFLOAT16 off); {LOAD}; Stable-Baselines3 not measured (not installed, or "
        "`--no-sb3`).")


def test_bench_atari_s_tables_take_the_newest_file_of_one_environment(tmp_path):
    def loop(steps_per_second: float) -> dict:
        return {"steps_per_second": [steps_per_second], "steps": 1000, "wall_seconds": [2.0],
                "gradient_steps_per_call": 16,
                "parts": {"train": {"seconds": [1.0], "calls": [10]}}}

    write_bench(tmp_path, "bench_atari", "20261128T000000Z", {  # before --n-envs: one
        "env_name": "CartPole-v1", "before_commit": "none", "now": loop(500.0)})
    write_bench(tmp_path, "bench_atari", "20261128T010000Z", {  # newer, but 8 environments
        "env_name": "CartPole-v1", "n_envs": 8, "before_commit": "none", "now": loop(900.0)})
    rows = benchmark_tables.bench_atari("CartPole-v1", tmp_path).splitlines()
    assert "| agent steps/s | 500 (1 round) |  |" in rows
    write_bench(tmp_path, "bench_atari", "20261128T020000Z", {
        "env_name": "CartPole-v1", "n_envs": 1, "before_commit": "none", "now": loop(700.0)})
    rows = benchmark_tables.bench_atari("CartPole-v1", tmp_path).splitlines()
    assert "| agent steps/s | 700 (1 round) |  |" in rows


def test_same_log_renders_the_newest_check_of_each_command_it_was_run_with(tmp_path):
    folder = tmp_path / "same_log"
    folder.mkdir()

    def check(name: str, before: str, now: str, verdict: str) -> None:
        game = {"lines_now": 12, "verdict": verdict, "first_difference": "line 3:\n-a\n+b"}
        (folder / f"{name}.json").write_text(json.dumps({
            "command": f"python benchmarks/same_log.py --before {before}", "commit": now,
            "date": f"2026-11-{name[:2]}T10:00:00+00:00", "machine": "x86_64, 2 cores",
            "results": {"before": before, "now": now, "games": {"cartpole": game}}}))

    check("01", "aaa1111", "bbb2222", "different")
    check("02", "ccc3333", "ddd4444", "identical")
    check("03", "aaa1111", "eee5555", "identical")  # replaces the first: the same command
    assert benchmark_tables.same_log(tmp_path) == (
        "Between commits aaa1111 and eee5555: identical logs for cartpole (12 lines).\n\n"
        "`python benchmarks/same_log.py --before aaa1111` on x86_64, 2 cores (CPU model not "
        "recorded), commit eee5555, 2026-11-03.\n\n"
        "Between commits ccc3333 and ddd4444: identical logs for cartpole (12 lines).\n\n"
        "`python benchmarks/same_log.py --before ccc3333` on x86_64, 2 cores (CPU model not "
        "recorded), commit ddd4444, 2026-11-02.\n")


def test_the_replay_bytes_table_sets_each_n_beside_one_environment(tmp_path):
    def held(bytes_per_transition: float, lengths: list[int], full: bool = True) -> dict:
        return {"storage_bytes": 0, "transitions_held": 0, "episode_lengths": lengths,
                "bytes_per_transition": bytes_per_transition, "every_ring_full": full}

    pong = {"by_n_envs": {"1": held(7_000.0, [900, 1_000]), "8": held(7_140.0, [950])},
            "stack_bytes": 28_224, "pair_bytes": {"uint8 state + next_state": 56_461}}
    write_bench(tmp_path, "bench_replay_memory_bytes", "20261128T000000Z", {
        "capacity": 3_000, "steps": 24_000, "seed": 0, "sum_tree_bytes": 99_000,
        "games": {"PongNoFrameskip-v4": pong}})
    lines = benchmark_tables.bench_replay_memory_bytes(tmp_path).splitlines()
    assert lines[2:5] == [
        f"| PongNoFrameskip-v4 | FrameStackStorage, 1 environment | 7,000 | 7.0 | 1.00{X} |",
        # N rings cost a fixed few slots each, not a share: no million-transition figure
        f"| PongNoFrameskip-v4 | FrameStackStorage, 8 environments | 7,140 | — | 1.02{X} |",
        f"| PongNoFrameskip-v4 | uint8 state + next_state | 56,461 | 56.5 | 8.1{X} |"]
    assert lines[6].startswith(
        "A 3,000-slot storage in N streams after 24,000 random-policy env steps of N environments "
        "stepped in turn, every ring full; random-policy episodes that ended: PongNoFrameskip-v4 "
        "2 (950 steps on average) at N = 1 and 1 (950 steps on average) at N = 8; `PER.Memory`'s "
        "sum and min trees add 33.0 bytes per slot")
    pong["by_n_envs"]["8"]["every_ring_full"] = False
    del pong["by_n_envs"]["1"]["episode_lengths"][:]
    write_bench(tmp_path, "bench_replay_memory_bytes", "20261128T000000Z", {
        "capacity": 3_000, "steps": 24_000, "seed": 0, "sum_tree_bytes": 99_000,
        "games": {"PongNoFrameskip-v4": pong}})
    facts = benchmark_tables.bench_replay_memory_bytes(tmp_path).splitlines()[6]
    assert "in turn, not every ring full;" in facts and "PongNoFrameskip-v4 0 at N = 1" in facts
    del pong["by_n_envs"]["1"]
    write_bench(tmp_path, "bench_replay_memory_bytes", "20261128T000000Z", {
        "capacity": 3_000, "steps": 24_000, "seed": 0, "sum_tree_bytes": 99_000,
        "games": {"PongNoFrameskip-v4": pong}})
    with pytest.raises(ValueError, match="PongNoFrameskip-v4 have no run of one environment"):
        benchmark_tables.bench_replay_memory_bytes(tmp_path)
