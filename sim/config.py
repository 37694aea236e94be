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

from typing import Any

import attrs

from actors.core.config import FINITE_GT_0, INT_GE_0, INT_GT_0, NON_EMPTY, one_of, rule_field

# fcfs and priority: vLLM v1's waiting queues; batch_job_aware: the seed's batch-job-aware
# scheduler (docs/simulator.md §1, "Scheduler", docs/batch.md §5).
SCHEDULING_POLICIES = ("fcfs", "priority", "batch_job_aware")
DEFAULT_MODEL = "agentd-sim"


@attrs.frozen
class SimServerShape:
    """One simulated vLLM server; the defaults are the ``[embedded]`` section's (docs/config.md)."""

    dp_size: int = rule_field(INT_GT_0, 2)
    num_gpu_blocks: int = rule_field(INT_GT_0, 4096)
    block_size: int = rule_field(INT_GT_0, 16)
    max_num_seqs: int = rule_field(INT_GT_0, 256)
    max_num_batched_tokens: int = rule_field(INT_GT_0, 8192)
    time_scale: float = rule_field(FINITE_GT_0, 1.0)
    model: str = rule_field(NON_EMPTY, DEFAULT_MODEL)
    scheduling_policy: str = rule_field(one_of(*SCHEDULING_POLICIES), "fcfs")
    seed: int = rule_field(INT_GE_0, 0)

    @property
    def max_model_len(self) -> int:
        """Tokens one request may hold: every KV block but the reserved null block."""
        return (self.num_gpu_blocks - 1) * self.block_size


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
