# Copyright: llmops.vllm contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
"""What a failed task says, from its registered result (ansible_failed_result in a rescue)."""

from __future__ import annotations


def task_failure(result, task_name="") -> str:
    """`TASK: MESSAGE` (or MESSAGE without a task's name) of a failed result. A loop's own message says only that
    an item failed: the first failed item's says why."""
    result = result or {}
    failed_items = [item for item in result.get("results") or [] if isinstance(item, dict) and item.get("failed")]
    message = (failed_items[0].get("msg") if failed_items else None) or result.get("msg") or "failed"
    return f"{task_name}: {message}" if task_name else message
