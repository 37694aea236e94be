"""Structural invariants of ``SchedulerState``, recomputed from scratch.

``check(state, cfg)`` returns human-readable problems (empty = healthy).  Property tests call
it after every step; the scheduler actor may call it in debug mode.  It never mutates.  ``B<n>``
labels name the fixed reference behaviours of docs/program-scheduling.md §10.
"""

from __future__ import annotations

import math

from actors.core.config import ProgramSchedulingConfig
from actors.core.ids import ProgramRef
from actors.core.ledger import private_tokens
from actors.core.model import ACTING, ACTIVE, PAUSED, REASONING, Program
from actors.core.state import SchedulerState, live_program

_EPS = 1e-6


def check(state: SchedulerState, cfg: ProgramSchedulingConfig) -> list[str]:
    """Every broken invariant of ``state``, in a fixed order: pool, queues, Programs, ledgers, releases."""
    s = state
    out: list[str] = []
    buf = cfg.decode_buffer_tokens
    check_request_pool(s, out)
    live_in_flight = count_live_dispatches(s, out)
    queued = queue_membership(s, out)
    epochs: dict[int, ProgramRef] = {}
    for key, p in s.programs.items():
        if p.ref.key != key:
            out.append(f"program filed under {key} has ref {p.ref}")
        check_program(s, p, buf, live_in_flight, queued, epochs, out)
    for ref in queued:
        if live_program(s, ref) is None:
            out.append(f"queued ref {ref} is not live")
    check_ledgers(s, buf, out)
    check_release_records(s, out)
    check_batch(s, out)
    check_interactive(s, out)
    check_fairness(s, out)
    for rid in s.eta.first:  # a remembered first ETA belongs to a waiting request (docs/program-scheduling.md §13)
        if s.pool.get(rid) is None:
            out.append(f"queue ETA remembered for {rid}, which no longer waits")
    return out


def check_interactive(s: SchedulerState, out: list[str]) -> None:
    """The interactive class (docs/priority.md §2): each rank's interactive charge is the sum over
    its running interactive requests, and no request is both waiting and running."""
    st = s.interactive
    if not st.pending and any(r.interactive_claim_tokens for r in s.ranks.values()):
        out.append("a rank keeps an interactive claim but no interactive request waits")
    tokens: dict[str, float] = {}
    counts: dict[str, int] = {}
    for rid, r in st.running.items():
        if rid in st.pending:
            out.append(f"interactive request {rid} is both waiting and running")
        if r.on_ledger:
            tokens[r.target_id] = tokens.get(r.target_id, 0.0) + r.charged_tokens
            counts[r.target_id] = counts.get(r.target_id, 0) + 1
    for tid, rank in s.ranks.items():
        if abs(rank.interactive_tokens - tokens.get(tid, 0.0)) > _EPS:
            out.append(f"{tid}: interactive_tokens {rank.interactive_tokens} != running {tokens.get(tid, 0.0)}")
        if rank.interactive_requests != counts.get(tid, 0):
            out.append(f"{tid}: interactive_requests {rank.interactive_requests} != running {counts.get(tid, 0)}")


def check_fairness(s: SchedulerState, out: list[str]) -> None:
    """Tenant accounts (docs/priority.md §3): waiting counts equal the waiting requests of every
    class; rented KV equals what the tenant's idle Programs hold; every Program rents what it holds."""
    waiting: dict[str, int] = {}
    for ref in list(s.pool.refs()):
        for req in s.pool.requests(ref):
            waiting[req.tenant] = waiting.get(req.tenant, 0) + 1
    for ip in s.interactive.pending.values():
        waiting[ip.tenant] = waiting.get(ip.tenant, 0) + 1
    if s.batch is not None:
        for bp in s.batch.pending.values():
            waiting[bp.tenant] = waiting.get(bp.tenant, 0) + 1
    held: dict[str, float] = {}
    for p in s.programs.values():
        want = p.charged_tokens if p.state == ACTIVE and p.status == ACTING else 0.0
        if abs(p.rent_tokens - want) > _EPS:
            out.append(f"{p.ref}: rents {p.rent_tokens} KV tokens but holds {want}")
        if p.rent_tokens:
            held[p.tenant] = held.get(p.tenant, 0.0) + p.rent_tokens
    for tenant, a in s.fair.accounts.items():
        if a.waiting != waiting.get(tenant, 0):
            out.append(f"tenant {tenant!r}: {a.waiting} waiting in its account, {waiting.get(tenant, 0)} in the queues")
        if abs(a.held_tokens - held.get(tenant, 0.0)) > 1e-6 * max(1.0, a.held_tokens):
            out.append(f"tenant {tenant!r}: rents {a.held_tokens} KV tokens, its Programs hold {held.get(tenant, 0.0)}")
    for tenant in waiting:
        if tenant not in s.fair.accounts:
            out.append(f"tenant {tenant!r} has waiting requests but no account")


def check_batch(s: SchedulerState, out: list[str]) -> None:
    """The batch class (docs/batch.md §2): each rank's batch charge is the sum over its running
    batch requests, queue and pending table agree, and no request is both queued and running."""
    b = s.batch
    if b is None:
        return
    if len(b.queue) != len(b.pending):
        out.append(f"batch queue holds {len(b.queue)} requests but {len(b.pending)} are pending")
    for rid in b.pending:
        if rid in b.running:
            out.append(f"batch request {rid} is both queued and running")
        if b.queue.job_of(rid) is None:
            out.append(f"pending batch request {rid} is not in the queue")
    tokens: dict[str, float] = {}
    counts: dict[str, int] = {}
    for r in b.running.values():
        if not r.on_ledger:
            continue
        tokens[r.target_id] = tokens.get(r.target_id, 0.0) + r.charged_tokens
        counts[r.target_id] = counts.get(r.target_id, 0) + 1
    for tid, rank in s.ranks.items():
        if abs(rank.batch_tokens - tokens.get(tid, 0.0)) > _EPS:
            out.append(f"{tid}: batch_tokens {rank.batch_tokens} != running charges {tokens.get(tid, 0.0)}")
        if rank.batch_requests != counts.get(tid, 0):
            out.append(f"{tid}: batch_requests {rank.batch_requests} != running {counts.get(tid, 0)}")


def check_request_pool(s: SchedulerState, out: list[str]) -> None:
    """No empty FIFO is kept, the index matches the FIFOs, every waiter belongs to a live generation."""
    total = 0
    for ref in list(s.pool.refs()):
        n = s.pool.program_len(ref)
        if n == 0:
            out.append(f"empty FIFO kept for {ref}")
        total += n
        p = s.programs.get(ref.key)
        if p is None or p.ref != ref:
            out.append(f"waiting requests of a dead generation {ref}")
        for req in s.pool.requests(ref):
            if req.ref != ref:
                out.append(f"request {req.request_id} filed under {ref} but belongs to {req.ref}")
    if total != len(s.pool):
        out.append(f"pool total {len(s.pool)} != sum of FIFOs {total}")


def count_live_dispatches(s: SchedulerState, out: list[str]) -> dict[ProgramRef, int]:
    """In-flight requests per Program whose dispatch is still current (generation and epoch)."""
    live: dict[ProgramRef, int] = {}
    per_rank: dict[str, int] = {}
    for rid, d in s.in_flight.items():
        if s.pool.get(rid) is not None:
            out.append(f"request {rid} is both waiting and in flight")
        per_rank[d.target_id] = per_rank.get(d.target_id, 0) + 1
        p = s.programs.get(d.ref.key)
        if p is not None and p.ref == d.ref and p.placement == d.target_id and p.placement_epoch == d.placement_epoch:
            live[d.ref] = live.get(d.ref, 0) + 1
    for tid, rank in s.ranks.items():  # the waiting gate's drained test reads the count (docs/program-scheduling.md §3)
        if rank.dispatched != per_rank.get(tid, 0):
            out.append(f"{tid}: dispatched {rank.dispatched} != requests in flight there {per_rank.get(tid, 0)}")
    return live


def queue_membership(s: SchedulerState, out: list[str]) -> dict[ProgramRef, str]:
    """Which queue each queued Program is in (at most one); no empty queue is kept."""
    queued: dict[ProgramRef, str] = {}
    for t, q in s.rank_queues.items():
        if not q:
            out.append(f"empty rank queue kept for {t}")
        for ref in q:
            if ref in queued:
                out.append(f"{ref} in two queues")
            queued[ref] = f"rank:{t}"
    for pool, q in s.global_queues.items():
        if not q:
            out.append(f"empty global queue kept for {pool}")
        for ref in q:
            if ref in queued:
                out.append(f"{ref} in two queues")
            queued[ref] = f"global:{pool}"
    return queued


def check_program(
    s: SchedulerState,
    p: Program,
    buf: int,
    live_in_flight: dict[ProgramRef, int],
    queued: dict[ProgramRef, str],
    epochs: dict[int, ProgramRef],
    out: list[str],
) -> None:
    """One live Program: its state against its requests, placement, charge and queue entry."""
    ref = p.ref
    waiting = s.pool.program_len(ref)
    if (p.state == ACTIVE) != (p.placement is not None):
        out.append(f"{ref} state {p.state} with placement {p.placement}")
    if p.status == ACTING and (p.in_flight or waiting):
        out.append(f"{ref} acting with in_flight={p.in_flight} waiting={waiting}")
    if p.state == PAUSED and p.in_flight:
        out.append(f"{ref} paused with {p.in_flight} requests in flight")
    if p.state == ACTIVE and waiting:
        out.append(f"{ref} active with {waiting} undispatched requests")
    if p.state == PAUSED and p.status == REASONING and not waiting:
        out.append(f"B6 {ref} paused_reasoning without waiting requests")
    if live_in_flight.get(ref, 0) != p.in_flight:
        out.append(f"{ref} in_flight={p.in_flight} but {live_in_flight.get(ref, 0)} live dispatches")
    if s.last_generations.get(ref.key) != ref.generation:
        out.append(f"last generation of {ref.key} is {s.last_generations.get(ref.key)} not {ref.generation}")
    if p.state == ACTIVE:
        rank = s.ranks.get(p.placement) if p.placement is not None else None
        if rank is None or rank.active.get(ref) is not p:
            out.append(f"{ref} active on {p.placement} but not in that rank's active set")
        expect = private_tokens(p, buf)
        if abs(p.charged_tokens - expect) > _EPS:
            out.append(f"{ref} charged {p.charged_tokens} but private tokens are {expect}")
        if ref in queued:
            out.append(f"active {ref} is queued ({queued[ref]})")
        if p.placement_epoch in epochs:
            out.append(f"epoch {p.placement_epoch} shared by {ref} and {epochs[p.placement_epoch]}")
        epochs[p.placement_epoch] = ref
    else:
        if p.charged_tokens:
            out.append(f"{ref} paused but still charged {p.charged_tokens}")
        if p.status == REASONING and waiting and p.last_target is not None and ref not in queued:
            out.append(f"{ref} waits but is in no queue")
    where = queued.get(ref)
    if where is not None and p.queued_in is None:
        out.append(f"{ref} in {where} but queued_in is None")
    if p.queued_in is not None and where is None:
        out.append(f"{ref} says queued in {p.queued_in} but is in no queue")
    if p.queued_in is not None and p.queued_at is None:
        out.append(f"B8 {ref} queued without queued_at")
    if private_tokens(p, buf) < 0:
        out.append(f"{ref} negative private tokens")


def check_ledgers(s: SchedulerState, buf: int, out: list[str]) -> None:
    """Each rank's incremental ledger equals the private tokens of its active Programs."""
    for t, rank in s.ranks.items():
        total_tokens = 0.0
        for ref, p in rank.active.items():
            if p.state != ACTIVE or p.placement != t or s.programs.get(ref.key) is not p:
                out.append(f"rank {t} lists {ref} which is not active there")
            total_tokens += private_tokens(p, buf)
        if abs(rank.fallback_tokens - total_tokens) > 1e-6 * max(1.0, total_tokens):
            out.append(f"rank {t} ledger {rank.fallback_tokens} != recomputed {total_tokens}")


def check_release_records(s: SchedulerState, out: list[str]) -> None:
    """Release records name released Programs only, in release order (the tick prunes the front)."""
    previous = -math.inf
    for key, at in s.released_at.items():
        if key in s.programs:
            out.append(f"{key} is live but has a release record")
        if at < previous:
            out.append(f"release record of {key} ({at}) is out of release order")
        previous = at
