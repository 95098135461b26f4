"""The benchmarks' tables, rendered from their results files (render_docs.py).

Each renderer takes the results root and picks its script's newest file, or the newest whose
settings match (`newest_results`): bench_atari.py's CartPole or Pong run, bench_backends.py's and
bench_vs_sb3.py's per game. A table from one file gives its command, machine and commit in a
line under it (`stamp_line`); a table from several files, in columns. Each timed figure is shown
as the median of its rounds with their minimum and maximum (`timing.shown`; a file of one value
per figure is marked "1 round"), and each comparison of two figures holds only where their ranges
are apart (`timing.ratio`, `timing.change`).
"""

from __future__ import annotations

import json
import math
import re
import statistics
from pathlib import Path
from typing import Any

from benchmarks import provenance, timing
from benchmarks.markdown_table import format_row
from benchmarks.timing import Spread, spread

ROOT = Path(__file__).resolve().parent.parent
GAMES = {"PongNoFrameskip-v4": "Pong", "MinAtar/Breakout-v1": "MinAtar Breakout",
         "CartPole-v1": "CartPole"}  # a game's name in a table (others: their id)
TIMES = "\N{MULTIPLICATION SIGN}"
# A measured setting's value in a results file written before its script recorded it.
SETTINGS_BEFORE_RECORDED = {"n_envs": 1}
# The gradient steps per compiled call of ours' rows in bench_vs_sb3.py's files from before it
# recorded them: each game's preset (MinAtar's shares a call among 64; SB3's DQN takes 1).
VS_SB3_STEPS_PER_CALL_BEFORE_RECORDED = {"MinAtar/Breakout-v1": 64, "PongNoFrameskip-v4": 1}


def newest_results(results: Path, script: str, command: str | None = None, **settings: Any
                   ) -> dict[str, Any]:
    """The newest results file of `script` (benchmarks/<script>.py, or a program at the root)
    under `results` (its files are named by their UTC time), of `command` where given, whose
    measured settings ("results" fields) equal `settings`."""
    return newest_results_file(results, script, command, **settings)[1]


def newest_results_file(results: Path, script: str, command: str | None = None,
                        **settings: Any) -> tuple[Path, dict[str, Any]]:
    """`newest_results`' file and what it holds (its "file" says which one, for messages)."""
    found = newest_matching(results, script, command, **settings)
    if found is not None:
        return found
    wanted = ", ".join(f"{name} {value}" for name, value in settings.items())
    where = results.resolve()
    where = where.relative_to(ROOT) if where.is_relative_to(ROOT) else where
    source = f"benchmarks/{script}.py" if (ROOT / "benchmarks" / f"{script}.py").exists() else (
        f"{script}.py")
    raise ValueError(f"no results of {source}{' with ' + wanted if wanted else ''}"
                     f"{f' by `{command}`' if command else ''} in {where.as_posix()}")


def newest_matching(results: Path, script: str, command: str | None = None, **settings: Any
                    ) -> tuple[Path, dict[str, Any]] | None:
    """`newest_results_file`'s file and what it holds, or None where no file matches (a setting
    missing from an older file counts as SETTINGS_BEFORE_RECORDED's value)."""
    for path in sorted((results / script).glob("*.json"), reverse=True):
        run = {**json.loads(path.read_text()), "file": f"{script}/{path.name}"}
        if (command is None or run["command"] == command) and all(
                run["results"].get(name, SETTINGS_BEFORE_RECORDED.get(name)) == value
                for name, value in settings.items()):
            return path, run
    return None


def markdown_table(header: list[str], rows: list[list[str]]) -> str:
    """A markdown table, each line ending in a newline."""
    lines = [format_row(header), "|---" * len(header) + "|", *map(format_row, rows)]
    return "\n".join(lines) + "\n"


def stamp_line(run: dict[str, Any], *facts: str) -> str:
    """The line under a table from one results file: what else it measured (`facts`), then the
    command, machine, commit and date that its stamp gives."""
    measured = "; ".join(facts) + ". " if facts else ""
    measured = measured[:1].upper() + measured[1:]
    return (f"\n{measured}`{run['command']}` on {provenance.machine_label(run)}, commit "
            f"{provenance.commit_label(run)}, {run['date'][:10]}.\n")


def stamp_cells(run: dict[str, Any]) -> list[str]:
    """A row's command, machine and commit columns."""
    return [f"`{run['command']}`", provenance.machine_label(run), provenance.commit_label(run)]


def load(run: dict[str, Any], cores: bool = True) -> str:
    """The load a timing was taken under (`provenance.load_label`: refused if the machine was
    busy); without the core count (`cores` False) in a line that names the machine, whose label
    holds it."""
    return provenance.load_label(run, f"results file {run['file']}", cores)


def bench_per(results: Path) -> str:
    """Microseconds per replay-memory operation: PER.py, the tutorial's loops, cpprb."""
    run = newest_results(results, "bench_per")
    found = run["results"]
    cpprb = found["cpprb"] is not None
    header = ["operation", "PER.py µs", "tutorial loop µs", "speed-up",
              *(["cpprb µs", "PER.py / cpprb"] if cpprb else [])]
    rows = []
    for operation, times in found["microseconds"].items():
        ours, loop = spread(times["PER.py"]), spread(times["tutorial loop"])
        theirs = spread(times["cpprb"]) if cpprb else None
        rows.append([operation, timed(ours, "{:.1f}"), timed(loop, "{:.1f}"),
                     timing.ratio(loop, ours, 1),
                     *([timed(theirs, "{:.1f}"), timing.ratio(ours, theirs)] if theirs else [])])
    each = (f"{found['rounds']} timed runs each" if "rounds" in found
            else f"median of {found['repeats']} timed runs each")
    facts = [f"capacity {found['capacity']:,}, {each}",
             *([f"cpprb {found['cpprb']}"] if cpprb else []), load(run, cores=False)]
    return markdown_table(header, rows) + stamp_line(run, *facts)


def timed(figure: Spread, form: str, unit: str = "") -> str:
    """A timed figure's cell: `form` (a format string) for its median, minimum and maximum,
    `unit` after the median."""
    return timing.shown(figure, form.format, unit)


def round_values(values: float | list[float]) -> list[float]:
    """A figure's rounds: the list a results file holds, or an older file's one value."""
    return [values] if isinstance(values, int | float) else list(values)


def loop_seconds(measured: dict[str, Any], part: str | None = None) -> list[float]:
    """bench_atari.py's seconds per round of one part of the loop, or of the whole loop
    ("wall_seconds") where `part` is None."""
    return round_values(measured["wall_seconds"] if part is None
                        else measured["parts"][part]["seconds"])


def seconds_per_call(part: dict[str, Any]) -> list[float]:
    """bench_atari.py's seconds per call of one part of the loop in each round (an older file's
    one round: one count of calls)."""
    seconds = round_values(part["seconds"])
    calls = part["calls"] if isinstance(part["calls"], list) else [part["calls"]] * len(seconds)
    return [value / count for value, count in zip(seconds, calls, strict=True)]


def bench_atari(env_name: str, results: Path) -> str:
    """Microseconds per agent step of each part of the loop, before the fast path and now."""
    run = newest_results(results, "bench_atari", env_name=env_name, n_envs=1)
    found = run["results"]
    variants = [name for name in ("before", "now") if name in found]
    commits = {"before": f"{found.get('before_commit')} (before the fast path)",
               "now": provenance.commit_label(run)}
    header = ["part", *(f"µs per agent step, {commits[name]}" for name in variants),
              f"share of the time (medians), {run['commit']}"]
    now = found["now"]
    parts = list(now["parts"])

    def per_step(name: str, seconds: list[float]) -> Spread:
        return spread(seconds).scaled(1e6 / found[name]["steps"])

    def other(name: str) -> list[float]:
        return [wall - sum(in_parts) for wall, *in_parts in zip(
            loop_seconds(found[name]), *(loop_seconds(found[name], part)
                                         for part in found[name]["parts"]), strict=True)]

    def share(seconds: list[float]) -> str:
        return f"{100 * spread(seconds).median / spread(loop_seconds(now)).median:.0f}%"

    rows = [[part, *(timed(per_step(name, loop_seconds(found[name], part)), "{:,.0f}")
                     for name in variants), share(loop_seconds(now, part))] for part in parts]
    rows.append(["the rest (loop, episode lines)",
                 *(timed(per_step(name, other(name)), "{:,.0f}") for name in variants),
                 share(other("now"))])
    rows.append(["**total**", *(f"**{timed(per_step(name, loop_seconds(found[name])), '{:,.0f}')}**"
                                for name in variants), "100%"])
    rows.append(["agent steps/s", *(timing.shown(spread(found[name]["steps_per_second"]), rate)
                                    for name in variants), ""])
    facts = [f"{GAMES.get(env_name, env_name)}, {now['steps']:,} timed agent steps"
             + (f" in each of {found['rounds']} rounds" if "rounds" in found else ""),
             load(run, cores=False)]
    if "before" in found:
        facts.insert(1, "now / before " + timing.ratio(spread(now["steps_per_second"]),
                                                       spread(found["before"]["steps_per_second"])))
    if "replay_memory" in now:  # an image game's: measured from the memory's own arrays
        if "bfloat16" in found:  # files before the flag: the preset's choice, not recorded
            facts.insert(1, precision(found))
        memory = now["replay_memory"]
        facts.append(f"the replay memory {memory['bytes_per_transition']:,.0f} bytes per "
                     f"transition ({memory['slots_per_transition']:.4f} slots per transition)")
    return markdown_table(header, rows) + stamp_line(run, *facts)


def bench_backends(games: list[str], results: Path) -> str:
    """Milliseconds per gradient step and greedy action (back to back, and right after a call
    of gradient steps), per game and backend."""
    rows, steps_per_call = [], None
    for game in games:
        run = newest_results(results, "bench_backends", env_name=game)
        for backend, found in run["results"]["backends"].items():
            if "failed" in found:
                rows.append([GAMES.get(game, game), backend, f"failed: {found['failed']}", "",
                             "", "", "", load(run), *stamp_cells(run)])
                continue
            steps_per_call = steps_per_call or sorted(found["step_ms"], key=int)
            rows.append([GAMES.get(game, game), backend, found["device"],
                         *(timed(spread(found["step_ms"][steps]), "{:.2f}")
                           for steps in steps_per_call),
                         timed(spread(found["act_ms"]), "{:.2f}"),
                         timed(spread(found["act_after_step_ms"]), "{:.2f}"), load(run),
                         *stamp_cells(run)])
    header = ["game", "backend", "device",
              *(f"ms per step, {steps} per call" for steps in steps_per_call or ["1", "16"]),
              "ms per greedy action", "… right after a step", "load", "command", "machine",
              "commit"]
    return markdown_table(header, rows)


def bench_backends_ratios(games: list[str], results: Path) -> str:
    """TensorFlow's time over JAX's for each call bench_backends.py times, per game: above 1
    JAX is faster, a comparison drawn only where the rounds' ranges are apart."""
    rows, columns = [], None
    for game in games:
        backends = newest_results(results, "bench_backends", env_name=game)["results"]["backends"]
        tensorflow, jax = backends.get("tensorflow", {}), backends.get("jax", {})
        if not tensorflow or not jax or "failed" in tensorflow or "failed" in jax:
            continue
        columns = columns or sorted(tensorflow["step_ms"], key=int)
        figures = [*((tensorflow["step_ms"][steps], jax["step_ms"][steps]) for steps in columns),
                   (tensorflow["act_ms"], jax["act_ms"])]
        rows.append([GAMES.get(game, game), *(timing.ratio(spread(ours), spread(theirs))
                                              for ours, theirs in figures)])
    header = ["game", *(f"gradient step, {steps} per call" for steps in columns or ["1", "16"]),
              "greedy action"]
    return markdown_table(header, rows)


def speed_per_call(measured: dict[str, Any], steps: int) -> Spread:
    """bench_steps_per_call.py's agent steps/s of one game and backend at `steps` per call, over
    its windows."""
    return spread(measured["steps_per_second"][str(steps)])


def precision(found: dict[str, Any]) -> str:
    """What bench_atari.py's network computed in."""
    return "bfloat16 convolutions" if found.get("bfloat16") else "float32"


def bench_steps_per_call(results: Path) -> str:
    """Agent steps/s at 1 and at the preset's K gradient steps per call, per game and backend,
    and whether the gain keeps K in the preset (a gain holds where the ranges are apart)."""
    run = newest_results(results, "bench_steps_per_call")
    found = run["results"]
    rows = []
    for game, backends in found["games"].items():
        for backend, measured in backends.items():
            preset = measured["preset"]
            one, several = speed_per_call(measured, 1), speed_per_call(measured, preset)
            enough = (several.median / one.median - 1 >= found["gain_needed"]
                      and timing.ranges_apart(one, several))
            rows.append([GAMES.get(game, game), backend, str(preset), timing.shown(one, rate),
                         timing.shown(several, rate), timing.change(several, one),
                         "yes" if enough else "**no**"])
    header = ["game", "backend", "preset's K", "agent steps/s, 1 per call",
              "agent steps/s, K per call", "gain",
              f"at least {found['gain_needed']:.0%}, ranges apart"]
    facts = [f"{found['rounds']} alternating windows of {found['window']:,} agent steps each",
             load(run, cores=False)]
    return markdown_table(header, rows) + stamp_line(run, *facts)


def bench_pong_kernels(results: Path) -> str:
    """Pong's gradient step per torso and XLA setting, and the greedy action per call."""
    run = newest_results(results, "bench_pong_kernels")
    found = run["results"]
    flops, matmul = found["gradient_step_flops"], spread(found["matmul_flops_per_second"])
    steps = markdown_table(
        ["torso", "ms per gradient step", "GFLOP/s (median)",
         "share of the float32 matmul's rate (medians)"],
        [[name, timed(spread(seconds).scaled(1e3), "{:.2f}"),
          f"{flops / spread(seconds).median / 1e9:.0f}",
          f"{flops / spread(seconds).median / matmul.median:.0%}"]
         for name, seconds in found["gradient_step_seconds"].items()])
    actions = markdown_table(["greedy action, one state", "ms"],
                             [[name, timed(spread(seconds).scaled(1e3), "{:.3f}")]
                              for name, seconds in found["greedy_action_seconds"].items()])
    facts = [f"a gradient step (batch {found['batch_size']}) is {flops / 1e9:.2f} GFLOP",
             f"float32 matmul {timed(matmul.scaled(1e-9), '{:.0f}', ' GFLOP/s')}",
             f"each figure over {found['rounds']} alternating rounds, a round's value the median "
             f"of its {found['calls_per_round']} calls"
             + ("" if matmul.rounds > 1 else " (the rounds not kept: one median each)"),
             load(run, cores=False)]
    return steps + "\n" + actions + stamp_line(run, *facts)


def pong_xla(results: Path) -> str:
    """Pong's `Conv2D` gradient step with XLA over without it (bench_pong_kernels.py's rounds),
    a comparison only where the ranges are apart."""
    run = newest_results(results, "bench_pong_kernels")
    seconds = run["results"]["gradient_step_seconds"]
    on, off = spread(seconds["Conv2D, XLA on"]), spread(seconds["Conv2D, XLA off"])
    return (f"{timing.ratio(on, off)}: `{run['command']}` on {provenance.machine_label(run)}, "
            f"commit {provenance.commit_label(run)}, {load(run, cores=False)}.\n")


def rate(per_second: float) -> str:
    """A speed with three significant figures or more: 31.0, 1,772."""
    return f"{per_second:,.1f}" if per_second < 100 else f"{per_second:,.0f}"


def bench_vs_sb3(env_name: str, results: Path) -> str:
    """Env steps/s of ours and of Stable-Baselines3's DQN, side by side in one run; a ratio
    against SB3 only for a row of ours at one gradient step per call, as SB3's train() takes."""
    run = newest_results(results, "bench_vs_sb3", env_name=env_name)
    found = run["results"]
    speeds = {agent: spread(rounds) for agent, rounds in found["env_steps_per_second"].items()}
    ours = [agent for agent in speeds if not agent.startswith("SB3")]
    per_call = found.get("gradient_steps_per_call") or dict.fromkeys(
        ours, VS_SB3_STEPS_PER_CALL_BEFORE_RECORDED[env_name])
    rows = [[flags_as_code(agent), timing.shown(speed, rate)] for agent, speed in speeds.items()]
    sb3 = [speed for agent, speed in speeds.items() if agent.startswith("SB3")]
    like_for_like = [agent for agent in ours if per_call[agent] == 1]
    if sb3:
        fastest = max(sb3, key=lambda speed: speed.median)
        rows += [[f"**{flags_as_code(agent)} / SB3's faster**",
                  f"**{timing.ratio(speeds[agent], fastest)}**"] for agent in like_for_like]
    counts = sorted(set(per_call.values()), reverse=True)
    installed = found["versions"]
    facts = [f"{GAMES.get(env_name, env_name)}, {found['steps']:,} timed env steps each after "
             f"{found['warmup']:,} untimed", f"{found['rounds']} alternating rounds",
             f"ours at {' and '.join(f'{count:,}' for count in counts)} gradient "
             f"step{'s' if counts != [1] else ''} per compiled call"
             + (", SB3's DQN at 1 per train()" if sb3 else ""),
             *(["no ratio against SB3: this file has no row of ours at 1 gradient step per call "
                "(timed before that row was added)"] if sb3 and not like_for_like else []),
             load(run, cores=False),
             *([f"Stable-Baselines3 {installed['stable_baselines3']} on torch "
                f"{installed['torch']}"] if sb3 else [])]
    return markdown_table(["agent", "env steps/s"], rows) + stamp_line(run, *facts)


def flags_as_code(label: str) -> str:
    """A row's label with the flags it names as code: "ours, `--gradient-steps-per-call 1`"."""
    return re.sub(r"(--[a-z0-9-]+ \S+)", r"`\1`", label)


# bench_n_envs.py's columns, per env step: the parts of bench_atari.py's loop each one sums.
N_ENVS_COLUMNS = {"environment": ("env step",), "reset": ("env reset",), "action": ("act",),
                  "store": ("store",), "draw + priorities": ("sample", "priorities"),
                  "learn": ("train",)}
N_ENVS_GAMES = ("CartPole-v1", "MinAtar/Breakout-v1", "PongNoFrameskip-v4")


def not_measured(script: str, env_name: str) -> str:
    """A game's line in a block of `script`'s before it has measured the game."""
    return (f"**{GAMES.get(env_name, env_name)}**: none at this commit; `python "
            f"benchmarks/{script}.py --env-name {env_name}` measures it.\n")


def n_envs_figures(measured: dict[str, Any]) -> dict[str, Spread]:
    """bench_n_envs.py's figures of one N over its rounds: "env steps/s", then µs per env step
    of each of N_ENVS_COLUMNS, "outside the gradient step" (all but learn) and "total"."""
    def per_step(seconds: list[float]) -> Spread:
        return spread(seconds).scaled(1e6 / measured["steps"])

    figures = {"env steps/s": spread(measured["steps_per_second"])}
    for column, parts in N_ENVS_COLUMNS.items():
        figures[column] = per_step([sum(in_parts) for in_parts in zip(
            *(loop_seconds(measured, part) for part in parts), strict=True)])
    walls = loop_seconds(measured)
    figures["outside the gradient step"] = per_step(
        [wall - learn for wall, learn in zip(walls, loop_seconds(measured, "train"), strict=True)])
    figures["total"] = per_step(walls)
    return figures


def n_envs_game(env_name: str, results: Path) -> str:
    """One game's speed at each N from bench_n_envs.py's newest file of it: a sentence with the
    gradient step's share of an env step at each N, the time outside it and the env steps per
    second at each N over the smallest (drawn only where the rounds' ranges are apart), the largest
    N's over the smallest round by round (`timing.paired_ratio`) and,
    where the time outside it clearly changed, what N would buy were the gradient step free;
    then the table. A line naming the command where there is no file."""
    game = GAMES.get(env_name, env_name)
    newest = newest_matching(results, "bench_n_envs", env_name=env_name)
    if newest is None:
        return not_measured("bench_n_envs", env_name)
    _, run = newest
    found = run["results"]
    figures = {n: n_envs_figures(measured) for n, measured in found["ours"].items()}
    smallest, largest = min(figures, key=int), max(figures, key=int)
    first, last = figures[smallest], figures[largest]
    shares = in_words([f"{figure['learn'].median / figure['total'].median:.0%}"
                       for figure in figures.values()])
    outside = "outside the gradient step"
    largest_over_smallest = f"N = {largest} over N = {smallest}"
    sentence = (f"**{game}**: the gradient step takes {shares} of an env step at N = "
                f"{in_words(list(figures))} (medians); the time {outside} per env step, "
                f"{largest_over_smallest}: {timing.ratio(last[outside], first[outside])}; "
                f"env steps per second over N = {smallest}: " + "; ".join(
                    f"N = {n}, {timing.ratio(figure['env steps/s'], first['env steps/s'])}"
                    for n, figure in figures.items() if figure is not first)
                + f"; round by round, {largest_over_smallest} env steps per second: "
                + timing.paired_ratio(found["ours"][largest]["steps_per_second"],
                                      found["ours"][smallest]["steps_per_second"])
                + (f"; were the gradient step free, {largest_over_smallest} would run "
                   f"{first[outside].median / last[outside].median:.1f}{timing.TIMES} the env "
                   "steps per second (the medians' arithmetic, not a timing)"
                   if timing.ranges_apart(first[outside], last[outside]) else "") + ".\n\n")
    sb3 = found["sb3"] or {}
    columns = ["env steps/s", *N_ENVS_COLUMNS, outside]
    header = ["N", "env steps/s", *(f"{column}, µs" for column in columns[1:]),
              *(["SB3 DQN, env steps/s"] if sb3 else [])]
    rows = [[n, timing.shown(figure["env steps/s"], rate),
             *(timed(figure[column], "{:,.0f}") for column in columns[1:]),
             *([timing.shown(spread(sb3[n]["env_steps_per_second"]), rate)] if sb3 else [])]
            for n, figure in figures.items()]
    rounds = found["rounds"]
    facts = [f"{rounds} alternating round{'s' if rounds > 1 else ''} of {found['steps']:,} "
             f"timed env steps per N after {found['warmup']:,} untimed",
             f"a gradient step every {found['train_frequency']} env steps, "
             f"{found['gradient_steps_per_call']} per call, batch {found['batch_size']}, "
             f"memory {found['memory_size']:,}, float32 (the script sets BFLOAT16 off)",
             load(run, cores=False)]
    if sb3:
        installed = found["versions"]
        frequencies = ", ".join(f"{each['train_freq_and_gradient_steps'][0]}/"
                                f"{each['train_freq_and_gradient_steps'][1]}"
                                for each in sb3.values())
        facts.append(f"Stable-Baselines3 {installed['stable_baselines3']} on torch "
                     f"{installed['torch']}, {found['sb3_threads']} threads, train_freq/"
                     f"gradient_steps {frequencies} at N = {', '.join(sb3)}")
    else:
        facts.append("Stable-Baselines3 not measured (not installed, or `--no-sb3`)")
    return sentence + markdown_table(header, rows) + stamp_line(run, *facts)


VECTOR_ENV_GAMES = ("PongNoFrameskip-v4", "MinAtar/Breakout-v1")


def vector_envs_game(env_name: str, results: Path) -> str:
    """One game's env steps per second of each way of stepping N environments, from
    bench_vector_envs.py's newest file of it, and for Atari what its frame check found; or a
    line naming the command where there is no file."""
    newest = newest_matching(results, "bench_vector_envs", env_name=env_name)
    if newest is None:
        return not_measured("bench_vector_envs", env_name)
    _, run = newest
    found = run["results"]
    speeds = found["env_steps_per_second"]
    rows = [[kind, *(timing.shown(spread(by_n[str(n)]), rate) for n in found["n_envs"])]
            for kind, by_n in speeds.items()]
    header = ["stepper", *(f"N = {n}, env steps/s" for n in found["n_envs"])]
    rounds = found["rounds"]
    facts = [f"{rounds} alternating round{'s' if rounds > 1 else ''} of {found['steps']:,} env "
             "steps per stepper and N, random actions, the environments alone",
             load(run, cores=False)]
    table = markdown_table(header, rows) + stamp_line(run, *facts)
    frames = frame_check(found["frames"]) if "frames" in found else ""
    return f"**{GAMES.get(env_name, env_name)}**\n\n{table}{frames}"


def frame_check(frames: dict[str, Any]) -> str:
    """bench_vector_envs.py's frame check in sentences: under which reset settings ale-py's
    AtariVectorEnv gave gymnasium's AtariPreprocessing frames, and how each starts a stack."""
    def reset(setting: dict[str, Any]) -> str:
        noops = (f"up to {setting['noop_max']} random no-ops" if setting["noop_max"]
                 else "no random no-ops")
        return f"{noops} and {'FIRE' if setting['fire_on_reset'] else 'no FIRE'} on reset"

    def outcome(setting: dict[str, Any]) -> str:
        steps = setting["first_difference"]
        if all(step is None for step in steps):
            return f"equal to the last pixel at every step, from every seed ({reset(setting)})"
        shown = ", ".join("none" if step is None else "the reset" if step == 0 else f"step {step}"
                          for step in steps)
        return f"first differing at {shown} ({reset(setting)})"

    seeds = in_words([str(seed) for seed in frames["seeds"]])
    sentences = [f"\nFrames, ale-py's AtariVectorEnv against gymnasium's AtariPreprocessing, "
                 f"reset with the same seed ({seeds}) and stepped with the same random actions, "
                 f"up to {frames['steps']} steps or the first episode's end, newest frame "
                 "against newest frame: "
                 + "; ".join(outcome(setting) for setting in frames["settings"]) + "."]
    repeats = frames["agent_first_stack_repeats_first_frame"]
    blank = frames["ale_first_stack_older_frames_blank"]
    agent = "repeats its first frame" if repeats else "does not repeat its first frame"
    sentences.append(f"The first episode's first stack: the agent's {agent}; AtariVectorEnv's "
                     f"older frames {'are blank (zeros)' if blank else 'are not blank'}.\n")
    return " ".join(sentences)


def vector_envs(results: Path) -> str:
    """bench_vector_envs.py's speeds (and frame check), game after game."""
    return "\n".join(vector_envs_game(env_name, results) for env_name in VECTOR_ENV_GAMES)


def in_words(items: list[str]) -> str:
    """"a", "a and b", "a, b and c"."""
    return " and ".join(filter(None, [", ".join(items[:-1]), items[-1]]))


def n_envs_speed(results: Path) -> str:
    """bench_n_envs.py's speed at each N, game after game (`n_envs_game`)."""
    return "\n".join(n_envs_game(env_name, results) for env_name in N_ENVS_GAMES)


def bench_tensorboard(results: Path) -> str:
    """Milliseconds per CartPole env step with and without TensorBoard, and what the replay
    statistics add to a sample."""
    run = newest_results(results, "bench_tensorboard")
    found = run["results"]
    figures = {label: spread(values) for label, values in found["seconds_per_env_step"].items()}
    base = figures["no TensorBoard"]
    rows = [[f"`{label}`" if label.startswith("--") else label,
             timed(figure.scaled(1e3), "{:.3f}"),
             "" if figure is base else timing.change(figure, base, 1)]
            for label, figure in figures.items()]
    sample = {label: spread(values) for label, values in found["sample_128_microseconds"].items()}
    facts = [f"{found['total_steps']:,}-step CartPole runs",
             "`Memory.sample(128)` on a full 50,000-slot memory "
             f"{timed(sample['without replay statistics'], '{:.1f}', ' µs')} without the replay "
             f"statistics, {timed(sample['with replay statistics'], '{:.1f}', ' µs')} with them",
             load(run, cores=False)]
    rounds = found.get("rounds", found.get("repeats"))
    return markdown_table(["variant", f"ms per env step ({rounds} runs)",
                           "against no TensorBoard"], rows) + stamp_line(run, *facts)


def bench_replay_memory_bytes(results: Path) -> str:
    """Bytes per transition held on real Pong and MinAtar frames, with one environment and with
    N (each its own stream), and of whole stacks stored twice. A million transitions only where
    one environment's rate scales: N rings add a fixed few slots each, not a share."""
    run = newest_results(results, "bench_replay_memory_bytes")
    found = run["results"]
    rows, episodes, full = [], [], []
    for env_id, game in found["games"].items():
        by_n = game["by_n_envs"]
        if "1" not in by_n:
            raise ValueError(f"the newest bench_replay_memory_bytes.py results of {env_id} have "
                             "no run of one environment to compare with (--n-envs 1 ...)")
        one = by_n["1"]["bytes_per_transition"]
        ended = []
        for n, held in by_n.items():
            size = held["bytes_per_transition"]
            rows.append([env_id, f"FrameStackStorage, {n} environment{'' if n == '1' else 's'}",
                         f"{size:,.0f}", f"{size * 1e6 / 1e9:.1f}" if n == "1" else "—",
                         f"{size / one:.2f}{timing.TIMES}"])
            lengths = held["episode_lengths"]
            ended.append(f"{len(lengths):,}" + (f" ({statistics.mean(lengths):,.0f} steps on "
                                                  "average)" if lengths else "") + f" at N = {n}")
            full.append(held["every_ring_full"])
        episodes.append(f"{env_id} {' and '.join(ended)}")
        rows += [[env_id, storage, f"{size:,.0f}", f"{size * 1e6 / 1e9:.1f}",
                  f"{size / one:.1f}{timing.TIMES}"]
                 for storage, size in game["pair_bytes"].items()]
    facts = [f"a {found['capacity']:,}-slot storage in N streams after {found['steps']:,} "
             "random-policy env steps of N environments stepped in turn, "
             f"{'every' if all(full) else 'not every'} ring full; random-policy episodes that "
             "ended: " + "; ".join(episodes),
             "`PER.Memory`'s sum and min trees add "
             f"{found['sum_tree_bytes'] / found['capacity']:.1f} bytes per slot at this "
             "capacity (two float64 nodes a slot each, and the trees' fixed part)"]
    return markdown_table(["game", "storage", "bytes per transition held (sum tree apart)",
                           "a million transitions, GB (arithmetic)",
                           "over FrameStackStorage, 1 environment"],
                          rows) + stamp_line(run, *facts)


def bench_checkpoint(results: Path) -> str:
    """A checkpoint's files with a full Atari replay, and how long saving and loading took."""
    run = newest_results(results, "bench_checkpoint")
    found = run["results"]
    sizes = found["file_bytes"]
    rows = [[f"`{name}`", f"{size / 1e6:,.1f}"] for name, size in sizes.items()]
    rows.append(["**total**", f"**{sum(sizes.values()) / 1e6:,.1f}**"])
    facts = [f"{found['env_name']}, {found['transitions']:,} transitions in a "
             f"{found['memory_size']:,}-slot replay",
             f"saved in {timed(spread(found['save_seconds']), '{:.1f}', ' s')} "
             f"({found['save_peak_allocated_bytes'] / 1e6:,.0f} MB allocated while saving), "
             f"loaded in {timed(spread(found['load_seconds']), '{:.1f}', ' s')}",
             load(run, cores=False)]
    return markdown_table(["file", "MB"], rows) + stamp_line(run, *facts)


def bench_apex_solved(results: Path) -> str:
    """Seconds from launch to solving CartPole, apex.py against d3qn_agent.py."""
    run = newest_results(results, "bench_apex")
    if "solved_seconds" not in run["results"]:
        raise ValueError("the newest bench_apex.py results file has no CartPole runs")

    def seconds(value: float | None) -> str:
        return "not solved" if value is None else f"{value:.0f}"

    rows = [[str(seed["seed"]), seconds(seed["apex.py"]), seconds(seed["d3qn_agent.py"])]
            for seed in run["results"]["solved_seconds"]]
    return markdown_table(["seed", "`python apex.py` (2 actors), s", "`python d3qn_agent.py`, s"],
                          rows) + stamp_line(run, load(run, cores=False))


def bench_apex_throughput(results: Path) -> str:
    """Env steps/s collected and learner updates/s with 1 and 2 actors, paced and not."""
    run = newest_results(results, "bench_apex")
    found = run["results"]
    rows = [[str(row["actors"]), f"{row['updates_per_step']:g} updates/step"
             if row["updates_per_step"] else "none (flat out)",
             timed(spread(row["env_steps_per_second"]), "{:,.0f}"),
             timed(spread(row["updates_per_second"]), "{:,.0f}")]
            for row in found["throughput"]]
    return markdown_table(["actors", "pacing", "env steps/s collected", "learner updates/s"],
                          rows) + stamp_line(run, f"{found['steps']:,} env steps a run",
                                             load(run, cores=False))


def bench_apex_costs(results: Path) -> str:
    """What each part of Ape-X costs, one operation at a time."""
    run = newest_results(results, "bench_apex")
    costs = run["results"]["costs_seconds"]
    parts = [("actor: env step + greedy action, per transition", "actor_step", "ms"),
             ("actor: TD errors of a block (priorities)", "actor_td_errors_per_block", "ms"),
             ("learner: one update (`learn`)", "learner_update", "ms"),
             (f"replay: `store_block` ({costs['block_transitions']:.0f} transitions + context)",
              "replay_add_block", "µs"),
             ("replay: sample a batch, full replay", "replay_sample", "µs"),
             ("replay: priority update of a batch", "replay_update", "µs"),
             ("Ray: remote call round trip", "remote_call", "µs"),
             (f"Ray: a block to another process ({costs['block_bytes'] / 1e3:.1f} KB)",
              "block_transfer", "µs"),
             (f"Ray: weights published and pulled ({costs['weights_bytes'] / 1e6:.2f} MB)",
              "weights_publish_and_pull", "ms")]
    rows = [[name, timed(spread(costs[key]).scaled(1e3), "{:.3f}", " ms") if unit == "ms"
             else timed(spread(costs[key]).scaled(1e6), "{:.1f}", " µs")]
            for name, key, unit in parts]
    return markdown_table(["part", "cost"], rows) + stamp_line(run, load(run, cores=False))


def bench_apex_projection(results: Path) -> str:
    """The projection of the measured costs to more actors, at two replay ratios."""
    run = newest_results(results, "bench_apex")
    text = []
    for title, rows in run["results"]["projections"].items():
        table = markdown_table(
            ["actors", "actors could collect (steps/s)", "achievable (steps/s)",
             "learner updates/s", "replay actor busy", "object store MB/s", "bottleneck"],
            [[str(row["actors"]), f"{row['demand']:,.0f}", f"{row['rate']:,.0f}",
              f"{row['updates']:,.0f}", f"{100 * row['replay_busy']:.0f}%",
              f"{row['store_mb']:.1f}", row["bottleneck"]] for row in rows])
        last = rows[-1]
        text.append(f"Projected (arithmetic on the measured medians, not measured), at {title}:"
                    f"\n\n{table}\nAt {last['actors']} actors: "
                    f"{math.ceil(last['demand'] / last['replay_limit']):,} replay actors' and "
                    f"{math.ceil(last['demand'] / last['learner_limit']):,} learners' worth of "
                    "work "
                    f"would keep up (one replay actor serves {last['replay_limit']:,.0f} env "
                    f"steps/s, one learner {last['learner_limit']:,.0f}).\n")
    return "\n".join(text) + stamp_line(run, "arithmetic from the costs above")


def one_quantity(results: Path) -> str:
    """CartPole's, MinAtar's and Pong's agent step, gradient step, greedy action and draw as
    each script measures them, with what each one's run differs in: the figures of one quantity
    side by side."""
    rows, machines = [], []

    def row(game: str, quantity: str, run: dict[str, Any], figure: str, runs: str) -> None:
        rows.append([game, quantity, f"`{run['command']}`", figure, runs, load(run),
                     provenance.commit_label(run)])
        machines.append(provenance.machine_label(run))

    def loop(env_name: str) -> tuple[dict[str, Any], dict[str, Any]]:
        run = newest_results(results, "bench_atari", env_name=env_name, n_envs=1)
        return run, run["results"]["now"]

    def gradient_step_ms(run: dict[str, Any]) -> Spread:
        now = run["results"]["now"]
        if "gradient_steps_per_call" not in now:
            raise ValueError(f"results file {run['file']} does not say its gradient steps per "
                             f"call: measure it again (python benchmarks/bench_atari.py "
                             f"--env-name {run['results']['env_name']})")
        return spread(seconds_per_call(now["parts"]["train"])).scaled(
            1e3 / now["gradient_steps_per_call"])

    def backends(env_name: str) -> tuple[dict[str, Any], dict[str, Any]]:
        run = newest_results(results, "bench_backends", env_name=env_name)
        return run, run["results"]["backends"]["tensorflow"]

    steps_per_call = newest_results(results, "bench_steps_per_call")

    def per_call(game: str) -> tuple[dict[str, Any], str]:
        measured = steps_per_call["results"]["games"][game]["tensorflow"]
        return steps_per_call, timing.shown(speed_per_call(measured, measured["preset"]), rate)

    stopwatch = "the loop after an untimed warm-up, ε at the preset's last value, a stopwatch "
    taking_turns = ("the loop, ε at the preset's last value, no stopwatch, taking turns with an "
                    "agent of one gradient step per call")
    # CartPole
    default_run = newest_results(results, "default_run")
    cartpole, cartpole_now = loop("CartPole-v1")
    row("CartPole", "agent steps/s", default_run,
        timed(spread(default_run["results"]["training_steps_per_second"]), "{:,.0f}"),
        "the default run less its greedy evaluations: ε falls from 1 (a random action skips the "
        "network), no gradient step before `LEARNING_STARTS`, the first compile")
    row("CartPole", "agent steps/s", cartpole,
        timing.shown(spread(cartpole_now["steps_per_second"]), rate),
        stopwatch + "around each part")
    logging = newest_results(results, "bench_tensorboard")
    per_step = round_values(logging["results"]["seconds_per_env_step"]["no TensorBoard"])
    row("CartPole", "agent steps/s", logging,
        timing.shown(spread([1 / seconds for seconds in per_step]), rate),
        f"whole {logging['results']['total_steps']:,}-step `agent.run()`s of the default flags: "
        "the first compile, the closing greedy evaluation and the plots included, ε falling "
        "from 1 throughout")
    row("CartPole", "agent steps/s", *per_call("CartPole-v1"), taking_turns)
    steps = cartpole_now.get("gradient_steps_per_call")
    row("CartPole", "ms per gradient step", cartpole, timed(gradient_step_ms(cartpole), "{:.2f}"),
        f"`learn` on the memory's draws, {steps} per call, in the loop")
    run, found = backends("CartPole-v1")
    row("CartPole", "ms per gradient step", run,
        timed(spread(found["step_ms"][str(steps)]), "{:.2f}"),
        f"`learn` on random batches from the host, {steps} per call, alone")
    row("CartPole", "ms per gradient step", run, timed(spread(found["step_ms"]["1"]), "{:.2f}"),
        "the same, 1 per call")
    apex = newest_results(results, "bench_apex")
    costs = apex["results"]["costs_seconds"]
    row("CartPole", "ms per gradient step", apex,
        timed(spread(costs["learner_update"]).scaled(1e3), "{:.2f}"),
        "`learn` of apex.py's learner, 1 per call, on a batch its replay drew, after an Ape-X "
        "actor's steps in the same process, with a local Ray up beside it")
    env_and_act = [step + act for step, act in zip(loop_seconds(cartpole_now, "env step"),
                                                   loop_seconds(cartpole_now, "act"), strict=True)]
    row("CartPole", "ms per env step and action", cartpole,
        timed(spread(env_and_act).scaled(1e3 / cartpole_now["steps"]), "{:.3f}"),
        "`env.step` and `act` in the loop")
    row("CartPole", "ms per env step and action", apex,
        timed(spread(costs["actor_step"]).scaled(1e3), "{:.3f}"),
        "an Ape-X actor at ε 0, with a local Ray up beside it: also each transition into its "
        "block and a share of the block's TD-error call (a block ends with every episode)")
    sample = logging["results"]["sample_128_microseconds"]["without replay statistics"]
    row("CartPole", "µs per draw of 128", logging, timed(spread(sample), "{:.1f}"),
        "`Memory.sample(128)`, full 50,000-slot memory, one-step transitions of equal priority")
    row("CartPole", "µs per draw of 128", apex,
        timed(spread(costs["replay_sample"]).scaled(1e6), "{:.1f}"),
        "apex.py's replay, with a local Ray up beside it: a full memory of its blocks, n-step "
        "returns put together per draw")
    # MinAtar
    minatar, minatar_now = loop("MinAtar/Breakout-v1")
    row("MinAtar Breakout", "agent steps/s", minatar,
        timing.shown(spread(minatar_now["steps_per_second"]), rate),
        stopwatch + "around each part")
    sb3 = newest_results(results, "bench_vs_sb3", env_name="MinAtar/Breakout-v1")
    ours = spread(sb3["results"]["env_steps_per_second"]["ours, float32"])
    row("MinAtar Breakout", "agent steps/s", sb3, timing.shown(ours, rate),
        "the loop, ε at the preset's last value, no stopwatch, between Stable-Baselines3's runs")
    row("MinAtar Breakout", "agent steps/s", *per_call("MinAtar/Breakout-v1"), taking_turns)
    # Pong
    pong, pong_now = loop("PongNoFrameskip-v4")
    row("Pong", "agent steps/s", pong, timing.shown(spread(pong_now["steps_per_second"]), rate),
        stopwatch + f"around each part, {precision(pong['results'])}")
    sb3 = newest_results(results, "bench_vs_sb3", env_name="PongNoFrameskip-v4")
    ours = spread(sb3["results"]["env_steps_per_second"]["ours, float32"])
    row("Pong", "agent steps/s", sb3, timing.shown(ours, rate),
        "the same loop and settings, float32, no stopwatch, between Stable-Baselines3's runs")
    row("Pong", "ms per gradient step", pong, timed(gradient_step_ms(pong), "{:.2f}"),
        f"`learn` on the memory's draws, {precision(pong['results'])}, in the loop")
    run, found = backends("PongNoFrameskip-v4")
    row("Pong", "ms per gradient step", run, timed(spread(found["step_ms"]["1"]), "{:.2f}"),
        "`learn` on random batches from the host, float32, alone")
    kernels = newest_results(results, "bench_pong_kernels")
    seconds = kernels["results"]["gradient_step_seconds"]["Conv2D, XLA off"]
    row("Pong", "ms per gradient step", kernels, timed(spread(seconds).scaled(1e3), "{:.2f}"),
        "the same step, float32, in rounds that alternate with other networks' steps")
    row("Pong", "ms per greedy action", pong,
        timed(spread(seconds_per_call(pong_now["parts"]["act"])).scaled(1e3), "{:.2f}"),
        "`act` in the loop: ε-greedy at 0.01, so nearly every call runs the network; one call "
        "in `TRAIN_FREQUENCY` right after a gradient step")
    row("Pong", "ms per greedy action", run, timed(spread(found["act_ms"]), "{:.2f}"),
        "`greedy_actions`, back to back")
    row("Pong", "ms per greedy action", run, timed(spread(found["act_after_step_ms"]), "{:.2f}"),
        "`greedy_actions` right after a call of gradient steps")
    seconds = kernels["results"]["greedy_action_seconds"]["compiled by XLA (acting's)"]
    row("Pong", "ms per greedy action", kernels, timed(spread(seconds).scaled(1e3), "{:.2f}"),
        "the same call, float32, in rounds that alternate with other networks' calls")
    header = ["game", "quantity", "script", "figure", "how its run differs", "load", "commit"]
    if len(set(machines)) == 1:
        return markdown_table(header, rows) + f"\nAll on {machines[0]}.\n"
    return markdown_table([*header, "machine"], [
        [*cells, machine] for cells, machine in zip(rows, machines, strict=True)])


def same_log(results: Path) -> str:
    """Which games' seeded runs logged the same lines, timings left out, on the two commits of
    benchmarks/same_log.py, with its command, machine and commit: the newest file of each
    command it was run with (an earlier commit, games), oldest command first; or that none was
    checked yet."""
    newest: dict[str, dict[str, Any]] = {}  # by command: a later file replaces an earlier one
    for path in sorted((results / "same_log").glob("*.json")):
        run = json.loads(path.read_text())
        newest[run["command"]] = run
    if not newest:
        return ("Not yet checked: no results file of `python benchmarks/same_log.py` under "
                "`benchmarks/results/same_log/`.\n")
    paragraphs = []
    for run in newest.values():
        measured = run["results"]
        games = measured["games"]
        identical = [f"{game} ({each['lines_now']:,} lines)" for game, each in games.items()
                     if each["verdict"] == "identical"]
        different = [f"{game} ({each['first_difference'].splitlines()[0].rstrip(':')})"
                     for game, each in games.items() if each["verdict"] != "identical"]
        said = [f"identical logs for {', '.join(identical)}"] if identical else []
        said += [f"different logs for {', '.join(different)}"] if different else []
        paragraphs.append(f"Between commits {measured['before']} and {measured['now']}: "
                          f"{'; '.join(said)}.\n" + stamp_line(run))
    return "\n".join(paragraphs)
