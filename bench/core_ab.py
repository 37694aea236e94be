"""The pure core's cycle of two checkouts in one process, interleaved (docs/benchmarks.md §1.1).

Usage (from the repository root)::

    python -m bench.core_ab OTHER_CHECKOUT [--tools] [--programs 10000] [--blocks 60] [--block 100]

Separate runs of ``bench.core_bench`` on a shared machine differ by more than a small change of
the core: the machine's speed moves by 1.5-2x within seconds.  This loads this checkout's core and
OTHER_CHECKOUT's core into one process (each imported from its own directory, kept apart in
``sys.modules``), builds the same state in both (``--programs`` idle Programs over 64 ranks,
populated and warmed as ``bench.core_bench`` does), freezes the garbage collector's view of that
state, and then times blocks of ``--block`` submit -> admit -> complete cycles, alternating the
two cores block by block (the order flips every block).  Printed: each side's median thread CPU
per cycle over the blocks and the block-by-block ratio this / other (median and quartiles), which
the machine's drift affects equally.  ``--tools``: every turn calls one of four tools (the
per-tool acting TTL decides, docs/program-scheduling.md §12).
"""

from __future__ import annotations

import argparse
import gc
import importlib
import statistics
import sys
import time
from pathlib import Path
from types import ModuleType
from typing import Any

from bench.interrupt import run_main
from daemon.commands.argtypes import positive_int

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("actors", "bench", "daemon", "sim")
TOOLS = ("read_file", "run_tests", "search_code", "edit_file")
RANKS = 64


def load_core_bench(root: Path) -> ModuleType:
    """``bench.core_bench`` (and the core under it) imported from ``root``."""
    for name in [m for m in sys.modules if m.split(".")[0] in PACKAGES]:
        del sys.modules[name]
    sys.path.insert(0, str(root))
    try:
        module = importlib.import_module("bench.core_bench")
    finally:
        sys.path.remove(str(root))
    if not str(module.__file__).startswith(str(root)):
        raise SystemExit(f"{root}: imported {module.__file__} instead (not an agentd checkout?)")
    return module


class Side:
    """One checkout's core with its own state, driven with events of its own classes."""

    def __init__(self, root: Path, programs: int, tools: bool) -> None:
        self.cb = load_core_bench(root)
        self.tools = tools
        self.programs = programs
        self.bench: Any = self.cb.Bench(RANKS, self.cb.identities(programs))
        for i in range(programs + 2000):  # every Program once, then a warm-up as core_bench does
            self.cycle(i % programs)

    def events(self, index: int) -> tuple[Any, Any]:
        b, cb = self.bench, self.cb
        b.seq += 1
        rid = cb.RequestId(f"req-{b.seq}")
        prompt = 2000 + 10 * (b.seq % 50)
        usage = cb.Usage(prompt, prompt // 2, 100)
        if self.tools:
            done = cb.RequestCompleted(rid, True, usage, finish_reason="tool_calls", tool_names=(TOOLS[index % 4],))
        else:
            done = cb.RequestCompleted(rid, True, usage)
        return cb.RequestSubmitted(rid, b.idents[index], prompt), done

    def cycle(self, index: int) -> None:
        submit, done = self.events(index)
        self.bench.run(submit)
        self.bench.run(done)

    def block(self, start: int, size: int) -> float:
        """Thread CPU microseconds per cycle over ``size`` cycles (events built before the clock)."""
        events = [self.events(((start + i) * 7919) % self.programs) for i in range(size)]
        run = self.bench.run
        t0 = time.thread_time_ns()
        for submit, done in events:
            run(submit)
            run(done)
        return (time.thread_time_ns() - t0) / size / 1000.0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.core_ab", description=__doc__.splitlines()[0])
    parser.add_argument("other", type=Path, help="the other checkout (e.g. a worktree of main)")
    parser.add_argument("--tools", action="store_true", help="every turn calls one of four tools")
    parser.add_argument("--programs", type=positive_int, default=10_000)
    parser.add_argument("--blocks", type=positive_int, default=60)
    parser.add_argument("--block", type=positive_int, default=100, help="cycles per block")
    args = parser.parse_args(argv)
    other = args.other.resolve()
    if not (other / "actors" / "core" / "scheduler.py").is_file():
        print(f"other: {other} is not an agentd checkout (no actors/core/scheduler.py)", file=sys.stderr)
        return 2
    if args.programs < 1 or args.blocks < 2 or args.block < 1:
        print("--programs, --block: must be >= 1; --blocks: must be >= 2", file=sys.stderr)
        return 2
    sides = {"other": Side(other, args.programs, args.tools), "this": Side(ROOT, args.programs, args.tools)}
    gc.collect()
    gc.freeze()  # the two states are long-lived: collections should not walk them at random moments
    per_block: dict[str, list[float]] = {name: [] for name in sides}
    for i in range(args.blocks):
        order = list(sides.items()) if i % 2 == 0 else list(reversed(sides.items()))
        for name, side in order:
            per_block[name].append(side.block(i * args.block, args.block))
    mode = "--tools" if args.tools else "default"
    print(
        f"core A/B in one process ({mode}, {args.programs} Programs / {RANKS} ranks, "
        f"{args.blocks} blocks of {args.block} cycles, alternated): this {ROOT}, other {other}"
    )
    for name, values in per_block.items():
        print(f"  {name:5}: median {statistics.median(values):.1f} us per cycle (fastest block {min(values):.1f})")
    ratios = [a / b for a, b in zip(per_block["this"], per_block["other"], strict=True)]
    quartiles = statistics.quantiles(ratios, n=4)
    print(
        f"  this / other, block by block: median {statistics.median(ratios):.3f} "
        f"(quartiles {quartiles[0]:.3f} .. {quartiles[2]:.3f})"
    )
    return 0


if __name__ == "__main__":
    sys.exit(run_main(main, "python -m bench.core_ab"))
