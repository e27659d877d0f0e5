# Copyright: llmops.vllm contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
"""The one way this collection waits: a monotonic deadline, a poll interval, and what was last seen.

A check is a function returning `(done, observed)`. `wait_for` calls it until it is done the asked number
of times in a row or the deadline passes, and returns a `WaitResult` either way; a check that sees that
waiting longer is pointless (the unit failed, the process died) raises `WaitAborted` to end at once.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any


class WaitAborted(Exception):
    """Raised by a check when what it waits for can no longer happen."""

    def __init__(self, reason: str, observed: Any = None):
        super().__init__(reason)
        self.reason = reason
        self.observed = observed


@dataclass
class WaitResult:
    ok: bool
    observed: Any
    elapsed: float
    polls: int
    aborted: str | None = None


def positive_seconds(value: float, what: str) -> float:
    """`value` as seconds, refusing zero, negative and endless values with a message that names `what`."""
    seconds = float(value)
    if not 0 < seconds < math.inf:
        raise ValueError(f"{what} must be more than 0 seconds, got {value}")
    return seconds


def wait_for(
    check: Callable[[], tuple[bool, Any]],
    timeout: float,
    interval: float,
    consecutive: int = 1,
    clock: Callable[[], float] = time.monotonic,
    sleep: Callable[[float], None] = time.sleep,
) -> WaitResult:
    """Poll `check` every `interval` s until it is done `consecutive` times in a row, for at most `timeout` s.

    The last poll happens at the deadline, so a wait never gives up before `timeout` has passed.
    """
    start = clock()
    deadline = start + timeout
    streak = polls = 0
    observed = None
    while True:
        polls += 1
        try:
            done, observed = check()
        except WaitAborted as abort:
            return WaitResult(False, abort.observed, clock() - start, polls, aborted=abort.reason)
        streak = streak + 1 if done else 0
        now = clock()
        if streak >= consecutive:
            return WaitResult(True, observed, now - start, polls)
        if now >= deadline:
            return WaitResult(False, observed, now - start, polls)
        sleep(max(0.0, min(interval, deadline - now)))
