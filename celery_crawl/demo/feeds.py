"""Feed file names: one file per worker process, so writers never interleave."""

import os
from typing import Any


def uri_params(params: dict[str, Any], spider: Any) -> dict[str, Any]:
    return {**params, "pid": os.getpid()}
