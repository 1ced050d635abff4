"""Counting the round trips a redis-py client makes."""

from __future__ import annotations

from typing import Any


class RoundTrips:
    """Counts the commands a redis-py client sends (each one is a round trip)."""

    def __init__(self, client: Any) -> None:
        self.client = client
        self.count = 0
        self.commands: list[str] = []

    def __enter__(self) -> RoundTrips:
        real = type(self.client).execute_command

        def counting(*args: Any, **options: Any) -> Any:
            self.count += 1
            self.commands.append(str(args[0]))
            return real(self.client, *args, **options)

        self.client.execute_command = counting
        return self

    def __exit__(self, *exc: object) -> None:
        del self.client.execute_command
