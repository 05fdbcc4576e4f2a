"""The settings: frozen dataclasses whose fields document their unit, default and reason.

This package is the one place a setting is declared, one module per part of the tree:
:mod:`~edgeheal.config.schema.fields` (how a key is declared), the agent's own sections
(:mod:`~edgeheal.config.schema.agent`), the checks' (:mod:`~edgeheal.config.schema.checks`),
the remedies' (:mod:`~edgeheal.config.schema.remediation`), and here :class:`Config`, the
tree that holds them. ``docs/configuration.md`` is rendered from the ``doc`` metadata
(:func:`edgeheal.config.render.reference`), parsing reads the type hints
(:mod:`edgeheal.config.parse`), and ``secret``/``duration`` marks decide redaction and how a
value is printed. A check section subclasses :class:`~edgeheal.config.schema.checks.CheckSettings`,
so every check takes the same common keys and the generic rules (:mod:`edgeheal.config.validate`)
find it by type. Rules that belong to one check or one remedy live with that module's
registration, not here.
"""

from __future__ import annotations

import socket
from dataclasses import dataclass, field

from edgeheal.config.schema.agent import (
    AgentSettings,
    AlertSettings,
    FleetSettings,
    HttpSettings,
    KubernetesSettings,
    MetricsSettings,
)
from edgeheal.config.schema.checks import (
    ControlSettings,
    MqttSettings,
    OffloadSettings,
    PmtuSettings,
    UplinkSettings,
    WireguardSettings,
)
from edgeheal.config.schema.fields import doc
from edgeheal.config.schema.remediation import RemediationSettings


@dataclass(frozen=True, slots=True)
class Config:
    agent: AgentSettings = field(default_factory=AgentSettings)
    http: HttpSettings = field(default_factory=HttpSettings)
    metrics: MetricsSettings = field(default_factory=MetricsSettings)
    offload: OffloadSettings = field(default_factory=OffloadSettings)
    wireguard: WireguardSettings = field(default_factory=WireguardSettings)
    mqtt: MqttSettings = field(default_factory=MqttSettings)
    uplink: UplinkSettings = field(default_factory=UplinkSettings)
    pmtu: PmtuSettings = field(default_factory=PmtuSettings)
    control: ControlSettings = field(default_factory=ControlSettings)
    alerts: AlertSettings = field(default_factory=AlertSettings)
    kubernetes: KubernetesSettings | None = field(
        default=None, metadata=doc("The Kubernetes API ([kubernetes]); absent: not used."))
    remediation: RemediationSettings = field(default_factory=RemediationSettings)
    fleet: FleetSettings = field(default_factory=FleetSettings)
    source: str = field(default="", metadata=doc("internal: the file this came from"))
    sections: frozenset[str] = field(
        default=frozenset(), metadata=doc("internal: the top-level tables the file sets"))

    @property
    def node(self) -> str:
        return self.agent.node_name or socket.gethostname()
