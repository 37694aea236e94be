"""The batch file format (daemon/batchfile.py, docs/batch.md §3)."""

from __future__ import annotations

import io
import json
from pathlib import Path
from typing import Any

import pytest

from daemon import batchfile
from daemon.batchfile import (
    BATCH_CLASS_HEADER,
    BatchLine,
    LineError,
    encode_record,
    error_record,
    iter_lines,
    output_record,
    parse_line,
    request_headers,
    with_job_tag,
    without_duplicates,
)
from daemon.http.requests import ENDPOINTS


def line(**over: Any) -> str:
    obj: dict[str, Any] = {
        "custom_id": "req-1",
        "method": "POST",
        "url": "/v1/chat/completions",
        "body": {"model": "m", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 5},
    }
    for key, value in over.items():
        if value is ...:
            obj.pop(key)
        else:
            obj[key] = value
    return json.dumps(obj)


def test_constants_follow_the_plan_and_the_proxy() -> None:
    assert BATCH_CLASS_HEADER == "x-agentd-class"
    assert batchfile.BATCH_CLASS == "batch"
    assert set(batchfile.SUPPORTED_URLS) <= set(ENDPOINTS)
    wanted = {"/v1/chat/completions", "/v1/completions", "/v1/responses", "/v1/embeddings"}
    assert wanted <= set(batchfile.SUPPORTED_URLS)


def test_a_valid_line_parses_from_bytes_and_str() -> None:
    for raw in (line(), line().encode() + b"\n", "\ufeff" + line() + "\r\n"):
        parsed = parse_line(raw, 3)
        assert parsed == BatchLine(3, "req-1", "POST", "/v1/chat/completions", json.loads(line())["body"]), parsed


@pytest.mark.parametrize(
    ("raw", "custom_id", "fragment"),
    [
        ("{not json", None, "line 7: not valid JSON"),
        ("[1, 2]", None, "line 7: must be a JSON object, got [1, 2]"),
        ('{"x": NaN}', None, "line 7: not valid JSON"),
        (b"\xff\xfe{}", None, "line 7: not valid UTF-8"),
        ("   ", None, "line 7: empty line"),
        ("[" * 100_000, None, "line 7: "),
        (line(custom_id=...), None, "line 7: custom_id: must be a non-empty string (missing)"),
        (line(custom_id=""), None, "line 7: custom_id: must be a non-empty string"),
        (line(custom_id=5), None, "line 7: custom_id: must be a non-empty string (got 5)"),
        (line(custom_id="a\nb"), None, "line 7: custom_id: must be printable ASCII"),
        (line(custom_id="é"), None, "line 7: custom_id: must be printable ASCII"),
        (line(custom_id="x" * 513), None, "line 7: custom_id: must be at most 512 characters"),
        (line(method="GET"), "req-1", 'line 7: method: must be "POST" (got "GET")'),
        (line(method=...), "req-1", 'line 7: method: must be "POST" (missing)'),
        (line(url="/v1/moderations"), "req-1", "line 7: url: must be one of /v1/chat/completions"),
        (line(url=...), "req-1", "line 7: url: must be one of"),
        (line(body=[]), "req-1", "line 7: body: must be a JSON object (got [])"),
        (line(body=...), "req-1", "line 7: body: must be a JSON object (missing)"),
        (line(body={"model": 3}), "req-1", "line 7: body.model: must be a string, got 3"),
        (line(body={"stream": True}), "req-1", "line 7: body.stream: must be false or absent"),
    ],
)
def test_a_bad_line_is_an_error_naming_the_field(raw: str | bytes, custom_id: str | None, fragment: str) -> None:
    parsed = parse_line(raw, 7)
    assert isinstance(parsed, LineError), parsed
    assert parsed.line_number == 7
    assert parsed.code == "invalid_request"
    assert parsed.custom_id == custom_id
    assert parsed.message.startswith(fragment), parsed.message


def test_model_may_be_missing_and_stream_false_is_fine() -> None:
    assert isinstance(parse_line(line(body={"prompt": "x", "stream": False}, url="/v1/completions"), 1), BatchLine)


def test_iter_lines_streams_skips_blank_lines_and_counts_physical_lines(tmp_path: Path) -> None:
    path = tmp_path / "in.jsonl"
    path.write_bytes(
        (line(custom_id="a") + "\n\n" + "oops\n" + "   \n" + line(custom_id="b")).encode()  # no final newline
    )
    items = list(iter_lines(path))
    assert [(type(i).__name__, i.line_number, i.custom_id) for i in items] == [
        ("BatchLine", 1, "a"),
        ("LineError", 3, None),
        ("BatchLine", 5, "b"),
    ]
    assert [i.line_number for i in iter_lines(io.BytesIO(path.read_bytes()))] == [1, 3, 5]


def test_an_over_long_line_is_reported_without_loading_it(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(batchfile, "MAX_LINE_BYTES", 64)
    data = (line(custom_id="a") + "\n" + "x" * 200 + "\n" + line(custom_id="b") + "\n").encode()
    items = list(iter_lines(io.BytesIO(data)))
    assert isinstance(items[0], LineError) and items[0].message == "line 1: longer than 64 bytes"
    assert isinstance(items[1], LineError) and items[1].line_number == 2
    assert isinstance(items[2], LineError) and items[2].line_number == 3


def test_duplicates_the_first_line_wins() -> None:
    items = [
        parse_line(line(custom_id="a"), 1),
        parse_line(line(custom_id="b", url="/nope"), 2),
        parse_line(line(custom_id="a"), 3),
        parse_line(line(custom_id="b"), 4),
        parse_line("junk", 5),
        parse_line("junk", 6),
    ]
    out = list(without_duplicates(items))
    assert out[0] is items[0] and out[1] is items[1] and out[4] is items[4] and out[5] is items[5]
    for dup, first in ((out[2], 1), (out[3], 2)):
        assert isinstance(dup, LineError)
        assert dup.code == "duplicate_custom_id"
        assert dup.message.startswith(f"line {dup.line_number}: custom_id: duplicate of line {first}")


def test_request_headers() -> None:
    parsed = parse_line(line(custom_id="q7"), 1)
    assert isinstance(parsed, BatchLine)
    assert request_headers(parsed) == {
        "content-type": "application/json",
        "x-agentd-class": "batch",
        "x-request-id": "q7",
    }
    assert request_headers(parsed, "batch_abc")["x-request-id"] == "q7#job_name[batch_abc]#"
    tagged = parse_line(line(custom_id="#job_name[eval]#-q7"), 1)
    assert isinstance(tagged, BatchLine)
    assert request_headers(tagged, "batch_abc")["x-request-id"] == "#job_name[eval]#-q7"
    own = parse_line(line(body={"request_id": "mine", "prompt": "x"}), 1)
    assert isinstance(own, BatchLine)
    assert "x-request-id" not in request_headers(own, "job")
    with pytest.raises(ValueError, match="job name"):
        with_job_tag("x", "a]b")


def test_output_record_shapes() -> None:
    ok = output_record("a", status_code=200, body={"x": 1}, request_id="r1", error=None, record_id="batch_req_1")
    assert ok == {
        "id": "batch_req_1",
        "custom_id": "a",
        "response": {"status_code": 200, "request_id": "r1", "body": {"x": 1}},
        "error": None,
    }
    failed = output_record("a", status_code=None, body=None, request_id=None, error=("timeout", "t"), record_id="i")
    assert failed["response"] is None and failed["error"] == {"code": "timeout", "message": "t"}
    err = error_record(LineError(4, None, "invalid_request", "line 4: bad"), "batch_req_line_4")
    assert err == {
        "id": "batch_req_line_4",
        "custom_id": None,
        "response": None,
        "error": {"code": "invalid_request", "message": "line 4: bad"},
    }


def test_encode_record_is_one_line_of_json() -> None:
    rec = output_record("a", status_code=200, body={"t": "é\n\ud800"}, request_id=None, error=None, record_id="i")
    raw = encode_record(rec)
    assert raw.endswith(b"\n") and raw.count(b"\n") == 1
    assert json.loads(raw) == rec
    assert json.loads(encode_record({"t": "é"})) == {"t": "é"}
    with pytest.raises(ValueError):
        encode_record({"x": float("nan")})


def test_a_line_over_the_limit_counts_in_the_total_whatever_it_holds(tmp_path) -> None:
    """A line longer than the limit is reported malformed even when it is only spaces; the
    progress total counted it as blank, so the summary read "1 lines: 1 ok, 0 failed, 1 malformed"
    (found by a session-34 walk)."""
    from daemon.batch_runner import count_lines
    from daemon.batchfile import MAX_LINE_BYTES, LineError, iter_lines

    path = tmp_path / "in.jsonl"
    ok = b'{"custom_id": "a", "method": "POST", "url": "/v1/chat/completions", "body": {"messages": []}}\n'
    path.write_bytes(ok + b" " * (MAX_LINE_BYTES + 10) + b"\n" + b"   \n")
    items = list(iter_lines(path))
    assert [isinstance(item, LineError) for item in items] == [False, True]
    assert count_lines(path) == len(items) == 2
