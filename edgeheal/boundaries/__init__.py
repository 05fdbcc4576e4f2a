"""The boundaries: one module or package per outside thing, each with its own errors.

The kernel (:mod:`~edgeheal.boundaries.kernel`: ethtool, link events, the uplink
interfaces), WireGuard (:mod:`~edgeheal.boundaries.wg`), MQTT
(:mod:`~edgeheal.boundaries.mqtt`), the Kubernetes API (:mod:`~edgeheal.boundaries.kube`),
D-Bus (:mod:`~edgeheal.boundaries.bus`) and ModemManager over it
(:mod:`~edgeheal.boundaries.modemmanager`), systemd's notify socket
(:mod:`~edgeheal.boundaries.sd_notify`), the control socket and the state-directory lock
(:mod:`~edgeheal.boundaries.control_socket`), Prometheus exposition
(:mod:`~edgeheal.boundaries.prometheus`). Each sits behind a narrow interface, so the logic
above it is tested with recorded data, and is itself tested against the real thing.
"""
