"""A queue entry as Python builds it (:class:`Entry`) and as a lease returns it (:class:`Lease`).

The one wire format of a queued request, shared by the queue (which pushes and
leases it), the job store (whose ``job_start.lua`` pushes a job's seeds) and the
scheduler: it lives in the foundation layer so that none of them imports another
for it. The byte layout of an entry and of a lease member is described in
:mod:`celery_crawl.queue.queues`; ``queue/lua/include/entries.lua`` reads it in Lua.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass
from typing import Any

MAX_JOB_ID = 63  # bytes; an entry's length byte keeps two bits: fingerprint and site follow
# the ARGV group of one entry, in every script that enqueues (queue/lua/include/push.lua)
ENTRY_ARGV = ("priority", "fingerprint", "job_id", "payload", "lane", "site")


def lua_entry_args() -> str:
    """``ENTRY_WIDTH``, the size of :data:`ENTRY_ARGV` (``core/lua/include/entry_args.lua``)."""
    return f"local ENTRY_WIDTH = {len(ENTRY_ARGV)}  -- {', '.join(ENTRY_ARGV)}"


@dataclass(frozen=True)
class Lease:
    """A request taken from the queue but not yet acknowledged."""

    member: bytes

    @property
    def priority(self) -> int:
        return int(struct.unpack_from(">i", self.member, 8)[0])

    @property
    def job(self) -> str:
        return self.member[13 : 13 + (self.member[12] & 0x3F)].decode()

    @property
    def site(self) -> str:
        """The site the request counts against, ``""`` when it carries none."""
        flags, at = self.member[12], self._after_fingerprint()
        return self.member[at + 1 : at + 1 + self.member[at]].decode() if flags & 0x40 else ""

    @property
    def payload(self) -> bytes:
        """The encoded request: after the job id, and the fingerprint and site when carried."""
        at = self._after_fingerprint()
        if self.member[12] & 0x40:
            at += 1 + self.member[at]
        return self.member[at:]

    def _after_fingerprint(self) -> int:
        flags = self.member[12]
        at = 13 + (flags & 0x3F)
        return at + 1 + self.member[at] if flags & 0x80 else at


@dataclass(frozen=True)
class Entry:
    """A request ready to enqueue: ``fingerprint`` is None for ``dont_filter``."""

    payload: bytes
    priority: int = 0
    fingerprint: bytes | None = None
    job: str = ""
    site: str = ""  # held to that site's limits; "" none (celery_crawl.politeness.sites)

    def args(self, uses_priority: bool, lane: int = 0) -> list[Any]:
        """The script arguments of this entry, as :data:`ENTRY_ARGV` names them (see
        ``queue/lua/include/push.lua``).

        ``lane`` 0 is the script's own queue; ``lane`` j > 0 the j-th routed queue.
        """
        if len(self.job.encode()) > MAX_JOB_ID:
            raise ValueError(f"job id longer than {MAX_JOB_ID} bytes: {self.job[:40]}...")
        priority = self.priority if uses_priority else 0
        # in ENTRY_ARGV's order
        return [priority, self.fingerprint or b"", self.job, self.payload, lane, self.site]
