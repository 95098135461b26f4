"""A study's rendered command repeats its runs: resolved by today's flags and presets, on a CPU
with bfloat16 units (bfloat16 timed faster or slower) or without one, it gives every setting that
the runs' result files recorded."""

import json
import shlex

import pytest
from conftest import ROOT

import d3qn_agent
from benchmarks import study
from d3qn_utils import bfloat16_timing, settings


def settings_of(command: str) -> dict:
    """What `command` (a d3qn_agent.py command line) resolves to today, lists for tuples."""
    words = shlex.split(command)
    flags = settings.explicit_flags(words[words.index("d3qn_agent.py") + 1:],
                                    settings.d3qn_parser(d3qn_agent))
    config, _ = settings.resolve(d3qn_agent, settings.D3QN_FLAGS, settings.d3qn_presets, flags)
    return {name: list(value) if isinstance(value, tuple) else value
            for name, value in vars(config).items()}


@pytest.mark.parametrize(("bfloat16_units", "milliseconds"), [
    (None, None), ("AVX512_BF16", (40.0, 60.0)), ("AVX512_BF16", (60.0, 40.0))],
    ids=["no-units", "bfloat16-faster", "bfloat16-slower"])
def test_each_study_row_s_command_resolves_to_the_settings_its_runs_recorded(
        monkeypatch, tmp_path, bfloat16_units, milliseconds):
    monkeypatch.setattr(settings, "native_bfloat16", lambda: bfloat16_units)
    monkeypatch.setattr(bfloat16_timing, "time_gradient_steps", lambda *args: milliseconds)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    # The studies, those of N_ENVS a level down, not screens/.
    files = sorted([*study.RESULTS.glob("*/*/*/seed*.json"),
                    *study.RESULTS.glob("n_envs/*/*/*/seed*.json")])
    assert files and any(path.is_relative_to(study.RESULTS / "n_envs") for path in files)
    for path in files:
        run = json.loads(path.read_text())
        today = settings_of(study.reproducing_command(run))
        differs = {name: (recorded, today[name]) for name, recorded in run["settings"].items()
                   if name in today and today[name] != recorded}
        assert not differs, f"{path.relative_to(ROOT)}: (recorded, today) {differs}"
