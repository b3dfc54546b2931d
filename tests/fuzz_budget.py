"""How many examples a property-based (Hypothesis) test draws: all of them in CI, a fifth in a developer's run.

The properties are the same either way; the count only sets how much of the input space one run explores. A
developer's quick loop runs often (and each example of a launcher property runs bash or shellcheck), CI runs once
per change with the full count, so the same code meets every example before it lands.
"""

from __future__ import annotations

import os

IN_CI = os.environ.get("CI", "").lower() in ("true", "1")
LOCAL_SHARE = 5  # a developer's run draws 1/LOCAL_SHARE of CI's examples
LOCAL_FLOOR = 8  # and never fewer than this


def examples(in_ci: int) -> int:
    """The example count for a test that draws ``in_ci`` examples in CI."""
    return in_ci if IN_CI else max(LOCAL_FLOOR, in_ci // LOCAL_SHARE)
