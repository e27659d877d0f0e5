# Copyright: llmops.vllm contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
"""Who may read the /metrics of a host's vLLM servers, besides the host itself: the file that the servers'
guard reads.

vLLM's --api-key guards the API under /v1 and no more; /metrics tells anyone who reaches the port which models
run, how loaded they are and how fast they answer. The collection's middleware in every server
(llmops_vllm_dev_guard.MetricsReaders, in each venv) answers /metrics to the host itself and to the networks
listed in this file, one per line, and 403 to everyone else. The file is read again whenever it changes, so a
new monitoring host needs no restart of any server.
"""

from __future__ import annotations

import ipaddress
import socket

READERS_FILE = "/etc/vllm/metrics-readers"
# The servers run as their own user, which must read it.
READERS_MODE = 0o644


class ReadersError(ValueError):
    """A reader that is neither an address, a network nor a name that resolves."""


def _resolve(name: str) -> list[str]:
    return sorted({info[4][0] for info in socket.getaddrinfo(name, None, proto=socket.IPPROTO_TCP)})


def reader_networks(readers: list[str], resolve=_resolve) -> list[str]:
    """Each reader as networks: an address or a network as it is, a host name as the addresses it resolves to.

    Sorted, each once; ReadersError names a reader that is none of these.
    """
    networks = set()
    for reader in readers:
        text = str(reader).strip()
        try:
            networks.add(ipaddress.ip_network(text, strict=False))
            continue
        except ValueError:
            pass
        try:
            addresses = resolve(text)
        except (OSError, UnicodeError) as error:
            raise ReadersError(
                f"metrics reader {reader!r} is neither an address, a network (10.0.0.0/24) nor a name that "
                f"resolves here: {error}"
            ) from None
        networks.update(ipaddress.ip_network(address.split("%", 1)[0]) for address in addresses)
    return [str(network) for network in sorted(networks, key=lambda network: (network.version, network))]


def readers_text(networks: list[str]) -> str:
    """The readers file: a comment that says what it is, then one network per line."""
    header = (
        "# Written by llmops.vllm (vllm_targets): who may read /metrics of the vLLM servers on this host,\n"
        "# besides the host itself. One address or network per line; every other client gets 403.\n"
    )
    return header + "".join(f"{network}\n" for network in networks)
