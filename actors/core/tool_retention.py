"""Tool-call-aware acting TTL: per-tool gap windows and a ski-rental decision (docs/program-scheduling.md §12).

The response that ends an agent's turn says what the agent does next: ``finish_reason:
"tool_calls"`` and the names of the called functions (read by the shell from the relayed
response, ``RequestCompleted.tool_names``).  The time until the Program's next request depends
on that tool far more than on the rank (a file read returns in milliseconds, a test run in
seconds, a human in minutes), so agentd learns the gap per turn key and model pool:

* the **turn key** of a completion is the sorted set of its tool names (each cut to
  ``MAX_TOOL_NAME_CHARS``, at most ``MAX_TOOLS_PER_TURN``); a turn that called no tool is keyed
  ``<finish_reason>`` (``<stop>``, ``<length>``) when ``finish_reason_keys`` is on; otherwise it
  has no key;
* a :class:`GapWindow` per (model pool, key) keeps the last ``window_size`` gaps (completion ->
  the Program's next arrival; a Program released by paused retention contributes its idle time
  as one long gap, so tools after which Programs never come back still learn "long");
  ``max_tools`` bounds the entries, the least recently used is forgotten;
* :meth:`ToolGapModel.decide` holds the KV for the TTL ``d`` maximising the empirical ski-rental
  utility over the window's gaps ``g_1..g_n``, with ``C`` the price of a miss and ``rho`` the rent
  of one second held::

      U(d) = (1/n) * sum_i [ C - rho * g_i  if g_i <= d  else  -rho * d ]          U(0) = 0

  over the candidates ``{min(d_max, g_i * (1 + margin_ratio) + margin_seconds)} + {d_max}``
  with ``d_max = min(max_acting_ttl_seconds, C / rho)`` (holding longer never pays);
  0 (release at once) when no candidate has a positive utility.  Ties keep the shorter TTL.
  ``C`` is the Program's cache-miss impact times the miss ratio measured after this key
  (``measured_miss``, once it has ``min_samples`` resumes), else the caller's cost (the impact
  times the cluster's resume miss ratio, as the fitted TTL uses); ``rho`` is the caller's rent
  (1, more while Programs wait for capacity: ``completion.tool_rent``).
  A turn with several tools decides on the tool with the longest median gap (the agent returns
  when all calls have).  A key with fewer than ``min_samples`` gaps gives no decision: the caller
  falls back to the fitted per-rank Progress-TTL;
* what the decisions did is counted per key for diagnostics: against the fitted TTL of the same
  moment, how the Program came back (within the per-tool TTL or after it, and what the fit would
  have done), and what each gap cost (the previous context lost at the next placement start).

Pure: no clock, no I/O; the memory is bounded by ``max_tools * window_size`` floats.
"""

from __future__ import annotations

import math
from bisect import bisect_left, bisect_right, insort_right
from collections import deque
from collections.abc import Iterable
from itertools import accumulate

from attrs import frozen

from actors.core.config import ToolRetentionConfig

MAX_TOOL_NAME_CHARS = 64
MAX_TOOLS_PER_TURN = 4
TOOL = "tool"  # TtlArmed source: the per-tool decision held the KV
TOOL_RELEASE = "tool_release"  # TtlArmed source: the per-tool decision released it at once (TTL 0)


def turn_keys(tool_names: Iterable[str], finish_reason: str | None, cfg: ToolRetentionConfig) -> tuple[str, ...]:
    """The gap-model keys of one completed turn (see the module docstring); ``()`` = no key."""
    names = sorted({n[:MAX_TOOL_NAME_CHARS] for n in tool_names if n})
    if names:
        return tuple(names[:MAX_TOOLS_PER_TURN])
    if cfg.finish_reason_keys and finish_reason:
        return (f"<{finish_reason[:MAX_TOOL_NAME_CHARS]}>",)
    return ()


class GapWindow:
    """The last ``limit`` gaps after one turn key, and what was decided from them.

    The window is kept sorted as gaps arrive and leave (``push``), and the ski-rental search of
    :meth:`best_ttl` works on candidates prepared once per window change (:meth:`_candidates`):
    the decision runs at every completion after the key, the window changes at most once per
    arrival (docs/program-scheduling.md §12, "How the decision is computed").
    """

    __slots__ = (
        "limit",
        "gaps",
        "observed",
        "_sorted",
        "_prefix",
        "_cand",
        "held",
        "released",
        "fallbacks",
        "last_ttl",
        "shorter_than_fit",
        "longer_than_fit",
        "returned_held",
        "returned_released",
        "fit_would_hold",
        "fit_would_release",
        "resumes",
        "recomputed_tokens",
        "resumed_context_tokens",
        "recompute_seconds",
    )

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self.gaps: deque[float] = deque()
        self.observed = 0  # gaps ever pushed (the window keeps the last `limit`)
        # the window in ascending order, equal gaps oldest first (what a stable sort of `gaps` gives)
        self._sorted: list[float] = []
        self._prefix: list[float] | None = [0.0]  # prefix sums of `_sorted`, None = stale
        # the candidates of `_candidates` prepared so far, None = stale
        self._cand: _Candidates | None = None
        self.held = 0  # decisions that held the KV (TTL > 0)
        self.released = 0  # decisions that released it at once
        self.fallbacks = 0  # completions that fell back to the fitted TTL (too few gaps)
        self.last_ttl: float | None = None
        # what the decisions changed (docs/program-scheduling.md §12, "Diagnostics"):
        self.shorter_than_fit = 0  # per-tool TTL below the fitted TTL of the same moment
        self.longer_than_fit = 0  # ... above it
        self.returned_held = 0  # the Program came back within its per-tool TTL
        self.returned_released = 0  # ... after it (the capacity had been released)
        self.fit_would_hold = 0  # came back after the per-tool TTL but within the fit's
        self.fit_would_release = 0  # came back after the fit's TTL but within the per-tool one
        # what the gaps after this key cost: placement starts after it, and the previous context
        # the engine no longer had cached then (tokens, and their recompute seconds)
        self.resumes = 0
        self.recomputed_tokens = 0
        self.resumed_context_tokens = 0  # the previous contexts of those placement starts
        self.recompute_seconds = 0.0

    def miss_ratio(self, min_resumes: int) -> float | None:
        """Share of the previous context lost over the gaps after this key (None: too few resumes)."""
        if self.resumes < min_resumes or self.resumed_context_tokens <= 0:
            return None
        return min(1.0, self.recomputed_tokens / self.resumed_context_tokens)

    def push(self, gap: float) -> None:
        if not (math.isfinite(gap) and gap >= 0):
            return
        srt = self._sorted
        if len(self.gaps) >= self.limit:
            # the oldest of equal gaps is the leftmost of them (insort_right puts a newer one after)
            del srt[bisect_left(srt, self.gaps.popleft())]
        self.gaps.append(gap)
        insort_right(srt, gap)
        self.observed += 1
        self._prefix = None
        self._cand = None

    def sorted_gaps(self) -> list[float]:
        """The window in ascending order (the list itself: do not modify it)."""
        return self._sorted

    def prefix_sums(self) -> list[float]:
        """``[0, g1, g1 + g2, ...]`` over the sorted window, summed left to right."""
        prefix = self._prefix
        if prefix is None:
            prefix = self._prefix = list(accumulate(self._sorted, initial=0.0))
        return prefix

    def quantile(self, q: float) -> float | None:
        """The nearest-rank ``q`` quantile of the window (None when empty)."""
        g = self._sorted
        if not g:
            return None
        return g[min(len(g) - 1, max(0, math.ceil(q * len(g)) - 1))]

    def utility(self, d: float, c: float, rent: float = 1.0) -> float:
        """Mean utility of holding ``d`` seconds at ``rent`` per second against recompute cost ``c``."""
        g = self._sorted
        n = len(g)
        if n == 0 or d <= 0:
            return 0.0
        k = bisect_right(g, d)
        return (c * k - rent * (self.prefix_sums()[k] + d * (n - k))) / n

    def best_ttl(self, c: float, d_max: float, margin_ratio: float, margin_seconds: float, rent: float = 1.0) -> float:
        """The ski-rental TTL (module docstring); 0 when holding never pays.

        The same value as :func:`best_ttl_scan` (the definition: every candidate in order) for
        every input; the window's candidates are prepared once per window change and only the
        first candidate of each run with the same held count ``k`` is evaluated (a later one
        holds longer for the same hits, so it cannot be strictly better).  Inputs outside the
        range where that argument holds in floating point (a negative rent or margin, magnitudes
        near overflow) take the scan.
        """
        if c <= 0 or d_max <= 0:
            return 0.0
        n = len(self._sorted)
        if n == 0:
            return 0.0
        if not (
            0.0 <= rent <= _SAFE
            and c <= _SAFE
            and d_max <= _SAFE
            and 0.0 <= margin_ratio <= _SAFE
            and 0.0 <= margin_seconds <= _SAFE
            and self.prefix_sums()[-1] <= _SAFE
        ):
            return best_ttl_scan(self._sorted, c, d_max, margin_ratio, margin_seconds, rent)
        cand = self._candidates(margin_ratio, margin_seconds, d_max)
        raws = cand.raws
        best_d, best_u = 0.0, 0.0
        cut = bisect_right(raws, d_max)
        if cut:
            # u = (c*k - rent*(prefix[k] + d*(n - k))) / n: the scan's expression, so the same floats
            us = [(c * k - rent * a) / n for k, a in zip(cand.ks[:cut], cand.rents[:cut], strict=True)]
            top = max(us)
            if top > 0.0:
                i = us.index(top)  # the first maximum: ties keep the shorter TTL
                best_d, best_u = raws[i], top
        # d_max itself comes last (any candidate above it is clipped to it); evaluating it again
        # when it equals a candidate gives the same utility, which a tie never takes
        u = self.utility(d_max, c, rent)
        if u > best_u:
            best_d = d_max
        return best_d

    def _candidates(self, margin_ratio: float, margin_seconds: float, upto: float) -> _Candidates:
        """The window's positive candidate TTLs ``g * (1 + margin_ratio) + margin_seconds`` in
        ascending order, the first of each run with the same held count ``k`` (gaps <= the TTL),
        with ``k`` and ``prefix[k] + d * (n - k)`` (the seconds held over the window); prepared
        up to the first one above ``upto`` (or all), and extended by a later call that needs more."""
        cand = self._cand
        gaps = self._sorted
        n = len(gaps)
        if cand is None or cand.margin_ratio != margin_ratio or cand.margin_seconds != margin_seconds:
            # a zero gap without a margin gives the candidate 0: utility 0, never taken
            start = 0 if margin_seconds > 0 else bisect_right(gaps, 0.0)
            cand = self._cand = _Candidates(margin_ratio, margin_seconds, start)
        raws = cand.raws
        i = cand.next_index
        if i >= n or (raws and raws[-1] > upto):
            return cand
        prefix = self.prefix_sums()
        scale = 1.0 + margin_ratio
        ks, rents = cand.ks, cand.rents
        while i < n:
            d = gaps[i] * scale + margin_seconds
            k = bisect_right(gaps, d, i)  # d >= gaps[i]
            raws.append(d)
            ks.append(k)
            rents.append(prefix[k] + d * (n - k))
            if k >= n:
                i = n  # every later candidate holds all n gaps too
                break
            # the next candidate that holds more is the first j with gaps[j] * scale + margin >= gaps[k]:
            # an estimate by division, then corrected with the candidates' own arithmetic
            nxt = gaps[k]
            j = bisect_right(gaps, (nxt - margin_seconds) / scale, i + 1)
            while j > i + 1 and gaps[j - 1] * scale + margin_seconds >= nxt:
                j -= 1
            while j < n and gaps[j] * scale + margin_seconds < nxt:
                j += 1
            i = j
            if d > upto:
                break  # enough for this decision
        cand.next_index = i
        return cand


class _Candidates:
    """The prepared candidates of one window version (``GapWindow._candidates``): parallel lists,
    ascending, and the index of the next gap to look at."""

    __slots__ = ("margin_ratio", "margin_seconds", "raws", "ks", "rents", "next_index")

    def __init__(self, margin_ratio: float, margin_seconds: float, start: int) -> None:
        self.margin_ratio = margin_ratio
        self.margin_seconds = margin_seconds
        self.raws: list[float] = []
        self.ks: list[int] = []
        self.rents: list[float] = []
        self.next_index = start


# Magnitudes below which the candidate pruning of ``GapWindow.best_ttl`` is exact in floats (no
# product or sum of the utility can overflow: c * k and rent * (prefix[k] + d * (n - k)) stay finite).
_SAFE = 1e100


def best_ttl_scan(
    gaps: list[float], c: float, d_max: float, margin_ratio: float, margin_seconds: float, rent: float = 1.0
) -> float:
    """The ski-rental TTL by definition (module docstring) over the ascending ``gaps``: every
    candidate in order, the first strictly best one kept.  :meth:`GapWindow.best_ttl` computes
    the same value faster; the property test compares the two."""
    if c <= 0 or d_max <= 0:
        return 0.0
    n = len(gaps)
    if n == 0:
        return 0.0
    prefix = list(accumulate(gaps, initial=0.0))
    best_d, best_u = 0.0, 0.0
    seen: set[float] = set()
    for g in gaps:
        if g > d_max:
            break
        d = min(d_max, g * (1.0 + margin_ratio) + margin_seconds)
        if d in seen:
            continue
        seen.add(d)
        if d <= 0:
            continue  # utility 0: never better than holding nothing
        k = bisect_right(gaps, d)
        u = (c * k - rent * (prefix[k] + d * (n - k))) / n
        if u > best_u:
            best_d, best_u = d, u
    if d_max not in seen:
        k = bisect_right(gaps, d_max)
        u = (c * k - rent * (prefix[k] + d_max * (n - k))) / n
        if u > best_u:
            best_d, best_u = d_max, u
    return best_d


@frozen
class ToolDecision:
    """A per-tool acting TTL: ``ttl_seconds`` (0 = release at once) decided on ``key``'s gaps."""

    ttl_seconds: float
    key: str

    @property
    def source(self) -> str:
        return TOOL if self.ttl_seconds > 0 else TOOL_RELEASE


@frozen
class ToolSnapshot:
    """One (model pool, turn key) as ``/scheduling/diagnostics`` shows it."""

    model_pool: str
    tool: str
    samples: int
    observed: int
    gap_p50_seconds: float | None
    gap_p90_seconds: float | None
    gap_p99_seconds: float | None
    decides: bool  # enabled and has min_samples gaps: its completions get a per-tool TTL
    held: int
    released: int
    fallbacks: int
    last_ttl_seconds: float | None
    shorter_than_fit: int = 0
    longer_than_fit: int = 0
    returned_held: int = 0
    returned_released: int = 0
    fit_would_hold: int = 0
    fit_would_release: int = 0
    resumes: int = 0
    recomputed_tokens: int = 0
    recompute_seconds: float = 0.0
    resume_miss_ratio: float | None = None  # recomputed / previous context over those resumes


class ToolGapModel:
    """Gap windows per (model pool, turn key), bounded by ``cfg.max_tools`` (least recently used out)."""

    __slots__ = ("cfg", "windows")

    def __init__(self, cfg: ToolRetentionConfig) -> None:
        self.cfg = cfg
        self.windows: dict[tuple[str, str], GapWindow] = {}

    def _window(self, pool: str, key: str) -> GapWindow:
        """``(pool, key)``'s window, created when new, moved to the most recently used end."""
        k = (pool, key)
        w = self.windows.pop(k, None)
        if w is None:
            w = GapWindow(self.cfg.window_size)
            while len(self.windows) >= self.cfg.max_tools:
                del self.windows[next(iter(self.windows))]
        self.windows[k] = w  # re-inserted last: the dict is in least-recently-used order
        return w

    def observe(
        self, pool: str, keys: tuple[str, ...], gap: float, armed: tuple[str, float, float] | None = None
    ) -> None:
        """The Program whose last turn had ``keys`` came back (or was released) after ``gap`` seconds.

        ``armed`` = ``(key, per-tool TTL, fitted TTL)`` when a per-tool decision was armed for that
        turn: the outcome is counted against both TTLs on ``key``'s window (diagnostics only).
        """
        for key in keys:
            w = self._window(pool, key)
            w.push(gap)
        if armed is None or not math.isfinite(gap):
            return
        key, ttl, fit = armed
        aw = self.windows.get((pool, key))
        if aw is None:
            return
        if gap <= ttl:
            aw.returned_held += 1
            aw.fit_would_release += int(gap > fit)
        else:
            aw.returned_released += 1
            aw.fit_would_hold += int(gap <= fit)

    def note_armed(self, pool: str, key: str, ttl: float, fit: float) -> None:
        """A per-tool TTL ``ttl`` was armed where the fit gave ``fit`` (diagnostics only)."""
        w = self.windows.get((pool, key))
        if w is None:
            return
        w.shorter_than_fit += int(ttl < fit)
        w.longer_than_fit += int(ttl > fit)

    def observe_resume(
        self, pool: str, keys: tuple[str, ...], recomputed_tokens: int, seconds: float, context_tokens: int = 0
    ) -> None:
        """A Program whose last turn had ``keys`` started a placement with ``recomputed_tokens`` of its
        previous context (``context_tokens``) no longer cached (recompute ``seconds``): what that
        gap cost.  Every key of the turn learns its miss ratio; the first carries the cost."""
        for i, key in enumerate(keys):
            w = self.windows.get((pool, key))
            if w is None:
                continue
            w.resumes += 1
            w.recomputed_tokens += max(0, recomputed_tokens)
            w.resumed_context_tokens += max(0, context_tokens)
            if i == 0:
                w.recompute_seconds += max(0.0, seconds)

    def decide(
        self,
        pool: str,
        keys: tuple[str, ...],
        cost: float,
        max_ttl: float,
        rent: float = 1.0,
        impact: float | None = None,
    ) -> ToolDecision | None:
        """The per-tool TTL for a turn with ``keys``, recompute cost ``cost`` and holding priced at
        ``rent`` per second (>= 1; module docstring); None = fall back to the fitted TTL.

        With ``impact`` (the cost of losing the whole context) and ``cfg.measured_miss``, a key that
        has ``min_samples`` resumes prices a miss at ``impact`` times its own measured miss ratio
        instead of ``cost``."""
        if not self.cfg.enabled or not keys:
            return None
        chosen: tuple[float, GapWindow, str] | None = None
        missing = False
        for key in keys:
            w = self._window(pool, key)
            if len(w.gaps) < self.cfg.min_samples:
                w.fallbacks += 1
                missing = True
                continue
            median = w.quantile(0.5) or 0.0
            if chosen is None or median > chosen[0]:
                chosen = (median, w, key)
        if missing or chosen is None:
            return None
        _, w, key = chosen
        ratio = w.miss_ratio(self.cfg.min_samples) if impact is not None and self.cfg.measured_miss else None
        if ratio is not None and impact is not None:
            cost = impact * ratio
        rent = max(1.0, rent)
        ttl = w.best_ttl(cost, min(max_ttl, cost / rent), self.cfg.margin_ratio, self.cfg.margin_seconds, rent)
        if ttl <= 0 and not self.cfg.release_when_long:
            w.fallbacks += 1
            return None
        w.last_ttl = ttl
        if ttl > 0:
            w.held += 1
        else:
            w.released += 1
        return ToolDecision(ttl_seconds=ttl, key=key)

    def snapshot(self) -> tuple[ToolSnapshot, ...]:
        """Every kept (model pool, key), sorted by pool then key."""
        out = []
        for (pool, key), w in sorted(self.windows.items()):
            out.append(
                ToolSnapshot(
                    model_pool=pool,
                    tool=key,
                    samples=len(w.gaps),
                    observed=w.observed,
                    gap_p50_seconds=w.quantile(0.5),
                    gap_p90_seconds=w.quantile(0.9),
                    gap_p99_seconds=w.quantile(0.99),
                    # with the per-tool TTL off nothing decides, however many gaps were learned
                    decides=self.cfg.enabled and len(w.gaps) >= self.cfg.min_samples,
                    held=w.held,
                    released=w.released,
                    fallbacks=w.fallbacks,
                    last_ttl_seconds=w.last_ttl,
                    shorter_than_fit=w.shorter_than_fit,
                    longer_than_fit=w.longer_than_fit,
                    returned_held=w.returned_held,
                    returned_released=w.returned_released,
                    fit_would_hold=w.fit_would_hold,
                    fit_would_release=w.fit_would_release,
                    resumes=w.resumes,
                    recomputed_tokens=w.recomputed_tokens,
                    recompute_seconds=round(w.recompute_seconds, 6),
                    resume_miss_ratio=w.miss_ratio(1),
                )
            )
        return tuple(out)
