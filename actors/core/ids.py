"""Identifiers of the scheduling core.

* ``ProgramKey`` = ``(model_pool, program_id)``: the runtime key of a Program across generations.
* ``ProgramRef`` = ``(model_pool, program_id, generation)``: one materialisation (generation) of a
  Program.  Every table of the core is indexed by the full ref, so a stale ref of an older
  generation never matches the live one.
* ``RequestId``/``TargetId`` are plain strings chosen by the shell (``RequestId`` is the shell's
  unique handle of one HTTP request, not the client's correlation ``request_id`` hint).
* ``redacted_id`` is the 16-hex-digit stable hash used in logs and metrics (never the raw id);
  blake2b over ``model_pool \\0 program_id \\0 generation``, so generations differ.
"""

# No ``from __future__ import annotations`` here: the NamedTuple fields keep real types, so
# cattrs can (un)structure the messages that carry these ids (docs/architecture.md §3).
import hashlib
from typing import NamedTuple, NewType

RequestId = NewType("RequestId", str)
TargetId = NewType("TargetId", str)

DEFAULT_MODEL_POOL = "default"
# the tenant of a request whose edge could not name one (docs/priority.md §3)
DEFAULT_TENANT = "default"


class ProgramKey(NamedTuple):
    model_pool: str
    program_id: str


class ProgramRef(NamedTuple):
    """One generation of a Program.  Tuple equality/hash use all three fields."""

    model_pool: str
    program_id: str
    generation: int

    @property
    def key(self) -> ProgramKey:
        return ProgramKey(self.model_pool, self.program_id)


def redacted_id(ref: ProgramRef) -> str:
    """16 lowercase hex digits identifying ``ref`` in logs/metrics without revealing the id."""
    data = f"{ref.model_pool}\0{ref.program_id}\0{ref.generation}".encode()
    return hashlib.blake2b(data, digest_size=8).hexdigest()


class SeqCounter:
    """A monotonic integer counter (timer tokens, FIFO sequence numbers, placement epochs).

    Explicit counters replace ``id()``/wake-order tie-breaks so that the core is deterministic.
    """

    __slots__ = ("value",)

    def __init__(self, start: int = 0) -> None:
        self.value = start

    def next(self) -> int:
        self.value += 1
        return self.value
