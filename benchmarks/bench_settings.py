"""The forum app's settings, without the item feed: every system only counts items."""

from tasks.settings import *  # noqa: F403

FORUM_FEED = None
LOG_LEVEL = "INFO"
