"""The committed networks (models/pretrained/*.keras), each played greedily by `python
d3qn_agent.py --test --model models/pretrained/<file> --env-name <game> --test-episodes N`, and
what they scored.

    python benchmarks/play_pretrained.py                    # 10 greedy episodes each, Pong 3
    python benchmarks/play_pretrained.py --episodes 5 --pong-episodes 1

Plays each network in this process as that command does (`DQNAgent(...).test(model)`, seed 0)
and writes per network its file, size, command and each episode's score to
benchmarks/results/play_pretrained/<UTC date and time>.json (`--results`). docs/usage.md renders
its table of the committed networks from the newest such file (`python benchmarks/render_docs.py`).
"""

from __future__ import annotations

import argparse
import re
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
import d3qn_agent
from benchmarks import provenance

PRETRAINED = Path("models") / "pretrained"  # from the repository root
PONG = "PongNoFrameskip-v4"


def env_name(network: Path) -> str:
    """The game a committed network plays, from its file name: MinAtar-Breakout-v1 is
    MinAtar/Breakout-v1."""
    return re.sub(r"^MinAtar-", "MinAtar/", network.stem)


def play(network: Path, episodes: int) -> dict[str, object]:
    """`--test` of one committed network for `episodes` greedy episodes: its command, scores and
    seconds."""
    command = (f"python d3qn_agent.py --test --model {network.as_posix()} --env-name "
               f"{env_name(network)} --test-episodes {episodes}")
    start = time.perf_counter()
    agent = d3qn_agent.DQNAgent(env_name(network), test_episodes=episodes)
    scores = agent.test(str(provenance.ROOT / network))  # the file from anywhere
    return {"file": network.as_posix(), "bytes": (provenance.ROOT / network).stat().st_size,
            "env_name": env_name(network), "command": command, "scores": scores,
            "seconds": time.perf_counter() - start}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--episodes", type=int, default=10, help="greedy episodes per network")
    parser.add_argument("--pong-episodes", type=int, default=3,
                        help=f"greedy episodes of {PONG}'s network (thousands of steps each)")
    provenance.add_results_argument(parser, __file__)
    args = parser.parse_args()
    code = provenance.commit()  # before playing: the checkout may move on meanwhile
    networks = sorted((provenance.ROOT / PRETRAINED).glob("*.keras"))
    played = [play(path.relative_to(provenance.ROOT), args.pong_episodes
                   if path.stem == PONG else args.episodes) for path in networks]
    provenance.write_results(args.results, {"networks": played}, code=code)
    return 0


if __name__ == "__main__":
    sys.exit(main())
