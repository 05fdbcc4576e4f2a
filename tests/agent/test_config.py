"""Configuration: strict parsing, clear errors naming file and key path, exit status 2."""

from __future__ import annotations

import json
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest

from edgeheal import config
from edgeheal import settings as validation
from edgeheal.config import ConfigError

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.parametrize(("text", "key", "fragment"), [
    ('[agent]\nnode_nme = "x"', "agent.node_nme", "did you mean 'node_name'"),
    ("[agent]\ncheck_interval = true", "agent.check_interval", "expected a duration"),
    ('[agent]\ncheck_interval = "5 parsecs"', "agent.check_interval", "expected a duration"),
    ('[agent]\ncheck_interval = "-5s"', "agent.check_interval", "expected a duration"),
    ("[agent]\ncheck_interval = 0", "agent.check_interval", "greater than zero"),
    ('[http]\nlisten = "127.0.0.1:9917"', "http.listen", "expected a list of a string"),
    ('[http]\nlisten = ["localhost"]', "http.listen[0]", "host:port"),
    ('[wireguard]\nrekey_failing_after = "soon"', "wireguard.rekey_failing_after",
     "expected"),
    ('[wireguard]\nfail_after = 0', "wireguard.fail_after", "at least 1"),
    ('[wireguard]\nrequired = "yes"', "wireguard.required", "true or false"),
    ('[offload]\nfeatures = ["tx-checksuming"]', "offload.features[0]",
     "did you mean"),
    ('[offload]\nfeatures = ["tx-checksumming"]', "offload.features[0]", "valid names"),
    ('[[mqtt.targets]]\nname = "b"\nhost = "h"\n[[mqtt.targets]]\nname = "b"\nhost = "h"',
     "mqtt.targets[1].name", "duplicate check name 'b'"),
    ('[[mqtt.targets]]\nname = "wireguard"\nhost = "h"', "mqtt.targets[0].name",
     "duplicate check name"),
    ('[[mqtt.targets]]\nname = "b"\nhost = "h"\nport = 70000', "mqtt.targets[0].port",
     "1-65535"),
    ('[[mqtt.targets]]\nname = "b"\nhost = "h"\npath = "cable"', "mqtt.targets[0].path",
     "'tunnel' or 'direct'"),
    ('[[mqtt.targets]]\nname = "b"\nhost = "h"\ninterval = "1x"',
     "mqtt.targets[0].interval", "duration"),
    ('[alerts]\ntarget = "nope"', "alerts.target", "no [[mqtt.targets]] entry named 'nope'"),
    ("[agent\n", "", "not valid TOML"),
    ('[[mqtt.targets]]\nname = "a"\nhost = "h"\n[[mqtt.targets]]\nname = "b"\nhost = "h"\n'
     'timeout = 0', "mqtt.targets[1].timeout", "greater than zero"),
    ("[offload]\nrecover_after = 0", "offload.recover_after", "at least 1"),
    ('[offload]\ninterfaces = ["a/b"]', "offload.interfaces[0]", "not an interface name"),
    ('[[mqtt.targets]]\nname = "a"\nhost = "h"\ncert_file = "/c"\ntls = true',
     "mqtt.targets[0].key_file", "go together"),
    ('[remediation]\ncooldown = "-1s"', "remediation.cooldown", "expected a duration"),
    ("[remediation]\nmax_per_hour = 0", "remediation.max_per_hour", "at least 1"),
    ('[kubernetes]\nkubeconfig = "kube.yaml"', "kubernetes.kubeconfig", "absolute path"),
])
def test_bad_input_names_the_key_and_what_was_expected(text: str, key: str,
                                                       fragment: str) -> None:
    with pytest.raises(ConfigError) as caught:
        validation.loads(text, source="/etc/edgeheal/edgeheal.toml")
    assert caught.value.key == key
    assert fragment in str(caught.value)
    assert str(caught.value).startswith("/etc/edgeheal/edgeheal.toml: ")


@pytest.mark.parametrize(("value", "seconds"), [
    ("20s", 20.0), ("2m", 120.0), ("1h", 3600.0), ("500ms", 0.5), (7, 7.0), (2.5, 2.5),
    ("90", 90.0)])
def test_durations(value: object, seconds: float) -> None:
    assert config.parse_duration(value) == seconds


def test_defaults_are_complete_and_valid() -> None:
    cfg = config.loads_generic("")
    assert cfg.http.listen == ("127.0.0.1:9917",)
    assert cfg.agent.state_dir == "/var/lib/edgeheal"
    assert cfg.agent.check_interval == 5.0
    assert cfg.node  # the hostname


def test_the_example_config_is_valid() -> None:
    cfg = validation.load(ROOT / "edgeheal.example.toml")
    assert cfg.mqtt.targets


def test_check_config_exits_2_with_the_message_on_stderr(tmp_path: Path) -> None:
    bad = tmp_path / "bad.toml"
    bad.write_text('[agent]\ncheck_interval = "often"\n')
    proc = subprocess.run([sys.executable, "-m", "edgeheal", "check-config", "--config",
                           str(bad)], capture_output=True, text=True, check=False)
    assert proc.returncode == 2
    assert f"{bad}: agent.check_interval: expected a duration" in proc.stderr
    assert proc.stdout == ""


def test_env_var_selects_the_file_and_run_refuses_a_bad_config(tmp_path: Path) -> None:
    bad = tmp_path / "bad.toml"
    bad.write_text("[agnet]\n")
    proc = subprocess.run([sys.executable, "-m", "edgeheal", "run"], capture_output=True,
                          text=True, check=False, env={"EDGEHEAL_CONFIG": str(bad),
                                                       "PATH": "/usr/bin:/bin"})
    assert proc.returncode == 2
    assert "agnet: unknown key; did you mean 'agent'?" in proc.stderr


def test_check_config_prints_the_effective_config_without_secrets(tmp_path: Path) -> None:
    secret = "s3cr3t-Passw0rd"
    (tmp_path / "pass").write_text(secret)
    cfg = tmp_path / "ok.toml"
    cfg.write_text(f'[[mqtt.targets]]\nname = "b"\nhost = "broker"\nusername = "u"\n'
                   f'password_file = "{tmp_path / "pass"}"\n')
    proc = subprocess.run([sys.executable, "-m", "edgeheal", "check-config", "--config",
                           str(cfg)], capture_output=True, text=True, check=False)
    assert proc.returncode == 0, proc.stderr
    doc = json.loads(proc.stdout)
    assert doc["mqtt"]["targets"][0]["password_file"] == str(tmp_path / "pass")
    assert doc["agent"]["check_interval"] == "5s"
    assert secret not in proc.stdout + proc.stderr


def test_fields_marked_secret_are_redacted() -> None:
    @dataclass(frozen=True)
    class WithSecret:
        token: str = config.setting("", "a token", secret=True)
        name: str = config.setting("", "a name")

    assert config.redacted(WithSecret(token="abc", name="n")) == {
        "token": config.REDACTED, "name": "n"}


def test_the_configuration_reference_documents_every_key() -> None:
    text = (ROOT / "docs" / "configuration.md").read_text()
    missing = [key for key, _, _ in config.reference() if f"`{key}`" not in text]
    assert not missing, f"docs/configuration.md lacks {missing}; run " \
        "`scripts/generate`"


def test_every_check_section_gets_the_common_rules_found_by_type_not_by_name() -> None:
    toml = ('[[mqtt.targets]]\nname = "a"\nhost = "h"\n[[mqtt.targets]]\nname = "b"\n'
            'host = "h"\n')
    found = [key for key, _ in config.check_sections(config.loads_generic(toml))]
    # a new check's section joins this list by itself (docs/contributing.md): no list to edit
    assert {"offload", "wireguard", "mqtt.targets[0]", "mqtt.targets[1]"} <= set(found)
    assert all(isinstance(settings, config.CheckSettings)
               for _, settings in config.check_sections(config.loads_generic(toml)))


def test_the_config_package_alone_applies_only_the_generic_rules() -> None:
    text = '[[mqtt.targets]]\nname = "a"\nhost = "h"\nport = 0\n'
    assert config.loads_generic(text).mqtt.targets[0].port == 0  # the MQTT check's rule, not ours
    with pytest.raises(ConfigError) as caught:
        validation.loads(text, source="edge.toml")
    assert str(caught.value) == "edge.toml: mqtt.targets[0].port: expected 1-65535, got 0"


def test_a_hook_error_names_the_file_when_loaded_from_disk(tmp_path: Path) -> None:
    bad = tmp_path / "edge.toml"
    bad.write_text('[wireguard]\nwatch_peers = []\n')
    with pytest.raises(ConfigError) as caught:
        validation.load(bad)
    assert str(caught.value).startswith(f"{bad}: wireguard.watch_peers: ")


def test_check_config_reports_a_check_rule_with_the_file_and_exit_2(tmp_path: Path) -> None:
    bad = tmp_path / "bad.toml"
    bad.write_text('[offload]\nfeatures = ["tx-checksuming"]\n')
    proc = subprocess.run([sys.executable, "-m", "edgeheal", "check-config", "--config",
                           str(bad)], capture_output=True, text=True, check=False)
    assert proc.returncode == 2
    assert f"{bad}: offload.features[0]: unknown feature 'tx-checksuming'" in proc.stderr


@pytest.mark.parametrize("value", [
    float("nan"), float("inf"), -float("inf"), "-1s", "1e9", 10 ** 400, "9" * 40 + "s", True])
def test_a_duration_is_finite_and_never_negative(value: object) -> None:
    with pytest.raises(ValueError, match="duration"):
        config.parse_duration(value)


@pytest.mark.parametrize(("seconds", "shown"), [
    (0.5, "500ms"), (0.1, "100ms"), (5.0, "5s"), (90.0, "90s"), (120.0, "2m"),
    (7200.0, "2h"), (86400.0, "1d"), (7 * 86400.0, "7d"), (65535.0, "65535s"), (1.5, "1.5s")])
def test_durations_print_in_the_unit_they_are_written_in(seconds: float, shown: str) -> None:
    assert config.format_duration(seconds) == shown
    assert config.parse_duration(shown) == seconds


def test_every_duration_has_a_range_and_the_reference_shows_it() -> None:
    rows = {key: text for key, _, text in config.reference()}
    durations = [key for key, text in rows.items() if "Range: " in text]
    assert "agent.check_interval" in durations
    assert "Range: 1s to 1d." in rows["mqtt.targets[].interval"]
    assert "Range: 1s to 65535s." in rows["mqtt.targets[].keepalive"]
    for key, default, _ in config.reference():
        if default.startswith('"') and default[1:-1][-1:] in "smhd" \
                and default[1:-1][:1].isdigit():
            assert key in durations, f"{key} is a duration without a documented range"


def test_a_setting_out_of_its_range_names_key_range_and_value() -> None:
    with pytest.raises(ConfigError) as caught:
        validation.loads('[[mqtt.targets]]\nname = "a"\nhost = "h"\ninterval = "1ms"\n',
                         source="edge.toml")
    assert str(caught.value) == ("edge.toml: mqtt.targets[0].interval: must be at least 1s "
                                 "(allowed: 1s to 1d), got 1ms")


def test_an_unknown_key_is_quoted_when_it_is_not_a_bare_key() -> None:
    with pytest.raises(ConfigError) as caught:
        config.loads_generic('[agent]\n"a\\nb" = 1\n')
    assert "\n" not in str(caught.value)
    assert "agent.'a\\nb'" in str(caught.value)


def test_file_settings_are_found_by_their_mark() -> None:
    cfg = config.loads_generic('[[mqtt.targets]]\nname = "a"\nhost = "h"\ntls = true\n'
                       'ca_file = "/ca.pem"\n[kubernetes]\nkubeconfig = "/kc"\n')
    assert dict(config.file_settings(cfg)) == {"mqtt.targets[0].ca_file": "/ca.pem",
                                               "kubernetes.kubeconfig": "/kc"}
