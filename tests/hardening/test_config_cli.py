"""Issue 17, findings 4, 10 and 11: every bad configuration is exit 2 from the real CLI, with
the file, the key path and what was expected — never a traceback, a hang or another code.

Each case is one ``python -m edgeheal check-config --config FILE`` (a few ``run``), run as a
subprocess; they run a few at a time so the whole table costs a few seconds. A control case
(a valid configuration with every file present) must pass, so the table cannot pass by
refusing everything.
"""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

import pytest

from edgeheal.boundaries import control_socket as control
from edgeheal.config import validate as generic_rules

TIMEOUT = 60.0
"""Seconds one CLI run may take; a FIFO that blocked the reader would hit it."""


@dataclass(frozen=True)
class Case:
    name: str
    text: str | bytes | Callable[[Path], Path] | None
    """The file's content, or a function that makes the file and returns its path (None:
    no --config path from a file; see ``argv``)."""
    key: str
    """The key path the message must name ("" for a problem of the file itself)."""
    fragment: str
    command: str = "check-config"
    argv: tuple[str, ...] | None = None
    """Replaces ``--config FILE`` (e.g. ``--config ""``)."""
    code: int = 2


def _fifo(d: Path) -> Path:
    os.mkfifo(d / "fifo.toml")
    return d / "fifo.toml"


def _directory(d: Path) -> Path:
    (d / "dir.toml").mkdir()
    return d / "dir.toml"


def _large(d: Path) -> Path:
    path = d / "large.toml"
    path.write_text("# padding\n" * 120_000 + "[agent]\n", encoding="utf-8")
    return path


def _with_file(body: str, *names: str) -> Callable[[Path], Path]:
    """A config naming files under the case's directory ({d}); ``names`` are created."""
    def make(d: Path) -> Path:
        for name in names:
            (d / name).write_text("x\n", encoding="utf-8")
        path = d / "edge.toml"
        path.write_text(body.replace("{d}", str(d)), encoding="utf-8")
        return path
    return make


def _kubeconfig(user: str, *, extra: str = "") -> Callable[[Path], Path]:
    def make(d: Path) -> Path:
        (d / "kubeconfig").write_text(
            "apiVersion: v1\nkind: Config\ncurrent-context: c\n"
            "clusters:\n- name: k\n  cluster:\n    server: https://127.0.0.1:6443\n"
            "contexts:\n- name: c\n  context:\n    cluster: k\n    user: u\n"
            f"users:\n- name: u\n  user:\n{user}{extra}", encoding="utf-8")
        path = d / "edge.toml"
        path.write_text(f'[kubernetes]\nkubeconfig = "{d}/kubeconfig"\n', encoding="utf-8")
        return path
    return make


TARGET = '[[mqtt.targets]]\nname = "b"\nhost = "127.0.0.1"\n'
LONG_STATE = "/var/lib/" + "s" * (generic_rules.UNIX_PATH_MAX - 20)

CASES = [
    # --- finding 11: the file itself --------------------------------------------------------
    Case("not-utf8", b'[agent]\nnode_name = "caf\xe9"\n', "", "not UTF-8 text (an invalid "
         "byte on line 2"),
    Case("not-utf8-run", b"[agent]\n\xff\xfe\n", "", "not UTF-8 text", command="run"),
    Case("deep-arrays", "a = " + "[" * 5000 + "]" * 5000 + "\n", "", "nested too deeply"),
    Case("deep-tables", "a = " + "{b = " * 3000 + "1" + "}" * 3000 + "\n", "",
         "nested too deeply"),
    Case("5000-digit-int", "[agent]\ncheck_interval = 1" + "0" * 5000 + "\n", "",
         "a number too long"),
    Case("fifo", _fifo, "", "not a regular file"),
    Case("fifo-run", _fifo, "", "not a regular file", command="run"),
    Case("dev-zero", None, "", "not a regular file", argv=("--config", "/dev/zero")),
    Case("directory", _directory, "", "is a directory"),
    Case("over-1-MiB", _large, "", "larger than 1 MiB"),
    Case("missing", lambda d: d / "nope.toml", "", "no such configuration file"),
    Case("empty-config-path", None, "", "--config: the path is empty",
         argv=("--config", "")),
    Case("empty-config-path-run", None, "", "--config: the path is empty", command="run",
         argv=("--config", "")),
    # --- finding 11: state_dir --------------------------------------------------------------
    Case("state-dir-nul", '[agent]\nstate_dir = "/var/lib/a\\u0000b"\n', "agent.state_dir",
         "contains a NUL character"),
    Case("state-dir-empty", '[agent]\nstate_dir = ""\n', "agent.state_dir", "is empty"),
    Case("state-dir-relative", '[agent]\nstate_dir = "state"\n', "agent.state_dir",
         "must be an absolute path, got 'state'"),
    Case("state-dir-too-long", f'[agent]\nstate_dir = "{LONG_STATE}"\n', "agent.state_dir",
         "fit a unix socket address"),
    # --- finding 11: listen -----------------------------------------------------------------
    Case("listen-duplicate", '[http]\nlisten = ["127.0.0.1:9917", "127.0.0.1:9917"]\n',
         "http.listen[1]", "repeats http.listen[0]"),
    Case("listen-duplicate-run", '[http]\nlisten = ["127.0.0.1:9917", "127.0.0.1:9917"]\n',
         "http.listen[1]", "repeats http.listen[0]", command="run"),
    Case("listen-v6-spelled-twice", '[http]\nlisten = ["[::1]:9917", "[0:0::1]:9917"]\n',
         "http.listen[1]", "repeats"),
    Case("listen-wildcard-overlap", '[http]\nlisten = ["0.0.0.0:9917", "10.0.0.5:9917"]\n',
         "http.listen[1]", "overlaps http.listen[0]"),
    Case("listen-host-name", '[http]\nlisten = ["localhost:9917"]\n', "http.listen[0]",
         "expected an IP address, got the host name 'localhost'"),
    Case("listen-long-name", '[http]\nlisten = ["a..b:9917"]\n', "http.listen[0]",
         "expected an IP address"),
    # --- finding 11: files that must exist ---------------------------------------------------
    Case("password-file-missing", _with_file(
        TARGET + 'username = "u"\npassword_file = "{d}/missing.pass"\n'),
        "mqtt.targets[0].password_file", "missing.pass: no such file"),
    Case("password-file-is-dir", _with_file(
        TARGET + 'username = "u"\npassword_file = "{d}"\n'),
        "mqtt.targets[0].password_file", "is a directory"),
    Case("ca-file-missing", _with_file(TARGET + 'tls = true\nca_file = "{d}/ca.pem"\n'),
         "mqtt.targets[0].ca_file", "ca.pem: no such file"),
    Case("cert-file-missing", _with_file(
        TARGET + 'tls = true\ncert_file = "{d}/c.pem"\nkey_file = "{d}/k.pem"\n', "k.pem"),
        "mqtt.targets[0].cert_file", "c.pem: no such file"),
    Case("key-file-missing", _with_file(
        TARGET + 'tls = true\ncert_file = "{d}/c.pem"\nkey_file = "{d}/k.pem"\n', "c.pem"),
        "mqtt.targets[0].key_file", "k.pem: no such file"),
    Case("ca-file-relative", _with_file(TARGET + 'tls = true\nca_file = "ca.pem"\n'),
         "mqtt.targets[0].ca_file", "must be an absolute path"),
    Case("kubeconfig-missing", _with_file('[kubernetes]\nkubeconfig = "{d}/kc"\n'),
         "kubernetes.kubeconfig", "kc: no such file"),
    Case("kubeconfig-not-yaml", _kubeconfig("    token: [unclosed\n"),
         "kubernetes.kubeconfig", "not valid YAML on line"),
    Case("kubeconfig-token-newline", _kubeconfig("    token: |\n      abc.def\n"),
         "kubernetes.kubeconfig", "users[u].user.token ends with a line break"),
    Case("kubeconfig-client-key-missing", _kubeconfig(
        "    client-certificate: cert.pem\n    client-key: key.pem\n"),
        "kubernetes.kubeconfig", "users[u].user.client-certificate"),
    Case("kubeconfig-no-context", _kubeconfig("    token: abc\n",
                                              extra="current-context: other\n"),
         "kubernetes.kubeconfig", "no entry named other under contexts"),
    # --- finding 4: durations ---------------------------------------------------------------
    Case("interval-nan", "[agent]\ncheck_interval = nan\n", "agent.check_interval",
         "not a finite duration (allowed: 100ms to 1d)"),
    Case("interval-nan-run", "[agent]\ncheck_interval = nan\n", "agent.check_interval",
         "not a finite duration", command="run"),
    Case("timeout-inf", TARGET + "timeout = inf\n", "mqtt.targets[0].timeout",
         "allowed: 1s to 10m"),
    Case("timeout-minus-inf", TARGET + "timeout = -inf\n", "mqtt.targets[0].timeout",
         "not a finite duration"),
    Case("probe-interval-1ms", TARGET + 'interval = "1ms"\n', "mqtt.targets[0].interval",
         "must be at least 1s (allowed: 1s to 1d), got 1ms"),
    Case("probe-retry-nan", TARGET + "retry_interval = nan\n",
         "mqtt.targets[0].retry_interval", "allowed: 1s to 1d"),
    Case("check-interval-1ms", '[agent]\ncheck_interval = "1ms"\n', "agent.check_interval",
         "must be at least 100ms"),
    Case("negative-float", "[remediation]\ncooldown = -1.5\n", "remediation.cooldown",
         "cannot be negative"),
    Case("keepalive-too-long", TARGET + "keepalive = 70000\n", "mqtt.targets[0].keepalive",
         "must be at most 65535s"),
    Case("reminder-a-billion-days", '[alerts]\nreminder_interval = "1000000000d"\n',
         "alerts.reminder_interval", "must be at most 7d"),
    Case("outbox-age-1e300", "[alerts]\noutbox_max_age = 1e300\n", "alerts.outbox_max_age",
         "must be at most 365d"),
    Case("kube-timeout-zero", '[kubernetes]\nrequest_timeout = "0s"\n',
         "kubernetes.request_timeout", "must be greater than zero"),
    Case("wg-dead-after-huge", '[wireguard]\ndead_after = "400d"\n', "wireguard.dead_after",
         "must be at most 1d"),
    Case("duration-400-digits", f'[remediation]\ncooldown = "{"9" * 400}s"\n',
         "remediation.cooldown", "expected a duration"),
    # --- finding 10: names that become MQTT topics and Kubernetes names ---------------------
    Case("node-hash", '[agent]\nnode_name = "edge#1"\n', "agent.node_name",
         "not a Kubernetes node name: 'edge#1'"),
    Case("node-plus", '[agent]\nnode_name = "edge+1"\n', "agent.node_name",
         "not a Kubernetes node name"),
    Case("node-slash", '[agent]\nnode_name = "edge/1"\n', "agent.node_name",
         "not a Kubernetes node name"),
    Case("node-upper", '[agent]\nnode_name = "Edge-1"\n', "agent.node_name",
         "lower-case letters"),
    Case("node-too-long", f'[agent]\nnode_name = "{"a" * 254}"\n', "agent.node_name",
         "at most 253 characters"),
    Case("prefix-wildcard", '[alerts]\ntopic_prefix = "a/#"\n', "alerts.topic_prefix",
         "contains '#'"),
    Case("prefix-control-char", '[alerts]\ntopic_prefix = "a\\u0007b"\n',
         "alerts.topic_prefix", "control characters"),
    Case("prefix-sys", '[alerts]\ntopic_prefix = "$SYS/edge"\n', "alerts.topic_prefix",
         "cannot start with '$'"),
    Case("prefix-empty", '[alerts]\ntopic_prefix = "/"\n', "alerts.topic_prefix",
         "it is empty"),
    Case("prefix-too-long", f'[alerts]\ntopic_prefix = "{"p" * 70000}"\n',
         "alerts.topic_prefix", "longer than MQTT's 65535 bytes"),
    # --- the control: everything present and valid passes ------------------------------------
    Case("valid-with-every-file", _with_file(
        '[agent]\nnode_name = "edge-01.example"\nstate_dir = "{d}/state"\n'
        '[http]\nlisten = ["127.0.0.1:9917", "[::1]:9917", "0.0.0.0:9918"]\n'
        + TARGET + 'tls = true\nca_file = "{d}/ca.pem"\ncert_file = "{d}/c.pem"\n'
        'key_file = "{d}/k.pem"\nusername = "u"\npassword_file = "{d}/pass"\n'
        'interval = "1s"\ntimeout = "1s"\n', "ca.pem", "c.pem", "k.pem", "pass"),
        "", "", code=0),
]


def _run(case: Case, d: Path) -> tuple[str, subprocess.CompletedProcess[str]]:
    d.mkdir()
    source = ""
    if case.argv is not None:
        argv = list(case.argv)
    else:
        if callable(case.text):
            path = case.text(d)
        else:
            path = d / "edge.toml"
            data = case.text if isinstance(case.text, bytes) else str(case.text).encode()
            path.write_bytes(data)
        source, argv = str(path), ["--config", str(path)]
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("NOTIFY_", "WATCHDOG_", "EDGEHEAL_"))}
    proc = subprocess.run([sys.executable, "-m", "edgeheal", case.command, *argv],
                          capture_output=True, text=True, check=False, timeout=TIMEOUT,
                          env=env)
    return source, proc


@pytest.fixture(scope="module")
def results(tmp_path_factory: pytest.TempPathFactory,
            ) -> dict[str, tuple[str, subprocess.CompletedProcess[str]]]:
    base = tmp_path_factory.mktemp("cli")
    with ThreadPoolExecutor(max_workers=3) as pool:
        futures = {c.name: pool.submit(_run, c, base / c.name) for c in CASES}
        return {name: f.result() for name, f in futures.items()}


@pytest.mark.parametrize("case", CASES, ids=[c.name for c in CASES])
def test_bad_config_is_exit_2_naming_file_key_and_expectation(
        case: Case, results: dict[str, tuple[str, subprocess.CompletedProcess[str]]],
        ) -> None:
    source, proc = results[case.name]
    assert proc.returncode == case.code, proc.stderr
    assert "Traceback" not in proc.stderr
    if case.code == 0:
        assert "valid" in proc.stderr
        return
    assert proc.stdout == ""
    line = proc.stderr.strip().splitlines()[-1]
    assert line.startswith("edgeheal: configuration error: "), proc.stderr
    where = f"{source}: " if source else ""
    assert f"{where}{case.key}: " in line if case.key else where in line, line
    assert case.fragment in line, line
    assert len(line) < 700, "an error quotes what was given, not all of it"


def test_the_control_socket_name_the_rule_assumes_is_the_real_one() -> None:
    assert generic_rules.CONTROL_SOCKET == "/" + control.SOCKET_NAME
