"""Pure logic: classification per interface and feature, a pass over recorded feature sets
of real drivers, and the check's reason table. No kernel needed."""

from __future__ import annotations

import pytest

from edgeheal.boundaries.kernel.ethtool import Feature
from edgeheal.checks.offload import judge
from edgeheal.checks.offload.enforcer import (
    Correction,
    Outcome,
    Report,
    apply,
    classify,
    select,
    to_disable,
)
from edgeheal.checks.offload.feature_table import KERNEL_FEATURES
from edgeheal.config import OffloadSettings
from edgeheal.model import State
from tests.offload.helpers import CSUM, ETHTOOL_ALIASES, FIXTURES, FixtureSource, fixture

ON, OFF = True, False


@pytest.mark.parametrize(("before", "after", "expected"), [
    (None, None, Outcome.NOT_PRESENT),
    (Feature("f", ON, True), None, Outcome.FIXED_ON),
    (Feature("f", OFF, True), None, Outcome.FIXED_OFF),
    (Feature("f", OFF, False), None, Outcome.ALREADY_OFF),
    (Feature("f", ON, False), None, Outcome.ON),
    (Feature("f", ON, False), Feature("f", OFF, False), Outcome.CHANGED),
    (Feature("f", ON, False), Feature("f", ON, False), Outcome.REFUSED),
])
def test_classify_maps_before_and_after_to_one_outcome(
        before: Feature | None, after: Feature | None, expected: Outcome) -> None:
    assert classify(before, after) is expected


def test_only_on_and_changeable_features_are_switched_off() -> None:
    feats = {"a": Feature("a", ON, False), "b": Feature("b", ON, True),
             "c": Feature("c", OFF, False)}
    assert to_disable(feats, ("a", "b", "c", "missing")) == ["a"]


def test_globs_select_interfaces_and_report_patterns_that_match_nothing() -> None:
    matched, unmatched = select(["eth0", "wwan0", "wwan1", "lo"], ("wwan*", "eth0", "usb*"))
    assert matched == ["eth0", "wwan0", "wwan1"]
    assert unmatched == ["usb*"]


# driver fixture -> expected outcome for (ipv4, ip-generic, ipv6) after an enforcing pass
DRIVERS = {
    "veth": (Outcome.FIXED_OFF, Outcome.CHANGED, Outcome.FIXED_OFF),
    "virtio_net": (Outcome.FIXED_OFF, Outcome.CHANGED, Outcome.FIXED_OFF),
    "e1000e": (Outcome.FIXED_OFF, Outcome.CHANGED, Outcome.FIXED_OFF),
    "loopback": (Outcome.FIXED_OFF, Outcome.FIXED_ON, Outcome.FIXED_OFF),
    "qeth": (Outcome.CHANGED, Outcome.FIXED_OFF, Outcome.FIXED_OFF),
    "smsc95xx": (Outcome.CHANGED, Outcome.FIXED_OFF, Outcome.FIXED_OFF),
    "gianfar": (Outcome.ALREADY_OFF, Outcome.FIXED_OFF, Outcome.FIXED_OFF),
    "wan_no_csum": (Outcome.FIXED_OFF, Outcome.FIXED_OFF, Outcome.FIXED_OFF),
    "bonding": (Outcome.FIXED_OFF, Outcome.CHANGED, Outcome.FIXED_OFF),
}


def test_every_fixture_file_has_an_expectation_and_cites_its_source() -> None:
    files = {p.stem for p in FIXTURES.glob("*.txt")}
    assert files == set(DRIVERS)
    for name in files:
        text = (FIXTURES / f"{name}.txt").read_text(encoding="utf-8")
        assert "# source:" in text, name
        assert "# driver:" in text, name


@pytest.mark.parametrize("driver", sorted(DRIVERS))
def test_an_enforcing_pass_over_a_real_drivers_feature_set(driver: str) -> None:
    source = FixtureSource({"nic0": fixture(driver)})
    report = apply(source, ("nic*",), CSUM, act=True)
    (iface,) = report.interfaces
    assert tuple(r.outcome for r in iface.results) == DRIVERS[driver]
    assert report.all_off is (Outcome.FIXED_ON not in DRIVERS[driver])
    changed = [f for f, o in zip(CSUM, DRIVERS[driver], strict=True) if o is Outcome.CHANGED]
    assert source.disabled == ([("nic0", tuple(changed))] if changed else [])


@pytest.mark.parametrize("driver", sorted(DRIVERS))
def test_a_dry_pass_changes_nothing_and_reports_what_is_on(driver: str) -> None:
    source = FixtureSource({"nic0": fixture(driver)})
    report = apply(source, ("nic0",), CSUM, act=False)
    assert source.disabled == []
    expected = tuple(Outcome.ON if o is Outcome.CHANGED else o for o in DRIVERS[driver])
    assert tuple(r.outcome for r in report.interfaces[0].results) == expected


def test_a_feature_the_driver_does_not_report_is_not_present() -> None:
    source = FixtureSource({"eth0": fixture("smsc95xx")})  # excerpt: no tunnel features
    report = apply(source, ("eth0",), ("tx-udp_tnl-csum-segmentation",), act=True)
    assert report.interfaces[0].results[0].outcome is Outcome.NOT_PRESENT
    assert report.all_off


def test_a_driver_that_keeps_the_feature_on_is_refused() -> None:
    source = FixtureSource({"eth0": fixture("qeth")}, sticky={"tx-checksum-ipv4"})
    report = apply(source, ("eth0",), CSUM, act=True)
    assert report.interfaces[0].results[0].outcome is Outcome.REFUSED
    assert not report.all_off


def test_permission_denied_is_reported_per_interface_and_nothing_claims_off() -> None:
    source = FixtureSource({"eth0": fixture("veth")}, deny=True)
    report = apply(source, ("eth0",), CSUM, act=True)
    assert report.permission_denied
    assert not report.all_off
    assert report.interfaces[0].results[1].outcome is Outcome.ON


def test_fixtures_recorded_on_this_kernel_use_only_known_feature_names() -> None:
    # full listings (5.x-6.18 kernels): every name is in the table
    for name in ("veth", "virtio_net", "loopback", "e1000e"):
        unknown = set(fixture(name)) - ETHTOOL_ALIASES - set(KERNEL_FEATURES)
        assert not unknown, (name, unknown)


# --- the check's reason table -----------------------------------------------------------

def _settings(**kw: object) -> OffloadSettings:
    return OffloadSettings(interfaces=("nic*",), **kw)  # type: ignore[arg-type]


def _report(driver: str | None, **kw: object) -> Report:
    source = FixtureSource({"nic0": fixture(driver)} if driver else {}, **kw)  # type: ignore[arg-type]
    return apply(source, ("nic*",), CSUM, act=True)


DRIFT = [Correction("nic0", ("tx-checksum-ip-generic",), "link_event", drift=True)]


@pytest.mark.parametrize(("case", "report", "settings", "drift", "state", "reason"), [
    ("all off", lambda: _report("veth"), _settings(), [], State.OK, "ok"),
    ("drift fixed", lambda: _report("veth"), _settings(), DRIFT, State.OK, "drift_corrected"),
    ("fixed on", lambda: _report("loopback"), _settings(), [], State.DEGRADED,
     "cannot_disable"),
    ("refused", lambda: _report("qeth", sticky={"tx-checksum-ipv4"}), _settings(), [],
     State.DEGRADED, "cannot_disable"),
    ("missing", lambda: _report(None), _settings(), [], State.OK, "interface_missing"),
    ("missing, required", lambda: _report(None), _settings(require_interface=True), [],
     State.FAILED, "interface_missing"),
    ("denied", lambda: _report("veth", deny=True), _settings(), [], State.UNKNOWN,
     "permission_denied"),
    ("observe only", lambda: apply(FixtureSource({"nic0": fixture("veth")}), ("nic*",), CSUM,
                                   act=False), _settings(enforce=False), [], State.DEGRADED,
     "offload_on"),
])
def test_the_check_maps_each_situation_to_one_reason(  # noqa: PLR0917 - one table row
        case: str, report: object, settings: OffloadSettings, drift: list[Correction],
        state: State, reason: str) -> None:
    result = judge(report(), settings, drift)  # type: ignore[operator]
    assert (result.state, result.reason) == (state, reason), (case, result.message)
    assert result.message
