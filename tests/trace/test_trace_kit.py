"""Trace format, profile synthesis (statistics within tolerance, determinism) and stats."""

from __future__ import annotations

import io
import json

import pytest

from bench.trace.format import TraceError, dumps_trace, read_trace
from bench.trace.stats import compare, trace_stats
from bench.trace.synth import PROFILES, Knobs, synthesize, targets_for

SIZES = {"swe-short": 300, "coding-long": 160, "bfcl": 300, "chat-human": 400, "batch": 1500, "agent-tools": 300}


@pytest.mark.parametrize("profile", PROFILES)
def test_synth_profile_statistics_within_tolerance(profile: str) -> None:
    trace = read_trace(io.StringIO(dumps_trace(synthesize(profile, SIZES[profile], seed=11))))
    stats = trace_stats(trace)
    misses = [c for c in compare(stats, targets_for(profile)) if not c.ok]
    assert misses == []


def test_synth_scaled_profile_targets_follow_the_scale() -> None:
    knobs = Knobs(input_scale=0.25, output_scale=0.5)
    stats = trace_stats(synthesize("swe-short", 300, seed=5, knobs=knobs))
    assert [c for c in compare(stats, targets_for("swe-short", knobs)) if not c.ok] == []
    assert stats["initial_input_tokens.p50"] == pytest.approx(750, rel=0.12)


@pytest.mark.parametrize("profile", PROFILES)
def test_synth_is_deterministic_for_a_seed(profile: str) -> None:
    a = dumps_trace(synthesize(profile, 40, seed=7))
    b = dumps_trace(synthesize(profile, 40, seed=7))
    c = dumps_trace(synthesize(profile, 40, seed=8))
    assert a == b
    assert a != c


def test_records_carry_the_agent_fields() -> None:
    trace = synthesize("coding-long", 60, seed=2)
    children = [r for r in trace.records if r.parent_session_id is not None and r.turn == 0]
    assert children, "coding-long must spawn subagents"
    child = children[0]
    parent = trace.sessions()[child.parent_session_id]
    assert child.parent_turn is not None and child.parent_turn < len(parent)
    assert child.agent_id != "lead" and child.task_id == child.parent_session_id
    later = [r for r in trace.records if r.turn > 0]
    assert any(r.tool_name for r in later) and all(r.pre_gap_ms >= 0 for r in later)
    batch = synthesize("batch", 30, seed=2)
    assert all(r.job is not None and r.is_batch and not r.stream for r in batch.records)


def test_hash_ids_share_prefix_blocks() -> None:
    trace = synthesize("swe-short", 3, seed=1, knobs=Knobs(input_scale=1.0))
    s = trace.sessions()
    a0, a1 = s["swe-00000"][0], s["swe-00000"][1]
    b0 = s["swe-00001"][0]
    # the next turn's prompt extends the previous one: its first blocks are the previous full blocks
    full = a0.input_length // 512
    assert a1.hash_ids[:full] == a0.hash_ids[:full]
    # the 1500-token shared system prompt covers the first two 512-token blocks of every session
    assert a0.hash_ids[:2] == b0.hash_ids[:2]
    assert a0.hash_ids[2] != b0.hash_ids[2]
    assert len(a0.hash_ids) == -(-a0.input_length // 512)


def _line(**fields: object) -> str:
    base = {"session_id": "s", "turn": 0, "input_delta": 10, "output_length": 5}
    base.update(fields)
    return json.dumps(base)


@pytest.mark.parametrize(
    ("lines", "message"),
    [
        ([_line(turn=1)], "line 1: field 'turn' of session 's' must be 0, got 1"),
        ([_line(output_length=0)], "line 1: field 'output_length' must be >= 1"),
        ([_line(role="robot")], "line 1: field 'role' must be one of"),
        ([_line(bogus=1)], "line 1: unknown field 'bogus'"),
        ([_line(input_delta="10")], "line 1: field 'input_delta' must be int"),
        ([_line(pre_gap_ms=-1)], "line 1: field 'pre_gap_ms' must be finite and >= 0"),
        ([_line(), _line(turn=1, input_length=3)], "line 2: field 'input_length' must be 25 (derived), got 3"),
        ([_line(parent_session_id="nope", parent_turn=0)], "must name an earlier session"),
        ([_line(), _line(session_id="c", parent_session_id="s", parent_turn=4)], "'parent_turn' 4 is beyond"),
        (["{not json"], "line 1: invalid JSON"),
        ([_line(), '{"meta": {"profile": "x"}}'], "line 2: the meta line must come before every record"),
    ],
)
def test_read_trace_rejects_bad_records_naming_line_and_field(lines: list[str], message: str) -> None:
    with pytest.raises(TraceError) as info:
        read_trace(io.StringIO("\n".join(lines) + "\n"))
    assert message in str(info.value)


def test_plain_mooncake_lines_load_as_one_turn_sessions() -> None:
    text = (
        '{"timestamp": 0, "input_length": 100, "output_length": 20, "hash_ids": [1, 2]}\n'
        '{"timestamp": 50, "input_length": 70, "output_length": 10, "hash_ids": [1]}\n'
    )
    trace = read_trace(io.StringIO(text))
    assert [(r.session_id, r.turn, r.input_delta, r.input_length) for r in trace.records] == [
        ("line-1", 0, 100, 100),
        ("line-2", 0, 70, 70),
    ]


def test_stats_measure_the_trace_not_the_profile() -> None:
    trace = read_trace(
        io.StringIO(
            "\n".join(
                [
                    _line(session_id="a", input_delta=100, output_length=10),
                    _line(session_id="a", turn=1, input_delta=20, output_length=10, pre_gap_ms=500, role="tool"),
                    _line(session_id="a", turn=2, input_delta=30, output_length=10, pre_gap_ms=20000, role="tool"),
                ]
            )
            + "\n"
        )
    )
    st = trace_stats(trace)
    assert st["turns_per_program.p50"] == 3
    assert st["append_tokens.mean"] == 25
    assert st["return_gap.share_under_1s"] == 0.5
    assert st["total_input_tokens"] == 100 + 130 + 170
    # infinite cache: turn 1 reuses 100 + 10 tokens, turn 2 reuses 130 + 10
    assert st["ideal_prefix_hit_ratio"] == pytest.approx(250 / 400)


def test_max_turns_caps_every_session() -> None:
    full = synthesize("coding-long", 20, seed=3)
    capped = synthesize("coding-long", 20, seed=3, knobs=Knobs(max_turns=5))
    assert max(len(v) for v in full.sessions().values()) > 5
    assert max(len(v) for v in capped.sessions().values()) == 5
    first = "code-00000"
    assert [r.input_delta for r in capped.sessions()[first]] == [r.input_delta for r in full.sessions()[first]][:5]
