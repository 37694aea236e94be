"""Initial binding strategies (docs/program-scheduling.md §9)."""

from __future__ import annotations

from core_support import Harness, Ident, tid
from hypothesis import given, settings
from hypothesis import strategies as st

from actors.core.events import RequestSubmitted
from actors.core.ids import ProgramKey, RequestId, TargetId
from actors.core.model import Lineage
from actors.core.placement import CACHE_AWARE_PREFIX_CHARS, Binder, Candidate, HashRing, stable_hash64


def cand(
    t: str,
    programs: int = 0,
    tokens: float = 0.0,
    cap: int | None = None,
    pressure: float = 0.0,
    admissible: bool = True,
) -> Candidate:
    return Candidate(TargetId(t), programs, tokens, cap, pressure, admissible)


def key(p: str) -> ProgramKey:
    return ProgramKey("default", p)


def test_core_binding_round_robin_over_sorted_targets() -> None:
    b = Binder("program_round_robin", 160)
    cands = [cand("rank-1"), cand("rank-0")]
    assert b.bind(key("p1"), "p1", cands, None) == "rank-0"
    assert b.bind(key("p2"), "p2", cands, None) == "rank-1"
    assert b.bind(key("p1"), "p1", cands, None) == "rank-0"  # stable binding


def test_core_binding_least_program_count_ties_by_target_id() -> None:
    b = Binder("least_program_count", 160)
    cands = [cand("rank-2", 1), cand("rank-1", 1), cand("rank-0", 2)]
    assert b.bind(key("p"), "p", cands, None) == "rank-1"


def test_core_binding_token_balance_picks_most_remaining_capacity() -> None:
    b = Binder("reasoning_token_balance", 160)
    cands = [cand("a", tokens=500, cap=1000), cand("b", tokens=100, cap=1000), cand("c", tokens=100, cap=1000)]
    assert b.bind(key("p"), "p", cands, None) == "b"  # 900 remaining, tie with c -> smaller id


def test_core_binding_consistent_hash_independent_of_candidate_order() -> None:
    b1, b2 = Binder("consistent_hash", 160), Binder("consistent_hash", 160)
    c = [cand(f"http://w@{i}") for i in range(4)]
    for p in ("alpha", "beta", "gamma", "delta", "eps"):
        assert b1.bind(key(p), f"session:{p}", c, None) == b2.bind(key(p), f"session:{p}", list(reversed(c)), None)


def test_core_consistent_hash_ring_is_stable_and_balanced() -> None:
    ids = tuple(TargetId(f"http://w@{i}") for i in range(4))
    ring = HashRing(ids, 160)
    assert len(ring.points) == 640
    counts = {t: 0 for t in ids}
    for i in range(4000):
        counts[ring.owner(f"k{i}")] += 1
    assert min(counts.values()) > 600  # roughly 1000 each
    # stable across processes: blake2b, not hash()
    assert stable_hash64("x") == int.from_bytes(__import__("hashlib").blake2b(b"x", digest_size=8).digest(), "big")
    # removing a target only moves the keys it owned
    ring3 = HashRing(ids[:3], 160)
    moved = sum(1 for i in range(2000) if ring.owner(f"k{i}") != ring3.owner(f"k{i}") and ring.owner(f"k{i}") != ids[3])
    assert moved == 0


def test_core_binding_stable_until_release_or_removal() -> None:
    h = Harness(n_targets=2, binding_strategy="program_round_robin")
    h.submit("a")
    assert h.program("a").home_target == tid(0)
    h.complete("r1", at=1.0, prompt=10, terminate=True)  # released: binding dropped
    h.submit("b", at=2.0)  # counter moves on: rank 1
    h.submit("a", at=3.0)  # new generation re-binds: rank 0
    assert h.program("b").home_target == tid(1) and h.program("a").home_target == tid(0)


def test_core_cache_aware_learns_only_after_dispatch_and_follows_prefix() -> None:
    b = Binder("cache_aware", 160)
    cands = [cand("r0", pressure=0.5), cand("r1", pressure=0.1)]
    text = "system: you are a helpful agent\nuser: fix the bug"
    assert b.bind(key("p1"), "p1", cands, text) == "r1"  # no knowledge: lowest pressure
    b.commit_placement(text, TargetId("r0"))  # a request of some Program was dispatched to r0
    assert b.bind(key("p2"), "p2", cands, text + " quickly") == "r0"  # shared prefix follows


def test_core_cache_aware_without_a_prefix_match_takes_the_lowest_kv_pressure_for_every_key() -> None:
    """docs/program-scheduling.md §9: with no shared prefix, cache_aware picks the lowest KV
    pressure (then the smaller id), never a hash of the Program's key."""
    b = Binder("cache_aware", 160)
    cands = [cand("r0", pressure=0.5), cand("r1", pressure=0.1), cand("r2", pressure=0.1)]
    assert {b.bind(key(f"p{i}"), f"p{i}", cands, f"prompt {i}") for i in range(16)} == {"r1"}


def test_core_cache_aware_matches_the_best_of_a_targets_remembered_texts() -> None:
    """docs/program-scheduling.md §9: a target's match is the longest prefix any of its dispatched
    texts shares with the request's text; other, unrelated texts of that target do not hide it."""
    b = Binder("cache_aware", 160)
    text = "system: you are a helpful agent\nuser: fix the bug"
    b.commit_placement(text, TargetId("r0"))
    b.commit_placement("a different agent altogether", TargetId("r0"))
    cands = [cand("r0", pressure=0.5), cand("r1", pressure=0.1)]
    assert b.bind(key("p"), "p", cands, text + " quickly") == "r0"


def test_core_cache_aware_counts_a_rank_filled_exactly_to_its_limits_as_admissible() -> None:
    """docs/program-scheduling.md §3, §9: cache_aware keeps the immediately admissible ranks; a rank
    the new Program would fill exactly to the low watermark and to ``max_active_programs_per_target``
    is one, so the shared prefix takes the new Program there rather than to the idle rank."""
    h = Harness(
        n_targets=2, binding_strategy="cache_aware", token_capacity_per_dp_rank=1000, max_active_programs_per_target=2
    )
    text = "system: you are a helpful agent\nuser: fix the bug"
    h.feed(RequestSubmitted(RequestId("r1"), Ident("x", "x", "x"), 400, routing_text=text))
    home = h.program("x").placement
    assert h.state.ranks[home].fallback_tokens == 500.0
    h.feed(RequestSubmitted(RequestId("r2"), Ident("y", "y", "y"), 400, routing_text=text + " quickly"))
    assert h.program("y").home_target == home  # 500 + 400 + 100 == 1000, 1 + 1 == 2


def test_core_least_program_count_counts_only_active_or_waiting_programs() -> None:
    """docs/program-scheduling.md §9: least_program_count binds to the rank with the fewest
    accounted Programs (active, or waiting for admission); a paused idle Program is not one."""
    h = Harness(n_targets=2, binding_strategy="least_program_count")
    h.submit("a")  # a tie: the smaller id
    assert h.program("a").home_target == tid(0)
    h.complete("r1", at=1.0, prompt=100)  # TTL 0: a pauses, idle
    assert h.program("a").lifecycle == "paused_acting"
    h.submit("b", at=2.0)  # 0 accounted on both ranks again
    assert h.program("b").home_target == tid(0)
    h.submit("c", at=3.0)  # b is active on rank 0
    assert h.program("c").home_target == tid(1)


_LONG = CACHE_AWARE_PREFIX_CHARS - 8  # texts around the prefix's end


@settings(max_examples=60, deadline=None)
@given(
    st.lists(
        st.tuples(
            st.integers(0, 2),  # the shared head: one of three long system prompts
            st.text("ab", max_size=24),  # the rest, straddling the prefix's end
            st.integers(0, 2),  # the rank a request of it is then dispatched to
        ),
        min_size=1,
        max_size=12,
    )
)
def test_core_cache_aware_reads_only_the_prefix_of_a_routing_text(steps: list[tuple[int, str, int]]) -> None:
    """Relay processes send only ``CACHE_AWARE_PREFIX_CHARS`` of a routing text (docs/architecture.md
    §9): bindings and what the binder learns are the same with the full texts and the cut ones."""
    full, cut = Binder("cache_aware", 160), Binder("cache_aware", 160)
    cands = [cand("r0", pressure=0.3), cand("r1", pressure=0.2), cand("r2", pressure=0.1)]
    for n, (head, rest, rank) in enumerate(steps):
        text = "xyz"[head] * _LONG + rest
        short = text[:CACHE_AWARE_PREFIX_CHARS]
        assert full.bind(key(f"p{n}"), f"p{n}", cands, text) == cut.bind(key(f"p{n}"), f"p{n}", cands, short)
        full.commit_placement(text, TargetId(f"r{rank}"))
        cut.commit_placement(short, TargetId(f"r{rank}"))
    assert full.bindings == cut.bindings


def test_core_cache_aware_prefers_immediately_admissible_over_prefix_match() -> None:
    b = Binder("cache_aware", 160)
    text = "system: shared prompt"
    b.commit_placement(text, TargetId("r0"))
    cands = [cand("r0", pressure=0.9, admissible=False), cand("r1", pressure=0.2)]
    assert b.bind(key("p"), "p", cands, text) == "r1"


def test_core_cache_aware_cold_burst_accounts_bound_but_unadmitted_programs() -> None:
    h = Harness(n_targets=2, binding_strategy="cache_aware", token_capacity_per_dp_rank=10_000)
    h.observe(0, kv=0.0, running=0, waiting=5, at=0.0)  # both ranks gated: nobody is admitted
    h.observe(1, kv=0.0, running=0, waiting=5, at=0.0, epoch=2)
    h.submit("a", tokens=1000, at=0.1)
    h.submit("b", tokens=1000, at=0.2)
    assert {h.program("a").home_target, h.program("b").home_target} == {tid(0), tid(1)}


def test_core_binding_removed_target_rebinds_to_remaining() -> None:
    b = Binder("consistent_hash", 160)
    both = [cand("r0"), cand("r1")]
    first = b.bind(key("p"), "p", both, None)
    b.remove_target(first)
    rest = [c for c in both if c.target_id != first]
    assert b.bind(key("p"), "p", rest, None) == rest[0].target_id


def test_core_lineage_resolves_chains_roots_and_late_parents() -> None:
    lin = Lineage()
    lin.observe("m", "t:c", "t:b", None)  # parent declared before it exists (late parent)
    lin.observe("m", "t:b", "t:lead", None)
    assert lin.root("m", "t:c") == "t:lead"
    lin.observe("m", "t:lead", "t:c", None)  # would create a cycle: ignored
    assert lin.root("m", "t:c") == "t:lead"
    lin.observe("m", "t:d", "t:c", "t:root")  # explicit root overrides the parent link
    assert lin.root("m", "t:d") == "t:root"
    assert lin.root("other", "t:c") == "t:c"  # model scoped
