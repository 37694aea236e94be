"""Capacity invariants: the counters that must return to their resting value when no request is
in flight (docs/operations.md §11, issue 14 "no leaks").

:func:`capacity_invariants` reads them (never mutates anything) from the daemon's handles; it is
the ``invariants`` section of ``/scheduling/diagnostics`` and what the fault suite checks after
every case.  Request-bound counters (``at_rest`` requires each to be zero):

* ``native_in_flight`` - leases held by identity-free requests (the native dispatcher's count);
* ``proxy_in_flight`` - the sum of ``agentd_proxy_in_flight_requests`` over targets;
* ``program_open_leases`` - Program/batch requests submitted and not yet rejected, completed or
  abandoned (the dispatcher's counters);
* ``program_in_flight`` and ``program_queued`` - requests the core holds as dispatched or waiting;
* ``in_flight_reserved_tokens`` - the context tokens the core reserved for its in-flight requests;
* ``pending_replies`` - reply channels the scheduler keeps for requests not answered yet;
* ``relay_native_in_flight`` - identity-free requests in flight in the relay processes, as last
  reported (docs/operations.md §13; 0 in one process).

Also reported, not request-bound: ``charged_tokens`` (tokens the ledger charges to active
Programs, released by their TTL), ``release_waits_count`` (completions/abandons that waited for
room in the scheduler inbox: delivered late, never dropped), ``scheduler_inbox_used``, and the
upstream pools' ``upstream_open_connections``/``upstream_idle_connections`` (plain HTTP and TLS
workers together) with ``upstream_stale_retries_count`` (plain HTTP requests sent again after the
keep-alive idle-close race).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from daemon.handles import DaemonHandles

REQUEST_BOUND = (
    "native_in_flight",
    "proxy_in_flight",
    "program_open_leases",
    "program_in_flight",
    "program_queued",
    "in_flight_reserved_tokens",
    "pending_replies",
    "relay_native_in_flight",
)


def capacity_invariants(handles: DaemonHandles) -> dict[str, Any]:
    out: dict[str, Any] = {
        "native_in_flight": handles.native_dispatcher.total_in_flight(),
        "proxy_in_flight": int(
            sum(
                handles.registry.get_sample_value("agentd_proxy_in_flight_requests", {"target": t.target_id}) or 0
                for t in handles.targets
            )
        ),
        "program_open_leases": 0,
        "program_in_flight": 0,
        "program_queued": 0,
        "in_flight_reserved_tokens": 0,
        "pending_replies": 0,
        # identity-free requests in flight in the relay processes (docs/operations.md §13), as they
        # last reported (every 50 ms); 0 without relay processes
        "relay_native_in_flight": 0 if handles.data_plane is None else handles.data_plane.hub.native_in_flight(),
    }
    program = handles.program_dispatcher
    scheduler = getattr(program, "scheduler", None)
    if program is not None and scheduler is not None:
        state = scheduler.state
        counters = program.counters  # type: ignore[attr-defined]
        out["program_open_leases"] = counters.open_leases()
        out["program_in_flight"] = len(state.in_flight)
        out["program_queued"] = len(state.pool)
        out["in_flight_reserved_tokens"] = sum(d.estimated_context_tokens for d in state.in_flight.values())
        out["pending_replies"] = scheduler.pending_replies_count
        out["charged_tokens"] = round(sum(r.fallback_tokens + r.batch_tokens for r in state.ranks.values()), 3)
        out["release_waits_count"] = counters.release_waits_count
        out["scheduler_inbox_used"] = scheduler.inbox.send.statistics().current_buffer_used
    transport = handles.engine.transport
    pool = getattr(transport, "pool", None)
    if pool is not None:
        # both pools of the upstream transport: plain HTTP (daemon/h1client.py) and, once an
        # ``https://`` worker was asked, TLS (daemon/pool_reaper.py); docs/operations.md §11.5
        tls = getattr(transport, "tls", None)
        out["upstream_open_connections"] = pool.open_connections + (0 if tls is None else tls.open_connections())
        out["upstream_idle_connections"] = pool.idle_connections() + (0 if tls is None else tls.idle_connections())
        out["upstream_stale_retries_count"] = pool.stale_retries_count
    out["at_rest"] = all(out[name] == 0 for name in REQUEST_BOUND)
    return out
