"""The data plane across processes: N relay processes, one scheduler process (docs/operations.md §13).

With ``[server] data_plane_processes = 1`` (the default) none of this runs: one process serves HTTP
and schedules, exactly as before.  With N > 1 the supervisor (the *scheduler process*) keeps the
actors, the pure core, the health checks, model discovery and every operational route, and starts N
*relay processes* that accept on the public port (one listening socket, inherited) and run the HTTP
edge and the proxy.  Each relay talks to the scheduler over its own Unix socket pair:

* :mod:`daemon.dataplane.wire` - the frame values and their codec (length-prefixed compact JSON of
  cattrs-unstructured attrs values);
* :mod:`daemon.dataplane.link` - a framed connection (one writer task, batched writes);
* :mod:`daemon.dataplane.scheduler_side` - the scheduler's end: feeds the relays' lease requests
  through the in-process :class:`~daemon.program_dispatch.ProgramDispatcher` (same code, another
  transport), abandons every open lease of a relay whose socket ends, publishes snapshots (healthy
  targets, served models, native in-flight counts) and collects the relays' metrics;
* :mod:`daemon.dataplane.relay` - the relay's end: the remote Program dispatcher, the native
  dispatcher over the published snapshot, the relay process's ASGI app and main loop;
* :mod:`daemon.dataplane.processes` - starting, watching and restarting relay processes;
* :mod:`daemon.dataplane.metrics_merge` - one ``/metrics`` exposition from every process.
"""

from __future__ import annotations

import os

MAX_AUTO_DATA_PLANE_PROCESSES = 4


def resolve_processes(configured: int, *, embedded: bool, cpu_count: int | None = None) -> int:
    """The number of relay processes to run: ``configured``, ``0`` meaning the number of cores
    capped at :data:`MAX_AUTO_DATA_PLANE_PROCESSES`; always 1 in embedded mode (the simulated
    workers live in the scheduler process)."""
    if embedded:
        return 1
    if configured == 0:
        cores = cpu_count if cpu_count is not None else (os.cpu_count() or 1)
        return max(1, min(cores, MAX_AUTO_DATA_PLANE_PROCESSES))
    return configured
