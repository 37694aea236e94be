"""Structural invariants of ``SchedulerState`` (core spec 16), recomputed from scratch.

``check(state, cfg)`` returns human-readable problems (empty = healthy).  Property tests call
it after every step; the scheduler actor may call it in debug mode.  It never mutates.
"""

from __future__ import annotations

import math
from typing import Any

from actors.core.ledger import private_tokens
from actors.core.model import ACTING, ACTIVE, PAUSED, REASONING

_EPS = 1e-6


def check(state: Any, cfg: Any) -> list[str]:
    s = state
    out: list[str] = []
    buf = cfg.decode_buffer_tokens
    # RequestPool (I4)
    total = 0
    for ref in list(s.pool.refs()):
        n = s.pool.program_len(ref)
        if n == 0:
            out.append(f"I4 empty FIFO kept for {ref}")
        total += n
        p = s.programs.get(ref.key)
        if p is None or p.ref != ref:
            out.append(f"waiting requests of a dead generation {ref}")
        for req in s.pool.requests(ref):
            if req.ref != ref:
                out.append(f"request {req.request_id} filed under {ref} but belongs to {req.ref}")
    if total != len(s.pool):
        out.append(f"I4 pool total {len(s.pool)} != sum of FIFOs {total}")
    # in-flight accounting
    live_in_flight: dict[Any, int] = {}
    for rid, d in s.in_flight.items():
        if s.pool.get(rid) is not None:
            out.append(f"request {rid} is both waiting and in flight")
        p = s.programs.get(d.ref.key)
        if p is not None and p.ref == d.ref and p.placement == d.target_id and p.placement_epoch == d.placement_epoch:
            live_in_flight[d.ref] = live_in_flight.get(d.ref, 0) + 1
    queued: dict[Any, str] = {}
    for t, q in s.rank_queues.items():
        if not q:
            out.append(f"empty rank queue kept for {t}")
        for ref in q:
            if ref in queued:
                out.append(f"I10 {ref} in two queues")
            queued[ref] = f"rank:{t}"
    for pool, q in s.global_queues.items():
        if not q:
            out.append(f"empty global queue kept for {pool}")
        for ref in q:
            if ref in queued:
                out.append(f"I10 {ref} in two queues")
            queued[ref] = f"global:{pool}"
    epochs: dict[int, Any] = {}
    for key, p in s.programs.items():
        ref = p.ref
        if ref.key != key:
            out.append(f"program filed under {key} has ref {ref}")
        waiting = s.pool.program_len(ref)
        if (p.state == ACTIVE) != (p.placement is not None):
            out.append(f"I1 {ref} state {p.state} with placement {p.placement}")
        if p.status == ACTING and (p.in_flight or waiting):
            out.append(f"I3 {ref} acting with in_flight={p.in_flight} waiting={waiting}")
        if p.state == PAUSED and p.in_flight:
            out.append(f"{ref} paused with {p.in_flight} requests in flight")
        if p.state == ACTIVE and waiting:
            out.append(f"{ref} active with {waiting} undispatched requests")
        if p.state == PAUSED and p.status == REASONING and not waiting:
            out.append(f"B6 {ref} paused_reasoning without waiting requests")
        if live_in_flight.get(ref, 0) != p.in_flight:
            out.append(f"{ref} in_flight={p.in_flight} but {live_in_flight.get(ref, 0)} live dispatches")
        if s.last_generations.get(key) != ref.generation:
            out.append(f"I12 last generation of {key} is {s.last_generations.get(key)} not {ref.generation}")
        if p.state == ACTIVE:
            rank = s.ranks.get(p.placement)
            if rank is None or rank.active.get(ref) is not p:
                out.append(f"{ref} active on {p.placement} but not in that rank's active set")
            expect = private_tokens(p, buf)
            if abs(p.charged_tokens - expect) > _EPS:
                out.append(f"{ref} charged {p.charged_tokens} but private tokens are {expect}")
            if ref in queued:
                out.append(f"I10 active {ref} is queued ({queued[ref]})")
            if p.placement_epoch in epochs:
                out.append(f"I8 epoch {p.placement_epoch} shared by {ref} and {epochs[p.placement_epoch]}")
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
            out.append(f"I21 {ref} negative private tokens")
    for ref in queued:
        p = s.programs.get(ref.key)
        if p is None or p.ref != ref:
            out.append(f"queued ref {ref} is not live")
    # ledger (I20): incremental vs from scratch
    for t, rank in s.ranks.items():
        total_tokens = 0.0
        for ref, p in rank.active.items():
            if p.state != ACTIVE or p.placement != t or s.programs.get(ref.key) is not p:
                out.append(f"rank {t} lists {ref} which is not active there")
            total_tokens += private_tokens(p, buf)
        if abs(rank.fallback_tokens - total_tokens) > 1e-6 * max(1.0, total_tokens):
            out.append(f"I20 rank {t} ledger {rank.fallback_tokens} != recomputed {total_tokens}")
    previous = -math.inf
    for key, at in s.released_at.items():
        if key in s.programs:
            out.append(f"{key} is live but has a release record")
        if at < previous:
            out.append(f"release record of {key} ({at}) is out of release order")
        previous = at
    return out
