"""The timers each Program wants armed in its Program actor, and the diff that keeps them armed.

At the end of every step, :func:`sync_timers` compares, for every Program the step touched,
the timers it wants (:func:`wanted_timers`) with the ones it has armed (``Program.timers``,
``kind -> (deadline, token)``) and emits ``CancelTimer`` for each kind no longer wanted and
``ArmTimer`` with a fresh token for each new or moved deadline.  A ``TimerFired`` whose token is
not the armed one is dropped by ``handlers.on_timer``.
"""

from __future__ import annotations

from actors.core.effects import ArmTimer, CancelTimer
from actors.core.events import ACTING_TTL, FORCE_RESUME, PAUSED_RETENTION, QUEUE_TIMEOUT
from actors.core.model import ACTING, ACTIVE, PAUSED, Program
from actors.core.state import SchedulerState, lookup_key


def wanted_timers(s: SchedulerState, p: Program) -> dict[str, float]:
    """``kind -> deadline`` of the timers ``p`` needs now.

    * acting TTL while Active/Acting, even when already due (a fitted TTL of 0 fires at once);
    * force resume while Paused with waiters and the deadline is still ahead (one already due
      makes the Program a forced candidate of every admission pass, no timer needed);
    * queue timeout while Paused with waiters: the earliest queue deadline of its requests;
    * paused retention while Paused/Acting and idle.
    """
    now = s.now
    out: dict[str, float] = {}
    waiting = s.pool.program_len(p.ref)
    if p.state == ACTIVE and p.status == ACTING and p.ttl_deadline is not None:
        out[ACTING_TTL] = p.ttl_deadline
    if p.state == PAUSED and waiting:
        if p.force_resume_deadline is not None and p.force_resume_deadline > now:
            out[FORCE_RESUME] = p.force_resume_deadline
        front = s.pool.front(p.ref)
        if front is not None:
            out[QUEUE_TIMEOUT] = min(r.queue_deadline for r in s.pool.requests(p.ref))
    if p.state == PAUSED and p.status == ACTING and p.in_flight == 0 and not waiting:
        out[PAUSED_RETENTION] = p.paused_at + s.cfg.paused_retention_ttl_seconds
    return out


def sync_timers(s: SchedulerState) -> None:
    """Emit the timer commands of every Program touched by this step (first-touch order)."""
    programs, effects = s.programs, s.effects
    for ref, p in s.touched.items():
        if programs.get(lookup_key(ref)) is not p:
            continue
        have = p.timers
        if p.state == ACTIVE:  # the common case, without ``wanted_timers``: an Active Program
            # wants the acting TTL (while Acting, with a deadline) and nothing else
            deadline = p.ttl_deadline
            if p.status == ACTING and deadline is not None:
                if have is not None and len(have) == 1:
                    cur = have.get(ACTING_TTL)
                    if cur is not None and cur[0] == deadline:
                        continue  # armed as wanted
                want = {ACTING_TTL: deadline}
            elif have is None:
                continue  # nothing armed, nothing wanted
            else:
                want = {}
        else:
            want = wanted_timers(s, p)
        if have is None:
            if not want:
                continue  # nothing armed, nothing wanted
            have = {}
        else:
            for kind in [k for k in have if k not in want]:  # armed order
                del have[kind]
                effects.append(CancelTimer(program=ref, kind=kind))
        for kind, deadline in want.items():
            cur = have.get(kind)
            if cur is None or cur[0] != deadline:
                token = s.timer_tokens.next()
                have[kind] = (deadline, token)
                effects.append(ArmTimer(program=ref, kind=kind, deadline=deadline, token=token))
        p.timers = have or None
