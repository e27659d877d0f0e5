# Copyright: llmops.vllm contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
"""Seconds, as the roles hand them over: clock readings (now().timestamp()) and the timings of module results."""

from __future__ import annotations

import numbers


class ClockError(ValueError):
    """A reading or a duration that is no number of seconds; the message says which."""


def seconds(value, what) -> float:
    """`value` as seconds; `what` names it in the error."""
    if isinstance(value, bool) or not isinstance(value, (numbers.Real, str)):
        raise ClockError(f"{what} must be a number of seconds, got {value!r}")
    try:
        return float(value)
    except ValueError:
        raise ClockError(f"{what} must be a number of seconds, got {value!r}") from None
