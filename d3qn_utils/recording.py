"""Recording a greedy episode as an animated GIF (`python d3qn_agent.py --test --record FILE.gif`),
small enough for a README: the GIF_* limits below set how small.
"""

from __future__ import annotations

import io
import tempfile
from pathlib import Path
from typing import Any

import gymnasium as gym
import numpy as np
from PIL import Image

from d3qn_utils import run_files
from d3qn_utils.atomic_files import atomic_file

GIF_MAX_FPS = 25  # keep at most this many screens per second of game time, played in real time
GIF_MAX_FRAMES = 2_000  # cap the length: 80 s of CartPole (50 steps/s), 133 s of Atari (15/s)
GIF_MAX_WIDTH = 320  # shrink wider screens (CartPole renders 600x400; Atari's 160x210 stays)
GIF_COLORS = 64  # one shared palette; flat game graphics need few colours
GIF_MAX_BYTES = 3_000_000  # if still larger, every 2nd frame is dropped until it fits


def check_gif_path(path: str) -> Path:
    """`path` as a Path if a GIF can be written there (checked by writing a temporary file
    beside it), else ValueError naming it, so that a bad path fails before any episode."""
    target = Path(path)
    if target.suffix.lower() != ".gif":
        raise ValueError(f"cannot record to {path!r}: the file name must end in .gif")
    if target.is_dir():  # else only writing the GIF, after the episode, would fail
        raise ValueError(f"cannot record to {path!r}: it is a directory")
    try:
        tempfile.TemporaryFile(dir=target.parent).close()
    except OSError as err:
        raise ValueError(f"cannot record to {path!r}: cannot write in {str(target.parent)!r} "
                         f"({err.strerror or err})") from err
    return target


class GifRecorder:
    """The screens of one episode, shrunk as they come in, written as one animated GIF that
    plays in real time at `steps_per_second` (the env's `render_fps`)."""

    def __init__(self, steps_per_second: float) -> None:
        if not steps_per_second > 0:
            raise ValueError(f"steps_per_second must be positive, got {steps_per_second}")
        self.every = max(1, round(steps_per_second / GIF_MAX_FPS))
        self.frame_ms = 1000.0 * self.every / steps_per_second
        self.frames: list[Image.Image] = []  # palette images sharing the first frame's palette
        self.last_step: int | None = None

    def capture(self, env: gym.Env, step: int, last: bool = False) -> None:
        """Render `env` and keep its screen, if the screen after `step` steps is wanted."""
        if self.wants(step, last):
            self.add(step, env.render())

    def wants(self, step: int, last: bool = False) -> bool:
        """Whether to keep the screen after `step` steps: every `every`-th and the `last`, until
        GIF_MAX_FRAMES are kept."""
        return (len(self.frames) < GIF_MAX_FRAMES and step != self.last_step
                and (step % self.every == 0 or last))

    def add(self, step: int, frame: Any) -> None:
        """Keep `frame`, the uint8 RGB screen after `step` steps, shrunk to GIF_MAX_WIDTH, in
        the first frame's palette without dithering (flat colours compress well and do not
        flicker). ValueError if the environment gave no RGB frame."""
        frame = None if frame is None else np.asarray(frame)
        if frame is None or frame.dtype != np.uint8 or frame.ndim != 3 or frame.shape[-1] != 3:
            got = None if frame is None else f"{frame.dtype} {frame.shape}"
            raise ValueError(f"the environment's render() gave no RGB frame (got {got}); "
                             "--record needs render_mode='rgb_array'")
        image = Image.fromarray(frame)
        if image.width > GIF_MAX_WIDTH:
            height = round(image.height * GIF_MAX_WIDTH / image.width)
            # Area averaging: sharp enough for shrinking, with a smaller kernel than Lanczos'.
            image = image.resize((GIF_MAX_WIDTH, height), Image.Resampling.BOX)
        palette = self.frames[0] if self.frames else image.quantize(GIF_COLORS,
                                                                     dither=Image.Dither.NONE)
        self.frames.append(image.quantize(palette=palette, dither=Image.Dither.NONE))
        self.last_step = step

    def encode(self, max_bytes: int = GIF_MAX_BYTES) -> tuple[bytes, int]:
        """The GIF's bytes and frame count; every 2nd frame dropped (each kept one lasting
        twice as long) until it fits in `max_bytes`."""
        if not self.frames:
            raise ValueError("no frame was recorded")
        every = 1
        while True:
            kept = self.frames[::every]
            buffer = io.BytesIO()
            kept[0].save(buffer, format="GIF", save_all=True, append_images=kept[1:],
                         duration=round(self.frame_ms * every), loop=0)
            if buffer.tell() <= max_bytes or len(kept) == 1:
                return buffer.getvalue(), len(kept)
            every *= 2

    def finish(self, path: str | Path) -> None:
        """Write the GIF to `path` atomically and say so in one line, after a note where it
        replaces a file that came with the repository (the README's GIF)."""
        data, frames = self.encode()
        if note := run_files.shipped_note(*run_files.shipped([str(path)])):
            print(f"note: {note}", flush=True)
        with atomic_file(path) as temporary:
            temporary.write_bytes(data)
        print(f"recorded episode 1 to {path}: {frames} frames, {len(data) / 1e6:.2f} MB",
              flush=True)


def record_episode(env: gym.Env, policy: Any, seed: int, path: str) -> float:
    """Play one greedy episode of `policy` in `env` (render_mode="rgb_array"), reset with `seed`,
    written to `path` as a GIF as soon as it ends; its score (Atari's unclipped one)."""
    state, _ = env.reset(seed=seed)
    recorder = GifRecorder(env.metadata.get("render_fps") or GIF_MAX_FPS)
    recorder.capture(env, 0)
    score, done, info, steps = 0.0, False, {}, 0
    while not done:
        action = int(policy(state[np.newaxis])[0])
        state, reward, terminated, truncated, info = env.step(action)
        score, steps, done = score + reward, steps + 1, terminated or truncated
        recorder.capture(env, steps, last=done)
    recorder.finish(path)
    return float(info.get("episode", {}).get("r", score))
