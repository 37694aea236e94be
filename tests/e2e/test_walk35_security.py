"""The session-35 security walk: a large request body is parsed one at a time.

Parsing JSON takes up to about 20 times the body's size in memory (a body of a million small
members, 12 MB, took 300 MB), and six such bodies at once took the daemon from 254 MB to 1.7 GB.
Bodies over ``LARGE_BODY_BYTES`` now wait for each other (docs/operations.md §12); smaller ones
never wait for them.
"""

from __future__ import annotations

import json
from functools import partial
from pathlib import Path

import attrs
import httpx
import trio
import trio.testing

from daemon.config import BatchApiConfig
from daemon.config_loading import load_config
from daemon.http.app import create_app
from daemon.http.edge import LARGE_BODY_BYTES
from daemon.supervisor import run_daemon

ROOT = Path(__file__).resolve().parents[2]


def chat(padding: int = 0) -> bytes:
    body = {"model": "agentd-sim", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2}
    if padding:
        body["metadata_padding"] = "x" * padding  # an unknown member: forwarded as it is
    return json.dumps(body).encode()


async def test_large_bodies_are_parsed_one_at_a_time(tmp_path: Path) -> None:
    cfg = load_config(ROOT / "configs" / "quickstart.toml")
    cfg = attrs.evolve(cfg, batch_api=BatchApiConfig(database_path=str(tmp_path / "b.sqlite3")))
    with trio.fail_after(600):
        async with trio.open_nursery() as nursery:
            handles = await nursery.start(partial(run_daemon, cfg, serve_http=False))
            app = create_app(handles)
            transport = httpx.ASGITransport(app)  # type: ignore[arg-type]
            async with httpx.AsyncClient(transport=transport, base_url="http://agentd", timeout=600) as client:
                post = partial(client.post, "/v1/chat/completions", headers={"content-type": "application/json"})
                answers: list[int] = []
                answered = trio.Event()

                async def large() -> None:
                    answers.append((await post(content=chat(LARGE_BODY_BYTES + 1))).status_code)
                    answered.set()

                async with app.edge.large_body_parse:  # another large body is being parsed
                    nursery.start_soon(large)
                    await trio.testing.wait_all_tasks_blocked()
                    assert app.edge.large_body_parse.statistics().tasks_waiting == 1
                    small = await post(content=chat(LARGE_BODY_BYTES // 2))
                    assert small.status_code == 200 and answers == []  # a smaller body does not wait
                await answered.wait()
                assert answers == [200]
            handles.request_shutdown()
