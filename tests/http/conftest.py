"""HTTP-layer fixtures (helpers live in ``http_fakes.py``)."""

from __future__ import annotations

import random
from collections.abc import AsyncIterator
from functools import partial

import pytest
import trio
from http_fakes import DaemonApp, MiniWorker, http_config

from daemon.handles import DaemonHandles
from daemon.http.app import create_app
from daemon.supervisor import run_daemon


@pytest.fixture
async def daemon_app() -> AsyncIterator[DaemonApp]:
    worker = MiniWorker()
    async with trio.open_nursery() as nursery:
        handles: DaemonHandles = await nursery.start(
            partial(
                run_daemon, http_config(), transport_factory=worker.transport, serve_http=False, rng=random.Random(0)
            )
        )
        yield DaemonApp(handles, create_app(handles), worker)
        handles.request_shutdown()
