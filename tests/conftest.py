"""Every test sees a CPU without bfloat16 instructions, so that a Pong agent is built alike on
every machine; tests of the bfloat16 preset say which CPU they mean."""

import pytest

from d3qn_utils import settings


@pytest.fixture(autouse=True)
def cpu_without_bfloat16(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(settings, "native_bfloat16", lambda: None)
