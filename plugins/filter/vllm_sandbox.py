# Copyright: llmops.vllm contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
"""The filter that says what the vLLM unit's sandbox would keep from the server (the vllm_server role's preflight)."""

from __future__ import annotations

from ansible_collections.llmops.vllm.plugins.module_utils.service.sandbox import sandbox_refusals


class FilterModule:
    def filters(self):
        return {"vllm_sandbox_refusals": sandbox_refusals}
