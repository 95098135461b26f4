"""Blind Cliffwalk: the PER paper's cleanest evidence that replay order matters.

Reproduces the Blind Cliffwalk experiment of "Prioritized Experience Replay" (Schaul et al.,
ICLR 2016; Section 3, Figures 1 and 2, Appendix B.1) in its tabular form:

- A chain of n states and two actions. In every state one action is "right" and moves on, the
  other is "wrong" and ends the episode with reward 0; the right action in the last state ends the
  episode with reward 1. Which action is right alternates between states -- here action
  `state % 2` is right -- so "always pick action 0" is not an answer. A random policy reaches the
  reward with probability 2^-n.
- The replay memory holds the transitions of all 2^n action sequences run until termination:
  2^(n+1) - 2 transitions ("memory size" on the plot), exactly one of them rewarded, stored in
  random order.
- Tabular Q-learning replays one transition per update, Q initialised from N(0, 0.1),
  gamma = 1 - 1/n, step size 1/4, until the mean squared error between Q and the true Q-values is
  below 10^-3. After each update the transition's |TD error| becomes its new priority.

Methods: uniform replay (`PER.UniformMemory`); proportional and rank-based prioritization
(`PER.Memory` and `rank_based.RankBasedMemory`, the agent's code, with beta = 0: tabular
Q-learning needs no importance-sampling correction); and two of the paper's reference points,
greedy TD-error prioritization (always replay the largest last-seen |TD error|, Figure 2 left)
and the oracle, which replays the transition whose update lowers the global error most
(Figure 1). The paper runs the stochastic variants with a linear function approximator (Figure 2
right); here everything is tabular, as in Figure 2 left.
The paper does not give alpha for this experiment, so both variants use its Atari values, which
are also the agent's: 0.6 proportional, 0.7 rank-based.

Proportional priorities are (|delta| + eps)^alpha, and eps matters here: once the rewarded
transition's error has been replayed away, the ~2^(n+1) transitions with |delta| = 0 each keep
eps^alpha of the probability mass. `--priority-epsilon 1e-2 1e-4 1e-6` runs the proportional
method once per value (one column each).

Usage: python blind_cliffwalk.py [--max-n 12] [--seeds 10] [--methods uniform,rank,...]
                                 [--priority-epsilon 1e-2 1e-6]
"""

from __future__ import annotations

import argparse
import json
import math
import sys
import time
from pathlib import Path

from d3qn_utils import quiet_startup  # isort: skip -- first: before TensorFlow
import numpy as np

from benchmarks import provenance
from d3qn_utils import atomic_files, run_files
from PER import Memory, UniformMemory
from rank_based import RankBasedMemory

# ---- Hyperparameters (each one is a command-line flag, see --help) ----
MIN_N = 2  # shortest chain
MAX_N = 12  # longest chain; the memory then holds 2^13 - 2 = 8190 transitions
LONGEST_CHAIN = 16  # the largest --max-n: the memory and the time at least double with each n
SEEDS = 10  # independent runs per chain length and method
SEED = 0  # first seed; the runs use SEED, SEED + 1, ...
METHODS = ("uniform", "proportional", "rank", "greedy", "oracle")  # replay schemes to compare
STEP_SIZE = 0.25  # eta, the Q-learning step size (paper: 1/4)
Q_INIT_STD = 0.1  # Q starts from N(0, 0.1), read as a standard deviation of 0.1
MSE_TOLERANCE = 1e-3  # converged once the mean squared error to the true Q is below this
ALPHA_PROPORTIONAL = 0.6  # priority exponent, proportional (paper's Atari value; none given here)
ALPHA_RANK = 0.7  # priority exponent, rank-based (paper's Atari value; none given here)
PRIORITY_EPSILON = 0.01  # eps in (|delta| + eps)^alpha, proportional only (Memory's default)
BUDGET_PER_TRANSITION = 100  # give up after this many updates per transition in the memory
PLOT_PATH = "plots/blind_cliffwalk.png"  # where the figure goes

# Colours of the extra proportional columns, one per priority eps.
EXTRA_COLORS = ("tab:blue", "tab:green", "tab:orange", "tab:brown", "tab:pink")

# Uniform draws do not depend on Q, so fetching many at once is the same experiment, in fewer calls.
UNIFORM_DRAW_AHEAD = 4096


# ---- The environment ----
def right_action(state: int) -> int:
    """The action that moves on from `state`: action 0 in even states, action 1 in odd ones."""
    return state % 2


def cliffwalk_step(n: int, state: int, action: int) -> tuple[int, float, bool]:
    """One step of the n-state Blind Cliffwalk: returns (next_state, reward, done).

    The wrong action ends the episode with reward 0; the right action moves to `state + 1`, and
    in the last state it ends the episode with reward 1. Every episode ends in the terminal
    pseudo-state `n`, which has no Q-values.
    """
    if not 0 <= state < n:
        raise ValueError(f"state must be in [0, {n}), got {state}")
    if action not in (0, 1):
        raise ValueError(f"action must be 0 or 1, got {action}")
    if action != right_action(state):
        return n, 0.0, True
    if state == n - 1:
        return n, 1.0, True
    return state + 1, 0.0, False


def enumerate_transitions(n: int) -> list[tuple[int, int, float, int, bool]]:
    """Transitions of all 2^n action sequences run from state 0 until the episode ends.

    Returns 2^(n+1) - 2 tuples (state, action, reward, next_state, done) in enumeration order:
    state i is reached by 2^(n-i) sequences, half of which take the right action there, and
    exactly one transition is rewarded. Cost O(2^n) time and memory.
    """
    if n < 1:
        raise ValueError(f"n must be at least 1, got {n}")
    transitions = []
    for sequence in range(2**n):
        state, done = 0, False
        while not done:
            # Bit `state` of the sequence number is the action taken in that state.
            action = (sequence >> state) & 1
            next_state, reward, done = cliffwalk_step(n, state, action)
            transitions.append((state, action, reward, next_state, done))
            state = next_state
    return transitions


def discount(n: int) -> float:
    """The paper's gamma = 1 - 1/n, which keeps the values on a similar scale for every n."""
    return 1.0 - 1.0 / n


def true_q_values(n: int) -> np.ndarray:
    """The optimal Q-values, shape (n, 2): gamma^(n-1-s) for the right action, 0 for the wrong."""
    q = np.zeros((n, 2))
    for state in range(n):
        q[state, right_action(state)] = discount(n) ** (n - 1 - state)
    return q


# ---- Learning ----
class TabularQ:
    """A Q-table with its squared error to the true Q-values kept up to date in O(1) per update.

    Python lists rather than numpy arrays: each update touches one entry, and a list hands back a
    Python float where numpy would box each scalar it reads.
    """

    def __init__(
        self, initial_q: np.ndarray, true_q: np.ndarray, gamma: float, step_size: float
    ) -> None:
        self.q = initial_q.tolist()
        self.true_q = true_q.tolist()
        self.gamma = gamma
        self.step_size = step_size
        self.size = initial_q.size
        self.squared_error = self.exact_squared_error()

    def exact_squared_error(self) -> float:
        """Sum of squared errors over the whole table, recomputed from scratch (O(n))."""
        return sum(
            (value - target) * (value - target)
            for row, true_row in zip(self.q, self.true_q, strict=True)
            for value, target in zip(row, true_row, strict=True)
        )

    def mse(self) -> float:
        """Mean squared error between the Q-table and the true Q-values."""
        return self.squared_error / self.size

    def td_error(
        self, state: int, action: int, reward: float, next_state: int, done: bool
    ) -> float:
        """delta = r + gamma * max_a Q(s', a) - Q(s, a), with no bootstrap after termination."""
        target = reward if done else reward + self.gamma * max(self.q[next_state])
        return target - self.q[state][action]

    def apply(self, state: int, action: int, td_error: float) -> None:
        """Q(s, a) += eta * delta, and move the running squared error along."""
        old = self.q[state][action]
        new = old + self.step_size * td_error
        target = self.true_q[state][action]
        self.q[state][action] = new
        # Products rather than ** 2: a diverging run then overflows to inf instead of raising.
        self.squared_error += (new - target) * (new - target) - (old - target) * (old - target)

    def converged(self, tolerance: float) -> bool:
        """MSE below `tolerance`, confirmed exactly so rounding drift cannot fake convergence."""
        if not self.mse() < tolerance:
            return False
        self.squared_error = self.exact_squared_error()
        return self.mse() < tolerance


def make_memory(
    method: str,
    capacity: int,
    alpha_proportional: float,
    alpha_rank: float,
    rng: np.random.Generator,
    priority_epsilon: float = PRIORITY_EPSILON,
) -> Memory | RankBasedMemory | UniformMemory:
    """The agent's replay memory for `method` ("uniform", "proportional" or "rank").

    `priority_epsilon` is the eps of proportional priorities (|delta| + eps)^alpha.

    beta = 0 and no beta growth: importance sampling corrects the bias that sampling by priority
    puts into an average over transitions. Here each (state, action) entry has its own
    deterministic target, so it converges to the true Q-value whatever the sampling rates.
    """
    if method == "uniform":
        return UniformMemory(capacity, rng=rng)
    if method == "proportional":
        return Memory(capacity, alpha=alpha_proportional, beta=0.0, beta_increment=0.0,
                      epsilon=priority_epsilon, rng=rng)
    if method == "rank":
        return RankBasedMemory(capacity, alpha=alpha_rank, beta=0.0, beta_increment=0.0, rng=rng)
    raise ValueError(f"unknown replay method {method!r}")


def replay_until_converged(
    table: TabularQ, memory: Memory | RankBasedMemory | UniformMemory,
    draw_size: int, tolerance: float, budget: int
) -> int | None:
    """Q-learning on transitions drawn from `memory`: the updates used, None if over budget.

    Every update replays one transition and hands its |TD error| back as its new priority. With
    draw_size > 1 several transitions are drawn before they are replayed, which is only the same
    experiment when the draws do not depend on the priorities (uniform replay).
    """
    updates = 0
    while updates < budget:
        tree_idx, batch, _ = memory.sample(draw_size)
        abs_errors = np.zeros(draw_size)
        rows = zip(*(column.tolist() for column in batch), strict=True)
        for j, (state, action, reward, next_state, done, _discount) in enumerate(rows):
            td_error = table.td_error(state, action, reward, next_state, done)
            if not math.isfinite(td_error):
                return None  # diverged (a step size too large); NaN is no priority
            table.apply(state, action, td_error)
            abs_errors[j] = abs(td_error)
            updates += 1
            if table.converged(tolerance):
                memory.batch_update(tree_idx[: j + 1], abs_errors[: j + 1])
                return updates
            if updates == budget:
                break
        memory.batch_update(tree_idx[: j + 1], abs_errors[: j + 1])
    return None


def greedy_until_converged(
    table: TabularQ, memory_contents: list[tuple], tolerance: float, budget: int
) -> int | None:
    """Greedy TD-error prioritization: always replay the transition with the largest last |delta|.

    New transitions start at infinite priority so each is replayed at least once, in memory order.
    An argmax over all priorities, O(N) per update, is fast enough at these sizes.
    Returns the updates used, None if over budget or diverged.
    """
    priorities = np.full(len(memory_contents), np.inf)
    for updates in range(1, budget + 1):
        index = int(np.argmax(priorities))
        state, action, reward, next_state, done = memory_contents[index]
        td_error = table.td_error(state, action, reward, next_state, done)
        if not math.isfinite(td_error):
            return None  # diverged
        table.apply(state, action, td_error)
        priorities[index] = abs(td_error)
        if table.converged(tolerance):
            return updates
    return None


def oracle_until_converged(table: TabularQ, n: int, tolerance: float, budget: int) -> int | None:
    """The paper's oracle: each update replays the transition that lowers the global error most.

    Copies of a transition have the same effect, so the oracle only needs to try the 2n distinct
    (state, action) transitions, O(n) per update. Returns the updates used, None if over budget
    or diverged.
    """
    distinct = [(s, a, *cliffwalk_step(n, s, a)) for s in range(n) for a in (0, 1)]
    for updates in range(1, budget + 1):
        best_change, best_move = np.inf, None
        for state, action, next_state, reward, done in distinct:
            td_error = table.td_error(state, action, reward, next_state, done)
            old = table.q[state][action]
            target = table.true_q[state][action]
            new = old + table.step_size * td_error
            change = (new - target) * (new - target) - (old - target) * (old - target)
            if change < best_change:
                best_change, best_move = change, (state, action, td_error)
        if best_move is None:
            return None  # diverged: every candidate change is NaN
        table.apply(*best_move)
        if table.converged(tolerance):
            return updates
    return None


def updates_to_converge(
    n: int,
    method: str,
    seed: int,
    step_size: float = STEP_SIZE,
    q_init_std: float = Q_INIT_STD,
    tolerance: float = MSE_TOLERANCE,
    alpha_proportional: float = ALPHA_PROPORTIONAL,
    alpha_rank: float = ALPHA_RANK,
    budget_per_transition: float = BUDGET_PER_TRANSITION,
    priority_epsilon: float = PRIORITY_EPSILON,
) -> int | None:
    """Updates one run of `method` needs on the n-state Blind Cliffwalk; None if it failed.

    A run fails when it has not converged within `budget_per_transition` x memory size updates,
    or when Q diverged (possible only with a step size far above the paper's 1/4).

    The seed fixes the Q initialisation, the memory's order and the sampling; a given (n, seed)
    starts every method from the same Q and the same memory, so methods compare run by run.
    Cost: O(2^n) to fill the memory plus the updates themselves.
    """
    if method not in METHODS:
        raise ValueError(f"unknown method {method!r}; choose from {', '.join(METHODS)}")
    init_rng, order_rng, sample_rng = (
        np.random.default_rng(child) for child in np.random.SeedSequence([seed, n]).spawn(3)
    )
    table = TabularQ(
        init_rng.normal(0.0, q_init_std, size=(n, 2)), true_q_values(n), discount(n), step_size
    )
    transitions = enumerate_transitions(n)
    budget = int(budget_per_transition * len(transitions))
    if table.converged(tolerance):
        return 0
    if method == "oracle":
        return oracle_until_converged(table, n, tolerance, budget)
    memory_contents = [transitions[index] for index in order_rng.permutation(len(transitions))]
    if method == "greedy":
        return greedy_until_converged(table, memory_contents, tolerance, budget)
    memory = make_memory(
        method, len(transitions), alpha_proportional, alpha_rank, sample_rng, priority_epsilon
    )
    for transition in memory_contents:
        memory.store(transition)
    draw_size = UNIFORM_DRAW_AHEAD if method == "uniform" else 1
    return replay_until_converged(table, memory, draw_size, tolerance, budget)


# ---- Report ----
def summarize(runs: list[int | None], budget: int) -> tuple[float, int, int, int]:
    """(median, min, max, failures) of the updates; a failed run counts as `budget` updates."""
    counts = np.array([budget if run is None else run for run in runs])
    return float(np.median(counts)), int(counts.min()), int(counts.max()), runs.count(None)


def format_table(results: dict, methods: list[str], budget_per_transition: float) -> str:
    """The results as a text table: per n the memory size and per method median / min / max."""
    widths = [max(28, len(m) + 12) for m in methods]
    header = f"{'n':>3} {'memory':>7}" + "".join(
        f" | {m + ' med/min/max':>{width}}" for m, width in zip(methods, widths, strict=True)
    )
    lines = [header, "-" * len(header)]
    any_failed = False
    for n in sorted({key[0] for key in results}):
        size = 2 ** (n + 1) - 2
        budget = int(budget_per_transition * size)
        cells = []
        for method, width in zip(methods, widths, strict=True):
            median, low, high, failures = summarize(results[n, method], budget)
            flag = f" ({failures} failed)" if failures else ""
            any_failed |= bool(failures)
            cells.append(f" | {f'{median:.0f} / {low} / {high}{flag}':>{width}}")
        lines.append(f"{n:>3} {size:>7}" + "".join(cells))
    if any_failed:
        lines.append(
            f"failed: no convergence within {budget_per_transition:g} x memory size updates (or"
            " diverged); counted as that budget, so its median is a lower bound"
        )
    return "\n".join(lines)


def plot(results: dict, methods: list[str], path: str, source: Path) -> None:
    """Updates vs memory size on log-log axes: median line, min-max band per method, saved to
    `path` atomically with the name of its results file, `source`, in the PNG.

    `methods` are the column labels of `results`; extra proportional columns (one per priority
    eps) are drawn in lighter blues.
    """
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    colors = {"uniform": "black", "proportional": "tab:blue", "rank": "tab:red",
              "greedy": "tab:purple", "oracle": "tab:cyan"}
    fig, ax = plt.subplots(figsize=(6, 4.5))
    for method in methods:
        # Only chain lengths where every run converged: a capped run has no update count to plot.
        ns = sorted(n for (n, m), runs in results.items() if m == method and None not in runs)
        if not ns:
            continue
        sizes = [2 ** (n + 1) - 2 for n in ns]
        counts = [np.array(results[n, method]) for n in ns]
        extra = [label for label in methods if label not in colors]
        color = colors.get(method) or EXTRA_COLORS[extra.index(method) % len(EXTRA_COLORS)]
        ax.plot(sizes, [np.median(c) for c in counts], "o-", color=color, label=method, ms=3)
        ax.fill_between(sizes, [c.min() for c in counts], [c.max() for c in counts],
                        color=color, alpha=0.15, lw=0)
    # Any method that gives new transitions top priority replays each one at least once.
    sizes = [2 ** (n + 1) - 2 for n in sorted({n for n, _ in results})]
    ax.plot(sizes, sizes, ":", color="gray", label="updates = memory size")
    ax.set_xscale("log", base=2)
    ax.set_yscale("log")
    ax.set_xlabel("memory size (transitions, 2^(n+1) - 2)")
    ax.set_ylabel("updates until MSE < 1e-3")
    ax.set_title("Blind Cliffwalk, tabular Q-learning (median, min-max band)")
    ax.grid(True, which="both", alpha=0.3)
    ax.legend()
    fig.tight_layout()
    with atomic_files.atomic_file(path) as temporary:
        fig.savefig(temporary, dpi=120)
        provenance.name_figure_source(temporary, source)
    plt.close(fig)


# ---- Command line ----
def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    """Command-line flags; every hyperparameter above has one."""
    parser = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0], formatter_class=argparse.ArgumentDefaultsHelpFormatter
    )
    parser.add_argument("--min-n", type=int, default=MIN_N, help="shortest chain")
    parser.add_argument("--max-n", type=int, default=MAX_N, help="longest chain")
    parser.add_argument("--seeds", type=int, default=SEEDS, help="runs per chain length")
    parser.add_argument("--seed", type=int, default=SEED, help="first seed")
    parser.add_argument("--methods", default=",".join(METHODS),
                        help=f"comma-separated subset of {','.join(METHODS)}")
    parser.add_argument("--step-size", type=float, default=STEP_SIZE, help="Q-learning eta")
    parser.add_argument("--q-init-std", type=float, default=Q_INIT_STD,
                        help="standard deviation of the initial Q-values")
    parser.add_argument("--mse-tolerance", type=float, default=MSE_TOLERANCE,
                        help="converged once the MSE to the true Q is below this")
    parser.add_argument("--alpha-proportional", type=float, default=ALPHA_PROPORTIONAL,
                        help="priority exponent of proportional prioritization")
    parser.add_argument("--alpha-rank", type=float, default=ALPHA_RANK,
                        help="priority exponent of rank-based prioritization")
    parser.add_argument("--priority-epsilon", type=float, nargs="+", default=[PRIORITY_EPSILON],
                        help="eps of proportional priorities (|delta| + eps)^alpha; several "
                        "values run the proportional method once per value")
    parser.add_argument("--budget-per-transition", type=float, default=BUDGET_PER_TRANSITION,
                        help="give up after this many updates per transition in the memory")
    parser.add_argument("--plot-path", default=PLOT_PATH, help="where to save the figure")
    parser.add_argument("--replot", type=Path, metavar="RESULTS_FILE",
                        help="run nothing: draw the figure again from a results file this "
                             "script wrote")
    provenance.add_results_argument(parser, __file__)
    args = parser.parse_args(argv)
    args.methods = [m.strip() for m in args.methods.split(",") if m.strip()]
    return args


def check_args(args: argparse.Namespace) -> None:
    """ValueError naming the first flag whose value cannot work, before any run: each number in
    its range, the chain short enough to finish, the figure and the results file writable."""
    unknown = [m for m in args.methods if m not in METHODS]
    if unknown or not args.methods:
        raise ValueError(f"--methods: unknown {', '.join(unknown) or 'empty list'}; choose from "
                         + ", ".join(METHODS))
    if not 1 <= args.min_n <= args.max_n:
        raise ValueError(f"need 1 <= --min-n <= --max-n, got {args.min_n} and {args.max_n}")
    if args.max_n > LONGEST_CHAIN:
        raise ValueError(f"--max-n must be at most {LONGEST_CHAIN}, got {args.max_n}: the memory "
                         "holds 2^(n+1) - 2 transitions, so each n doubles it and at least "
                         "doubles the time")
    if args.seeds < 1:
        raise ValueError(f"--seeds must be at least 1, got {args.seeds}")
    if args.seed < 0:
        raise ValueError(f"--seed must be >= 0, got {args.seed}")
    if not 0 < args.step_size <= 1:  # NaN fails every comparison
        raise ValueError(f"--step-size must be in (0, 1], got {args.step_size}: a step of 1 "
                         "moves Q onto its update's target, a larger one past it")
    for flag in ("q_init_std", "mse_tolerance", "budget_per_transition"):
        if not 0 < getattr(args, flag) < math.inf:
            raise ValueError(f"--{flag.replace('_', '-')} must be positive and finite, got "
                             f"{getattr(args, flag)}")
    bad_epsilons = [eps for eps in args.priority_epsilon if not 0 < eps < math.inf]
    if bad_epsilons:
        raise ValueError(f"--priority-epsilon must be positive and finite, got {bad_epsilons[0]}")
    for flag in ("alpha_proportional", "alpha_rank"):
        if not 0 <= getattr(args, flag) < math.inf:
            raise ValueError(f"--{flag.replace('_', '-')} must be >= 0 and finite, got "
                             f"{getattr(args, flag)}")
    if Path(args.plot_path).suffix.lower() != ".png":
        raise ValueError(f"--plot-path must end in .png, got {args.plot_path}: the figure is a "
                         "PNG that names its results file")
    run_files.check_writable("--plot-path", args.plot_path, directory=False)
    if not args.replot:
        run_files.check_writable("--results", args.results, directory=False)


def read_results(path: Path) -> tuple[dict, list[str]]:
    """The update counts (per chain length and column) and the column labels of a results file
    this script wrote; ValueError naming --replot and `path` if it is missing or another's."""
    try:
        measured = json.loads(path.read_text())
    except OSError as error:
        raise ValueError(f"--replot {path} cannot be read: {atomic_files.reason(error)}"
                         ) from None
    except (UnicodeDecodeError, json.JSONDecodeError) as error:
        raise ValueError(f"--replot {path} is not a JSON results file ({error})") from None
    found = measured.get("results") if isinstance(measured, dict) else None
    columns = found.get("columns") if isinstance(found, dict) else None
    rows = found.get("runs") if isinstance(found, dict) else None
    if not (isinstance(columns, list) and columns and isinstance(rows, list) and rows
            and all(isinstance(column, str) for column in columns)
            and all(is_results_row(row, columns) for row in rows)):
        raise ValueError(f"--replot {path} is not a results file of blind_cliffwalk.py (its "
                         "\"results\" hold the \"columns\" and the \"runs\" of a measurement)")
    return {(row["n"], row["column"]): row["updates"] for row in rows}, columns


def is_results_row(row: object, columns: list[str]) -> bool:
    """Whether `row` is one chain length and column of a results file: its updates per seed."""
    return (isinstance(row, dict) and type(row.get("n")) is int and row["n"] >= 1
            and row.get("column") in columns and isinstance(row.get("updates"), list)
            and bool(row["updates"])
            and all(updates is None or type(updates) is int for updates in row["updates"]))


def table_columns(
    methods: list[str], priority_epsilons: list[float]
) -> list[tuple[str, str, float]]:
    """(label, method, priority eps) per column: "proportional" once per eps when several."""
    columns = []
    for method in methods:
        if method == "proportional" and len(priority_epsilons) > 1:
            columns += [(f"proportional eps={eps:g}", method, eps) for eps in priority_epsilons]
        else:
            columns.append((method, method, priority_epsilons[0]))
    return columns


def main(argv: list[str] | None = None) -> int:
    """Run every (n, column, seed), print the table and save the plot (its PNG names the results
    file); with --replot, draw the plot again from a results file alone. Returns the exit code:
    2 after one `error:` line for bad input (before any run), 1 after one for a write that
    failed, 130 after Ctrl-C."""
    quiet_startup.main_started()  # Ctrl-C from here is a KeyboardInterrupt, a stop
    written: list[str] = []  # what this run wrote, to say after Ctrl-C
    try:
        args = parse_args(argv)
        check_args(args)
        measured = read_results(args.replot) if args.replot else None
    except ValueError as error:
        print(f"error: {error}", file=sys.stderr)
        return 2
    if note := run_files.shipped_note(*run_files.shipped(
            [args.plot_path, *([] if args.replot else [str(args.results)])])):
        print(f"note: {note}", flush=True)
    try:
        if measured is not None:
            plot(*measured, args.plot_path, args.replot)
            print(f"plot: {args.plot_path}, drawn from {args.replot}")
        else:
            run(args, written)
    except KeyboardInterrupt:
        print(f"interrupted by Ctrl-C; {' and '.join(written) or 'nothing'} written",
              file=sys.stderr)
        return 130
    except (atomic_files.WriteError, OSError) as error:  # a disk that filled during the runs
        print(f"error: {error}", file=sys.stderr)
        return 1
    return 0


def run(args: argparse.Namespace, written: list[str]) -> None:
    """Run every (n, column, seed) of `args`, print the table, save the plot and the results
    file, adding to `written` each path once it is written."""
    code = provenance.commit()  # before the runs: the checkout may move on meanwhile
    columns = table_columns(args.methods, args.priority_epsilon)
    results = {}
    start = time.perf_counter()
    for n in range(args.min_n, args.max_n + 1):
        for label, method, priority_epsilon in columns:
            results[n, label] = [
                updates_to_converge(
                    n, method, seed, args.step_size, args.q_init_std, args.mse_tolerance,
                    args.alpha_proportional, args.alpha_rank, args.budget_per_transition,
                    priority_epsilon,
                )
                for seed in range(args.seed, args.seed + args.seeds)
            ]
        print(f"n={n} done after {time.perf_counter() - start:.1f} s", file=sys.stderr)
    labels = [label for label, _, _ in columns]
    print(format_table(results, labels, args.budget_per_transition))
    if "proportional" in args.methods:
        print(f"proportional priority eps: {', '.join(f'{e:g}' for e in args.priority_epsilon)}")
    plot(results, labels, args.plot_path, args.results)
    written.append(args.plot_path)
    print(f"plot: {args.plot_path}; wall time {time.perf_counter() - start:.1f} s")
    write_results(args, results, labels, time.perf_counter() - start, code)
    written.append(str(args.results))


def write_results(args: argparse.Namespace, results: dict, labels: list[str],
                  wall_seconds: float, code: tuple[str, bool]) -> None:
    """The updates of every run (None: failed) per chain length and column, with the settings,
    the wall time and provenance's stamp, to `args.results` (docs/blind_cliffwalk.md's tables are
    rendered from it by benchmarks/render_docs.py)."""
    settings = {name: value for name, value in vars(args).items() if name != "results"}
    rows = [{"n": n, "memory": 2 ** (n + 1) - 2, "column": label, "updates": results[n, label]}
            for n, label in results]
    provenance.write_results(args.results, {"settings": settings, "columns": labels,
                                            "runs": rows, "wall_seconds": wall_seconds},
                             code=code)


if __name__ == "__main__":
    sys.exit(main())
