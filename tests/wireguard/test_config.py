"""The `[wireguard]` section's validation: bad input names the key and what was wrong."""

from __future__ import annotations

import pytest

from edgeheal import config
from edgeheal import settings as validation

KEY = "NHaGGWcW3a1sapt+JD/2harVDhDxKOnxBE9CNO0J/D8="


@pytest.mark.parametrize(("toml", "key", "problem"), [
    ('watch_peers = "some"', "wireguard.watch_peers", "expected \"auto\""),
    ('watch_peers = []', "wireguard.watch_peers", "watches nothing"),
    ('watch_peers = ["nope"]', "wireguard.watch_peers[0]", "base64 public key"),
    (f'watch_peers = ["{KEY}", "10.0.0.0/33"]', "wireguard.watch_peers[1]", "CIDR"),
    ('interfaces = ["a-name-far-too-long"]', "wireguard.interfaces[0]", "interface name"),
    ('interfaces = [""]', "wireguard.interfaces[0]", "interface name"),
    ('dead_after = "2m"\nrekey_failing_after = "3m"', "wireguard.rekey_failing_after",
     "less than dead_after (2m)"),
    ('rx_stall_after = 0', "wireguard.rx_stall_after", "greater than zero"),
    ('send_fail_after = 0', "wireguard.send_fail_after", "greater than zero"),
    ('send_fail_after = "soon"', "wireguard.send_fail_after", "expected"),
    ('connect_grace = "soon"', "wireguard.connect_grace", "expected a duration"),
    ('dead_after = "later"', "wireguard.dead_after", "expected"),
    ('rekey_after = "auto"', "wireguard.rekey_after", "unknown key"),
])
def test_bad_wireguard_settings_are_rejected_by_key(toml: str, key: str, problem: str) -> None:
    with pytest.raises(config.ConfigError) as info:
        validation.loads(f"[wireguard]\n{toml}\n")
    assert info.value.key == key
    assert problem in info.value.problem


def test_good_settings_parse_with_auto_and_durations() -> None:
    wg = validation.loads(f'[wireguard]\nwatch_peers = ["{KEY}", "203.0.113.0/24"]\n'
                      'dead_after = "200s"\nrx_stall_after = "1m"\n'
                      'send_fail_after = "40s"\n').wireguard
    assert wg.watch_peers == (KEY, "203.0.113.0/24")
    assert (wg.rekey_failing_after, wg.dead_after, wg.rx_stall_after) == ("auto", 200.0, 60.0)
    assert wg.send_fail_after == 40.0
    assert validation.loads("").wireguard.send_fail_after == "auto"
