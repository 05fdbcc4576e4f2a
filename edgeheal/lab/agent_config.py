"""The agent config (TOML) of a lab edge: the lab's tuning, or the shipped defaults.

Why one module: the lab's scenarios and the benchmarks (``bench/labkit.py``) run the same
agent against the same world, and a setting added to one copy and not the other made their
figures disagree silently. Two variants, nothing else:

- **tuned** (the lab's default): fast cadences, short graces and debounce, so a scenario
  finishes in minutes; every figure derives from the lab's keepalive.
- **shipped** (``edgeheal lab --field``, the benchmarks' ``defaults``): only what names this
  world (addresses, interfaces, paths) is set, as in ``edgeheal.example.toml``; every
  cadence, threshold and safeguard is the agent's default.

Either way the edge's uplink sections follow when its world has modems
(:func:`edgeheal.lab.modems.uplink_config`, in the same variant).
"""

from __future__ import annotations

from edgeheal.lab.world import AGENT_PORT, BROKER_CLUSTER_IP, Edge


def render(edge: Edge, *, mqtt_port: int, shipped: bool, uplink: bool,
           remediation: str = "pod", extra: str = "", ladder: str = "") -> str:
    """The config file of ``edge``'s agent. ``uplink``: add the uplink sections (the world
    has a modem behind this edge); ``extra``: TOML appended before them; ``ladder``: keys
    added to their ``[remediation.uplink]``."""
    head = _shipped(edge, mqtt_port, remediation) if shipped else \
        _tuned(edge, mqtt_port, remediation)
    return head + extra + (_uplink(edge, shipped=shipped) + ladder if uplink else "")


def _tuned(edge: Edge, mqtt_port: int, remediation: str) -> str:
    return f"""\
[agent]
node_name = "{edge.name}"
state_dir = "{edge.state_dir}"
check_interval = "1s"

[http]
listen = ["127.0.0.1:{AGENT_PORT}"]

[offload]
interfaces = ["{edge.uplink}"]
interval = "30s"
fail_after = 1
recover_after = 1

[wireguard]
interfaces = ["{edge.wg_ifname}"]
connect_grace = "20s"
interval = "1s"

[[mqtt.targets]]
name = "broker-tunnel"
host = "{BROKER_CLUSTER_IP}"
port = {mqtt_port}
path = "tunnel"
interval = "5s"
timeout = "5s"
fail_after = 3
required = true

[[mqtt.targets]]
name = "broker-direct"
host = "{edge.cloud_ip}"
port = {mqtt_port}
path = "direct"
interval = "5s"
timeout = "5s"
keepalive = "4s"                 # the alert connection's keepalive is the direct-path signal

[alerts]
target = "broker-direct"
reminder_interval = "60s"
reconnect_max = "10s"

[kubernetes]
kubeconfig = "{edge.workdir / 'kubeconfig'}"

[remediation]
mode = "{remediation}"
cooldown = "20s"
max_per_hour = 3
startup_grace = "10s"
verify_timeout = "30s"
uplink_settle = "20s"
restart_jitter = "0s"
"""


def _shipped(edge: Edge, mqtt_port: int, remediation: str) -> str:
    return f"""\
[agent]
node_name = "{edge.name}"
state_dir = "{edge.state_dir}"

[http]
listen = ["127.0.0.1:{AGENT_PORT}"]

[offload]
interfaces = ["{edge.uplink}"]

[wireguard]
interfaces = ["{edge.wg_ifname}"]

[[mqtt.targets]]
name = "broker-tunnel"
host = "{BROKER_CLUSTER_IP}"
port = {mqtt_port}
path = "tunnel"
required = true

[[mqtt.targets]]
name = "broker-direct"
host = "{edge.cloud_ip}"
port = {mqtt_port}
path = "direct"

[alerts]
target = "broker-direct"

[kubernetes]
kubeconfig = "{edge.workdir / 'kubeconfig'}"

[remediation]
mode = "{remediation}"
"""


def _uplink(edge: Edge, *, shipped: bool) -> str:
    from edgeheal.lab.modems import uplink_config

    return uplink_config(edge, field=shipped)
