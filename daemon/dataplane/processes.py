"""Relay processes: start, watch, restart, drain (docs/operations.md §13.1-13.2).

:class:`DataPlane` runs in the scheduler process (the supervisor).  It owns the public listening
socket (bound once; every relay inherits it and accepts on it, so the kernel hands each new
connection to whichever relay accepts first, and a relay that dies loses only the connections it
had accepted), one :class:`~daemon.dataplane.scheduler_side.DataPlaneHub` and one slot per relay.
A slot starts ``python -m daemon.dataplane.relay_main`` with a fresh Unix socket pair (one end
inherited by the child), writes the child's :class:`~daemon.dataplane.relay_main.RelaySpec` to its
stdin and serves its socket until the process exits.

* A relay that exits while the daemon is not shutting down is logged (``relay_exited``) and
  started again after a backoff (0.5 s, doubling up to 10 s; back to 0.5 s after a relay lived 30 s).
  Its socket ended with its death, so the hub already released its open leases as abandoned.
* Shutdown (``shutdown`` set: SIGTERM/SIGINT or ``handles.request_shutdown()``): the parent's copy
  of the listening socket is closed, every relay gets :data:`STOP_SIGNAL` and drains (the same graceful drain as
  one process, docs/operations.md §10.4); a relay still alive ``shutdown_grace_seconds`` + 5 s later
  is killed.
* The scheduler process failing (an actor crash cancels the supervisor): every relay socket is
  closed, so each relay refuses new work with a 503, drains and exits; the same deadline applies.
"""

from __future__ import annotations

import logging
import os
import pickle
import signal
import socket
import subprocess
import sys
from typing import Any

import attrs
import trio
from hypercorn.utils import repr_socket_addr

from actors.logevents import get_logger, log_event
from daemon.config import AgentdConfig
from daemon.dataplane.balance import NOT_ACCEPTING, AcceptBoard
from daemon.dataplane.link import Link
from daemon.dataplane.metrics_merge import RelayMetrics
from daemon.dataplane.scheduler_side import METRICS_TIMEOUT_SECONDS, DataPlaneHub, RelayConnection
from daemon.http.serve import ACCEPT_BACKLOG, bind_address, create_listening_sockets, hypercorn_config

logger = get_logger("dataplane")
RESTART_INITIAL_SECONDS = 0.5
RESTART_MAX_SECONDS = 10.0
RESTART_RESET_AFTER_SECONDS = 30.0
READY_TIMEOUT_SECONDS = 60.0
READY_POLL_SECONDS = 0.01
KILL_MARGIN_SECONDS = 5.0
# How the scheduler process asks a relay to drain.  Not SIGTERM: a process manager that signals the
# whole group or cgroup (systemd's default KillMode=control-group, `kill -TERM -PGID`) sends every
# relay a SIGTERM of its own, and a relay took the scheduler's as the second signal that cancels at
# once, cutting every stream without the drain.  A relay drains on the first of either and cancels
# only on a second signal of the same kind (daemon/dataplane/relay_main.py).  Its default action
# ends a relay still importing, quietly (SIGINT would raise KeyboardInterrupt there).
STOP_SIGNAL = signal.SIGUSR1


def listening_socket(host: str, port: int) -> tuple[socket.socket, str]:
    """The public listening socket (bound and listening, never accepted on by the parent)."""
    config = hypercorn_config(host, port, 0.0)
    config.bind = [bind_address(host, port)]
    sockets = create_listening_sockets(config, "server.port")
    sock = sockets[0]
    for extra in sockets[1:]:
        extra.close()
    sock.listen(ACCEPT_BACKLOG)
    return sock, f"http://{repr_socket_addr(sock.family, sock.getsockname())}"


class RelayStartError(RuntimeError):
    """A relay process exited (or did not accept connections in time) before it was ready: the
    daemon does not start (``agentd start`` says so in one line, exit 1; docs/operations.md §13.2)."""


@attrs.frozen
class RelaySpec:
    config: AgentdConfig
    index: int
    control_fd: int
    listen_fd: int
    scheduler_url: str  # the scheduler process's internal listener (every non-proxy route)
    board_fd: int  # the AcceptBoard every relay maps (daemon/dataplane/balance.py)
    processes: int  # its slots, one per relay


@attrs.define(eq=False)
class RelaySlot:
    """One relay process position (diagnostics read it)."""

    index: int
    pid: int | None = None
    starts_count: int = 0
    restarts_count: int = 0
    last_exit: str | None = None
    started_at: float | None = None
    # leases released because an earlier process's socket ended (the current connection counts its own)
    abandoned_before: int = 0
    connection: RelayConnection | None = None
    process: trio.Process | None = None


def _exit_text(code: int | None) -> str:
    if code is None:
        return "running"
    if code < 0:
        try:
            return f"killed by {signal.Signals(-code).name}"
        except ValueError:
            return f"killed by signal {-code}"
    return f"exit status {code}"


class DataPlane:
    """The relay processes of one daemon (see the module doc)."""

    def __init__(
        self, cfg: AgentdConfig, processes: int, hub: DataPlaneHub, sock: socket.socket, public_url: str
    ) -> None:
        self.cfg = cfg
        self.processes = processes
        self.hub = hub
        self.sock = sock
        self.public_url = public_url
        self.slots = [RelaySlot(i) for i in range(processes)]
        self.board = AcceptBoard.create(processes)  # open connections per relay, shared with them
        self.scheduler_url: str | None = None
        self.stopping = False
        # /metrics: the relays' expositions, counters kept across relay restarts (docs/operations.md §13.3)
        self.relay_metrics = RelayMetrics(lambda: self.hub.connections, METRICS_TIMEOUT_SECONDS)

    def restarts_count(self) -> int:
        """Relay processes started again after one exited, over every position (``/metrics``)."""
        return sum(slot.restarts_count for slot in self.slots)

    def diagnostics(self) -> dict[str, Any]:
        """The ``data_plane`` section of ``/scheduling/diagnostics``."""
        now = trio.current_time()
        relays = []
        counts = self.board.counts()
        for slot in self.slots:
            conn = slot.connection
            relays.append(
                {
                    "index": slot.index,
                    "pid": slot.pid,
                    "alive": slot.process is not None and slot.process.returncode is None,
                    "starts_count": slot.starts_count,
                    "restarts_count": slot.restarts_count,
                    "last_exit": slot.last_exit,
                    "uptime_seconds": None if slot.started_at is None else now - slot.started_at,
                    "accepting": counts[slot.index] != NOT_ACCEPTING,
                    "open_connections": max(0, counts[slot.index]),
                    **(conn.document() if conn is not None else {"open_leases": 0}),
                    # over every process of this position, as restarts_count: a restart began a new
                    # connection whose count started at 0 (session-35 walk)
                    "abandoned_on_close_count": slot.abandoned_before
                    + (conn.abandoned_on_close_count if conn is not None else 0),
                }
            )
        return {
            "processes": self.processes,
            "scheduler_pid": os.getpid(),
            "public_url": self.public_url,
            "open_leases": sum(r["open_leases"] for r in relays),
            "passes": self.hub.passes_document(),
            "view_mismatches_count": self.hub.view_mismatches_count,
            "metrics": self.relay_metrics.document(),
            "relays": relays,
        }

    async def run(
        self, scheduler_url: str, shutdown: trio.Event, *, task_status: Any = trio.TASK_STATUS_IGNORED
    ) -> None:
        """Run every relay until ``shutdown`` drains them; started once each relay said hello."""
        self.scheduler_url = scheduler_url
        try:
            async with trio.open_nursery() as nursery:
                nursery.start_soon(self.hub.run_publisher)
                async with trio.open_nursery() as slots:
                    ready = trio.Semaphore(0)  # one release per relay that said hello
                    for slot in self.slots:  # the relays boot concurrently
                        slots.start_soon(self._run_slot, slot, shutdown, ready)
                    for _ in self.slots:
                        await ready.acquire()
                    task_status.started()
                    slots.start_soon(self._stop_on, shutdown)
                nursery.cancel_scope.cancel()
        finally:
            self.sock.close()
            self.board.close()

    async def _stop_on(self, shutdown: trio.Event) -> None:
        await shutdown.wait()
        self.stopping = True
        self.sock.close()  # no new connection waits in a backlog nobody will accept from
        for slot in self.slots:
            if slot.process is not None and slot.process.returncode is None:
                slot.process.send_signal(STOP_SIGNAL)

    async def _spawn(self, slot: RelaySlot) -> tuple[trio.Process, Link]:
        parent_end, child_end = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            assert self.scheduler_url is not None
            spec = RelaySpec(
                self.cfg,
                slot.index,
                child_end.fileno(),
                self.sock.fileno(),
                self.scheduler_url,
                self.board.fd,
                self.processes,
            )
            command, env = relay_command()
            proc = await trio.lowlevel.open_process(
                command,
                env=env,
                stdin=subprocess.PIPE,
                pass_fds=(child_end.fileno(), self.sock.fileno(), self.board.fd),
                # a process group of its own: a Ctrl-C in a terminal signals the whole foreground
                # group, and a relay still importing died of it with a traceback (the daemon then
                # exited 1); the scheduler process turns SIGINT/SIGTERM into one STOP_SIGNAL per relay
                process_group=0,
            )
        finally:
            child_end.close()
        assert proc.stdin is not None
        try:
            async with proc.stdin:
                await proc.stdin.send_all(pickle.dumps(spec))
        except trio.BrokenResourceError:
            # the child died before it read its specification: a signal to this process group
            # (a Ctrl-C) that reached it before it left the group.  Its exit is handled as any
            # relay's: a start-up error, a restart, or nothing during the shutdown
            pass
        stream = trio.SocketStream(trio.socket.from_stdlib_socket(parent_end))
        return proc, Link(stream)

    async def _run_slot(self, slot: RelaySlot, shutdown: trio.Event, ready: trio.Semaphore) -> None:
        backoff = RESTART_INITIAL_SECONDS
        first = True
        while not shutdown.is_set():
            proc, link = await self._spawn(slot)
            conn = self.hub.connect(slot.index, link)
            if slot.connection is not None:  # the previous process's connection (diagnostics showed it until now)
                slot.abandoned_before += slot.connection.abandoned_on_close_count
            slot.process, slot.pid, slot.connection = proc, proc.pid, conn
            if self.stopping:
                # the shutdown began while this relay was being started (a restart: _spawn awaits),
                # so _stop_on's signals missed it; without one it accepted on the public port and
                # the daemon waited for it forever (docs/operations.md §13.2)
                proc.send_signal(STOP_SIGNAL)
            slot.starts_count += 1
            slot.started_at = trio.current_time()
            log_event(logger, logging.INFO, "relay_started", relay=slot.index, pid=proc.pid, start=slot.starts_count)
            try:
                async with trio.open_nursery() as nursery:
                    nursery.start_soon(conn.serve)
                    if first:
                        await self._wait_ready(conn, proc, slot, shutdown)
                        ready.release()
                        first = False
                    await self._wait_exit(proc, slot, shutdown)
            finally:
                with trio.CancelScope(shield=True):
                    await self._reap(proc, conn)
                self.board.set(slot.index, NOT_ACCEPTING)  # the others stop leaving connections to it
                self.hub.disconnect(conn)
            lived = trio.current_time() - slot.started_at
            slot.last_exit = _exit_text(proc.returncode)
            if shutdown.is_set():
                log_event(logger, logging.INFO, "relay_stopped", relay=slot.index, pid=proc.pid, exit=slot.last_exit)
                return
            slot.restarts_count += 1
            if lived >= RESTART_RESET_AFTER_SECONDS:
                backoff = RESTART_INITIAL_SECONDS
            log_event(
                logger,
                logging.WARNING,
                "relay_exited",
                relay=slot.index,
                pid=proc.pid,
                exit=slot.last_exit,
                lived_seconds=round(lived, 3),
                restart_in_seconds=backoff,
                abandoned_leases=conn.abandoned_on_close_count,
            )
            await _sleep_unless(shutdown, backoff)
            backoff = min(backoff * 2, RESTART_MAX_SECONDS)

    async def _wait_exit(self, proc: trio.Process, slot: RelaySlot, shutdown: trio.Event) -> None:
        """Until the relay exits; once the shutdown began, at most ``shutdown_grace_seconds`` + 5 s:
        a relay that does not drain by then (stopped, stuck) is killed (``relay_killed``,
        docs/operations.md §13.2).  Before, the supervisor waited for it without a deadline."""
        async with trio.open_nursery() as watch:

            async def deadline() -> None:
                await shutdown.wait()
                await trio.sleep(self.cfg.server.shutdown_grace_seconds + KILL_MARGIN_SECONDS)
                log_event(logger, logging.WARNING, "relay_killed", relay=slot.index, pid=proc.pid)
                proc.kill()

            watch.start_soon(deadline)
            await proc.wait()
            watch.cancel_scope.cancel()

    async def _wait_ready(
        self, conn: RelayConnection, proc: trio.Process, slot: RelaySlot, shutdown: trio.Event
    ) -> None:
        """Until the relay accepts connections; a relay that exits first did not start (an error),
        unless the shutdown began meanwhile (a Ctrl-C during start-up: the relays are then stopped
        at once, not after they finished booting)."""
        accepting = False
        async with trio.open_nursery() as race:

            async def exited() -> None:
                await proc.wait()
                race.cancel_scope.cancel()

            async def stopping() -> None:
                await shutdown.wait()
                race.cancel_scope.cancel()

            race.start_soon(exited)
            race.start_soon(stopping)
            with trio.move_on_after(READY_TIMEOUT_SECONDS):
                await conn.hello.wait()
                # ready = accepting: the relay marks its slot of the board at its first accept() call,
                # after its first snapshot and its server's start-up (the daemon's "listening" banner
                # then means every relay takes connections, so none is missed by a burst of connects)
                while self.board.get(slot.index) == NOT_ACCEPTING:  # noqa: ASYNC110 (another process writes it)
                    await trio.sleep(READY_POLL_SECONDS)
                accepting = True
            race.cancel_scope.cancel()
        if not accepting and not shutdown.is_set():
            raise RelayStartError(
                f"relay process {slot.index} (pid {proc.pid}) did not start: {_exit_text(proc.returncode)}"
            )

    async def _reap(self, proc: trio.Process, conn: RelayConnection) -> None:
        """After the relay's end (or on the scheduler's): close its socket and make sure it exits."""
        conn.link.close()
        await trio.aclose_forcefully(conn.link.stream)  # a live relay sees the end: it drains and exits
        if proc.returncode is not None:
            return
        with trio.move_on_after(self.cfg.server.shutdown_grace_seconds + KILL_MARGIN_SECONDS):
            await proc.wait()
            return
        log_event(logger, logging.WARNING, "relay_killed", relay=conn.index, pid=proc.pid)
        proc.kill()
        await proc.wait()


def relay_command() -> tuple[list[str], dict[str, str]]:
    """The relay process's command line and environment: the same interpreter and the same agentd
    code as this process, wherever it was started from.

    ``python -m`` puts the working directory first on ``sys.path``: started from a directory that
    holds a ``daemon`` package or a ``daemon.py`` (another checkout, an unrelated project), the
    relays imported that instead of agentd (a relay that fails to start stops the daemon).  ``-P``
    (Python 3.11) leaves the working directory out, and the directory this process imported agentd
    from goes first on the child's ``PYTHONPATH``: the child then imports that same code even where
    this process found it through a path the child does not inherit (a source checkout run with
    ``python -m daemon``, a second checkout beside an editable install, a test runner's own
    ``sys.path`` entries)."""
    import daemon

    root = os.path.dirname(os.path.dirname(os.path.abspath(daemon.__file__)))
    env = dict(os.environ)
    rest = [p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p and os.path.abspath(p) != root]
    env["PYTHONPATH"] = os.pathsep.join([root, *rest])
    return [sys.executable, "-P", "-m", "daemon.dataplane.relay_main"], env


async def _sleep_unless(event: trio.Event, seconds: float) -> None:
    with trio.move_on_after(seconds):
        await event.wait()
