# Copyright: llmops.vllm contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)

from __future__ import annotations


class ModuleDocFragment:
    # Where the modules that read a hub model (its config.json, its weights) read it from (module_utils/weights).
    DOCUMENTATION = r"""
options:
  hub_endpoint:
    description:
      - Base URL of the hub, or of a hub-compatible proxy.
      - Defaults to the E(HF_ENDPOINT) variable of the module's environment, else C(https://huggingface.co).
    type: str
  hub_token:
    description:
      - Token for gated or private repositories, sent as a bearer token to the hub's own host only, never to the
        CDN it redirects downloads to; never returned or logged.
      - The only token used; a token that huggingface_hub could find on the host (E(HF_TOKEN), a login) is not.
    type: str
  mirror:
    description:
      - Read hub models from this mirror instead of the hub, from C(MIRROR/owner/name).
      - An C(http://) or C(https://) URL of a directory listing (with the manifest when it has one, for hashes;
        otherwise sizes come from C(Content-Length)), or an absolute path that the host mounts.
    type: str
"""
