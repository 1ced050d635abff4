"""The forum app's settings for the benchmark: items go to JSON-lines files."""

from tasks.settings import *  # noqa: F403

LOG_LEVEL = "INFO"
