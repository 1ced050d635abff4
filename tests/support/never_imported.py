"""A module of the allowed test package that no test imports.

Payloads name it, and the decoders must refuse it rather than import it: the codec
tests check that it never appears in ``sys.modules``.
"""

from __future__ import annotations

import dataclasses


@dataclasses.dataclass
class Bait:
    value: int = 0
