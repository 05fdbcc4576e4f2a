"""A real Mosquitto broker for the lab and the tests, always cleaned up.

Why a real broker: the MQTT boundary's failure modes (refused credentials, TLS trust, the
will message, retained status, PUBACK timing) are the broker's behaviour, not ours to fake.

API::

    with Sandbox() as sb:
        broker = Mosquitto(sb, tmp_path, users={"edge": "s3cret"}, tls=True)  # ns=... too
        broker.start()              # waits until the broker logs that it is running
        broker.port, broker.tls_port, broker.host, broker.ca_file
        broker.password_file_for("edge")  # a file holding that user's password
        broker.extra_port           # a second plain listener (e.g. for a subscriber that
                                    # must keep working while a test drops `port`)
        broker.stop(); broker.start()   # same ports, same files
        proc = broker.subscribe("edgeheal/#", out_path, user="edge")  # mosquitto_sub -v

- Ports: inside a namespace (``ns``) the namespace is fresh, so fixed-looking random ports
  are free; on the host's loopback a free port is found by binding port 0.
- ``persistence=True``: sessions and queued QoS 1 messages survive ``stop``/``start``
  (a persistent subscriber keeps what was published while it or the broker was away).
- ``users``: a password file made with ``mosquitto_passwd -b``; with users, anonymous
  clients are refused. Without users, anonymous access is allowed.
- ``tls=True``: throw-away CA and server certificate (trustme) for ``127.0.0.1`` and
  ``localhost`` on a second listener, ``tls_port``; ``ca_file`` is the CA to trust and
  ``other_ca_file`` a CA that did not sign it (for wrong-CA tests).
- Every process goes through the :class:`~edgeheal.lab.netns.Sandbox`, so ``Sandbox.close``
  kills the broker and its subscribers even when a test fails; files live in ``workdir``.
"""

from __future__ import annotations

import contextlib
import secrets
import shutil
import socket
import subprocess
import time
from pathlib import Path

from edgeheal.lab.netns import LabError, Sandbox, require_programs, run, stop_process


def free_port(host: str = "127.0.0.1") -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind((host, 0))
        return int(sock.getsockname()[1])


class Mosquitto:
    """One broker process with a generated config (see the module docstring)."""

    def __init__(self, sandbox: Sandbox, workdir: Path, *, ns: str | None = None,
                 host: str = "127.0.0.1", users: dict[str, str] | None = None,
                 tls: bool = False, extra_listener: bool = False, persistence: bool = False,
                 ready_timeout: float = 10.0) -> None:
        require_programs("mosquitto", "mosquitto_passwd")
        self.sandbox, self.ns, self.host = sandbox, ns, host
        self.dir = sandbox.track(Path(workdir) / f"mosquitto-{secrets.token_hex(4)}")
        self.dir.mkdir(parents=True)
        self.users = dict(users or {})
        self.tls = tls
        self.persistence = persistence
        self.ready_timeout = ready_timeout
        self.port = self._port()
        self.tls_port = self._port() if tls else None
        self.extra_port = self._port() if extra_listener else None
        self.log_path = self.dir / "mosquitto.log"
        self.out_path = self.dir / "mosquitto.out"
        self.ca_file = self.other_ca_file = ""
        self.proc: subprocess.Popen[bytes] | None = None
        if tls:
            self._make_certs()
        self.password_file = ""
        if self.users:
            self._make_passwords()
        self.config_path = self.dir / "mosquitto.conf"
        self.config_path.write_text(self._config(), encoding="utf-8")

    def _port(self) -> int:
        if self.ns is not None:
            return 20000 + secrets.randbelow(40000)
        return free_port(self.host)

    def _make_certs(self) -> None:
        import trustme  # lab extra

        ca = trustme.CA()
        cert = ca.issue_cert("127.0.0.1", "localhost", self.host)
        self.ca_file = str(self.dir / "ca.pem")
        ca.cert_pem.write_to_path(self.ca_file)
        cert.private_key_pem.write_to_path(str(self.dir / "server.key"))
        cert.cert_chain_pems[0].write_to_path(str(self.dir / "server.pem"))
        self.other_ca_file = str(self.dir / "other-ca.pem")
        trustme.CA().cert_pem.write_to_path(self.other_ca_file)

    def _make_passwords(self) -> None:
        path = self.dir / "passwd"
        for i, (user, password) in enumerate(self.users.items()):
            argv = ["mosquitto_passwd", *(["-c"] if i == 0 else []), "-b", str(path), user,
                    password]
            run(argv)
        self.password_file = str(path)

    def password_file_for(self, user: str) -> str:
        """A client-side file holding ``user``'s password (what ``password_file`` names)."""
        path = self.dir / f"{user}.pass"
        path.write_text(self.users[user] + "\n", encoding="utf-8")
        path.chmod(0o600)
        return str(path)

    def _config(self) -> str:
        lines = ["per_listener_settings false", "user root",
                 *(["persistence true", f"persistence_location {self.dir}/"]
                   if self.persistence else ["persistence false"]),
                 f"log_dest file {self.log_path}", "log_type error", "log_type warning",
                 "log_type notice", "log_type information", "log_type subscribe",
                 "connection_messages true",
                 f"allow_anonymous {'false' if self.users else 'true'}"]
        if self.password_file:
            lines.append(f"password_file {self.password_file}")
        lines.append(f"listener {self.port} {self.host}")
        if self.extra_port is not None:
            lines.append(f"listener {self.extra_port} {self.host}")
        if self.tls_port is not None:
            lines += [f"listener {self.tls_port} {self.host}",
                      f"certfile {self.dir / 'server.pem'}",
                      f"keyfile {self.dir / 'server.key'}"]
        return "\n".join(lines) + "\n"

    @property
    def running(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def start(self) -> None:
        """Start the broker and wait until it says it is running (bounded)."""
        if self.running:
            return
        offset = self.log_path.stat().st_size if self.log_path.exists() else 0
        self.proc = self.sandbox.spawn(["mosquitto", "-c", str(self.config_path)], ns=self.ns,
                                       log_path=self.out_path)
        deadline = time.monotonic() + self.ready_timeout
        while time.monotonic() < deadline:
            text = self.log()[offset:]
            if " running" in text:
                return
            if self.proc.poll() is not None:
                break
            time.sleep(0.02)
        log = self.log()[offset:] + self.out_path.read_text(encoding="utf-8", errors="replace")
        self.stop()
        raise LabError(f"mosquitto did not start within {self.ready_timeout:g}s: {log[-800:]}")

    def stop(self) -> None:
        if self.proc is not None:
            stop_process(self.proc)
            self.proc = None

    def kill(self) -> None:
        """SIGKILL: the broker vanishes without closing anything."""
        if self.proc is not None:
            with contextlib.suppress(ProcessLookupError):
                self.proc.kill()
            self.proc.wait(timeout=5)
            self.proc = None

    def log(self) -> str:
        if not self.log_path.exists():
            return ""
        return self.log_path.read_text(encoding="utf-8", errors="replace")

    def subscribe(self, topic: str, out_path: Path, *, user: str | None = None,
                  port: int | None = None, client_id: str | None = None,
                  clean: bool = True, qos: int = 1) -> subprocess.Popen[bytes]:
        """A ``mosquitto_sub -v`` (one ``topic payload`` line per message) to ``out_path``.

        Returns once the broker has logged the subscription (bounded), so nothing
        published afterwards can be missed. ``clean=False`` with a ``client_id`` makes a
        persistent session: QoS 1 messages published while it is away are kept for it.
        """
        sub = shutil.which("mosquitto_sub")
        if sub is None:
            raise LabError("missing program: mosquitto_sub")
        argv = [sub, "-h", self.host, "-p", str(port or self.port), "-t", topic, "-q",
                str(qos), "-v"]
        client_id = client_id or f"sub-{secrets.token_hex(4)}"
        argv += ["-i", client_id]
        if not clean:
            argv.append("-c")
        if user:
            argv += ["-u", user, "-P", self.users[user]]
        proc = self.sandbox.spawn(argv, ns=self.ns, log_path=out_path)
        if not self.wait_for_log(f" {client_id} {qos} {topic}", self.ready_timeout):
            stop_process(proc)
            said = out_path.read_text(errors="replace")[-400:] if out_path.exists() else ""
            raise LabError(f"mosquitto_sub {client_id} did not subscribe to {topic} within "
                           f"{self.ready_timeout:g}s: {said.strip() or 'no output'}")
        return proc

    def wait_for_log(self, needle: str, timeout: float = 10.0) -> bool:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if needle in self.log():
                return True
            time.sleep(0.02)
        return False
