"""A relay's connect timeout travels as a connect failure does (docs/operations.md §11.3, §13): the
relay takes the worker out of its own rotation at once (keeping it when nothing else is left), the
``Report`` frame makes it suspect on the scheduler's board, whose health actor probes it, and the
next snapshot carries the verdict back.  One process, virtual time, a real socket pair between
the scheduler's hub and the relay's side; the worker is faked at the HTTP boundary."""

from __future__ import annotations

from collections.abc import Callable

import httpx
import trio
import trio.testing

from actors.core.config import BackendTarget
from daemon.dataplane.link import Link
from daemon.dataplane.relay import RemoteOutcomes, SnapshotView, read_scheduler_frames
from daemon.dataplane.scheduler_side import DataPlaneHub
from daemon.dataplane.wire import Hello, Report, Snapshot, decode, encode
from daemon.health import HealthBoard, run_suspect_probes

W0, W1 = "http://w0:8000", "http://w1:8000"
TARGETS = tuple(BackendTarget(worker_url=u, dp_rank=0, target_id=f"{u}@0", index=i) for i, u in enumerate((W0, W1)))
PROBE_SECONDS = 0.3  # how long the fake worker takes to answer /health


class SentFrames:
    """A relay link that keeps what is sent (the relay-side unit checks)."""

    def __init__(self) -> None:
        self.frames: list[object] = []

    def send(self, frame: object) -> None:
        self.frames.append(frame)


class WatchedView(SnapshotView):
    """The relay's view, telling when a snapshot was applied."""

    def __init__(self, targets: tuple[BackendTarget, ...]) -> None:
        super().__init__(targets)
        self.applied = trio.Event()

    def apply(self, snapshot: Snapshot) -> None:
        super().apply(snapshot)
        self.applied.set()

    async def until(self, predicate: Callable[[], bool]) -> None:
        with trio.fail_after(60):
            while not predicate():
                self.applied = trio.Event()
                await self.applied.wait()


def urls(view: SnapshotView) -> list[str]:
    return [t.worker_url for t in view.healthy_targets()]


def test_the_report_frame_carries_the_suspect_flag() -> None:
    frame = Report(W0, False, "timeout: ConnectTimeout", False, True)
    assert decode(encode(frame)[4:]) == frame


def test_the_relay_keeps_suspects_out_of_its_rotation_unless_nothing_else_is_left() -> None:
    view = SnapshotView(TARGETS)
    view.apply(Snapshot(seq=0, healthy=(0, 1), unhealthy_reason="", others_in_flight=(0, 0)))
    link = SentFrames()
    outcomes = RemoteOutcomes(view, link)  # type: ignore[arg-type]
    assert outcomes.report_failure(W0, "timeout: ConnectTimeout", suspect=True) is True
    assert link.frames == [Report(W0, False, "timeout: ConnectTimeout", False, True)]
    assert urls(view) == [W1]
    assert outcomes.report_failure(W1, "timeout: ConnectTimeout", suspect=True) is True
    assert urls(view) == [W0, W1]  # both suspect: both stay, as on the scheduler's board
    assert outcomes.report_failure(W0, "unreachable: refused", eject_now=True) is True
    assert urls(view) == [W1]  # refused is certain: out, even as the last one
    # a snapshot that includes all three reports: the board's verdict from then on
    view.apply(Snapshot(seq=1, healthy=(1,), unhealthy_reason="", others_in_flight=(0, 0), reports_applied=3))
    assert view.suspected == {} and view.ejected == {} and urls(view) == [W1]


async def test_a_relays_connect_timeout_is_probed_by_the_scheduler_and_the_verdict_comes_back(
    autojump_clock: trio.testing.MockClock,
) -> None:
    health_at: list[float] = []

    async def worker(request: httpx.Request) -> httpx.Response:
        assert request.url.path == "/health"
        await trio.sleep(PROBE_SECONDS)
        health_at.append(trio.current_time())
        return httpx.Response(200)

    board = HealthBoard(TARGETS)
    for target in TARGETS:
        board.record_check(target.worker_url, True, "ok", 0.0)
    hub = DataPlaneHub(TARGETS, board, None)
    left, right = trio.socket.socketpair()
    conn = hub.connect(0, Link(trio.SocketStream(left)))
    relay_link = Link(trio.SocketStream(right))
    view = WatchedView(TARGETS)
    async with httpx.AsyncClient(transport=httpx.MockTransport(worker)) as client, trio.open_nursery() as nursery:
        nursery.start_soon(run_suspect_probes, board, client, 2.0)
        nursery.start_soon(hub.run_publisher)
        nursery.start_soon(conn.serve)
        nursery.start_soon(relay_link.run_writer)
        nursery.start_soon(read_scheduler_frames, relay_link, None, view, lambda: "")
        relay_link.send(Hello(0, 4242))
        await view.first.wait()
        outcomes = RemoteOutcomes(view, relay_link)
        t0 = trio.current_time()
        assert outcomes.report_failure(W0, "timeout: ConnectTimeout", suspect=True) is True
        assert urls(view) == [W1]  # at once, before any round trip
        await view.until(lambda: view.snapshot is not None and view.snapshot.reports_applied == 1)
        since = board.worker(W0).suspect_since
        assert since is not None and since >= t0
        assert board.worker(W0).healthy and [t.worker_url for t in board.healthy_targets()] == [W1]
        await view.until(lambda: urls(view) == [W0, W1])  # the probe, then the next snapshot
        assert health_at == [since + PROBE_SECONDS]  # the probe went out when the report arrived
        assert not board.worker(W0).suspect and board.suspects_count == {"ejected": 0, "restored": 1}
        assert view.suspected == {}
        with trio.CancelScope(shield=True):
            for link in (conn.link, relay_link):
                await trio.aclose_forcefully(link.stream)
        nursery.cancel_scope.cancel()
