"""Batch requests as a class of the scheduler (docs/batch.md §2).

A batch request (``BatchSubmitted``) waits in the router, in the seed's job-aware queue
(``batchjobs.JobQueue``), beside the Programs' RequestPool, and is dispatched into the KV capacity
the Programs leave free, on the same per-rank ledger:

* **Programs first.** :func:`after_step` runs at the end of every step, after the step's
  Program decisions. On a rank a waiting Program would resume on, batch admission stops beyond
  the batch's guaranteed share (``guaranteed_kv_share`` of the capacity; the starvation escape
  aside), and Program admission leaves that share to backlogged batch work (``batch_claim_tokens``).
* **Preemption.** When a waiting Program lacks only tokens that batch holds above its share on
  its rank, the youngest preemptible batch requests there are preempted (their upstream call is
  cancelled; they wait again, keeping their arrival time) and the Program is admitted in the same
  step. Only requests the shell can restart are preemptible (non-streaming: nothing reached the
  client), each at most ``MAX_PREEMPTIONS_PER_REQUEST`` times.
* **Budget per rank** (the seed's admission budget at router scale)::

      free_blocks = floor((capacity * low_watermark_ratio - used - growth) / B)
      reserve     = min(running batch requests on the rank + reserve_margin_blocks, reserve_max_blocks)
      budget      = max(0, (free_blocks - reserve) * B)

  ``capacity`` is ``token_capacity_per_dp_rank``, or, when unset, the KV pool the engine reports
  (``vllm:cache_config_info``); until either is known a rank takes batch work only while idle.
  ``used`` is the rank's ``target_usage`` (which includes batch, ``ledger.charge_batch``); each
  running batch request decodes at most one new block per engine step, the seed's per-request
  projection in the decode phase, hence one block each.  ``growth`` (:func:`decode_growth_tokens`)
  is what the running requests a fresh observation saw still decode into, at its peak: the
  observation holds them at their current size, so without it admission would fill the KV their
  decodes need and the engine would preempt them (agentd's, not the seed's).
* **Pick**: ranks are offered in order of budget (ties: lower target index); each asks the queue
  for the seed's pick (cold start first, job order by budget against
  ``low_available_tokens_threshold``, LPT inside the job), with one agentd addition to the seed's
  prediction (below). The request is charged ``prompt + min(predicted decode, max_tokens)``; the
  first rank whose budget fits it takes it (or one running nothing at all that no Program waits
  for: a request larger than any budget runs alone rather than never). When no rank takes its
  pick, admission stops until capacity frees (head of line, as in the engine).
* **Decode speed and engine pressure**: beside active Programs a batch request is added only
  while the seed's decode-step cost stays within ``1 + max_decode_slowdown`` of theirs
  (:func:`decode_room`; one batch request per rank always runs), and not at all while the rank's
  engine queues at least ``admission_waiting_request_threshold`` requests (the Programs' waiting
  gate, which batch must never hold shut).
* **No rank's steps far slower than another's**: a batch request goes to a rank only while its
  decode step with it stays within ``RANK_STEP_RATIO`` times the fastest other rank's
  (:func:`step_balance_allows`; a rank running no batch request always takes one): a request
  decodes one token per step of its rank, so one sent where steps are much longer ends much later.
* **Engine-queue gate**: on any rank, no batch request is dispatched while the engine requests a
  fresh observation saw waiting plus the batch requests dispatched there since that observation
  reach ``engine_queue_requests`` (:func:`engine_queue_full`): queued requests hold no KV, so the
  observation does not see them, and the router's queue, not an engine's, is where batch work waits.
* **Starvation bound**: with free capacity and no Program waiting, a queued batch request that
  fits is dispatched in the same step. When Programs keep waiting, the oldest batch request is
  dispatched anyway once it has waited ``max_wait_seconds`` and a rank's budget fits it.
* **Progress lower bound** (agentd's, not the seed's): a job's prediction is at least
  ``elapsed × rate`` for its oldest running request, where ``rate`` is the observed decode rate of
  a batch request (EWMA of completion tokens over dispatch-to-completion seconds, which includes
  engine queueing and prefill, so it underestimates progress). A job whose first requests are
  still decoding long after shorter jobs finished is recognised as long before any of its
  requests completes, where the seed's cold-start prediction (128) would keep it behind jobs
  with known, shorter decodes.
* Completion releases the charge and, for natural stops (``finish_reason == "stop"``), feeds the
  job's decode estimate; abandon removes a queued request or releases a running one.
"""

from __future__ import annotations

from typing import NamedTuple

from actors.core import fairness
from actors.core.batch_state import BatchPending, BatchRunning, BatchState, JobCounters
from actors.core.costs import decode_step_seconds
from actors.core.effects import AdmitBatch, BatchCompleted, BatchJobCreated, BatchJobEvicted
from actors.core.errors import NO_TARGETS, InvalidEvent
from actors.core.events import BatchSubmitted, RequestCompleted
from actors.core.ids import RequestId, TargetId
from actors.core.interactive import batch_held_for_interactive
from actors.core.ledger import (
    charge_batch,
    fresh_waiting,
    observation_fresh,
    private_tokens,
    target_usage,
    waiting_gate_shut,
)
from actors.core.lifecycle import reject
from actors.core.model import Program, RankState
from actors.core.preemption import leave_engine_queue_count, preempt_batch
from actors.core.resume import ordered, schedule_waiting
from actors.core.state import SchedulerState, live_program

NATURAL_STOP = "stop"
RATE_ALPHA = 0.1


class JobPredictor:
    """The seed's per-job prediction raised to the job's progress lower bound (module docstring)."""

    def __init__(self, b: BatchState, now: float) -> None:
        self._b = b
        self._now = now

    def predict(self, job: str) -> int:
        b = self._b
        pred = b.estimator.predict(job)
        c = b.jobs.get(job)
        if b.decode_rate is None or c is None or not c.running_since:
            return pred
        oldest = next(iter(c.running_since.values()))
        bound = int((self._now - oldest) * b.decode_rate)
        return bound if bound > pred else pred


# ---- events ------------------------------------------------------------------------------------


def on_batch_submit(s: SchedulerState, ev: BatchSubmitted) -> None:
    """Queue a batch request (dispatch happens at the end of the step, :func:`dispatch_batch`)."""
    b = s.batch
    if b is None:
        raise InvalidEvent("a batch request arrived but batch scheduling is disabled")
    rid = ev.request_id
    if rid in b.pending or rid in b.running or s.pool.get(rid) is not None or rid in s.in_flight:
        raise InvalidEvent(f"request_id {rid!r} is already live")
    if not s.pools.get(ev.model_pool):
        s.effects.append(reject(rid, NO_TARGETS))
        return
    if ev.estimated_prompt_tokens < 0:
        raise InvalidEvent(f"estimated_prompt_tokens must be >= 0 (got {ev.estimated_prompt_tokens})")
    job = ev.job
    counters = b.jobs.get(job)
    if counters is None:
        counters = b.jobs[job] = JobCounters()
        b.jobs_created_count += 1
        s.effects.append(BatchJobCreated(job=job))
    counters.submitted += 1
    b.estimator.touch(job)
    fairness.arrive(s.fair, s.prio, ev.tenant, s.now)
    b.pending[rid] = BatchPending(
        rid,
        job,
        ev.estimated_prompt_tokens,
        ev.max_tokens,
        ev.model_pool,
        s.now,
        preemptible=ev.preemptible,
        tenant=ev.tenant,
        priority=ev.priority,
    )
    b.queue.add(rid, job, ev.estimated_prompt_tokens, (ev.priority, ev.tenant))


def on_batch_complete(s: SchedulerState, ev: RequestCompleted) -> bool:
    """Release a running batch request; False when ``ev`` is not a batch request's."""
    b = s.batch
    if b is None:
        return False
    r = b.running.pop(ev.request_id, None)
    if r is None:
        late = b.pending.get(ev.request_id)
        if late is None or not late.preemptions:
            return False
        # preempted while its answer was already complete: the shell kept the answer, so the
        # request is done (it leaves the queue), nothing is charged on a ledger and its tenant pays
        del b.pending[ev.request_id]
        b.queue.remove(ev.request_id)
        fairness.leave(s.fair, s.prio, late.tenant, s.now, dispatched=True)
        fairness.charge(
            s.fair, s.prio, late.tenant, input_tokens=late.prompt_tokens, output_tokens=ev.usage.completion_tokens or 0
        )
        counters = b.jobs.get(late.job)
        if counters is not None:
            counters.completed += 1
        _forget_job_if_idle(b, late.job)
        return True
    rank = s.ranks.get(r.target_id)
    if rank is not None and r.on_ledger:
        charge_batch(rank, -r.charged_tokens, -1)
        leave_engine_queue_count(rank, r)
    if r.pending is not None:
        out = fairness.output_tokens(ev.usage.completion_tokens, r.predicted_decode_tokens, ev.success)
        fairness.charge(s.fair, s.prio, r.pending.tenant, output_tokens=out)
    counters = b.jobs.get(r.job)
    if counters is not None:
        counters.running -= 1
        counters.running_since.pop(r.request_id, None)
    elapsed = s.now - r.dispatched_at
    tokens = ev.usage.completion_tokens
    if ev.success and tokens and elapsed > 0:
        rate = tokens / elapsed
        b.decode_rate = rate if b.decode_rate is None else (1 - RATE_ALPHA) * b.decode_rate + RATE_ALPHA * rate
        b.decoded_tokens_total += tokens
        b.decode_seconds_total += elapsed
    natural = ev.success and ev.finish_reason == NATURAL_STOP and ev.usage.completion_tokens is not None
    observed = ev.usage.completion_tokens if natural else None
    if counters is not None:
        if ev.success:
            counters.completed += 1
        else:
            counters.failed += 1
        if observed is not None:
            counters.observed_decode_tokens_sum += observed
            counters.observed_count += 1
    if observed is not None:
        evicted = b.estimator.observe(r.job, observed)
        if evicted is not None:
            b.jobs_evicted_count += 1
            s.effects.append(BatchJobEvicted(job=evicted))
            _forget_job_if_idle(b, evicted)
    s.effects.append(
        BatchCompleted(
            request_id=r.request_id,
            job=r.job,
            target_id=r.target_id,
            success=ev.success,
            predicted_decode_tokens=r.predicted_decode_tokens,
            observed_decode_tokens=observed,
        )
    )
    _forget_job_if_idle(b, r.job)
    return True


def on_batch_abandon(s: SchedulerState, rid: RequestId) -> bool:
    """A batch request's client left: unqueue it, or release it as a failure when it runs."""
    b = s.batch
    if b is None:
        return False
    pending = b.pending.pop(rid, None)
    if pending is not None:
        fairness.leave(s.fair, s.prio, pending.tenant, s.now, dispatched=False)
        b.queue.remove(rid)
        counters = b.jobs.get(pending.job)
        if counters is not None:
            counters.abandoned += 1
        _forget_job_if_idle(b, pending.job)
        return True
    if rid in b.running:
        return on_batch_complete(s, RequestCompleted(rid, False))
    return False


def _forget_job_if_idle(b: BatchState, job: str) -> None:
    """Drop a job's counters once nothing of it is queued or running and its estimate is gone."""
    c = b.jobs.get(job)
    if c is not None and c.running == 0 and b.queue.job_size(job) == 0 and b.estimator.stats(job) is None:
        del b.jobs[job]


# ---- dispatch ----------------------------------------------------------------------------------


def rank_budget_tokens(s: SchedulerState, rank: RankState) -> int:
    """The batch admission budget of ``rank`` in tokens (module docstring)."""
    b = s.batch
    capacity = s.cfg.token_capacity_per_dp_rank
    if capacity is None:
        capacity = rank.backend_kv_capacity_tokens  # the engine's own report (vllm:cache_config_info)
    if b is None or capacity is None:
        return 0
    cfg = b.cfg
    block = cfg.block_size_tokens
    # waiting interactive requests' claims are not batch's to take (docs/priority.md §2)
    used = target_usage(rank, s.now, s.cfg.metrics_interval_seconds) + rank.interactive_claim_tokens
    growth = decode_growth_tokens(s, rank)
    free_blocks = int((capacity * s.cfg.low_watermark_ratio - used - growth) // block)
    reserve = min(rank.batch_requests + cfg.reserve_margin_blocks, cfg.reserve_max_blocks)
    return max(0, (free_blocks - reserve) * block)


def peak_growth_tokens(running: list[tuple[float, float]]) -> float:
    """The largest future increase of the KV held by ``running`` decodes (docs/batch.md §2.2).

    Each entry is ``(held, remaining)``: tokens a request holds now and decode tokens it still
    produces.  All of them decode one token per engine step, so ``tau`` steps from now the set
    holds ``sum(held)`` plus ``tau`` for each request with ``remaining > tau``, minus the whole
    ``held`` of each request that has ended (``remaining <= tau``).  The increase peaks just
    before a request ends (``tau`` = its ``remaining``); with nothing left to grow it is 0.
    """
    order = sorted(running, key=lambda e: -e[1])
    ended_later = [0.0] * (len(order) + 1)  # held tokens of the requests after position i
    for i in range(len(order) - 1, -1, -1):
        ended_later[i] = ended_later[i + 1] + order[i][0]
    peak = 0.0
    for i, (_held, remaining) in enumerate(order):
        if remaining <= 0:
            break
        # at tau = remaining (just before this request's last token) the first i + 1 requests
        # (remaining >= this one's) have grown by tau; the rest ended, freeing what they held
        rise = (i + 1) * remaining - ended_later[i + 1]
        if rise > peak:
            peak = rise
    return peak


def decode_growth_tokens(s: SchedulerState, rank: RankState) -> float:
    """KV the running batch requests on ``rank`` will still grow into beyond what the ledger
    holds for them (docs/batch.md §2.2): 0 unless the ledger uses a fresh observation.

    A request dispatched after the observation is on the ledger with its whole predicted size
    (prompt + predicted decode), so it is not counted again.  One the observation saw holds its
    prompt plus what it had decoded by then, ``(observed_at - dispatched_at) x rate``
    tokens (the rate underestimates progress, so the remaining decode is overestimated); it still
    grows by the rest of its predicted decode.  The reserve is the peak of that growth, net of the
    requests that end first (:func:`peak_growth_tokens`).  ``rate`` is the ratio of sums over every
    successful batch request, not the EWMA ``decode_rate``: it does not depend on the order in which
    same-instant completions are handled, and progress counts whole tokens, so same-instant event
    orders give the same reserve (the EWMA made small simulations vary by up to 20 %).
    """
    b = s.batch
    at = rank.observed_at
    if b is None or at is None or not rank.batch_requests:
        return 0.0
    if not observation_fresh(rank, s.now, s.cfg.metrics_interval_seconds):
        return 0.0  # the fallback ledger already holds every request at its predicted size
    # tokens over seconds of every successful batch request so far: unlike the EWMA it does not
    # depend on the order in which same-instant completions are handled
    rate = b.decoded_tokens_total / b.decode_seconds_total if b.decode_seconds_total > 0 else 0.0
    predictor = JobPredictor(b, s.now)
    seen: list[tuple[float, float]] = []
    for r in b.running.values():
        if r.target_id != rank.target_id or not r.on_ledger or r.dispatched_at >= at:
            continue
        prompt = r.charged_tokens - r.predicted_decode_tokens  # charged: prompt + decode predicted then
        pred = float(max(r.predicted_decode_tokens, _current_prediction(r, predictor)))
        done = min(pred, float(int((at - r.dispatched_at) * rate)))  # whole tokens, as the job bound
        seen.append((prompt + done, pred - done))
    return peak_growth_tokens(seen)


def _current_prediction(r: BatchRunning, predictor: JobPredictor) -> int:
    """The job's prediction now (it may have risen since ``r`` was dispatched), capped by the
    request's ``max_tokens``."""
    pred = predictor.predict(r.job)
    cap = None if r.pending is None else r.pending.max_tokens
    return pred if cap is None else min(pred, cap)


def guaranteed_share_tokens(s: SchedulerState, rank: RankState) -> int:
    """What batch may still add on ``rank`` while Programs wait for it: up to
    ``guaranteed_kv_share`` of the rank's capacity (docs/batch.md §2)."""
    b = s.batch
    capacity = s.cfg.token_capacity_per_dp_rank or rank.backend_kv_capacity_tokens
    if b is None or capacity is None:
        return 0
    return max(0, int(capacity * b.cfg.guaranteed_kv_share - rank.batch_tokens))


def decode_room(s: SchedulerState, rank: RankState, extra_tokens: float) -> bool:
    """May one more batch request of ``extra_tokens`` context decode on ``rank`` beside the active
    Programs there (reasoning, or acting and about to reason again)?  Yes when there are none;
    else when the decode step (the seed's cost model) stays within ``1 + max_decode_slowdown``
    times the step of those Programs alone."""
    b = s.batch
    assert b is not None
    n = 0
    ctx = 0.0
    for a in rank.active.values():  # reasoning, or acting (a tool call) and about to reason again
        n += 1
        ctx += a.estimated_context_tokens
    if n == 0 or rank.batch_requests == 0:
        return True  # one batch request per rank always runs: batch keeps progressing
    model = s.cfg.decode_throughput_model
    alone = decode_step_seconds(n, ctx, model)
    shared = decode_step_seconds(n + rank.batch_requests + 1, ctx + rank.batch_tokens + extra_tokens, model)
    return shared <= (1.0 + b.cfg.max_decode_slowdown) * alone


# a batch request is not added to a rank whose decode step would then be more than this many
# times the fastest other rank's (docs/batch.md §2.3, docs/benchmarks.md §6.6)
RANK_STEP_RATIO = 3.0


def rank_decode_step(s: SchedulerState, rank: RankState, extra_tokens: float | None = None) -> float:
    """The seed's decode-step time of what runs on ``rank``: its active Programs and running batch
    requests (their charged tokens as context), plus one more batch request of ``extra_tokens``."""
    n = rank.batch_requests
    ctx = rank.batch_tokens
    for a in rank.active.values():
        n += 1
        ctx += a.estimated_context_tokens
    if extra_tokens is not None:
        n += 1
        ctx += extra_tokens
    return decode_step_seconds(n, ctx, s.cfg.decode_throughput_model)


def step_balance_allows(s: SchedulerState, rank: RankState, pool: str, extra_tokens: float) -> bool:
    """May one more batch request of ``extra_tokens`` go to ``rank`` as far as the batch's own decode
    speed goes (docs/batch.md §2.3)?  Yes while the rank's decode step with it stays within
    ``RANK_STEP_RATIO`` times the fastest decode step among the pool's other ranks, and always when
    the rank runs no batch request (one batch request per rank always runs).

    Every request on a rank decodes one token per step of that rank, so a request sent where steps
    are several times longer than elsewhere ends several times later.  Without this bound a rank
    left without Programs beside ranks whose batch the decode bound holds back took the whole
    backlog's long decodes and ran them alone at the end (docs/benchmarks.md §6.6)."""
    if not rank.batch_requests:
        return True
    fastest: float | None = None
    for tid in s.pools.get(pool, ()):
        other = s.ranks[tid]
        if other is rank:
            continue
        step = rank_decode_step(s, other)
        if fastest is None or step < fastest:
            fastest = step
    return fastest is None or rank_decode_step(s, rank, extra_tokens) <= RANK_STEP_RATIO * fastest


def engine_queue_full(s: SchedulerState, rank: RankState) -> bool:
    """The engine-queue gate of batch dispatch (docs/batch.md §2.2): the rank's fresh observation
    shows ``waiting`` engine requests, and ``batch_dispatched_since_observation`` batch requests
    went there after it; together they reach ``engine_queue_requests``.  Without a fresh
    observation (start-up, a stale scrape) the gate is open; 0 turns it off.

    A request queued in an engine holds no KV yet, so a fresh observation undercounts what the
    rank has taken; the gate keeps the rest in the router's queue, where whichever rank frees
    first takes it, instead of letting the first rank to refresh take a same-instant wave.
    """
    b = s.batch
    assert b is not None
    limit = b.cfg.engine_queue_requests
    if limit <= 0:
        return False
    waiting = fresh_waiting(rank, s.now, s.cfg.metrics_interval_seconds)
    return waiting is not None and waiting + rank.batch_dispatched_since_observation >= limit


def programs_waiting(s: SchedulerState, pool: str) -> bool:
    if s.global_queues.get(pool):
        return True
    return any(s.rank_queues.get(t) for t in s.pools.get(pool, ()))


def waiting_homes(s: SchedulerState, pool: str) -> set[TargetId | None]:
    """The ranks waiting Programs of ``pool`` would resume on (their last target; None = unbound,
    which any rank could take)."""
    homes: set[TargetId | None] = set()
    for ref in s.global_queues.get(pool, ()):
        p = live_program(s, ref)
        if p is not None:
            homes.add(p.last_target)
    for t in s.pools.get(pool, ()):
        if s.rank_queues.get(t):
            homes.add(t)
    return homes


def predicted_decode(b: BatchState, p: BatchPending, predictor: JobPredictor) -> int:
    pred = predictor.predict(p.job)
    return pred if p.max_tokens is None else min(pred, p.max_tokens)


def after_step(s: SchedulerState) -> None:
    """The batch class's part of every step: preempt batch work a waiting Program needs, dispatch,
    then refresh each rank's claim (what Program admission leaves to backlogged batch work: the
    guaranteed share not yet used)."""
    b = s.batch
    if b is None:
        return
    if b.running and preempt_for_programs(s):
        schedule_waiting(s)  # the freed capacity goes to the waiting Programs in this same step
    if b.pending:
        dispatch_batch(s)
    backlogged = bool(b.pending)
    for rank in s.ranks.values():
        rank.batch_claim_tokens = float(guaranteed_share_tokens(s, rank)) if backlogged else 0.0


MAX_PREEMPTIONS_PER_REQUEST = 2


def preempt_for_programs(s: SchedulerState) -> bool:
    """Preempt running batch requests on ranks where a waiting Program lacks only tokens that
    batch holds above its guaranteed share; True when any was preempted (docs/batch.md §2).

    Per rank, the first waiting Program in resume order whose home it is: its deficit is
    ``required - (capacity x low_watermark - used)``; victims are preemptible batch requests there,
    youngest first (least work lost), taken only when together they cover the deficit without
    going below the guaranteed share.  A request preempted ``MAX_PREEMPTIONS_PER_REQUEST`` times
    is no longer preemptible, so every batch request finishes.
    """
    b = s.batch
    capacity_cfg = s.cfg.token_capacity_per_dp_rank
    if b is None or s.cfg.binding_only:
        return False
    preempted = False
    for pool in sorted(s.pools):
        waiting = _waiting_by_home(s, pool)
        for tid in s.pools[pool]:
            rank = s.ranks[tid]
            program = waiting.get(tid)
            capacity = capacity_cfg if capacity_cfg is not None else rank.backend_kv_capacity_tokens
            if program is None or not rank.batch_requests or capacity is None:
                continue
            used = target_usage(rank, s.now, s.cfg.metrics_interval_seconds)
            deficit = private_tokens(program, s.cfg.decode_buffer_tokens) - (
                capacity * s.cfg.low_watermark_ratio - used
            )
            if deficit <= 0:
                continue  # not held back by tokens (count guard, gate, growth reserve): nothing to free
            spare = rank.batch_tokens - capacity * b.cfg.guaranteed_kv_share
            victims = sorted(
                (
                    r
                    for r in b.running.values()
                    if r.target_id == tid
                    and r.on_ledger
                    and r.pending is not None
                    and r.pending.preemptible
                    and r.pending.preemptions < MAX_PREEMPTIONS_PER_REQUEST
                ),
                key=lambda r: (-r.dispatched_at, r.request_id),
            )
            chosen: list[BatchRunning] = []
            freed = 0.0
            for r in victims:
                if freed >= deficit or freed + r.charged_tokens > spare:
                    break
                chosen.append(r)
                freed += r.charged_tokens
            if freed < deficit:
                continue  # preempting cannot make room: keep the work
            for r in chosen:
                preempt_batch(s, b, r, rank)
            preempted = True
    return preempted


def _waiting_by_home(s: SchedulerState, pool: str) -> dict[TargetId, Program]:
    """The first waiting Program (resume order) per home rank of ``pool``."""
    out: dict[TargetId, Program] = {}
    refs = list(s.global_queues.get(pool, ()))
    for t in s.pools.get(pool, ()):
        refs.extend(s.rank_queues.get(t, ()))
    for p in ordered(s, refs):
        home = p.last_target
        if home is not None and home not in out:
            out[home] = p
    return out


class Offer(NamedTuple):
    """What one rank offers the batch queue in a dispatch round."""

    rank: RankState
    budget: int
    gated: bool  # a Program waits for this rank (batch keeps only its guaranteed share)
    closed: bool  # the engine-queue gate is shut: nothing but an idle rank's lone request goes there


def dispatch_offers(s: SchedulerState, pool: str, oldest: BatchPending) -> tuple[list[Offer], bool]:
    """Each rank's offer in this round, largest budget first (ties by target index), and whether
    the starvation escape applies (the oldest request waited ``max_wait_seconds``)."""
    b = s.batch
    assert b is not None
    homes = waiting_homes(s, pool)
    escape = bool(homes) and s.now - oldest.arrived_at >= b.cfg.max_wait_seconds
    offers: list[Offer] = []
    for tid in s.pools.get(pool, ()):
        rank = s.ranks[tid]
        budget = rank_budget_tokens(s, rank)
        waited_for = None in homes or tid in homes
        # the engine queues: more batch would hold the Programs' waiting gate shut; or the engine
        # already queues enough: the rest waits here (late binding).  A budget of 0 alone would
        # still let a request predicted at 0 tokens through, so the offer says it is closed.
        shut = waiting_gate_shut(rank, s.now, s.cfg)
        closed = bool((rank.active or waited_for) and shut) or engine_queue_full(s, rank)
        if closed:
            budget = 0
        gated = waited_for and not escape
        if gated:
            budget = min(budget, guaranteed_share_tokens(s, rank))
        offers.append(Offer(rank, budget, gated, closed))
    offers.sort(key=lambda o: (-o.budget, o.rank.index))
    return offers, escape


def taken_pick(
    s: SchedulerState, offer: Offer, predictor: JobPredictor, oldest: BatchPending, escape: bool
) -> tuple[BatchPending, int, int] | None:
    """The request ``offer``'s rank takes now, with its predicted decode and its charge, or None.

    The queue's pick (the oldest request under the escape) must fit the budget -- or the rank run
    nothing at all and no Program wait for it (one request of any size) -- and leave the Programs
    there their decode speed (:func:`decode_room`).
    """
    b = s.batch
    assert b is not None
    rank, budget, gated, closed = offer
    idle = not rank.active and not rank.batch_requests and not gated
    if escape:
        rid: RequestId | None = oldest.request_id
    else:
        # an idle rank with no budget yet (capacity unknown) still asks for a pick: budget 1
        # makes the seed's best fit return the smallest prompt of the first job
        rid = b.queue.pick(
            max(budget, 1) if idle else budget,
            predictor,
            lambda lane: (-lane[0], fairness.counter(s.fair, s.prio, lane[1], s.now), lane[1]),
            low_available_tokens_threshold=b.cfg.low_available_tokens_threshold,
            short_decode_token_threshold=b.cfg.short_decode_token_threshold,
        )
    if rid is None:
        return None
    p = b.pending[rid]
    pred = predicted_decode(b, p, predictor)
    need = p.prompt_tokens + pred
    if (need > budget or closed) and not idle:
        return None  # does not fit here: re-evaluated when capacity frees (a completion, a tick)
    if not batch_caps_allow(s, rank, need):
        return None  # the batch class's caps on this rank (docs/priority.md §2)
    if not decode_room(s, rank, need):
        return None  # the Programs there would slow down more than allowed
    if not step_balance_allows(s, rank, p.model_pool, need):
        return None  # its steps would be far slower than another rank's: it waits for a faster one
    return p, pred, need


def batch_caps_allow(s: SchedulerState, rank: RankState, need: int) -> bool:
    """The ``batch`` class caps (docs/priority.md §2): running batch requests per rank and their
    share of the rank's capacity (one batch request per rank always runs)."""
    limits = s.prio.batch
    if limits.max_running_per_rank is not None and rank.batch_requests >= limits.max_running_per_rank:
        return False
    if batch_held_for_interactive(s, rank):  # headroom, reserved ranks (docs/priority.md §2)
        return False
    capacity = s.cfg.token_capacity_per_dp_rank or rank.backend_kv_capacity_tokens
    if capacity is not None and limits.max_kv_share < 1.0 and rank.batch_requests:
        return rank.batch_tokens + need <= limits.max_kv_share * capacity
    return True


def dispatch_batch(s: SchedulerState) -> None:
    """Dispatch queued batch requests into the capacity Programs leave free (module docstring).

    Each round offers every rank (:func:`dispatch_offers`); the first rank that takes its pick
    (:func:`taken_pick`) gets it.  The loop ends when no rank takes the pick it is offered.
    """
    b = s.batch
    if b is None or not b.pending:
        return
    predictor = JobPredictor(b, s.now)
    while b.pending:
        oldest = next(iter(b.pending.values()))
        offers, escape = dispatch_offers(s, oldest.model_pool, oldest)
        for offer in offers:
            taken = taken_pick(s, offer, predictor, oldest, escape)
            if taken is not None:
                p, pred, need = taken
                _dispatch(s, b, p, offer.rank, pred, need, escape=escape)
                break
        else:
            return


def _dispatch(
    s: SchedulerState, b: BatchState, p: BatchPending, rank: RankState, pred: int, need: int, *, escape: bool
) -> None:
    del b.pending[p.request_id]
    b.queue.remove(p.request_id)
    fairness.leave(s.fair, s.prio, p.tenant, s.now, dispatched=True)
    fairness.charge(s.fair, s.prio, p.tenant, input_tokens=p.prompt_tokens)  # output: at completion
    charge_batch(rank, float(need), 1)
    rank.batch_dispatched_since_observation += 1
    b.running[p.request_id] = BatchRunning(
        p.request_id, p.job, rank.target_id, float(need), pred, s.now, pending=p, gate_epoch=rank.batch_gate_epoch
    )
    wait = s.now - p.arrived_at
    counters = b.jobs.get(p.job)
    if counters is not None:
        counters.admitted += 1
        counters.running += 1
        counters.running_since[p.request_id] = s.now
        counters.queue_wait_seconds_sum += wait
    if escape:
        b.escapes_count += 1
    s.effects.append(
        AdmitBatch(
            request_id=p.request_id,
            target_id=rank.target_id,
            job=p.job,
            queue_wait_seconds=wait,
            predicted_decode_tokens=pred,
            charged_tokens=need,
            starvation_escape=escape,
        )
    )


def reject_without_targets(s: SchedulerState, pool: str) -> None:
    """The pool lost its last target: its queued batch requests get a 503 (retryable), not a wait."""
    b = s.batch
    if b is None:
        return
    for p in [p for p in b.pending.values() if p.model_pool == pool]:
        del b.pending[p.request_id]
        b.queue.remove(p.request_id)
        fairness.leave(s.fair, s.prio, p.tenant, s.now, dispatched=False)
        s.effects.append(reject(p.request_id, NO_TARGETS))
        _forget_job_if_idle(b, p.job)


def forget_target(s: SchedulerState, target: TargetId) -> None:
    """A rank left the topology: its running batch requests keep their entries (their completions
    still come) but no longer count on a ledger that is gone."""
    b = s.batch
    if b is None:
        return
    for r in b.running.values():
        if r.target_id == target:
            r.on_ledger = False


# ---- diagnostics -------------------------------------------------------------------------------


def batch_diagnostics(s: SchedulerState) -> dict[str, object]:
    """The ``batch`` section of ``/scheduling/diagnostics`` (docs/batch.md §2), read between steps."""
    b = s.batch
    if b is None:
        return {"enabled": False}
    jobs = []
    predictor = JobPredictor(b, s.now)
    for job in sorted(b.jobs):
        c = b.jobs[job]
        stats = b.estimator.stats(job)
        jobs.append(
            {
                "job": job,
                "queued": b.queue.job_size(job),
                "running": c.running,
                "submitted": c.submitted,
                "admitted": c.admitted,
                "completed": c.completed,
                "failed": c.failed,
                "abandoned": c.abandoned,
                "predicted_decode_tokens": predictor.predict(job),
                "estimated_decode_tokens": b.estimator.predict(job),
                "estimate_samples": 0 if stats is None else stats.samples,
                "observed_decode_tokens_mean": c.observed_decode_tokens_sum / c.observed_count
                if c.observed_count
                else None,
                "mean_queue_wait_seconds": c.queue_wait_seconds_sum / c.admitted if c.admitted else None,
            }
        )
    ranks = []
    for tid in sorted(s.ranks):
        rank = s.ranks[tid]
        ranks.append(
            {
                "target_id": tid,
                "running": rank.batch_requests,
                "charged_tokens": rank.batch_tokens,
                "reserve_blocks": min(rank.batch_requests + b.cfg.reserve_margin_blocks, b.cfg.reserve_max_blocks),
                "growth_reserve_tokens": decode_growth_tokens(s, rank),
                "budget_tokens": rank_budget_tokens(s, rank),
            }
        )
    return {
        "enabled": True,
        "queued": len(b.pending),
        "running": len(b.running),
        "starvation_escapes": b.escapes_count,
        "preemptions": b.preemptions_count,
        "jobs_created": b.jobs_created_count,
        "jobs_evicted": b.jobs_evicted_count,
        "max_jobs": b.cfg.max_jobs,
        "jobs_with_statistics": b.estimator.tracked_jobs,
        "decode_tokens_per_second": b.decode_rate,
        "oldest_wait_seconds": s.now - next(iter(b.pending.values())).arrived_at if b.pending else None,
        "programs_waiting": any(programs_waiting(s, pool) for pool in s.pools),
        "jobs": jobs,
        "ranks": ranks,
    }
