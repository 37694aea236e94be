"""The bench plots read as a user reads them (docs/benchmarks.md §9.6, README "PNG plots"): titles fit
the image, and one colour means one thing across the panels of ``time_split.png``.

Needs the ``plots`` extra (matplotlib); skipped without it, like the other plot tests.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

from bench.plots import CAUSE_PARTS, CLIENT_PARTS, SERVER_PARTS, write_plots


def _reports() -> dict[str, dict[str, Any]]:
    def rep(jct: float) -> dict[str, Any]:
        return {
            "samples": {"jct_seconds": [jct, jct * 2]},
            "cache": {"token_hit_ratio": 0.7},
            "preemptions": 0,
            "queue_wait_seconds": {
                "router": {"count": 3, "cdf": [[0.02, 0.5], [0.4, 1.0]]},
                "backend": {"count": 3, "cdf": [[1.2, 1.0], [4.0, 1.0]]},
            },
            "time_split_seconds": {"first_token": 2.0, "decode": 14.0, "between_turns": 21.0},
        }

    reports = {"native": rep(37.0), "agentd": rep(38.0)}
    reports["agentd"]["server_time_split"] = {
        "seconds_per_task": {"queue": 0.5, "prefill": 2.4, "recompute": 1.0, "decode": 22.0, "between_turns": 30.0},
        "recomputed_tokens_per_task": {"acting_ttl": 61.0, "migration": 20.0, "in_place": 3.0},
    }
    return reports


@pytest.fixture
def figures(tmp_path, monkeypatch) -> Iterator[dict[str, Any]]:
    """Every figure write_plots saves, by file name, kept open for inspection."""
    pytest.importorskip("matplotlib")
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    saved: dict[str, Any] = {}
    original = matplotlib.figure.Figure.savefig

    def savefig(fig: Any, path: Any, *args: Any, **kwargs: Any) -> None:
        saved[str(path).rsplit("/", 1)[-1]] = fig
        original(fig, path, *args, **kwargs)

    close = plt.close
    monkeypatch.setattr(matplotlib.figure.Figure, "savefig", savefig)
    monkeypatch.setattr(plt, "close", lambda fig=None: None)
    write_plots(_reports(), str(tmp_path))
    yield saved
    for fig in saved.values():
        close(fig)


def _bar_colors(ax: Any) -> dict[str, tuple[float, ...]]:
    return {c.get_label(): tuple(c.patches[0].get_facecolor()) for c in ax.containers}


def test_every_title_fits_inside_its_image(figures) -> None:
    assert set(figures) == {"jct_cdf.png", "queue_wait_cdf.png", "cache_hit.png", "time_split.png"}
    for name, fig in figures.items():
        fig.canvas.draw()
        renderer = fig.canvas.get_renderer()
        width = fig.bbox.width
        for ax in fig.axes:
            box = ax.title.get_window_extent(renderer)
            assert box.x0 >= 0 and box.x1 <= width, (name, ax.title.get_text(), box.x0, box.x1, width)


def test_time_split_panels_give_one_colour_one_meaning(figures) -> None:
    client_ax, server_ax, cause_ax = figures["time_split.png"].axes
    client, server, causes = _bar_colors(client_ax), _bar_colors(server_ax), _bar_colors(cause_ax)
    # decode and between turns look the same in the client's and the server's view
    assert client[dict(CLIENT_PARTS)["decode"]] == server[dict(SERVER_PARTS)["decode"]]
    assert client[dict(CLIENT_PARTS)["between_turns"]] == server[dict(SERVER_PARTS)["between_turns"]]
    # the server's prefill is the client's time to first token
    assert client[dict(CLIENT_PARTS)["first_token"]] == server[dict(SERVER_PARTS)["prefill"]]
    # inside a panel every part has its own colour
    assert len(set(server.values())) == len(SERVER_PARTS)
    assert len(set(causes.values())) == len(CAUSE_PARTS)
    # the causes (tokens) share no colour with a time part
    assert not set(causes.values()) & (set(client.values()) | set(server.values()))
