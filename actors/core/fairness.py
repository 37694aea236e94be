"""Tenant fairness: weighted virtual token counters with KV rent (docs/priority.md §3, §4).

Every tenant has an account whose ``counter`` is the service it received, normalised by its weight
(``cost / weight``).  The costs charged:

* a dispatch (any class): ``vtc_input_token_weight`` x the prompt tokens it makes the engine
  compute;
* its completion: ``vtc_output_token_weight`` x the completion tokens it reports (without usage:
  its expected output if it succeeded, nothing if it failed);
* KV rent: ``vtc_kv_token_second_weight`` x tokens x seconds of capacity held on a rank's ledger
  by an *idle* Program (Active/Acting: the acting TTL keeps its KV while it runs a tool).  Rent is
  settled whenever the held amount changes (end of every step, for the Programs the step touched,
  and at release) and read in between as ``held x now - sum(held x since)``, so it is exact at
  every instant without a per-step walk over Programs.

Ordering uses :func:`counter`: among waiting work of the same class and priority, the tenant with
the smallest counter goes first (``fairness = "off"`` makes every counter 0, i.e. no tenant order).

Counter lift (VTC): a tenant that becomes backlogged (its first waiting request in any class) is
raised to the smallest counter of the tenants already backlogged, or, when none is, to the
counter of the last tenant that stopped being backlogged.  Idle time therefore earns no credit.
"""

from __future__ import annotations

from attrs import define

from actors.core.config import PriorityConfig


@define(slots=True, eq=False)
class TenantAccount:
    """One tenant's fairness account (raw totals are for diagnostics and the conservation checks)."""

    counter: float = 0.0  # settled normalised service (rent of the current holdings excluded)
    input_tokens: float = 0.0
    output_tokens: float = 0.0
    kv_token_seconds: float = 0.0  # settled rent, raw token-seconds
    held_tokens: float = 0.0  # KV tokens its idle Programs hold now
    held_since_sum: float = 0.0  # sum of tokens x the time each holding started
    waiting: int = 0  # waiting requests of every class
    lifts: int = 0
    lifted: float = 0.0  # counter added by lifts (normalised): service never received
    dispatched: int = 0


class FairnessState:
    """Every tenant's account (one writer: the scheduler actor, inside ``step``)."""

    __slots__ = ("accounts", "last_left_counter")

    def __init__(self) -> None:
        self.accounts: dict[str, TenantAccount] = {}
        self.last_left_counter = 0.0


def account(fair: FairnessState, tenant: str) -> TenantAccount:
    a = fair.accounts.get(tenant)
    if a is None:
        a = fair.accounts[tenant] = TenantAccount()
    return a


def outstanding_rent_token_seconds(a: TenantAccount, now: float) -> float:
    """Rent accrued since the last settlement of the tenant's current holdings."""
    v = a.held_tokens * now - a.held_since_sum
    return v if v > 0 else 0.0


def counter(fair: FairnessState, cfg: PriorityConfig, tenant: str, now: float) -> float:
    """The tenant's virtual token counter at ``now`` (0 with ``fairness = "off"``)."""
    if cfg.fairness == "off":
        return 0.0
    a = fair.accounts.get(tenant)
    if a is None:
        return 0.0
    if not a.held_tokens:
        return a.counter
    return a.counter + cfg.vtc_kv_token_second_weight * outstanding_rent_token_seconds(a, now) / cfg.weight(tenant)


def charge(
    fair: FairnessState, cfg: PriorityConfig, tenant: str, *, input_tokens: float = 0.0, output_tokens: float = 0.0
) -> None:
    """Charge computed prompt tokens and output tokens (negative input: a preempted dispatch's refund)."""
    a = account(fair, tenant)
    a.input_tokens += input_tokens
    a.output_tokens += output_tokens
    cost = cfg.vtc_input_token_weight * input_tokens + cfg.vtc_output_token_weight * output_tokens
    a.counter += cost / cfg.weight(tenant)


def output_tokens(reported: int | None, reserved: int, success: bool) -> int:
    """Output tokens a completion is charged: the reported count, else the reservation when it
    succeeded without reporting usage, else (a failure) nothing."""
    if reported is not None:
        return reported
    return reserved if success else 0


def hold(
    fair: FairnessState, cfg: PriorityConfig, tenant: str, before: float, since: float, after: float, now: float
) -> None:
    """A holding of ``before`` tokens (since ``since``) becomes ``after`` tokens from ``now``: the
    old holding's rent is settled."""
    a = account(fair, tenant)
    if before:
        rent = before * (now - since)
        a.kv_token_seconds += rent
        a.counter += cfg.vtc_kv_token_second_weight * rent / cfg.weight(tenant)
        a.held_tokens -= before
        a.held_since_sum -= before * since
        if a.held_tokens < 1e-9:  # drift guard: nothing is held any more
            a.held_tokens = a.held_since_sum = 0.0
    if after:
        a.held_tokens += after
        a.held_since_sum += after * now


def arrive(fair: FairnessState, cfg: PriorityConfig, tenant: str, now: float) -> None:
    """A request of ``tenant`` starts waiting (any class); lifts the counter of a newly backlogged tenant."""
    a = account(fair, tenant)
    if a.waiting == 0 and cfg.fairness != "off":
        floor = None
        for name, other in fair.accounts.items():
            if other.waiting > 0 and name != tenant:
                c = counter(fair, cfg, name, now)
                if floor is None or c < floor:
                    floor = c
        if floor is None:
            floor = fair.last_left_counter
        mine = counter(fair, cfg, tenant, now)
        if floor > mine:
            a.counter += floor - mine
            a.lifted += floor - mine
            a.lifts += 1
    a.waiting += 1


def leave(fair: FairnessState, cfg: PriorityConfig, tenant: str, now: float, *, dispatched: bool) -> None:
    """A waiting request of ``tenant`` stops waiting (dispatched, cancelled or rejected)."""
    a = account(fair, tenant)
    a.waiting -= 1
    if dispatched:
        a.dispatched += 1
    if a.waiting <= 0:
        a.waiting = 0
        fair.last_left_counter = counter(fair, cfg, tenant, now)


MAX_ACCOUNTS = 4096


def prune(fair: FairnessState, cfg: PriorityConfig, now: float, keep: int = MAX_ACCOUNTS) -> int:
    """Bound the accounts (the tick calls it): beyond ``keep`` accounts, forget idle tenants (nothing
    waiting, no KV held) whose counter is at most the lift floor, oldest first.  A forgotten tenant
    that comes back starts at 0 and is lifted to the floor, which it had not exceeded: it gains
    no credit.  Returns the number forgotten."""
    if len(fair.accounts) <= keep:
        return 0
    floor = None
    for name, a in fair.accounts.items():
        if a.waiting > 0:
            c = counter(fair, cfg, name, now)
            floor = c if floor is None or c < floor else floor
    if floor is None:
        floor = fair.last_left_counter
    drop = [
        name
        for name, a in fair.accounts.items()
        if a.waiting == 0 and not a.held_tokens and counter(fair, cfg, name, now) <= floor
    ]
    drop = drop[: len(fair.accounts) - keep]
    for name in drop:
        del fair.accounts[name]
    return len(drop)


def total_kv_token_seconds(a: TenantAccount, now: float) -> float:
    """Settled plus outstanding rent of one account (raw token-seconds)."""
    return a.kv_token_seconds + outstanding_rent_token_seconds(a, now)
