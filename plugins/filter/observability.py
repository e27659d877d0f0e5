# Copyright: llmops.vllm contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
"""Filters of the collection's observability: the alert rules, the status table's throughput, and the addresses
of the monitoring hosts."""

from __future__ import annotations

from ansible.errors import AnsibleFilterError

from ansible_collections.llmops.vllm.plugins.module_utils.bench.throughput import with_throughput
from ansible_collections.llmops.vllm.plugins.module_utils.observability.alert_rules import (
    AlertSettingsError,
    alert_rules,
)


def vllm_alert_rules(settings, slos=None):
    try:
        return alert_rules(settings, slos)
    except AlertSettingsError as error:
        raise AnsibleFilterError(str(error)) from error


def vllm_host_addresses(hosts, hostvars):
    """The address at which each inventory host is reached: its ansible_host, else its name."""
    unknown = [host for host in hosts if host not in hostvars]
    if unknown:
        raise AnsibleFilterError(
            f"{', '.join(unknown)} not in the inventory; name the monitoring hosts by inventory name"
        )
    return [hostvars[host].get("ansible_host") or host for host in hosts]


class FilterModule:
    def filters(self):
        return {
            "vllm_alert_rules": vllm_alert_rules,
            "vllm_host_addresses": vllm_host_addresses,
            "vllm_status_throughput": with_throughput,
        }
