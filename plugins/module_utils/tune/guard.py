# Copyright: llmops.vllm contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
"""The guard of a tune: the instances a candidate displaces, and the command of the timer that brings the tuned
instance back by itself should the play not get there."""

from __future__ import annotations

from ansible_collections.llmops.vllm.plugins.module_utils.instance.host_instances import displaced
from ansible_collections.llmops.vllm.plugins.module_utils.tune.candidates import TuneError


def bystanders(tuned, records, candidate, gpu_count=0):
    """The running instances, other than the tuned one, that the tune's candidates would stop and never start again.

    tuned: the record of the tuned instance; records: the host's instance records; candidate: the name of the
    candidates' instance. Each candidate takes the tuned instance's port and GPUs, and the swap machinery stops
    whatever runs there; the tune brings back the tuned instance alone. A candidate left running by an earlier
    run is not one: the tune stops it anyway.
    """
    if not isinstance(tuned, dict) or not {"instance", "port"} <= tuned.keys():
        raise TuneError(f"the tuned instance's record needs its instance and port, got {tuned!r}")
    new = {"name": candidate, "port": tuned["port"], "gpus": tuned.get("gpus") or []}
    stopped = displaced(new, records, gpu_count)
    return [record["instance"] for record in stopped if record["instance"] != tuned["instance"]]


def guard_command(unit, after, instance, stop_unit="", start_unit=""):
    """The argument list of systemd-run that arms the tune's guard, a timer `unit` that fires `after` seconds from
    now. Its service stops and disables stop_unit (the candidate running, if any), then starts start_unit (the
    tuned instance, if it served) without waiting for its load. No shell: each command is a line of the service
    (ExecStartPre=, ExecStart=), and a failure of the stop or the disable (a unit already stopped) is ignored.
    """
    if isinstance(after, bool) or not isinstance(after, int) or after <= 0:
        raise TuneError(f"the guard fires after a whole number of seconds above 0, got {after!r}")
    for name in (unit, stop_unit, start_unit):
        if name and (not isinstance(name, str) or any(char.isspace() for char in name)):
            raise TuneError(f"{name!r} is not a unit name")
    command = [
        "systemd-run",
        f"--unit={unit}",
        f"--on-active={after}",
        "--timer-property=AccuracySec=1s",
        f"--description=llmops.vllm tune guard of {instance}",
    ]
    if stop_unit:
        command += [f"--property=ExecStartPre=-systemctl stop {stop_unit}",
                    f"--property=ExecStartPre=-systemctl disable {stop_unit}"]  # fmt: skip
    return command + (["systemctl", "start", "--no-block", start_unit] if start_unit else ["true"])
