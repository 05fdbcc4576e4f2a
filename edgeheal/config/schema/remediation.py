"""The remedies' sections: ``[remediation]`` (the Flannel ladder and its two remedies,
``pod`` and ``service``, and the rebind rung) with the other ladders' subsections,
``[remediation.uplink]`` and ``[remediation.control]``."""

from __future__ import annotations

from dataclasses import dataclass, field

from edgeheal.config.schema.fields import setting


@dataclass(frozen=True, slots=True)
class ServiceSettings:
    """`[remediation.service]`: how the `k3s-service` remedy restarts K3s's embedded Flannel."""

    unit: str = setting(
        "auto", "The systemd unit restarted over D-Bus. `auto`: `k3s-agent.service` on "
        "agents, `k3s.service` on servers (whichever is loaded; the active one if both "
        "are). Or a K3s unit name (`k3s*.service`, e.g. from `INSTALL_K3S_NAME`; then "
        "list it in the polkit rule too). The agent restarts this unit and no other.")
    timeout: float = setting(
        120.0, "How long the restart job plus the unit becoming `active` again may take "
        "before the restart counts as failed (K3s's start includes containerd).",
        duration=True, bounds=(1.0, 3600.0))


@dataclass(frozen=True, slots=True)
class PodRemedySettings:
    namespace: str = setting("kube-flannel", "Namespace of the Flannel DaemonSet's pods.")
    label_selector: str = setting("app=flannel", "Label selector of Flannel's pods.")
    ready_timeout: float = setting(
        60.0, "How long the replacement pod may take to be Running and Ready.",
        duration=True, bounds=(1.0, 3600.0))


@dataclass(frozen=True, slots=True)
class RebindSettings:
    """`[remediation.rebind]`: the rung before a Flannel restart (docs/remediation.md)."""

    enabled: bool = setting(
        False, "Before restarting Flannel for a watched peer that is `stalled` or `dead` "
        "while the direct path is up (and the `uplink` check, if configured, is ok), move "
        "the WireGuard device to a fresh random UDP port once: the cloud learns the new "
        "endpoint from the next packet (WireGuard roaming), which a carrier NAT's stale "
        "mapping of port 51820 cannot follow and a restart (same port) does not change. "
        "Counts as an attempt for the circuit and the budget. Off by default.")
    verify_timeout: float = setting(
        45.0, "How long a rebind waits for the tunnel to recover (fresh handshake, rx "
        "growing, tunnel-path MQTT ok) before the ladder climbs to the restart: one "
        "keepalive (25 s on K3s) plus a handshake (5 s), plus the checks' cadence.",
        duration=True, bounds=(1.0, 600.0))


UPLINK_RUNGS = ("modem-reconnect", "radio-cycle", "link-bounce", "modemmanager-restart",
                "usb-reauthorize", "reboot", "driver-rebind", "sim-switch")
"""Every uplink rung; the first five are the default ``rungs``, the last two are opt-in."""


@dataclass(frozen=True, slots=True)
class UplinkLadderSettings:
    """`[remediation.uplink]`: the uplink ladder (docs/remediation-uplink.md)."""

    enabled: bool = setting(
        False, "Run the uplink ladder: when the `uplink` check says `stuck`, "
        "`modem_absent`, `modem_failed` or `registration_denied` and every direct-path MQTT "
        "target fails too, try that verdict's rungs one by one. Off by default.")
    dry_run: bool = setting(False, "Log and alert what would be done; do nothing.")
    rungs: tuple[str, ...] = setting(
        UPLINK_RUNGS[:5], "The rungs, in escalation order (a subset of "
        "`modem-reconnect`, `radio-cycle`, `link-bounce`, `modemmanager-restart`, "
        "`driver-rebind`, `usb-reauthorize`, `sim-switch`, `reboot`; the default leaves out "
        "the opt-in `driver-rebind` and `sim-switch`). Each verdict takes only its own "
        "(`stuck`: modem-reconnect, radio-cycle, link-bounce, driver-rebind, "
        "usb-reauthorize, sim-switch, reboot; `modem_absent`/`modem_failed`: "
        "modemmanager-restart, driver-rebind, usb-reauthorize, reboot; "
        "`registration_denied`: radio-cycle, at most once an hour, then sim-switch). "
        "`sim-switch` is never an episode's first rung (listed first, it goes second). A "
        "rung that cannot act here (no ModemManager, `usb_device` empty, `sim_slots` empty, "
        "`reboot` false) is skipped. One rung up per attempt that did not cure.")
    act_after: float = setting(
        300.0, "How long the uplink must have been `stuck` or `registration_denied` (and "
        "every direct-path target failed) before the first rung (`modem_absent` already "
        "waited `[uplink] modem_absent_after`).", duration=True, bounds=(0.0, 86400.0))
    cooldown: float = setting(
        120.0, "Least time between two rungs.", duration=True, bounds=(0.0, 86400.0))
    max_per_hour: int = setting(4, "Most rungs in any sliding hour, across agent restarts.")
    startup_grace: float = setting(
        300.0, "No rung this soon after the agent or the node started (a modem needs "
        "minutes to register after a boot).", duration=True, bounds=(0.0, 86400.0))
    give_up_after: int = setting(
        4, "Rungs in a row that did not cure before the circuit opens (at most the number "
        "of usable rungs): a critical alert, no more rungs until the uplink is ok again or "
        "`edgeheal remediation reset --ladder uplink`.")
    verify_timeout: float = setting(
        90.0, "How long to wait after a rung for the uplink check and every direct-path "
        "target to be ok again (a modem re-registers in tens of seconds).",
        duration=True, bounds=(1.0, 3600.0))
    modemmanager_unit: str = setting(
        "ModemManager.service", "The `modemmanager-restart` rung: the unit restarted over "
        "systemd's D-Bus API (polkit grants exactly `restart` of this unit: "
        "49-edgeheal-uplink.rules).")
    modemmanager_timeout: float = setting(
        60.0, "How long the `modemmanager-restart` rung waits for the restart job and the "
        "unit active again (ModemManager re-probes its modems after that; the ladder's "
        "`verify_timeout` covers it).", duration=True, bounds=(1.0, 600.0))
    usb_device: str = setting(
        "", "The `usb-reauthorize` rung: `modem` (the USB device ModemManager reports for "
        "the modem) or a USB device name under /sys/bus/usb/devices (`1-1`). Empty: the "
        "rung is off (the agent writes to sysfs only where configured).")
    sim_slots: tuple[int, ...] = setting(
        (), "The `sim-switch` rung: the SIM slots (ModemManager's 1-based `SimSlots` "
        "index) in the order to use them, e.g. `[1, 2]`; the rung makes the slot after the "
        "modem's current `PrimarySimSlot` in this list primary (wrapping). Empty: the rung "
        "is off. At least two distinct slots.")
    reboot: bool = setting(
        False, "Allow the `reboot` rung (logind's Reboot over D-Bus): at most once a day, "
        "never within `startup_grace` of boot, after its alert is in the outbox.")


BALANCER_STATE = "/var/lib/rancher/k3s/agent/etc/k3s-agent-load-balancer.json"
"""Where K3s's agent keeps its load balancer's server list (k3s-io/k3s#11349)."""


@dataclass(frozen=True, slots=True)
class ControlLadderSettings:
    """`[remediation.control]`: the control ladder (docs/control.md). Off by default; it
    needs the `control` check (`[control]`)."""

    enabled: bool = setting(
        False, "Run the control ladder: restart the K3s agent's unit (over D-Bus, the "
        "`[remediation.service]` unit and its timeout) when the `control` check says "
        "`heartbeat_stale`, `balancer_stuck`, `node_ip_changed` or `not_ready` while a "
        "server answers directly. Never for `server_unreachable`, never while a "
        "direct-path target or the uplink check fails, never while the Flannel or the "
        "uplink ladder acts. Off by default.")
    dry_run: bool = setting(False, "Log and alert what would be done; do nothing.")
    act_after: float = setting(
        60.0, "How long a healable verdict must hold (beyond the check's own debounce) "
        "before the restart.", duration=True, bounds=(0.0, 86400.0))
    not_ready_window: float = setting(
        300.0, "How long `not_ready` must hold before the restart: a node back from an "
        "outage turns Ready by itself.", duration=True, bounds=(0.0, 86400.0))
    cooldown: float = setting(
        600.0, "Least time between two agent restarts.", duration=True,
        bounds=(0.0, 86400.0))
    max_per_hour: int = setting(
        2, "Most agent restarts in any sliding hour, across agent restarts on the same "
        "boot.")
    startup_grace: float = setting(
        300.0, "No restart this soon after edgeheal or the node started (a K3s agent "
        "needs a minute or two to register after a boot).", duration=True,
        bounds=(0.0, 86400.0))
    give_up_after: int = setting(
        3, "Restarts in a row that did not cure before the circuit opens (a critical "
        "alert, no more restarts until the check is ok again or `edgeheal remediation "
        "reset --ladder control`).")
    verify_timeout: float = setting(
        180.0, "How long to wait after a restart for a fresh `ok` of the `control` check "
        "(the kubelet renews its Lease within 10 s of starting; the check confirms it "
        "with two API reads `[control] api_spacing` apart).", duration=True,
        bounds=(1.0, 3600.0))
    balancer_state: str = setting(
        BALANCER_STATE, "For `balancer_stuck`: the agent's load-balancer state file, "
        "removed before the restart when edgeheal may remove it (its directory writable "
        "by the agent's user); otherwise the restart goes ahead without and its alert "
        "says why (`detail.balancer_state`). Empty: never removed.")


@dataclass(frozen=True, slots=True)
class RemediationSettings:
    mode: str = setting(
        "auto", "`pod` deletes this node's Flannel pod (DaemonSet Flannel), `k3s-service` "
        "restarts the k3s/k3s-agent unit (embedded Flannel), `none` only alerts. `auto` "
        "picks `pod` when a Flannel pod runs on this node, else `k3s-service` when the unit "
        "exists, else `none`, and says why in /status and the log.")
    dry_run: bool = setting(False, "Log and alert what would be done; do nothing.")
    cooldown: float = setting(120.0, "Least time between two restarts.", duration=True,
                               bounds=(0.0, 86400.0))
    max_per_hour: int = setting(
        3, "Most restarts in any sliding hour, across agent restarts on the same boot.")
    startup_grace: float = setting(
        60.0, "No restart this soon after the agent or the node started.", duration=True,
        bounds=(0.0, 86400.0))
    give_up_after: int = setting(
        3, "Restarts in a row that did not cure the tunnel before the circuit opens (no "
        "more restarts, a critical alert; it closes when the tunnel is healthy again or on "
        "`edgeheal remediation reset`).")
    verify_timeout: float = setting(
        60.0, "How long to wait for the tunnel to recover after a restart (fresh handshake, "
        "rx growing, tunnel-path MQTT ok).", duration=True, bounds=(0.1, 3600.0))
    uplink_settle: float = setting(
        30.0, "After the direct path comes back from an outage, the tunnel gets this long to "
        "recover by itself before a restart is considered: an uplink outage stalls the "
        "tunnel too, and restarting Flannel the moment the uplink returns would 'heal' an "
        "outage that was never the tunnel's.", duration=True, bounds=(0.0, 3600.0))
    restart_jitter: float = setting(
        30.0, "The first restart of a failure episode waits a random fraction of this long "
        "(uniform, drawn once per episode) after every other safeguard has let it through: "
        "a hub fault fails every edge's tunnel in the same second, and this spreads their "
        "restarts instead of sending them to the K3s server at once. Later restarts of the "
        "same episode keep `cooldown` only. The control ladder's first K3s-agent restart "
        "waits the same way. 0 turns it off.", duration=True, bounds=(0.0, 3600.0))
    pod: PodRemedySettings = field(default_factory=PodRemedySettings)
    service: ServiceSettings = field(default_factory=ServiceSettings)
    rebind: RebindSettings = field(default_factory=RebindSettings)
    uplink: UplinkLadderSettings = field(default_factory=UplinkLadderSettings)
    control: ControlLadderSettings = field(default_factory=ControlLadderSettings)
