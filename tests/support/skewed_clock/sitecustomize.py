"""A Python clock off by ``TEST_CLOCK_SKEW_SECONDS``, for a process started with this
folder first on its ``PYTHONPATH`` (Python imports ``sitecustomize`` at start-up).

Tests only: it shifts ``time.time`` and ``time.time_ns`` of the whole process, as a
host whose clock is ahead (positive) or behind (negative) would. Monotonic clocks
and Redis's clock are untouched.
"""

import os
import time

_SKEW = float(os.environ.get("TEST_CLOCK_SKEW_SECONDS", "0"))
_time, _time_ns = time.time, time.time_ns


def _skewed_time() -> float:
    return _time() + _SKEW


def _skewed_time_ns() -> int:
    return _time_ns() + int(_SKEW * 1_000_000_000)


time.time = _skewed_time
time.time_ns = _skewed_time_ns
