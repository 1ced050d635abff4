"""The fault-injection suite's fixtures: the integration tests' workers, app and state client."""

from tests.integration.conftest import app, env, start_worker, state_client

__all__ = ["app", "env", "start_worker", "state_client"]
