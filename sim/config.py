"""The shape of a simulated vLLM server: one frozen value for every place that describes one.

``SimServerShape`` is what a simulated server looks like from outside: its data-parallel ranks, KV
cache, batching limits, time scale, served model name, scheduling policy and seed.  Each field
carries its rule (``actors.core.config.rule_field``), so a configuration section built on it is
checked by ``actors.core.config.problems`` with errors naming the field, the rule and the value.
Built on it (docs/simulator.md §4):

* ``daemon.config.EmbeddedConfig`` (+ ``num_workers``): the ``[embedded]`` section;
* ``bench.bench.ClusterSpec`` (+ ``workers``): the bench's simulated workers;
* ``sim.sequence.EngineConfig`` (+ cost model, run planning): the engine of one rank;
* ``sim.cluster.SimConfig.from_shape(shape)``: a server of that shape.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import attrs

from actors.core.config import INT_GE_0, INT_GT_0, NON_EMPTY, finite, one_of, rule_field

# fcfs and priority: vLLM v1's waiting queues; batch_job_aware: the seed's batch-job-aware
# scheduler (docs/simulator.md §1, "Scheduler", docs/batch.md §5).
SCHEDULING_POLICIES = ("fcfs", "priority", "batch_job_aware")
DEFAULT_MODEL = "agentd-sim"

# What one process holds of simulated servers: a rank costs about 6 KB and a KV block about 60 bytes
# (sim.kv.BlockPool), so about 24 MB of ranks and 1 GB of blocks. Beyond them, num_gpu_blocks = 1e11
# was a MemoryError traceback at start and dp_size = 1e8 a process that grew until it was killed.
MAX_SIM_RANKS = 4096
MAX_SIM_KV_BLOCKS = 2**24
# The slowest a simulated server runs: a thousand times slower than real time. Virtual-time runs
# (agentd simulate, check-fairness) cost wall time per simulated second (the daemon's metrics and
# health ticks), so at 1e-6 a three-Program trace ran for hours and at 1e-12 never ended
# (docs/config.md [embedded], docs/traces.md "Time scale")
MIN_TIME_SCALE = 1e-3
TIME_SCALE_RULE = (
    lambda x: finite(x) and x >= MIN_TIME_SCALE,
    f"must be finite and >= {MIN_TIME_SCALE:g}",
)


@attrs.frozen
class SimServerShape:
    """One simulated vLLM server; the defaults are the ``[embedded]`` section's (docs/config.md)."""

    dp_size: int = rule_field(INT_GT_0, 2)
    num_gpu_blocks: int = rule_field(INT_GT_0, 4096)
    block_size: int = rule_field(INT_GT_0, 16)
    max_num_seqs: int = rule_field(INT_GT_0, 256)
    max_num_batched_tokens: int = rule_field(INT_GT_0, 8192)
    time_scale: float = rule_field(TIME_SCALE_RULE, 1.0)
    model: str = rule_field(NON_EMPTY, DEFAULT_MODEL)
    scheduling_policy: str = rule_field(one_of(*SCHEDULING_POLICIES), "fcfs")
    seed: int = rule_field(INT_GE_0, 0)

    @property
    def max_model_len(self) -> int:
        """Tokens one request may hold: every KV block but the reserved null block."""
        return (self.num_gpu_blocks - 1) * self.block_size

    def servers_in_process(self) -> tuple[str, int] | None:
        """The field that counts the servers of this shape one process runs, and its value (None:
        one server, as ``agentd sim-backend``)."""
        return None

    def _cross_field_problems(self, path: str) -> Iterator[str]:
        p = f"{path}." if path else ""
        count = self.servers_in_process()
        name, servers = count if count is not None else ("", 1)
        if not all(
            isinstance(x, int) and not isinstance(x, bool) and x > 0
            for x in (self.dp_size, self.num_gpu_blocks, servers)
        ):
            return  # a field's own rule names it
        of, got = (f"{name} x ", f"{servers} x ") if name else ("", "")
        if servers * self.dp_size > MAX_SIM_RANKS:
            what = f"{of}dp_size " if name else ""
            rule = f"must be at most {MAX_SIM_RANKS} simulated ranks in one process"
            yield f"{p}dp_size: {what}{rule} (got {got}{self.dp_size})"
        elif servers * self.dp_size * self.num_gpu_blocks > MAX_SIM_KV_BLOCKS:
            yield (
                f"{p}num_gpu_blocks: {of}dp_size x num_gpu_blocks must be at most {MAX_SIM_KV_BLOCKS} KV blocks "
                f"in one process (got {got}{self.dp_size} x {self.num_gpu_blocks})"
            )


def shape_fields(source: object) -> dict[str, Any]:
    """``SimServerShape``'s fields read from ``source`` (anything with these attributes), by name."""
    return {a.name: getattr(source, a.name) for a in attrs.fields(SimServerShape)}


def shape_of(source: object) -> SimServerShape:
    """The shape of ``source``, e.g. of ``agentd sim-backend``'s flags (they carry the field names)."""
    return SimServerShape(**shape_fields(source))


def own_fields_first(cls: type, fields: list[attrs.Attribute[Any]]) -> list[attrs.Attribute[Any]]:
    """attrs ``field_transformer`` for a class built on the shape: its own fields come before the
    inherited ones where fields are listed in order (``[embedded] num_workers`` first in
    ``agentd check-config``'s output, as before the shape existed)."""
    own = vars(cls).get("__annotations__", {})
    return [f for f in fields if f.name in own] + [f for f in fields if f.name not in own]
