"""Preemption of a running batch request (docs/batch.md §2, docs/priority.md §2).

Shared by the batch class (a waiting Program lacks tokens batch holds) and the interactive class
(an interactive request does not fit).  The request waits in the batch queue again, keeping its
arrival time; its tenant gets back what its dispatch was charged (it is charged again when it is
dispatched anew, docs/priority.md §3).
"""

from __future__ import annotations

from actors.core import fairness
from actors.core.batch_state import BatchRunning, BatchState
from actors.core.effects import PreemptBatch
from actors.core.ledger import charge_batch
from actors.core.model import RankState
from actors.core.state import SchedulerState


def leave_engine_queue_count(rank: RankState, r: BatchRunning) -> None:
    """A batch request dispatched since ``rank``'s last observation ended (completed, failed or
    preempted): it is in no engine queue, so the engine-queue gate (docs/batch.md §2.2) no longer
    counts it.  Without this, a rank that finishes more short requests per metrics interval than
    the gate's limit was throttled to that limit."""
    if r.gate_epoch == rank.batch_gate_epoch and rank.batch_dispatched_since_observation > 0:
        rank.batch_dispatched_since_observation -= 1


def preempt_batch(s: SchedulerState, b: BatchState, r: BatchRunning, rank: RankState) -> None:
    del b.running[r.request_id]
    charge_batch(rank, -r.charged_tokens, -1)
    leave_engine_queue_count(rank, r)
    p = r.pending
    assert p is not None
    p.preemptions += 1
    b.preemptions_count += 1
    fairness.charge(s.fair, s.prio, p.tenant, input_tokens=-p.prompt_tokens)
    fairness.arrive(s.fair, s.prio, p.tenant, s.now)
    b.pending[p.request_id] = p
    # keep ``pending`` in arrival order (the starvation escape serves its first entry); preemptions
    # are rare, so re-sorting here costs less than an ordered structure on every arrival
    items = sorted(b.pending.values(), key=lambda x: x.arrived_at)
    b.pending.clear()
    b.pending.update((x.request_id, x) for x in items)
    b.queue.add(p.request_id, p.job, p.prompt_tokens, (p.priority, p.tenant))
    counters = b.jobs.get(p.job)
    if counters is not None:
        counters.running -= 1
        counters.running_since.pop(p.request_id, None)
    s.effects.append(
        PreemptBatch(request_id=r.request_id, target_id=r.target_id, job=r.job, freed_tokens=int(r.charged_tokens))
    )
