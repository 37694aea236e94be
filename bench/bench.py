"""Side-by-side bench driver: the same trace through each system, each in front of fresh workers.

For every system in order the driver starts ``workers`` simulated vLLM servers (``agentd
sim-backend`` subprocesses on loopback, identical sizes, time scale and seed), starts the
system under test in front of them, waits for health, replays the trace (bench.replay via
``bench.report.measured_replay``: worker and router metrics scraped before and after), stops everything and
writes ``<out>/<system>.json``.  Systems:

- ``native``: agentd, Program scheduling off, ``consistent_hash`` (keyed by ``x-session-id``);
- ``agentd``: agentd with Program scheduling (token capacity = one rank's simulated KV,
  ``global_queue: true``, ``binding_strategy: reasoning_token_balance``, time-scaled timing
  parameters and cost models);
- ``vllm-router``: the reference router with ``--policy consistent_hash``;
- ``vllm-router-ps``: the reference router with ``--enable-program-scheduling`` and the same
  Program scheduling JSON as ``agentd``;
- ``floor``: ``native`` in front of workers with ``floor_kv_blocks`` blocks per rank, enough that
  nothing is evicted: the unlimited-KV floor of the same trace (docs/benchmarks.md §9).

Both routers take the same launch flags (agentd accepts the reference router's flags).  Time
scaling: the simulated workers run ``time_scale`` times faster than their cost model, the
replay divides trace gaps by it, and every Program-scheduling duration (intervals, timeouts,
TTL bounds, prefill/decode cost coefficients) is divided by it, so each system sees the same
problem, only faster.  Subprocess output goes to ``<out>/logs/``.

Ports are fixed by ``port_base`` (router ``base``, its Prometheus port ``base + 1``, worker ``i`` at
``base + 2 + i``) and are the same for every system: both routers place sessions on a consistent-hash
ring keyed by the worker URLs, so ephemeral ports would give each run a different session-to-rank
placement (on a 4-rank cluster that alone moved the native token hit of one trace between 0.65 and
0.78).  ``port_base = 0`` takes free ephemeral ports instead (not reproducible).
"""

from __future__ import annotations

import json
import os
import shutil
import socket
import sys
import tempfile
from collections.abc import Sequence
from typing import IO, Any

import attrs
import httpx
import trio

from actors.core.config import DecodeThroughputModel, PrefillCostModel, ProgramSchedulingConfig
from bench.harness import cpu_seconds, daemon_env, free_port
from bench.output import report_json, write_atomic
from bench.progress import progress_line
from bench.replay import ReplayOptions, replay_client
from bench.report import measured_replay
from bench.trace.format import Trace
from sim.config import SimServerShape

SYSTEMS = ("native", "agentd", "vllm-router", "vllm-router-ps", "floor")
FLOOR_KV_BLOCKS = 40_000  # per rank: every prefix of the bench traces stays cached (docs/benchmarks.md §9)
# The seed's cost-model coefficients, from their single source (actors.core.config).  All are
# durations, divided by the time scale, except decode_throughput_alpha (a ratio).
_SEED_PREFILL = attrs.asdict(PrefillCostModel())
_SEED_DECODE = attrs.asdict(DecodeThroughputModel())
_UNSCALED = frozenset({"decode_throughput_alpha"})
# The Program-scheduling durations scaled with the time scale, at their defaults (from the core).
_TIME_FIELDS = (
    "metrics_interval_seconds",
    "queue_timeout_seconds",
    "force_resume_timeout_seconds",
    "paused_retention_ttl_seconds",
    "shared_prefix_freshness_warmup_seconds",
    "max_acting_ttl_seconds",
)
_DEFAULT_TIMES = {name: getattr(ProgramSchedulingConfig(), name) for name in _TIME_FIELDS}


class BenchError(RuntimeError):
    """A system could not be started or measured; the message says which and why."""


class BenchUsageError(BenchError):
    """A flag the bench cannot run with (e.g. ``--port-base`` over ports in use): exit 2."""


@attrs.frozen
class ClusterSpec(SimServerShape):
    """``workers`` simulated servers of one shape (``sim.config.SimServerShape``); worker ``i`` is
    seeded ``seed + i``."""

    workers: int = 2

    @property
    def rank_kv_tokens(self) -> int:
        return self.num_gpu_blocks * self.block_size


@attrs.frozen
class BenchOptions:
    out_dir: str
    systems: tuple[str, ...] = ("native", "agentd")
    cluster: ClusterSpec = ClusterSpec()
    replay: ReplayOptions = ReplayOptions()
    vllm_router: str | None = None  # executable; None = not available
    python: str = sys.executable
    startup_timeout_seconds: float = 60.0
    program_overrides: dict[str, Any] = attrs.field(factory=dict)
    floor_kv_blocks: int = FLOOR_KV_BLOCKS
    progress: bool = True
    port_base: int = 18100  # 0 = ephemeral ports (placement then differs per run)
    # agentd's [server] data_plane_processes for the native and agentd systems (docs/operations.md §13)
    agentd_processes: int = 1


def find_vllm_router(explicit: str | None = None) -> str | None:
    """The ``vllm-router`` executable: ``explicit`` if given, else the one on PATH."""
    if explicit:
        return explicit if os.access(explicit, os.X_OK) else None
    return shutil.which("vllm-router")


def scaled_program_config(cluster: ClusterSpec, overrides: dict[str, Any] | None = None) -> dict[str, Any]:
    """The Program scheduling JSON for both agentd and vllm-router-ps at ``cluster.time_scale``."""
    s = cluster.time_scale
    cfg: dict[str, Any] = {
        "global_queue": True,
        "resume_order": "mru",
        # new Programs start on the rank with the most free logical KV (the reference's option of
        # the same name; its default, consistent_hash, reproduces native's hash imbalance)
        "binding_strategy": "reasoning_token_balance",
        "token_capacity_per_dp_rank": cluster.rank_kv_tokens,
        **{k: v / s for k, v in _DEFAULT_TIMES.items()},
        "prefill_cost_model": {k: v if k in _UNSCALED else v / s for k, v in _SEED_PREFILL.items()},
        "decode_throughput_model": {k: v / s for k, v in _SEED_DECODE.items()},
    }
    for key, value in (overrides or {}).items():
        cfg[key] = value
    return cfg


def bench_ports(port_base: int, workers: int) -> tuple[int, int, list[int]]:
    """``(router, prometheus, [worker...])`` ports; fixed from ``port_base`` (see the module docstring)."""
    if port_base == 0:
        return free_port(), free_port(), [free_port() for _ in range(workers)]
    ports = [port_base + k for k in range(workers + 2)]
    if ports[-1] > 65535:
        raise BenchUsageError(f"--port-base: {port_base} + {workers + 1} is past port 65535")
    for port in ports:
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as the servers do: TIME_WAIT is fine
            try:
                sock.bind(("127.0.0.1", port))
            except OSError as exc:
                raise BenchUsageError(
                    f"--port-base: port {port} (of {ports[0]}..{ports[-1]}) is in use ({exc.strerror}); "
                    "pick another base, or 0 for ephemeral ports"
                ) from None
    return ports[0], ports[1], ports[2:]


def sim_backend_command(python: str, port: int, cluster: ClusterSpec, index: int) -> list[str]:
    return [
        python,
        "-m",
        "daemon",
        "sim-backend",
        "--host",
        "127.0.0.1",
        "--port",
        str(port),
        "--dp-size",
        str(cluster.dp_size),
        "--num-gpu-blocks",
        str(cluster.num_gpu_blocks),
        "--block-size",
        str(cluster.block_size),
        "--max-num-seqs",
        str(cluster.max_num_seqs),
        "--max-num-batched-tokens",
        str(cluster.max_num_batched_tokens),
        "--time-scale",
        str(cluster.time_scale),
        "--seed",
        str(cluster.seed + index),
        "--model",
        cluster.model,
        "--scheduling-policy",
        cluster.scheduling_policy,
    ]


def system_command(
    system: str, opts: BenchOptions, port: int, prom_port: int, worker_urls: Sequence[str], log_dir: str
) -> list[str]:
    c = opts.cluster
    common = [
        "--host",
        "127.0.0.1",
        "--port",
        str(port),
        "--worker-urls",
        *worker_urls,
        "--intra-node-data-parallel-size",
        str(c.dp_size),
        "--policy",
        "consistent_hash",
    ]
    ps = [
        "--enable-program-scheduling",
        "--program-scheduling-config-json",
        json.dumps(scaled_program_config(c, opts.program_overrides), sort_keys=True),
    ]
    if system in ("native", "agentd", "floor"):
        cmd = [opts.python, "-m", "daemon", "start", *common, "--log-level", "warning"]
        if opts.agentd_processes != 1:
            cmd += ["--data-plane-processes", str(opts.agentd_processes)]
        return cmd + ps if system == "agentd" else cmd
    if system in ("vllm-router", "vllm-router-ps"):
        if opts.vllm_router is None:
            raise BenchError(f"system {system!r} needs the vllm-router executable (--vllm-router or PATH)")
        cmd = [
            opts.vllm_router,
            *common,
            "--prometheus-host",
            "127.0.0.1",
            "--prometheus-port",
            str(prom_port),
            "--log-dir",
            log_dir,
            "--log-level",
            "warning",
        ]
        return cmd + ps if system == "vllm-router-ps" else cmd
    raise BenchError(f"systems: unknown system {system!r} (choose from {', '.join(SYSTEMS)})")


def system_cluster(system: str, opts: BenchOptions) -> ClusterSpec:
    """The workers ``system`` runs on: the bench's cluster, with unlimited KV for ``floor``."""
    if system == "floor":
        return attrs.evolve(opts.cluster, num_gpu_blocks=max(opts.cluster.num_gpu_blocks, opts.floor_kv_blocks))
    return opts.cluster


class _Procs:
    """Subprocesses of one system run; stopped in reverse start order."""

    def __init__(self, log_dir: str) -> None:
        self.log_dir = log_dir
        self.procs: list[tuple[str, trio.Process, IO[bytes]]] = []

    def _open_log(self, name: str, cmd: list[str]) -> IO[bytes]:
        """The process's log file, headed by its command line (a small local write)."""
        log = open(os.path.join(self.log_dir, f"{name}.log"), "wb")  # noqa: SIM115 - closed in stop_all
        log.write((" ".join(cmd) + "\n").encode())
        log.flush()
        return log

    async def start(self, name: str, cmd: list[str]) -> trio.Process:
        log = self._open_log(name, cmd)
        # each process its own state directory beside its log (an agentd's Batch API database:
        # one daemon per database, docs/batch.md §4), never the user's
        env = dict(daemon_env(os.path.join(self.log_dir, "state", name)), NO_COLOR="1", PYTHONUNBUFFERED="1")
        proc = await trio.lowlevel.open_process(cmd, stdout=log, stderr=log, env=env)
        self.procs.append((name, proc, log))
        return proc

    def tail(self, name: str, lines: int = 15) -> str:
        try:
            with open(os.path.join(self.log_dir, f"{name}.log"), encoding="utf-8", errors="replace") as fh:
                return "".join(fh.readlines()[-lines:])
        except OSError:
            return ""

    async def stop_all(self) -> None:
        """SIGTERM everything at once, wait up to 3 s, then SIGKILL what is left (nothing to flush)."""
        with trio.CancelScope(shield=True):
            for _name, proc, _log in self.procs:
                if proc.returncode is None:
                    proc.terminate()
            with trio.move_on_after(3):
                for _name, proc, _log in self.procs:
                    await proc.wait()
            for _name, proc, log in self.procs:
                if proc.returncode is None:
                    proc.kill()
                    await proc.wait()
                log.close()
            self.procs.clear()


def process_cpu_seconds(pid: int) -> float | None:
    """User + system CPU seconds of a live process and its live descendants (agentd's relay
    processes, docs/operations.md §13) (Linux ``/proc``); ``None`` elsewhere."""
    try:
        total = cpu_seconds(pid)
    except OSError:
        return None
    for child in _children(pid):
        total += process_cpu_seconds(child) or 0.0
    return total


def _children(pid: int) -> list[int]:
    found: list[int] = []
    try:
        for tid in os.listdir(f"/proc/{pid}/task"):
            with open(f"/proc/{pid}/task/{tid}/children", encoding="ascii") as fh:
                found += [int(c) for c in fh.read().split()]
    except OSError:
        return found
    return found


async def _wait_healthy(
    client: httpx.AsyncClient, url: str, proc: trio.Process, procs: _Procs, name: str, startup_seconds: float
) -> None:
    with trio.move_on_after(startup_seconds):
        while True:
            if proc.returncode is not None:
                raise BenchError(f"{name} exited with code {proc.returncode}:\n{procs.tail(name)}")
            try:
                resp = await client.get(url, timeout=2.0)
                if resp.status_code == 200:
                    return
            except httpx.HTTPError:
                pass
            await trio.sleep(0.2)
    raise BenchError(f"{name} not healthy at {url} after {startup_seconds:g} s:\n{procs.tail(name)}")


async def run_system(system: str, trace: Trace, opts: BenchOptions, info: dict[str, Any]) -> dict[str, Any]:
    """One system's run.  Its processes' logs and state directories are written in a temporary
    directory; when the run ends (or fails: the logs say why) the logs replace ``OUT/logs/<system>``,
    the state directories are dropped, and a run stopped by Ctrl-C leaves nothing of its own."""
    work = tempfile.mkdtemp(prefix=f"agentd-bench-{system}-")
    try:
        report = await _run_system(system, trace, opts, info, work)
    except BaseException as exc:
        if isinstance(exc, Exception):
            _keep_logs(work, os.path.join(opts.out_dir, "logs", system))
        shutil.rmtree(work, ignore_errors=True)
        raise
    _keep_logs(work, os.path.join(opts.out_dir, "logs", system))
    shutil.rmtree(work, ignore_errors=True)
    return report


def _keep_logs(work: str, log_dir: str) -> None:
    """Move the run's logs (everything but the processes' state directories) to ``log_dir``."""
    shutil.rmtree(log_dir, ignore_errors=True)
    os.makedirs(log_dir)
    for name in os.listdir(work):
        if name != "state":
            shutil.move(os.path.join(work, name), os.path.join(log_dir, name))


async def _run_system(
    system: str, trace: Trace, opts: BenchOptions, info: dict[str, Any], log_dir: str
) -> dict[str, Any]:
    procs = _Procs(log_dir)
    try:
        async with replay_client() as client:
            port, prom_port, worker_ports = bench_ports(opts.port_base, opts.cluster.workers)
            workers = []
            cluster = system_cluster(system, opts)
            for i, wport in enumerate(worker_ports):  # start all, then wait: startups overlap
                proc = await procs.start(f"worker-{i}", sim_backend_command(opts.python, wport, cluster, i))
                workers.append((f"http://127.0.0.1:{wport}", proc))
            for i, (url, proc) in enumerate(workers):
                await _wait_healthy(client, f"{url}/health", proc, procs, f"worker-{i}", opts.startup_timeout_seconds)
            worker_urls = [url for url, _proc in workers]
            proc = await procs.start(system, system_command(system, opts, port, prom_port, worker_urls, log_dir))
            target = f"http://127.0.0.1:{port}"
            await _wait_healthy(client, f"{target}/health", proc, procs, system, opts.startup_timeout_seconds)
            router_metrics = (
                f"http://127.0.0.1:{prom_port}/metrics" if system.startswith("vllm-router") else f"{target}/metrics"
            )
            with progress_line(opts.progress, f"{system:>14}") as progress:
                report = await measured_replay(
                    trace,
                    client,
                    target,
                    opts.replay,
                    worker_metrics=[f"{u}/metrics" for u in worker_urls],
                    router_metrics=[router_metrics],
                    info=info,
                    system=system,
                    progress=progress,
                )
            report["process_cpu_seconds"] = {
                "system": process_cpu_seconds(proc.pid),
                "workers": [process_cpu_seconds(p.pid) for _url, p in workers],
            }
            report["cluster"] = attrs.asdict(cluster)
            if system in ("agentd", "vllm-router-ps"):
                report["program_scheduling_config"] = scaled_program_config(opts.cluster, opts.program_overrides)
            return report
    finally:
        await procs.stop_all()


async def run_bench(trace: Trace, opts: BenchOptions, info: dict[str, Any]) -> dict[str, dict[str, Any]]:
    reports: dict[str, dict[str, Any]] = {}
    for system in opts.systems:
        report = await run_system(system, trace, opts, info)
        os.makedirs(opts.out_dir, exist_ok=True)
        write_atomic(os.path.join(opts.out_dir, f"{system}.json"), report_json(report))
        reports[system] = report
    return reports


if __name__ == "__main__":
    import sys

    from bench.interrupt import not_a_command

    sys.exit(not_a_command("bench.bench", "agentd bench"))
