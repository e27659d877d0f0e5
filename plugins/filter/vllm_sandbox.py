# Copyright: llmops.vllm contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
"""The filters that say what the vLLM unit's sandbox would keep from the server, and which of the limits it asks for
systemd would not grant (the vllm_server role's preflight)."""

from __future__ import annotations

from ansible_collections.llmops.vllm.plugins.module_utils.service.sandbox import limit_refusals, sandbox_refusals


class FilterModule:
    def filters(self):
        return {"vllm_sandbox_refusals": sandbox_refusals, "vllm_limit_refusals": limit_refusals}
