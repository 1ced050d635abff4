"""Counting the round trips a redis-py client makes."""

from __future__ import annotations

from typing import Any

from redis.exceptions import NoScriptError


class RoundTrips:
    """Counts the commands a redis-py client sends (each one is a round trip).

    A script's first run on a server that does not have it yet (``EVALSHA`` refused
    with ``NOSCRIPT``, ``SCRIPT LOAD``, then ``EVALSHA`` again) counts as one trip: the
    load happens once per server, in whichever test runs the script first.
    """

    def __init__(self, client: Any) -> None:
        self.client = client
        self.count = 0
        self.commands: list[str] = []
        self.loads = 0  # scripts loaded on the way (not counted)

    def __enter__(self) -> RoundTrips:
        real = type(self.client).execute_command

        def counting(*args: Any, **options: Any) -> Any:
            command = str(args[0])
            if command == "SCRIPT LOAD":
                self.loads += 1
                return real(self.client, *args, **options)
            try:
                result = real(self.client, *args, **options)
            except NoScriptError:  # not counted: redis-py's Script loads it, sends it again
                raise
            self.count += 1
            self.commands.append(command)
            return result

        self.client.execute_command = counting
        return self

    def __exit__(self, *exc: object) -> None:
        del self.client.execute_command
