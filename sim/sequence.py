"""Values of the simulated engine: its configuration, a request's state, and an output.

``Request`` is mutable and owned by the engine once added (see ``engine.py``).
"""

from __future__ import annotations

import attrs

from actors.core.config import BatchJobsConfig
from sim.config import SimServerShape
from sim.kv import salt_key
from sim.stats import CostModel

WAITING, RUNNING, PREEMPTED, FINISHED = "waiting", "running", "preempted", "finished"


@attrs.frozen
class EngineConfig(SimServerShape):
    """The engine of one rank: the server's shape (the engine reads the per-rank fields, not
    ``dp_size`` nor ``model``) plus what only the engine model needs."""

    cost: CostModel = CostModel()
    max_steps_per_run: int = 1 << 30  # 1 disables multi-step runs (reference step-by-step mode)
    # the seed's batch_job_sched_config under scheduling_policy "batch_job_aware": the engine reads
    # max_jobs, reserve_margin_blocks, reserve_max_blocks, low_available_tokens_threshold and
    # short_decode_token_threshold (enabled, block_size_tokens and max_wait_seconds are the router's)
    batch_jobs: BatchJobsConfig = BatchJobsConfig()


class Request:
    """One request inside the engine (mutable; owned by the engine)."""

    __slots__ = (
        "request_id",
        "prompt",
        "output",
        "finish_reason",
        "priority",
        "arrival_time",
        "eligible_time",
        "salt",
        "skip_prefix_cache",
        "block_hashes",
        "status",
        "num_computed",
        "num_output",
        "blocks",
        "num_cached_blocks",
        "num_cached_tokens",
        "num_preemptions",
        "first_scheduled_time",
        "first_token_time",
        "last_token_time",
        "seq",
    )

    def __init__(
        self,
        request_id: str,
        prompt_token_ids: list[int],
        output_token_ids: list[int],
        *,
        finish_reason: str = "length",
        priority: int = 0,
        cache_salt: str | None = None,
        skip_prefix_cache: bool = False,
        prompt_block_hashes: list[int] | None = None,
    ) -> None:
        if not prompt_token_ids:
            raise ValueError("prompt_token_ids must not be empty")
        if not output_token_ids:
            raise ValueError("output_token_ids must not be empty")
        self.request_id = request_id
        self.prompt = prompt_token_ids
        self.output = output_token_ids
        self.finish_reason = finish_reason
        self.priority = priority
        self.salt = salt_key(cache_salt)
        self.skip_prefix_cache = skip_prefix_cache
        # the engine takes ownership of a supplied hash list (it appends output-block hashes)
        self.block_hashes: list[int] = prompt_block_hashes if prompt_block_hashes is not None else []
        self.arrival_time = 0.0
        self.eligible_time = 0.0
        self.status = WAITING
        self.num_computed = 0
        self.num_output = 0
        self.blocks: list[int] = []
        self.num_cached_blocks = 0
        self.num_cached_tokens = -1
        self.num_preemptions = 0
        self.first_scheduled_time: float | None = None
        self.first_token_time: float | None = None
        self.last_token_time = 0.0
        self.seq = 0

    @property
    def num_tokens(self) -> int:
        return len(self.prompt) + self.num_output

    def tokens(self, start: int, end: int) -> list[int]:
        p = len(self.prompt)
        if end <= p:
            return self.prompt[start:end]
        if start >= p:
            return self.output[start - p : end - p]
        return self.prompt[start:] + self.output[: end - p]

    def sort_key(self) -> tuple[int, float, str, int]:
        return (self.priority, self.arrival_time, self.request_id, self.seq)


@attrs.frozen
class EngineOutput:
    """Tokens ``[first_index, first_index + num_tokens)`` of a request's output, emitted by ``time``."""

    request_id: str
    first_index: int
    num_tokens: int
    time: float
    finish_reason: str | None
    num_cached_tokens: int
