"""KV rent bookkeeping of the Programs a step touched (docs/priority.md §3).

``scheduler.step`` calls :func:`sync_rent` at the end of every step, after the step's decisions:
each touched Program's holding (its ledger charge while Active/Acting, else 0) is compared with
the holding its tenant is renting for it, and a change settles the old holding's rent.  ``release``
settles a released Program's holding itself (:func:`settle_program`), since a released Program
leaves the touched set.
"""

from __future__ import annotations

from actors.core import fairness
from actors.core.model import ACTING, ACTIVE, Program
from actors.core.state import SchedulerState


def held_tokens(p: Program) -> float:
    """KV tokens ``p`` holds on a rank's ledger while it computes nothing (Active/Acting)."""
    return p.charged_tokens if p.state == ACTIVE and p.status == ACTING else 0.0


def settle_program(s: SchedulerState, p: Program, after: float) -> None:
    if p.rent_tokens == after:
        return
    fairness.hold(s.fair, s.prio, p.tenant, p.rent_tokens, p.rent_since, after, s.now)
    p.rent_tokens = after
    p.rent_since = s.now


def sync_rent(s: SchedulerState) -> None:
    for p in s.touched.values():
        settle_program(s, p, held_tokens(p))
