"""A streamed response closed after its simulated cluster stopped (found by the session-27 walk).

``python -m bench.eta_bench`` stopped by Ctrl-C sometimes printed a ``trio.BrokenResourceError``
traceback before "interrupted": the run's cancellation ended the cluster's task (closing its inbox)
before the proxy closed a response it was relaying, and closing an unfinished response aborts the
request in the cluster, which then raised.  A stopped cluster has nothing left to abort.
"""

from __future__ import annotations

import httpx
import trio
import trio.testing

from sim.cluster import SimCluster, SimConfig
from sim.transport import SimTransport


async def test_closing_a_stream_after_the_cluster_stopped_raises_nothing(autojump_clock: trio.abc.Clock) -> None:
    cluster_scope = trio.CancelScope()

    async def run_cluster(*, task_status: trio.TaskStatus[SimCluster]) -> None:
        with cluster_scope:
            await SimCluster(SimConfig(dp_size=1, deterministic=True)).run(task_status=task_status)

    async with trio.open_nursery() as nursery:
        cluster: SimCluster = await nursery.start(run_cluster)
        async with httpx.AsyncClient(transport=SimTransport(cluster), base_url="http://sim") as client:
            payload = {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 50, "stream": True}
            async with client.stream("POST", "/v1/chat/completions", json=payload) as response:
                chunks = response.aiter_bytes()
                first = await chunks.__anext__()
                assert first.startswith(b"data: ")
                cluster_scope.cancel()
                await trio.testing.wait_all_tasks_blocked()
                assert cluster_scope.cancelled_caught
            # leaving the block closed the unfinished response (an abort) without raising
            assert response.is_closed
