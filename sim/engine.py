"""Pure model of one vLLM v1 engine (one data-parallel rank): scheduler, KV cache, step timing.

No trio, no clock: callers pass ``now`` and the engine tells them when its next event is.

Scheduling (docs/simulator.md §1, "Scheduler"): each step has a token budget
of ``max_num_batched_tokens``.  The running pass walks the running list in order, giving every
request its remaining tokens (1 for a decode, a chunk for a prefill) capped by the budget, and
allocates KV slots; when allocation fails it preempts by recompute (victim: tail of the running list
under ``fcfs``; ``max(priority, arrival_time)`` under ``priority``, possibly the requester itself),
frees the victim's blocks and requeues it at the front.  Only when no preemption happened does the
waiting pass admit requests from the head of the waiting queue (FCFS deque or priority heap keyed
by ``(priority, arrival_time, request_id)``), with prefix-cache lookup, until ``max_num_seqs``, the
budget or the first allocation failure (head-of-line blocking).  Under ``batch_job_aware`` (the
seed's batch-job-aware scheduler, docs/simulator.md §1) the waiting queue is an
``actors.core.batchjobs.JobQueue``: nothing is admitted while the admission budget (free blocks
minus the running set's reserve) is 0, the queue's pick is kept until admitted, preempted requests
go back into their job's bucket, and natural stops feed the per-job decode estimator.

Timing: a request becomes schedulable ``intercept/time_scale`` after it is added (front-end
overhead, see ``stats.CostModel``).  A step's duration comes from ``CostModel``; its tokens and
finishes are applied at the step's end.

Event-driven: when a step is a *steady decode* (every running request decodes one token, nothing
can be admitted), the engine plans the longest run of identical-shape steps (until the first
finish, or the KV blocks run out) and computes its step end times in one loop, applying per-request
work once per run instead of once per token.  An arrival or an abort during a run truncates it at
the step in progress, so results equal a step-by-step simulation.  ``advance_to(now)`` may also be
called in the middle of a run (streaming) and applies the steps that ended by ``now``.
"""

from __future__ import annotations

import heapq
import math
from collections import deque
from collections.abc import Sequence
from itertools import accumulate

from actors.core.batchjobs import (
    DecodeEstimator,
    JobQueue,
    admission_budget_tokens,
    job_name,
    request_reserve_blocks,
    reserve_blocks,
)
from actors.core.config import DecodeThroughputModel
from actors.core.costs import decode_step_seconds
from sim.config import SCHEDULING_POLICIES
from sim.kv import BlockPool, extend_block_hashes, root_hash
from sim.sequence import FINISHED, PREEMPTED, RUNNING, EngineConfig, EngineOutput, Request
from sim.stats import EngineStats

__all__ = ["Engine", "EngineConfig", "EngineOutput", "Request"]


class _Run:
    """A planned run of steps: ``ends[i]`` is the end of step i; ``done`` steps already applied."""

    __slots__ = ("scheduled", "ends", "done", "decode", "head_query")

    def __init__(self, scheduled: list[tuple[Request, int]], ends: list[float], decode: bool) -> None:
        self.scheduled = scheduled
        self.ends = ends
        self.done = 0
        self.decode = decode
        self.head_query: tuple[int, int] | None = None  # blocked waiting head's (queries, hits) per step


class Engine:
    def __init__(self, config: EngineConfig) -> None:
        if config.scheduling_policy not in SCHEDULING_POLICIES:
            raise ValueError(
                f"scheduling_policy must be one of {', '.join(SCHEDULING_POLICIES)}, got {config.scheduling_policy!r}"
            )
        self.config = config
        self.block_size = config.block_size
        self.pool = BlockPool(config.num_gpu_blocks)
        self.stats = EngineStats()
        self.root = root_hash(config.seed)
        self.priority_policy = config.scheduling_policy == "priority"
        self.running: list[Request] = []
        self._fcfs_waiting: deque[Request] = deque()
        self._prio_waiting: list[tuple[tuple[int, float, str, int], Request]] = []
        # batch_job_aware (the seed's scheduler): the waiting queue is a JobQueue of requests, the
        # decode estimator learns from natural stops, the pick sticks until it is admitted
        self.job_policy = config.scheduling_policy == "batch_job_aware"
        self._job_waiting: JobQueue[Request] = JobQueue()
        self.estimator = DecodeEstimator(config.batch_jobs.max_jobs)
        self._picked: Request | None = None
        self._admission_closed = False  # this step's waiting pass stopped on a zero admission budget
        self._pending: list[tuple[float, int, Request]] = []
        self._requests: dict[str, Request] = {}
        self._run: _Run | None = None
        self._clock = 0.0
        self._seq = 0
        prefill, decode = config.cost.prefill, config.cost.decode
        scale = config.time_scale
        self._lin = prefill.linear_seconds_per_1k_tokens / 1000.0 / scale
        self._quad = 2.0 * prefill.quadratic_seconds_per_1k_tokens_squared / 1e6 / scale
        self._intercept = prefill.intercept_seconds / scale
        alpha = prefill.decode_throughput_alpha
        # mixed steps: prefill seconds allowed per second of the step's decode cost (None: no cap)
        self._mixed_ratio: float | None = (1.0 - alpha) / alpha if config.cost.simulate_alpha and alpha > 0 else None
        # the decode surface with every coefficient divided by time_scale, for decode_step_seconds
        self._decode = DecodeThroughputModel(
            fixed_step_seconds=decode.fixed_step_seconds / scale,
            batch_step_seconds_per_request=decode.batch_step_seconds_per_request / scale,
            context_step_seconds_per_token=decode.context_step_seconds_per_token / scale,
        )

    # ----------------------------------------------------------------- observation
    @property
    def num_running(self) -> int:
        return len(self.running)

    @property
    def num_waiting(self) -> int:
        """Waiting + preempted requests, including those still in the front-end delay."""
        return len(self._fcfs_waiting) + len(self._prio_waiting) + len(self._job_waiting) + len(self._pending)

    def kv_cache_usage(self) -> float:
        return self.pool.usage()

    def load_score(self) -> int:
        return self.num_waiting * 4 + self.num_running

    def idle_key(self) -> tuple[int, int, int] | None:
        """While the engine is idle (nothing pending, waiting, running or planned), a key that changes
        whenever anything it exposes could have: every change needs a request added (``_seq``), an
        engine step or an abort. None while it is busy (docs/simulator.md §3, the exposition cache)."""
        if self._run is not None or self._pending or self.running or self.num_waiting:
            return None
        return (self._seq, self.stats.num_steps, self.stats.request_success["abort"])

    def has_request(self, request_id: str) -> bool:
        return request_id in self._requests

    def next_event_time(self, *, per_step: bool = False) -> float | None:
        """Time of the next event: end of the current run (or of its next step), or an arrival."""
        t: float | None = None
        run = self._run
        if run is not None:
            t = run.ends[run.done] if per_step else run.ends[-1]
        if self._pending and (t is None or self._pending[0][0] < t):
            t = self._pending[0][0]
        return t

    # ----------------------------------------------------------------- input
    def add_request(self, req: Request, now: float) -> list[EngineOutput]:
        """Accept ``req`` at ``now``; returns outputs of steps that ended by ``now``."""
        if req.request_id in self._requests:
            raise ValueError(f"duplicate request_id {req.request_id!r}")
        if req.num_tokens + len(req.output) - 1 > self.config.max_model_len:
            raise ValueError(
                f"request needs {len(req.prompt) + len(req.output)} tokens of KV, "
                f"more than max_model_len {self.config.max_model_len}"
            )
        out = self.advance_to(now)
        self._seq += 1
        req.seq = self._seq
        req.arrival_time = now
        req.eligible_time = now + self._intercept
        self._requests[req.request_id] = req
        heapq.heappush(self._pending, (req.eligible_time, req.seq, req))
        return out  # a run in progress is truncated when the request becomes eligible

    def abort(self, request_id: str, now: float) -> list[EngineOutput]:
        """Abort a request at ``now`` (no-op if unknown or finished); returns earlier outputs."""
        out = self.advance_to(now)
        req = self._requests.pop(request_id, None)
        if req is None:
            return out
        if req.status == RUNNING:
            self.running.remove(req)
            self.pool.remember_chain(req.blocks[: req.num_cached_blocks])
            self.pool.free(req.blocks)
            req.blocks = []
        elif any(r is req for _, _, r in self._pending):
            self._pending = [e for e in self._pending if e[2] is not req]
            heapq.heapify(self._pending)
        elif self.priority_policy:
            self._prio_waiting = [e for e in self._prio_waiting if e[1] is not req]
            heapq.heapify(self._prio_waiting)
        elif self.job_policy:
            self._job_waiting.remove(req)
            if self._picked is req:
                self._picked = None
        else:
            self._fcfs_waiting.remove(req)
        req.status = FINISHED
        self.stats.request_success["abort"] += 1
        self._truncate_run(now)  # the queue or the batch changed: re-plan after the step in progress
        return out

    # ----------------------------------------------------------------- time
    def advance_to(self, now: float) -> list[EngineOutput]:
        out: list[EngineOutput] = []
        while True:
            run = self._run
            t_arr = self._pending[0][0] if self._pending else None
            if run is not None:
                end = run.ends[-1]
                if t_arr is not None and t_arr < end and t_arr <= now:
                    self._apply_steps_until(t_arr, out)
                    self._release_pending(t_arr)
                    self._truncate_run(t_arr)
                    continue
                if end <= now:
                    self._apply_steps_until(end, out)
                    self._run = None
                    self._clock = end
                    self._release_pending(end)
                    self._run = self._schedule(end)
                    continue
                self._apply_steps_until(now, out)
                return out
            if t_arr is not None and t_arr <= now:
                t = max(self._clock, t_arr)
                self._clock = t
                self._release_pending(t)
                self._run = self._schedule(t)
                continue
            return out

    def _release_pending(self, t: float) -> None:
        pending = self._pending
        while pending and pending[0][0] <= t:
            req = heapq.heappop(pending)[2]
            self._push_waiting(req)

    def _push_waiting(self, req: Request) -> None:
        if self.priority_policy:
            heapq.heappush(self._prio_waiting, (req.sort_key(), req))
        elif self.job_policy:
            job = job_name(req.request_id)
            self.estimator.touch(job)
            self._job_waiting.add(req, job, len(req.prompt))
        else:
            self._fcfs_waiting.append(req)

    def _prepend_waiting(self, req: Request) -> None:
        if self.priority_policy:
            heapq.heappush(self._prio_waiting, (req.sort_key(), req))
        elif self.job_policy:
            # no front of the queue: a preempted request goes back into its job's bucket
            self._job_waiting.add(req, job_name(req.request_id), len(req.prompt))
        else:
            self._fcfs_waiting.appendleft(req)

    def _truncate_run(self, t: float) -> None:
        """Keep only the step in progress at ``t`` (none if ``t`` is a step boundary)."""
        run = self._run
        if run is None:
            return
        start = run.ends[run.done - 1] if run.done else None
        if run.done and start is not None and start >= t:
            del run.ends[run.done :]
        else:
            del run.ends[run.done + 1 :]
        if not run.ends[run.done :]:
            self._run = None
            self._clock = t if start is None else max(start, self._clock)
            self._run = self._schedule(self._clock)

    # ----------------------------------------------------------------- KV helpers
    def _ensure_hashes(self, req: Request, n_blocks: int) -> None:
        have = len(req.block_hashes)
        if have < n_blocks:
            bs = self.block_size
            if n_blocks * bs <= len(req.prompt):
                extend_block_hashes(req.block_hashes, req.prompt, n_blocks, bs, self.root, req.salt)
            else:
                tokens = req.tokens(have * bs, n_blocks * bs)
                extend_block_hashes(req.block_hashes, tokens, n_blocks, bs, self.root, req.salt, offset=None)

    def _cache_full_blocks(self, req: Request, num_tokens: int) -> None:
        full = num_tokens // self.block_size
        if full <= req.num_cached_blocks:
            return
        self._ensure_hashes(req, full)
        start = req.num_cached_blocks
        self.pool.cache_blocks(req.blocks[start:full], req.block_hashes[start:full])
        req.num_cached_blocks = full

    def _allocate(self, req: Request, num_new: int, hits: Sequence[int] = ()) -> bool:
        bs = self.block_size
        total = req.num_computed + len(hits) * bs + num_new
        need = -(-total // bs) - len(req.blocks) - len(hits)
        if need < 0:
            need = 0
        pool = self.pool
        if need + (pool.count_evictable(hits) if hits else 0) > pool.num_free:
            return False
        if hits:
            pool.touch(hits)
            req.blocks.extend(hits)
            req.num_cached_blocks = len(req.blocks)
        if need:
            pool.allocate(need, req.blocks)
        self._cache_full_blocks(req, min(total, req.num_tokens))
        return True

    def _preempt(self, req: Request) -> None:
        self.pool.remember_chain(req.blocks[: req.num_cached_blocks])
        self.pool.free(req.blocks)
        req.blocks = []
        req.num_cached_blocks = 0
        req.num_computed = 0
        req.num_preemptions += 1
        req.status = PREEMPTED
        self.stats.num_preemptions += 1
        self._prepend_waiting(req)

    def _lookup(self, req: Request) -> list[int]:
        if req.skip_prefix_cache:
            hits: list[int] = []
        else:
            max_blocks = (req.num_tokens - 1) // self.block_size
            self._ensure_hashes(req, max_blocks)
            hits = self.pool.find_hits(req.block_hashes, max_blocks)
        if req.num_preemptions == 0:
            self.stats.prefix_cache_queries += req.num_tokens
            self.stats.prefix_cache_hits += len(hits) * self.block_size
        return hits

    # ----------------------------------------------------------------- scheduling
    def _schedule(self, now: float) -> _Run | None:
        """One vLLM scheduling step at ``now``; extended into a run when it is a steady decode."""
        while True:
            run, preempted = self._schedule_once(now)
            if run is not None or not preempted:
                return run

    def _schedule_once(self, now: float) -> tuple[_Run | None, bool]:
        cfg = self.config
        budget = cfg.max_num_batched_tokens
        running = self.running
        scheduled: list[tuple[Request, int]] = []
        preempted = False
        cap = self._prefill_cap(running)
        i = 0
        while i < len(running) and budget > 0:
            req = running[i]
            num_new = min(req.num_tokens - req.num_computed, budget)
            if cap is not None and not _decodes(req):
                n_cap = self._tokens_within(cap, req.num_computed, first=not any(not _decodes(r) for r, _ in scheduled))
                if n_cap == 0:
                    i += 1
                    continue
                num_new = min(num_new, n_cap)
                cap -= self._prefill_cost(num_new, req.num_computed)
            ok = True
            while not self._allocate(req, num_new):
                if self.priority_policy:
                    victim = max(running, key=_victim_key)
                    running.remove(victim)
                    for j, (sreq, n) in enumerate(scheduled):
                        if sreq is victim:
                            del scheduled[j]
                            budget += n
                            i -= 1
                            break
                else:
                    victim = running.pop()
                self._preempt(victim)
                preempted = True
                if victim is req:
                    ok = False
                    break
            if not ok:
                break
            scheduled.append((req, num_new))
            budget -= num_new
            i += 1
        head_query: tuple[int, int] | None = None
        blocked_on_kv = False
        self._admission_closed = False
        if not preempted:
            while budget > 0 and len(running) < cfg.max_num_seqs:
                head = self._peek_waiting()
                if head is None:
                    break
                req = head
                hits: list[int] = []
                if req.num_computed == 0:
                    q0, h0 = self.stats.prefix_cache_queries, self.stats.prefix_cache_hits
                    hits = self._lookup(req)
                    head_query = (self.stats.prefix_cache_queries - q0, self.stats.prefix_cache_hits - h0)
                num_new = min(req.num_tokens - len(hits) * self.block_size, budget)
                if cap is not None:
                    start = len(hits) * self.block_size
                    n_cap = self._tokens_within(cap, start, first=not any(not _decodes(r) for r, _ in scheduled))
                    if n_cap == 0:
                        break  # the step's prefill share is used up; the head waits (nothing allocated)
                    num_new = min(num_new, n_cap)
                if not self._allocate(req, num_new, hits):
                    blocked_on_kv = True
                    break
                head_query = None
                self._pop_waiting()
                running.append(req)
                req.status = RUNNING
                req.num_computed = len(hits) * self.block_size
                if req.num_cached_tokens < 0:
                    req.num_cached_tokens = req.num_computed
                if req.first_scheduled_time is None:
                    req.first_scheduled_time = now
                    self.stats.queue.observe(now - req.arrival_time)
                scheduled.append((req, num_new))
                budget -= num_new
                if cap is not None:
                    cap -= self._prefill_cost(num_new, req.num_computed)
        if not scheduled:
            return None, preempted
        self.stats.num_steps += 1
        duration, decode = self._step_duration(scheduled)
        run = _Run(scheduled, [now + duration], decode)
        # batch_job_aware: a run may only start when admission is closed by a zero admission budget,
        # which stays zero through a steady decode run (no blocks are freed, the reserve is capped);
        # a pick blocked on KV is retried step by step (its lookups and the pick itself may change)
        nothing_admissible = self._admission_closed if self.job_policy else blocked_on_kv
        steady = (
            decode
            and not preempted
            and len(scheduled) == len(running)
            and (not self._num_queued() or len(running) >= cfg.max_num_seqs or budget <= 0 or nothing_admissible)
        )
        if steady and cfg.max_steps_per_run > 1:
            run.head_query = head_query if blocked_on_kv else None
            self._extend_decode_run(run)
        return run, preempted

    def _prefill_cap(self, running: list[Request]) -> float | None:
        """Prefill seconds a step may carry next to its decodes (``simulate_alpha``), else None."""
        ratio = self._mixed_ratio
        if ratio is None:
            return None
        n_dec = 0
        ctx = 0
        for req in running:
            if _decodes(req):
                n_dec += 1
                ctx += req.num_tokens
        if not n_dec:
            return None
        return decode_step_seconds(n_dec, ctx, self._decode) * ratio

    def _prefill_cost(self, n: int, ctx: int) -> float:
        return self._lin * n + self._quad * n * (ctx + n / 2.0)

    def _tokens_within(self, cap: float, ctx: int, *, first: bool) -> int:
        """Most prefill tokens over ``ctx`` computed ones costing at most ``cap`` (at least 1 if ``first``)."""
        a = self._quad / 2.0
        b = self._lin + self._quad * ctx
        if cap <= 0:
            n = 0
        elif a > 0:
            n = int((-b + math.sqrt(b * b + 4.0 * a * cap)) / (2.0 * a))
        else:
            n = int(cap / b) if b > 0 else 1 << 30
        while n > 0 and self._prefill_cost(n, ctx) > cap:
            n -= 1
        return max(n, 1) if first else n

    def _num_queued(self) -> int:
        return len(self._fcfs_waiting) + len(self._prio_waiting) + len(self._job_waiting)

    def _peek_waiting(self) -> Request | None:
        if self.priority_policy:
            return self._prio_waiting[0][1] if self._prio_waiting else None
        if self.job_policy:
            return self._peek_job_waiting()
        return self._fcfs_waiting[0] if self._fcfs_waiting else None

    def _pop_waiting(self) -> None:
        if self.priority_policy:
            heapq.heappop(self._prio_waiting)
        elif self.job_policy:
            assert self._picked is not None
            self._job_waiting.remove(self._picked)
            self._picked = None
        else:
            self._fcfs_waiting.popleft()

    def admission_budget(self) -> int:
        """The seed's admission budget in tokens: ``(free blocks - reserve) * block_size``, the
        reserve being the running set's next-round blocks plus the margin, capped (docs/batch.md §1)."""
        jobs = self.config.batch_jobs
        bs = self.block_size
        m = self.config.max_num_batched_tokens
        reserve = reserve_blocks(
            (request_reserve_blocks(len(r.prompt), r.num_computed, bs, m) for r in self.running),
            jobs.reserve_margin_blocks,
            jobs.reserve_max_blocks,
        )
        return admission_budget_tokens(self.pool.num_free, reserve, bs)

    def _peek_job_waiting(self) -> Request | None:
        """The seed's waiting-queue head: nothing when the admission budget is 0, else the pick
        (kept until admitted: a pick that cannot get blocks blocks the queue and is tried again)."""
        if not self._job_waiting:
            return None
        budget = self.admission_budget()
        if budget <= 0:
            self._admission_closed = True
            return None
        if self._picked is None:
            jobs = self.config.batch_jobs
            self._picked = self._job_waiting.pick(
                budget,
                self.estimator,
                low_available_tokens_threshold=jobs.low_available_tokens_threshold,
                short_decode_token_threshold=jobs.short_decode_token_threshold,
            )
        return self._picked

    def _step_duration(self, scheduled: list[tuple[Request, int]]) -> tuple[float, bool]:
        n_dec = 0
        ctx_dec = 0
        prefill = 0.0
        lin, quad = self._lin, self._quad
        for req, n in scheduled:
            if n == 1 and req.num_output and req.num_computed == req.num_tokens - 1:
                n_dec += 1
                ctx_dec += req.num_tokens
            else:
                prefill += lin * n + quad * n * (req.num_computed + n / 2.0)
        duration = prefill
        if n_dec:
            duration += decode_step_seconds(n_dec, ctx_dec, self._decode)
        return duration, n_dec == len(scheduled)

    def _extend_decode_run(self, run: _Run) -> None:
        """Plan the longest run of identical decode steps that fits in KV (see module docstring)."""
        reqs = [r for r, _ in run.scheduled]
        k = min(len(r.output) - r.num_output for r in reqs)
        k = min(k, self.config.max_steps_per_run)
        if k <= 1:
            return
        bs = self.block_size
        free = self.pool.num_free
        computed = [(r.num_computed, len(r.blocks)) for r in reqs]

        def extra_blocks(steps: int) -> int:
            return sum(max(0, -(-(c + steps) // bs) - held) for c, held in computed)

        if extra_blocks(k) > free:
            lo, hi = 1, k  # extra_blocks(lo) == 0 <= free (step 1 is allocated)
            while hi - lo > 1:
                mid = (lo + hi) // 2
                if extra_blocks(mid) <= free:
                    lo = mid
                else:
                    hi = mid
            k = lo
        if k <= 1:
            return
        batch = len(reqs)
        ctx = sum(r.num_tokens for r in reqs)
        ends = run.ends
        # step i ends at ends[i-1] + decode_step_seconds(batch, ctx_i), with the batch term taken out
        # of the loop: the same float operations as a step-by-step loop, accumulated at C speed
        base = decode_step_seconds(batch, 0, self._decode)  # fixed + per_request * batch (+ 0.0)
        per_tok = self._decode.context_step_seconds_per_token
        increments = [base + per_tok * c for c in range(ctx + batch, ctx + batch * k, batch)]
        ends.extend(accumulate(increments, initial=ends[0]))
        del ends[1]  # accumulate repeats the initial value

    # ----------------------------------------------------------------- applying steps
    def _apply_steps_until(self, t: float, out: list[EngineOutput]) -> None:
        run = self._run
        if run is None:
            return
        ends = run.ends
        j = run.done
        while j < len(ends) and ends[j] <= t:
            j += 1
        if j == run.done:
            return
        if run.decode:
            self._apply_decode_steps(run, j, out)
        else:
            self._apply_generic_step(run, out)
        run.done = j

    def _apply_generic_step(self, run: _Run, out: list[EngineOutput]) -> None:
        t = run.ends[0]
        for req, n in run.scheduled:
            if req.status != RUNNING:
                continue
            req.num_computed += n
            if req.num_computed == req.num_tokens:
                self._emit(req, 1, t, out)

    def _apply_decode_steps(self, run: _Run, j: int, out: list[EngineOutput]) -> None:
        first = run.done
        m = j - first
        ends = run.ends
        stats = self.stats
        t_last = ends[j - 1]
        # Scheduling passes of steps first+2 .. j+1 (a blocked waiting head is looked up each time).
        if run.head_query is not None:
            passes = min(j + 1, len(ends)) - (first + 1)
            if passes > 0:
                stats.prefix_cache_queries += run.head_query[0] * passes
                stats.prefix_cache_hits += run.head_query[1] * passes
        live = [r for r, _ in run.scheduled if r.status == RUNNING]
        if m > 1 and live:
            stats.itl.observe_many(
                [b - a for a, b in zip(ends[first : j - 1], ends[first + 1 : j], strict=True)], len(live)
            )
        # Only the run's first step was allocated at scheduling time; the run was sized so that
        # the free queue holds every later block.  Blocks are handed out in the order a
        # step-by-step scheduler would (step, then running order), because physical block order
        # decides the free-queue order after release and therefore which cached blocks are evicted.
        bs = self.block_size
        events: list[tuple[int, int]] = []
        for idx, req in enumerate(live):
            c = req.num_computed
            held = len(req.blocks)
            u = (-c) % bs + 1
            while u <= m:
                if (c + u - 1) // bs >= held:
                    events.append((u, idx))
                u += bs
        if events:
            events.sort()
            self.pool.allocate_each([live[idx].blocks for _, idx in events])
        for req in live:
            req.num_computed += m
            self._cache_full_blocks(req, req.num_computed)
            self._emit(req, m, t_last, out, first_time=ends[first])

    def _emit(self, req: Request, m: int, t: float, out: list[EngineOutput], first_time: float | None = None) -> None:
        """Record ``m`` new tokens of ``req`` (the first at ``first_time``, the last at ``t``)."""
        stats = self.stats
        t_first = t if first_time is None else first_time
        start = req.num_output
        if req.first_token_time is None:
            req.first_token_time = t_first
            stats.ttft.observe(t_first - req.arrival_time)
            stats.record_prompt(len(req.prompt), req.num_cached_tokens)
        else:
            stats.itl.observe(t_first - req.last_token_time)
        req.num_output += m
        req.last_token_time = t
        stats.generation_tokens += m
        finish = None
        if req.num_output >= len(req.output):
            finish = req.finish_reason
            req.status = FINISHED
            self.running.remove(req)
            self.pool.remember_chain(req.blocks[: req.num_cached_blocks])
            self.pool.free(req.blocks)
            req.blocks = []
            del self._requests[req.request_id]
            stats.e2e.observe(t - req.arrival_time)
            label = "length" if finish == "length" else "stop"  # vLLM reports tool calls as stop
            stats.request_success[label] += 1
            if self.job_policy and label == "stop":  # natural stops only teach the estimator
                self.estimator.observe(job_name(req.request_id), len(req.output))
        out.append(EngineOutput(req.request_id, start, m, t, finish, req.num_cached_tokens))


def _decodes(req: Request) -> bool:
    """``req`` (running) decodes one token in the next step (the test of ``_step_duration``)."""
    return bool(req.num_output) and req.num_computed == req.num_tokens - 1


def _victim_key(req: Request) -> tuple[int, float]:
    return (req.priority, req.arrival_time)
