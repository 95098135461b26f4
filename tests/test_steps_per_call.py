"""GRADIENT_STEPS_PER_CALL earns its place: every game whose preset makes several gradient steps
per compiled call was measured training at least GAIN_NEEDED faster with them than with one
(benchmarks/bench_steps_per_call.py's newest results file, rendered in docs/benchmarks.md), and
the file measured the presets as they are today."""

import statistics

import pytest

import d3qn_agent
from benchmarks import bench_steps_per_call, benchmark_tables
from benchmarks.provenance import RESULTS
from d3qn_utils import settings

MEASURED = benchmark_tables.newest_results(RESULTS, "bench_steps_per_call")["results"]


def steps_per_call(game: str) -> int:
    """GRADIENT_STEPS_PER_CALL as a run of `game` resolves it today."""
    config, _ = settings.resolve(d3qn_agent, settings.D3QN_FLAGS, settings.d3qn_presets,
                                 {"env_name": game})
    return config.gradient_steps_per_call


def test_the_results_cover_every_game_the_script_measures_by_default():
    assert sorted(MEASURED["games"]) == sorted(bench_steps_per_call.GAMES)


@pytest.mark.parametrize("game", bench_steps_per_call.GAMES)
def test_a_preset_keeps_several_steps_per_call_only_where_they_were_measured_faster(game):
    preset = steps_per_call(game)
    for backend, found in MEASURED["games"][game].items():
        assert found["preset"] == preset, f"{game}: measured at {found['preset']}, now {preset}"
        one, several = (statistics.median(found["steps_per_second"][str(steps)])
                        for steps in (1, preset))
        assert preset == 1 or several / one - 1 >= MEASURED["gain_needed"], (game, backend)
