# Copyright: llmops.vllm contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
"""The error of a benchmark that cannot run or that failed its baseline."""

from __future__ import annotations


class BenchError(Exception):
    """A benchmark that cannot run or that failed its baseline, with a message for the user."""
