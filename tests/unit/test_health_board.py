"""HealthBoard verdicts: thresholds (no flapping) and passive outlier ejection (docs/operations.md §11.3)."""

from __future__ import annotations

from actors.core.config import BackendTarget
from daemon.health import HealthBoard

W0, W1 = "http://w0:8000", "http://w1:8000"


def board(**kwargs: int) -> HealthBoard:
    targets = [
        BackendTarget(worker_url=url, dp_rank=0, target_id=f"{url}@0", index=i) for i, url in enumerate((W0, W1))
    ]
    b = HealthBoard(targets, **kwargs)
    for url in (W0, W1):
        b.record_check(url, True, "ok", 0.0)  # the first check decides alone
    return b


def verdicts(b: HealthBoard, checks: list[bool]) -> list[bool]:
    out = []
    for i, ok in enumerate(checks):
        b.record_check(W0, ok, "ok" if ok else "HTTP 503", float(i + 1))
        out.append(b.worker(W0).healthy)
    return out


def test_first_check_decides_alone() -> None:
    targets = [BackendTarget(worker_url=W0, dp_rank=0, target_id=f"{W0}@0", index=0)]
    b = HealthBoard(targets, failures_to_eject=3, successes_to_restore=2)
    assert b.record_check(W0, False, "HTTP 503", 0.0) is False  # unhealthy from the start: no change
    assert not b.worker(W0).healthy
    b = HealthBoard(targets, failures_to_eject=3, successes_to_restore=2)
    assert b.record_check(W0, True, "ok", 0.0) is True
    assert [t.target_id for t in b.healthy_targets()] == [f"{W0}@0"]


def test_thresholds_eject_after_n_failures_and_restore_after_m_successes() -> None:
    b = board(failures_to_eject=3, successes_to_restore=2)
    assert verdicts(b, [False, False, True] * 3) == [True] * 9  # flapping within the threshold
    assert verdicts(b, [False, False, False, True, False, True, True]) == [True, True, False, False, False, False, True]
    assert b.worker(W0).reason == "ok"
    assert b.ejections_count == 1


def test_recovering_reason_counts_passed_checks() -> None:
    b = board(failures_to_eject=1, successes_to_restore=3)
    verdicts(b, [False, True])
    assert b.worker(W0).reason == "recovering: 1/3 checks passed"


def test_connect_failure_ejects_at_once_and_only_checks_restore() -> None:
    b = board(failures_to_eject=3, successes_to_restore=2, outlier_failures=5)
    assert b.report_failure(W0, "unreachable: refused", eject_now=True) is True
    assert [t.worker_url for t in b.healthy_targets()] == [W1]
    assert b.worker(W0).reason == "ejected: unreachable: refused"
    b.report_success(W0)  # traffic cannot restore it (none reaches it anyway)
    assert not b.worker(W0).healthy
    assert verdicts(b, [True, True]) == [False, True]


def test_consecutive_request_failures_eject_and_a_success_resets_the_count() -> None:
    b = board(outlier_failures=3)
    for _ in range(2):
        assert b.report_failure(W0, "stream: reset") is False
    b.report_success(W0)
    assert b.worker(W0).outlier_failures_count == 0
    assert [b.report_failure(W0, "timeout") for _ in range(3)] == [False, False, True]
    assert b.worker(W0).reason.startswith("ejected after 3 failed requests in a row")
    assert b.report_failure(W0, "timeout") is False  # already out


async def test_a_missing_engine_leaves_rotation_before_a_suspect_and_never_empties_it() -> None:
    """docs/operations.md §11.3: a rank whose engine is missing from its worker's /metrics is out of
    rotation while another rank is in it; with none left, missing engines rank after suspects as the
    last resort, then every healthy target."""
    b = board()
    t0, t1 = b.targets
    b.set_engine_missing(t0, True)
    assert b.healthy_targets() == (t1,) and b.engine_missing(t0) and not b.engine_missing(t1)
    b.report_failure(W1, "connect timeout", suspect=True)  # the only rank with its engine is suspect
    assert b.healthy_targets() == (t1,)  # a suspect with its engine beats a rank the worker refuses
    b.set_engine_missing(t1, True)
    assert b.healthy_targets() == (t0, t1)  # nothing has its engine: every healthy target
    b.set_engine_missing(t0, False)
    assert b.healthy_targets() == (t0,)
    b.report_failure(W0, "refused", eject_now=True)
    assert b.healthy_targets() == (t1,)  # ejected is out whatever the engines say
    b.set_engine_missing(t1, False)
    assert b.healthy_targets() == (t1,)
