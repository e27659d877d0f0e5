# Copyright: llmops.vllm contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)

from __future__ import annotations

DOCUMENTATION = r"""
name: model_slos
short_description: The latency SLOs of every entry of the llmops.vllm catalog that sets one
version_added: 0.1.0
author: llmops.vllm contributors (@llmops-vllm)
description:
  - Reads every entry of the catalog, the directories in O(paths) first and then the collection's own C(models/)
    (an entry in O(paths) overrides the collection's of the same name), checks each, and returns the C(slo) of
    those that set one, by model name.
  - The C(vllm_prometheus) role makes an alert rule of each (P(llmops.vllm.vllm_alert_rules#filter)).
  - Takes no terms.
options:
  paths:
    description: The user's catalog directories, searched in order before the collection's own.
    type: list
    elements: path
    default: []
"""

EXAMPLES = r"""
- name: The SLOs of the collection's catalog and of mine
  ansible.builtin.debug:
    msg: "{{ lookup('llmops.vllm.model_slos', paths=['my-catalog']) }}"
"""

RETURN = r"""
_raw:
  description: One mapping, model name to its C(slo) (C(pNN_LATENCY_ms) to milliseconds).
  type: list
  elements: dict
  sample:
    - {tiny: {p99_ttft_ms: 500}}
"""

import os

import yaml
from ansible.errors import AnsibleLookupError
from ansible.plugins.lookup import LookupBase

from ansible_collections.llmops.vllm.plugins.lookup.model_catalog import COLLECTION_CATALOG
from ansible_collections.llmops.vllm.plugins.module_utils.plan.catalog import CatalogError, catalog_files, check_entry


class LookupModule(LookupBase):
    def run(self, terms, variables=None, **kwargs):
        self.set_options(var_options=variables, direct=kwargs)
        if terms:
            raise AnsibleLookupError(f"model_slos takes no terms, got {terms!r}: it reads every catalog entry")
        directories = [*self.get_option("paths"), os.path.normpath(COLLECTION_CATALOG)]
        slos = {}
        try:
            for name, entry_file in sorted(catalog_files(directories).items()):
                with open(entry_file, encoding="utf-8") as stream:
                    entry = check_entry(name, yaml.safe_load(stream))
                if entry["slo"]:
                    slos[name] = entry["slo"]
        except CatalogError as error:
            raise AnsibleLookupError(str(error)) from error
        except (OSError, yaml.YAMLError) as error:
            raise AnsibleLookupError(f"cannot read the catalog: {error}") from error
        return [slos]
