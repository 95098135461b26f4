"""Reading back what a run wrote for TensorBoard (its event files), for the tests of the agent's
and Ape-X's TensorBoard curves. Its own module: TensorBoard's reader imports TensorFlow, which
conftest.py does not at its top."""

from pathlib import Path

from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
from tensorboard.util.tensor_util import make_ndarray


def read_events(directory: Path) -> dict[str, list[tuple[int, float]]]:
    """{tag: [(step, value), ...]} of every scalar in the event files under `directory`."""
    events = EventAccumulator(str(directory), size_guidance={"tensors": 0})  # 0: keep all
    events.Reload()
    return {tag: [(event.step, float(make_ndarray(event.tensor_proto)))
                  for event in events.Tensors(tag)]
            for tag in events.Tags()["tensors"]}
