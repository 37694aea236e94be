"""Measure the seven cost-model coefficients from a live OpenAI-compatible backend (``agentd calibrate``).

Three probe phases, run one after the other against ``/v1/completions`` with streamed responses
(``stream_options.continuous_usage_stats`` gives the exact token count of every chunk) and prompts
given as random token ids (exact lengths, a fresh random first token per probe so nothing is
prefix-cached):

1. **prefill**: lone cold prompts of several lengths, ``max_tokens=1``, one at a time; the time to
   first token is ``intercept + linear*x + quadratic*x^2`` with ``x = tokens/1000``.
2. **decode**: ``B`` concurrent streams of ``P``-token prompts and ``K`` output tokens for a grid of
   batch sizes and contexts; in the window where every stream is decoding (after the last first
   token, before the first finish) the mean step time (seconds per token of one stream) is
   ``fixed + per_request*B + per_token*C`` with ``C`` the batch's mean total context.
3. **alpha**: a decode batch runs, then a long cold prompt arrives; over the prefill's window (from
   its arrival plus the fitted intercept to its first token) the batch keeps
   ``alpha = tokens decoded in the window * baseline step / window`` of its throughput.

Phases 1 and 2 are fitted by ordinary least squares (normal equations with column scaling, solved
by Gaussian elimination with partial pivoting; stdlib only).  Every measured duration is multiplied
by ``time_scale`` so that a backend running X times faster (``agentd sim-backend --time-scale X``)
yields its unscaled coefficients.  Time is read from ``trio.current_time()``, so the probes also run
in virtual time against an in-process simulated backend (``sim.transport.SimTransport``).
"""

from __future__ import annotations

import json
import math
import random
from collections.abc import Callable, Sequence
from typing import Any

import attrs
import httpx
import trio

from actors.core.config import COEFFICIENT_FIELDS

# Token ids of probe prompts: inside every common vocabulary, away from special tokens at the bottom.
_TOKEN_LOW, _TOKEN_HIGH = 1000, 30000


class CalibrationError(RuntimeError):
    """A probe failed (unreachable target, HTTP error, malformed stream); the message says which."""


@attrs.frozen
class CalibrateOptions:
    model: str | None = None
    time_scale: float = 1.0
    max_prompt_tokens: int = 16384
    max_context_tokens: int = 32768
    max_concurrency: int = 16
    prefill_points: int = 8
    decode_tokens: int = 64
    alpha_prompt_tokens: int = 8192
    repeats: int = 2
    max_seconds: float = 600.0
    request_timeout: float = 600.0
    seed: int = 0

    def batch_sizes(self) -> list[int]:
        sizes = [b for b in (1, 2, 4, 8, 16, 32, 64) if b <= self.max_concurrency]
        if self.max_concurrency not in sizes:
            sizes.append(self.max_concurrency)
        return sizes

    def prefill_lengths(self) -> list[int]:
        lo, hi = min(256, self.max_prompt_tokens), self.max_prompt_tokens
        n = self.prefill_points
        return sorted({round(lo * (hi / lo) ** (i / (n - 1))) for i in range(n)}) if n > 1 else [hi]

    def decode_shapes(self) -> list[tuple[int, int]]:
        """``(batch size, prompt tokens per stream)``: a short and a long context per batch size."""
        k = self.decode_tokens
        shapes = []
        for b in self.batch_sizes():
            long_p = min(self.max_prompt_tokens, self.max_context_tokens // b) - k
            short_p = min(128, long_p)
            for p in sorted({short_p, long_p}):
                if p >= 1:
                    shapes.append((b, p))
        return shapes

    def total_probes(self) -> int:
        return self.repeats * (len(self.prefill_lengths()) + len(self.decode_shapes()) + 1)


@attrs.frozen
class Fit:
    names: tuple[str, ...]
    coefficients: tuple[float, ...]
    r_squared: float
    rms_residual: float
    max_abs_residual: float
    points: int


def least_squares(rows: Sequence[Sequence[float]], y: Sequence[float]) -> list[float]:
    """Ordinary least squares ``argmin |A b - y|`` by the normal equations on scaled columns."""
    n = len(rows[0])
    if len(rows) < n:
        raise ValueError(f"need at least {n} points, got {len(rows)}")
    scale = [max(abs(r[j]) for r in rows) or 1.0 for j in range(n)]
    a = [[r[j] / scale[j] for j in range(n)] for r in rows]
    m = [[sum(row[i] * row[j] for row in a) for j in range(n)] + [sum(row[i] * v for row, v in zip(a, y, strict=True))]
         for i in range(n)]  # fmt: skip
    for col in range(n):
        pivot = max(range(col, n), key=lambda r: abs(m[r][col]))
        if abs(m[pivot][col]) < 1e-300:
            raise ValueError("singular design: the probes do not vary enough to separate the coefficients")
        m[col], m[pivot] = m[pivot], m[col]
        for r in range(n):
            if r != col:
                f = m[r][col] / m[col][col]
                for c in range(col, n + 1):
                    m[r][c] -= f * m[col][c]
    return [m[i][n] / m[i][i] / scale[i] for i in range(n)]


def fit(names: tuple[str, ...], rows: Sequence[Sequence[float]], y: Sequence[float]) -> Fit:
    coef = least_squares(rows, y)
    pred = [sum(c * v for c, v in zip(coef, r, strict=True)) for r in rows]
    res = [a - b for a, b in zip(y, pred, strict=True)]
    mean = sum(y) / len(y)
    ss_tot = sum((v - mean) ** 2 for v in y)
    ss_res = sum(r * r for r in res)
    return Fit(
        names=names,
        coefficients=tuple(coef),
        r_squared=1.0 - ss_res / ss_tot if ss_tot > 0 else 1.0,
        rms_residual=math.sqrt(ss_res / len(res)),
        max_abs_residual=max(abs(r) for r in res),
        points=len(rows),
    )


@attrs.frozen
class StreamTrace:
    """One streamed probe: send time, prompt tokens, and ``(arrival time, completion tokens so far)``."""

    sent: float
    prompt_tokens: int
    tokens: list[tuple[float, int]]

    @property
    def first(self) -> float:
        return self.tokens[0][0]

    @property
    def last(self) -> float:
        return self.tokens[-1][0]


class Prober:
    def __init__(
        self,
        client: httpx.AsyncClient,
        base_url: str,
        opts: CalibrateOptions,
        progress: Callable[[int, int], None] | None = None,
    ) -> None:
        self.client = client
        self.url = base_url.rstrip("/") + "/v1/completions"
        self.opts = opts
        self.rng = random.Random(opts.seed)
        self.progress = progress
        self.done = 0
        self.total = opts.total_probes()
        self.t0 = trio.current_time()

    def _tick(self) -> None:
        self.done += 1
        if self.progress is not None:
            self.progress(self.done, self.total)

    def prompt(self, n: int) -> list[int]:
        return [self.rng.randrange(_TOKEN_LOW, _TOKEN_HIGH) for _ in range(n)]

    async def stream(
        self, prompt: list[int], max_tokens: int, on_token: Callable[[int], None] | None = None
    ) -> StreamTrace:
        body: dict[str, Any] = {
            "prompt": prompt,
            "max_tokens": max_tokens,
            "min_tokens": max_tokens,
            "ignore_eos": True,
            "temperature": 0,
            "stream": True,
            "stream_options": {"include_usage": True, "continuous_usage_stats": True},
        }
        if self.opts.model is not None:
            body["model"] = self.opts.model
        sent = trio.current_time()
        tokens: list[tuple[float, int]] = []
        prompt_tokens = len(prompt)
        try:
            async with self.client.stream("POST", self.url, json=body, timeout=self.opts.request_timeout) as resp:
                if resp.status_code != 200:
                    text = (await resp.aread()).decode("utf-8", "replace")[:300]
                    raise CalibrationError(f"{self.url} answered HTTP {resp.status_code}: {text}")
                async for line in resp.aiter_lines():
                    if not line.startswith("data:"):
                        continue
                    data = line[5:].strip()
                    if data == "[DONE]":
                        break
                    now = trio.current_time()
                    chunk = json.loads(data)
                    usage = chunk.get("usage") or {}
                    if usage.get("prompt_tokens"):
                        prompt_tokens = int(usage["prompt_tokens"])
                    if not chunk.get("choices"):
                        continue
                    count = usage.get("completion_tokens")
                    count = int(count) if count is not None else (tokens[-1][1] + 1 if tokens else 1)
                    if tokens and count <= tokens[-1][1]:
                        continue
                    tokens.append((now, count))
                    if on_token is not None:
                        on_token(count)
        except httpx.TransportError as exc:
            raise CalibrationError(f"cannot reach {self.url}: {exc or type(exc).__name__}") from exc
        if not tokens:
            raise CalibrationError(f"{self.url} streamed no tokens")
        return StreamTrace(sent, prompt_tokens, tokens)

    # ------------------------------------------------------------------ phases
    async def prefill_point(self, n: int) -> tuple[float, float]:
        """``(x = prompt tokens / 1000, TTFT seconds)`` of one lone cold prompt."""
        trace = await self.stream(self.prompt(n), 1)
        self._tick()
        return trace.prompt_tokens / 1000.0, (trace.first - trace.sent) * self.opts.time_scale

    async def batch(self, b: int, p: int, k: int) -> list[StreamTrace]:
        traces: list[StreamTrace | None] = [None] * b
        prompts = [self.prompt(p) for _ in range(b)]

        async def one(i: int) -> None:
            traces[i] = await self.stream(prompts[i], k)

        async with trio.open_nursery() as nursery:
            for i in range(b):
                nursery.start_soon(one, i)
        return [t for t in traces if t is not None]

    async def decode_point(self, b: int, p: int) -> tuple[int, float, float]:
        """``(B, mean context tokens, seconds per step)`` over the window where all ``b`` decode.

        When the streams overlap too little (a backend that throttles prefill next to decodes lets
        the first streams finish before the last one starts), the probe is rerun with 4x the output
        tokens, up to three times."""
        k = self.opts.decode_tokens
        for attempt in range(4):
            point = self._decode_window(b, p, await self.batch(b, p, k))
            if point is not None:
                self._tick()
                return point
            if attempt < 3:
                k *= 4
        raise CalibrationError(
            f"decode probe B={b} P={p}: fewer than 2 steps with the whole batch decoding even with "
            f"{k} output tokens per stream"
        )

    def _decode_window(self, b: int, p: int, traces: list[StreamTrace]) -> tuple[int, float, float] | None:
        start = max(t.first for t in traces)
        end = min(t.last for t in traces)
        steps: list[float] = []
        context = 0.0
        for t in traces:
            inside = [(ts, n) for ts, n in t.tokens if start <= ts <= end]
            if len(inside) < 2 or inside[-1][1] - inside[0][1] < 2:
                return None
            steps.append((inside[-1][0] - inside[0][0]) / (inside[-1][1] - inside[0][1]))
            # the context of a step that produces token n is prompt + n - 1 tokens (mean over the window)
            context += t.prompt_tokens + (inside[0][1] + inside[-1][1]) / 2.0
        return b, context, sum(steps) / len(steps) * self.opts.time_scale

    async def alpha_point(self, prefill: Fit, decode: Fit) -> float:
        """Retained decode throughput share while a long cold prompt is prefilled."""
        opts = self.opts
        b = max(1, min(4, opts.max_concurrency - 1))
        p = 128
        n = max(1, min(opts.alpha_prompt_tokens, opts.max_context_tokens - b * (p + 1)))
        x = n / 1000.0
        a0, a1, a2 = prefill.coefficients
        d0, d1, d2 = decode.coefficients
        p_est = max(a0 + a1 * x + a2 * x * x, 1e-6)
        step_est = max(d0 + d1 * b + d2 * b * p, 1e-6)
        warm = 16
        # long enough to outlast the prefill even if decode stopped completely during it
        k = warm + 2 * math.ceil(p_est / step_est) + 64
        k = min(k, max(warm + 8, opts.max_context_tokens // b - p))
        ready = trio.Event()
        counts = [0] * b
        prompts = [self.prompt(p) for _ in range(b)]
        traces: list[StreamTrace | None] = [None] * b
        big: list[StreamTrace] = []

        def seen(i: int) -> Callable[[int], None]:
            def cb(count: int) -> None:
                counts[i] = count
                if min(counts) >= warm:
                    ready.set()

            return cb

        async def one(i: int) -> None:
            traces[i] = await self.stream(prompts[i], k, seen(i))

        async def prefill_probe() -> None:
            await ready.wait()
            big.append(await self.stream(self.prompt(n), 1))

        async with trio.open_nursery() as nursery:
            for i in range(b):
                nursery.start_soon(one, i)
            nursery.start_soon(prefill_probe)
        self._tick()
        scale = opts.time_scale
        w0 = big[0].sent + a0 / scale
        w1 = big[0].first
        shares = []
        for t in traces:
            assert t is not None
            before = [(ts, c) for ts, c in t.tokens if ts <= big[0].sent]
            if len(before) < 2 or t.last < w1:
                raise CalibrationError("alpha probe: the decode batch did not span the prefill; raise --decode-tokens")
            baseline = (before[-1][0] - before[0][0]) / (before[-1][1] - before[0][1])
            tokens_in = sum(1 for ts, _ in t.tokens if w0 < ts <= w1)
            if w1 > w0:
                shares.append(min(1.0, tokens_in * baseline / (w1 - w0)))
        return sum(shares) / len(shares) if shares else 1.0


@attrs.frozen
class Calibration:
    prefill: Fit
    decode: Fit
    alpha: float
    alpha_samples: tuple[float, ...]
    elapsed_seconds: float
    probes: int

    def coefficients(self) -> dict[str, float]:
        a0, a1, a2 = self.prefill.coefficients
        d0, d1, d2 = self.decode.coefficients
        return {
            "prefill_cost_model.intercept_seconds": max(0.0, a0),
            "prefill_cost_model.linear_seconds_per_1k_tokens": max(0.0, a1),
            "prefill_cost_model.quadratic_seconds_per_1k_tokens_squared": max(0.0, a2),
            "prefill_cost_model.decode_throughput_alpha": min(1.0, max(0.0, self.alpha)),
            "decode_throughput_model.fixed_step_seconds": max(1e-9, d0),
            "decode_throughput_model.batch_step_seconds_per_request": max(0.0, d1),
            "decode_throughput_model.context_step_seconds_per_token": max(0.0, d2),
        }

    def clamped(self) -> list[str]:
        raw = dict(zip(COEFFICIENT_FIELDS, self._raw(), strict=True))
        return [name for name, v in self.coefficients().items() if v != raw[name]]

    def _raw(self) -> list[float]:
        a0, a1, a2 = self.prefill.coefficients
        d0, d1, d2 = self.decode.coefficients
        return [a0, a1, a2, self.alpha, d0, d1, d2]

    def toml_block(self) -> str:
        c = self.coefficients()
        lines = [
            "# agentd calibrate: the seven cost-model coefficients (drop the next line if the file has it)",
            "enable_program_scheduling = true",
            "",
            "[program_scheduling.prefill_cost_model]",
        ]
        for name, v in c.items():
            if name.startswith("prefill_cost_model."):
                lines.append(f"{name.split('.', 1)[1]} = {v!r}")
        lines += ["", "[program_scheduling.decode_throughput_model]"]
        for name, v in c.items():
            if name.startswith("decode_throughput_model."):
                lines.append(f"{name.split('.', 1)[1]} = {v!r}")
        return "\n".join(lines) + "\n"

    def report(self) -> str:
        out = [f"agentd calibrate: {self.probes} probes in {self.elapsed_seconds:.1f} s"]
        for label, f, unit in (
            ("prefill TTFT = intercept + linear*x + quadratic*x^2 (x = tokens/1000)", self.prefill, "s"),
            ("decode step = fixed + per_request*B + per_token*C", self.decode, "s"),
        ):
            out.append(
                f"  {label}: R^2 = {f.r_squared:.6f}, rms residual = {f.rms_residual:.3g} {unit}, "
                f"max |residual| = {f.max_abs_residual:.3g} {unit}, {f.points} points"
            )
        samples = ", ".join(f"{s:.3f}" for s in self.alpha_samples)
        out.append(f"  decode_throughput_alpha: mean of [{samples}]")
        for name in self.clamped():
            out.append(f"  warning: {name} fitted outside its valid range; clamped")
        return "\n".join(out)


async def calibrate(
    client: httpx.AsyncClient,
    base_url: str,
    opts: CalibrateOptions,
    progress: Callable[[int, int], None] | None = None,
) -> Calibration:
    """Run every probe (bounded by ``opts.max_seconds`` of wall or virtual time) and fit."""
    prober = Prober(client, base_url, opts, progress)
    t0 = trio.current_time()
    with trio.fail_after(opts.max_seconds):
        if True:
            xs: list[float] = []
            ttfts: list[float] = []
            for _ in range(opts.repeats):
                for n in opts.prefill_lengths():
                    x, ttft = await prober.prefill_point(n)
                    xs.append(x)
                    ttfts.append(ttft)
            prefill = fit(("intercept", "linear", "quadratic"), [(1.0, x, x * x) for x in xs], ttfts)
            rows: list[tuple[float, float, float]] = []
            steps: list[float] = []
            for _ in range(opts.repeats):
                for b, p in opts.decode_shapes():
                    bb, ctx, step = await prober.decode_point(b, p)
                    rows.append((1.0, float(bb), ctx))
                    steps.append(step)
            decode = fit(("fixed", "per_request", "per_token"), rows, steps)
            alphas = [await prober.alpha_point(prefill, decode) for _ in range(opts.repeats)]
    return Calibration(
        prefill=prefill,
        decode=decode,
        alpha=sum(alphas) / len(alphas),
        alpha_samples=tuple(alphas),
        elapsed_seconds=trio.current_time() - t0,
        probes=prober.done,
    )


if __name__ == "__main__":
    import sys

    from bench.interrupt import not_a_command

    sys.exit(not_a_command("bench.calibrate_costs", "agentd calibrate"))
