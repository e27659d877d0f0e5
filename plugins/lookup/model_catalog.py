# Copyright: llmops.vllm contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)

from __future__ import annotations

DOCUMENTATION = r"""
name: model_catalog
short_description: Read a model's entry from the llmops.vllm catalog
version_added: 0.1.0
author: llmops.vllm contributors (@llmops-vllm)
description:
  - Finds the catalog entry of each model name, checks it, and returns it with defaults filled in.
  - The catalog is one YAML file per model, named after the model (C(tiny.yml) holds C(tiny)).
    The directories in O(paths) are searched first, then the collection's own C(models/) directory,
    so users add or override entries without editing the collection.
  - An unknown name fails with the list of every known name.
options:
  _terms:
    description: Model names.
    required: true
    type: list
    elements: str
  paths:
    description: The user's catalog directories, searched in order before the collection's own.
    type: list
    elements: path
    default: []
  first_paths:
    description:
      - Directories searched before O(paths), such as the directory of entries that a tune writes for its
        candidates (an instance's C(catalog_paths)).
    type: list
    elements: path
    default: []
    version_added: 0.1.0
"""

EXAMPLES = r"""
- name: Read the entry of the model chosen with -e model=NAME
  ansible.builtin.set_fact:
    vllm_deploy_model: "{{ lookup('llmops.vllm.model_catalog', model, paths=vllm_catalog_paths | default([])) }}"
"""

RETURN = r"""
_raw:
  description: One entry per name, with C(name) added and defaults filled in.
  type: list
  elements: dict
  contains:
    name:
      description: The model's catalog name.
      type: str
    served_name:
      description: The name the server answers to in C(/v1/models).
      type: str
    source:
      description: Where the weights come from (C(kind) is C(generated) or C(hub)).
      type: dict
    layout:
      description: The default tensor/pipeline/data/expert parallel sizes.
      type: dict
"""

import os

import yaml
from ansible.errors import AnsibleLookupError
from ansible.plugins.lookup import LookupBase

from ansible_collections.llmops.vllm.plugins.module_utils.plan.catalog import CatalogError, check_entry, find_entry_file

COLLECTION_CATALOG = os.path.join(os.path.dirname(__file__), os.pardir, os.pardir, "models")


class LookupModule(LookupBase):
    def run(self, terms, variables=None, **kwargs):
        self.set_options(var_options=variables, direct=kwargs)
        directories = [*self.get_option("first_paths"), *self.get_option("paths"), os.path.normpath(COLLECTION_CATALOG)]
        entries = []
        for name in terms:
            try:
                entry_file = find_entry_file(name, directories)
                with open(entry_file, encoding="utf-8") as stream:
                    entries.append(check_entry(name, yaml.safe_load(stream)))
            except CatalogError as error:
                raise AnsibleLookupError(str(error)) from error
            except (OSError, yaml.YAMLError) as error:
                raise AnsibleLookupError(f"cannot read catalog entry {name!r}: {error}") from error
        return entries
