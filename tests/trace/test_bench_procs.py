"""The per-process accounting the socket benchmarks print (bench/procs.py, docs/benchmarks.md §10.3):
which process holds the server end of each load-generator connection, over real loopback sockets."""

from __future__ import annotations

import os
import socket
import subprocess
import sys

from bench.procs import connection_owners, process_cpu, process_role, tree_pids


def test_connections_are_attributed_to_the_process_holding_them() -> None:
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen(8)
    port = server.getsockname()[1]
    clients = [socket.create_connection(("127.0.0.1", port)) for _ in range(3)]
    accepted = [server.accept()[0] for _ in clients]
    other = socket.create_connection(("127.0.0.1", port))  # never accepted: no process holds it
    try:
        owners = connection_owners([os.getpid()], port)
        assert owners == {c.getsockname()[1]: os.getpid() for c in clients}
        assert connection_owners([os.getpid()], port + 1 if port < 65535 else port - 1) == {}
    finally:
        for one in [*clients, *accepted, other, server]:
            one.close()


def test_a_process_tree_with_roles_and_cpu() -> None:
    child = subprocess.Popen([sys.executable, "-c", "import sys; sys.stdin.read()"], stdin=subprocess.PIPE)
    try:
        pids = tree_pids(os.getpid())
        assert pids[0] == os.getpid() and child.pid in pids
        assert process_role(os.getpid()) == "main"
        cpu = process_cpu(os.getpid())
        assert cpu is not None and cpu > 0
    finally:
        assert child.stdin is not None
        child.stdin.close()
        child.wait()
    assert child.pid not in tree_pids(os.getpid())
    assert process_cpu(child.pid) is None and process_role(child.pid) == "gone"
