"""A Redis made full by hand: ``maxmemory`` a little over what is used, and a key grown past it."""

from __future__ import annotations

import redis


def fill_to_refusal(client: redis.Redis, room: int = 2_000_000, chunk: int = 200 * 1024) -> None:
    """``maxmemory`` ``room`` bytes over what is used, then a ``filler`` key grown until refused.

    Grown by APPEND: one big SET is refused at once, its query buffer counted, and a
    write under the limit is let in, so the last append takes Redis over it.
    """
    used = int(client.info("memory")["used_memory"])
    client.config_set("maxmemory", used + room)
    for _ in range(room // chunk + 16):  # bounded: the limit is met well before
        try:
            client.append("filler", b"x" * chunk)
        except redis.exceptions.OutOfMemoryError:
            return
    raise AssertionError("Redis took more than its maxmemory: is maxmemory set?")
