"""agentd's request ids are random version-4 UUIDs, unique, also across a fork."""

from __future__ import annotations

import os
import uuid

from daemon.request_ids import PREFIX, RequestIds


def test_ids_are_distinct_version_4_uuids_across_pool_refills() -> None:
    ids = RequestIds()
    drawn = [ids.new() for _ in range(1000)]  # several refills of the random pool
    assert len(set(drawn)) == 1000
    for rid in drawn:
        assert rid.startswith(PREFIX)
        value = uuid.UUID(rid[len(PREFIX) :])
        assert value.version == 4 and value.variant == uuid.RFC_4122 and value.hex == rid[len(PREFIX) :]


def test_a_forked_child_draws_its_own_ids() -> None:
    ids = RequestIds()
    ids.new()  # the parent's pool exists before the fork
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: report its next id and leave at once
        os.write(write, ids.new().encode())
        os._exit(0)
    os.close(write)
    child = os.read(read, 100).decode()
    os.close(read)
    os.waitpid(pid, 0)
    assert child != ids.new() and child.startswith(PREFIX)
