"""Programs from Debian's packages that some tests run: found, skipped, or failed under CI."""

from __future__ import annotations

import os
import shutil

import pytest


def debian_tool(name: str, package: str) -> str:
    """The path of ``name``; .ci/run installs ``package``, so under CI a missing one fails.

    Elsewhere the test is skipped, with the package to install as the reason.
    """
    path = shutil.which(name)
    if path is None:
        if os.environ.get("CI"):
            pytest.fail(f"{name} not installed: .ci/run must apt-get install {package}")
        pytest.skip(f"{name} not installed (apt-get install {package})")
    return path
