"""End to end: the lab's port-drift scenario (see docs/lab.md): flannel#1770's port drift at
the carrier's NAT. A one-sided re-map heals by roaming with no remediation; both sides
drifted and forgotten stay dead through a rebind and heal by a Flannel restart."""

from tests.lab.support import scenario_test

test_port_drift_passes = scenario_test("port-drift")
