"""End-to-end fixtures (helpers live in ``native_fakes.py``)."""

from __future__ import annotations

import pytest
from native_fakes import FakeWorker


@pytest.fixture
def fake_worker() -> FakeWorker:
    return FakeWorker(("http://w0:8000", "http://w1:8000"))
