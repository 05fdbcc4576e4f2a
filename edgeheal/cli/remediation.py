"""``edgeheal remediation pause [--for DURATION] | resume | reset`` and ``edgeheal kubeconfig``.

Why these exist: an operator working on a node (or on the uplink) must be able to hold the
remediator without stopping the agent's monitoring, and release the circuit after fixing
what made restarts useless. The commands go over the root-only control socket in
``state_dir`` (:mod:`edgeheal.boundaries.control_socket`); the HTTP port stays read-only.

``edgeheal kubeconfig`` turns the agent's ServiceAccount token Secret (``kubectl -n
kube-flannel get secret edgeheal-edge-1-token -o json``, see ``k3s-manifests/rbac.yaml``)
into the kubeconfig an edge node needs: the API server URL, the cluster CA from the
Secret, the token, nothing else. It runs offline, writes the file with mode 0600 and never
prints the token. Never give the agent K3s's admin ``k3s.yaml``.

Exit codes: 0 done; 2 usage (a bad duration — ``--for`` takes 1s to 30d —, an unusable
Secret, an existing output file without ``--force``); 3 the agent is not reachable (not
running, or not root); 1 the agent refused the command.
"""

from __future__ import annotations

import argparse
import base64
import os
import sys
from pathlib import Path
from typing import Any

from edgeheal.model import ExitCode

LADDERS = {"flannel": "remediation", "uplink": "remediation.uplink",
           "control": "remediation.control"}
"""``--ladder`` -> the prefix of its control-socket commands."""


def add_parser(sub: Any) -> None:
    p = sub.add_parser("remediation", help="hold or release the running agent's remediator")
    inner = p.add_subparsers(dest="remediation_command", metavar="ACTION")
    inner.required = True
    pause = inner.add_parser("pause", help="no restarts (monitoring and alerts go on)")
    pause.add_argument("--for", dest="duration", metavar="DURATION",
                       help="e.g. 30m or 2h (default: until `resume`)")
    pause.set_defaults(func=run)
    resume = inner.add_parser("resume", help="end a pause")
    resume.set_defaults(func=run)
    reset = inner.add_parser("reset", help="close an open circuit and clear the streak of "
                             "restarts that did not cure")
    reset.set_defaults(func=run)
    for each in (pause, resume, reset):
        each.add_argument("--ladder", choices=tuple(LADDERS), default="flannel",
                          help="which ladder: Flannel restarts (default), the uplink's "
                          "rungs or the K3s agent's restarts (control)")

    k = sub.add_parser("kubeconfig",
                       help="write the edge node's kubeconfig from its ServiceAccount token "
                       "Secret")
    k.add_argument("--server", required=True,
                   help="the API server URL the node reaches, e.g. https://10.0.0.1:6443")
    k.add_argument("--secret", default="-", metavar="FILE",
                   help="the Secret as JSON or YAML (`kubectl get secret ... -o json`); "
                   "default: standard input")
    k.add_argument("--output", "-o", required=True, metavar="FILE",
                   help="where to write the kubeconfig (mode 0600), e.g. "
                   "/etc/edgeheal/kubeconfig")
    k.add_argument("--force", action="store_true", help="overwrite an existing file")
    k.set_defaults(func=run_kubeconfig)


def run(args: argparse.Namespace) -> int:
    from edgeheal.agent.remediation.operator import pause_seconds
    from edgeheal.boundaries.control_socket import ControlError, call
    from edgeheal.config import format_duration
    from edgeheal.settings import load

    command = args.remediation_command
    payload: dict[str, Any] = {}
    if command == "pause" and args.duration is not None:
        try:  # checked before anything else: a bad --for never reaches the agent
            seconds = pause_seconds(args.duration)
            if seconds is None:
                raise ValueError("an empty duration (leave --for out to pause until resumed)")
        except ValueError as err:
            print(f"edgeheal: --for: {err}", file=sys.stderr)
            return ExitCode.USAGE
        payload["for"] = format_duration(seconds)
    config = load(getattr(args, "config", None))
    try:
        prefix = LADDERS[getattr(args, "ladder", "flannel")]
        view = call(config.agent.state_dir, f"{prefix}.{command}", payload)
    except ControlError as err:
        print(f"edgeheal: {err}", file=sys.stderr)
        return ExitCode.ENVIRONMENT if err.unreachable else ExitCode.CONDITION_FALSE
    print(summary(command, view if isinstance(view, dict) else {}))
    return ExitCode.OK


def summary(command: str, view: dict[str, Any]) -> str:
    paused = view.get("paused_until")
    state = {"pause": f"paused {'until resumed' if paused == 'indefinite' else f'until {paused}'}",
             "resume": "resumed", "reset": "circuit reset"}[command]
    return (f"remediation {state}: mode {view.get('mode', '?')}, circuit "
            f"{view.get('circuit', '?')}, {view.get('budget_left', '?')} restarts left this "
            "hour")


# --- kubeconfig ---------------------------------------------------------------------------

class SecretError(ValueError):
    """The input is not a usable ServiceAccount token Secret."""


def kubeconfig_from_secret(secret: dict[str, Any], server: str) -> dict[str, Any]:
    """Pure: a token Secret (``kubernetes.io/service-account-token``) -> kubeconfig dict."""
    if secret.get("kind") != "Secret":
        raise SecretError(f"expected a Secret, got kind {secret.get('kind')!r}")
    if secret.get("type") != "kubernetes.io/service-account-token":
        raise SecretError(f"expected type kubernetes.io/service-account-token, got "
                          f"{secret.get('type')!r}")
    data = secret.get("data") or {}
    missing = [k for k in ("token", "ca.crt") if not data.get(k)]
    if missing:
        raise SecretError(f"the Secret has no {' or '.join(missing)} yet (the token "
                          "controller fills it in a moment after creation; try again)")
    try:
        token = base64.b64decode(data["token"], validate=True).decode("ascii").strip()
        base64.b64decode(data["ca.crt"], validate=True)
    except (ValueError, UnicodeDecodeError) as err:
        raise SecretError("the Secret's token or ca.crt is not valid base64") from err
    if not server.startswith("https://"):
        raise SecretError(f"--server must be an https:// URL, got {server!r}")
    meta = secret.get("metadata") or {}
    account = (meta.get("annotations") or {}).get("kubernetes.io/service-account.name",
                                                  "edgeheal")
    name = f"edgeheal-{account}"
    return {
        "apiVersion": "v1", "kind": "Config", "preferences": {},
        "clusters": [{"name": "k3s", "cluster": {
            "server": server, "certificate-authority-data": data["ca.crt"]}}],
        "users": [{"name": name, "user": {"token": token}}],
        "contexts": [{"name": name, "context": {
            "cluster": "k3s", "user": name,
            "namespace": meta.get("namespace", "kube-flannel")}}],
        "current-context": name,
    }


def run_kubeconfig(args: argparse.Namespace) -> int:
    import yaml  # type: ignore[import-untyped]  # lightkube's dependency

    try:
        source = str(args.secret)
        raw = sys.stdin.read() if source == "-" else Path(source).read_text(
            encoding="utf-8")
    except OSError as err:
        print(f"edgeheal: --secret {args.secret}: {err.strerror}", file=sys.stderr)
        return ExitCode.USAGE
    try:
        secret = yaml.safe_load(raw)  # JSON is YAML
        if not isinstance(secret, dict):
            raise SecretError("the input is not a Kubernetes object")
        config = kubeconfig_from_secret(secret, args.server)
    except (SecretError, yaml.YAMLError) as err:
        print(f"edgeheal: --secret {args.secret}: {err}", file=sys.stderr)
        return ExitCode.USAGE
    out = Path(args.output)
    flags = os.O_WRONLY | os.O_CREAT | os.O_TRUNC | (0 if args.force else os.O_EXCL)
    try:
        out.parent.mkdir(parents=True, exist_ok=True)
        fd = os.open(out, flags, 0o600)
    except FileExistsError:
        print(f"edgeheal: {out} exists; use --force to overwrite", file=sys.stderr)
        return ExitCode.USAGE
    except OSError as err:
        print(f"edgeheal: cannot write {out}: {err.strerror}", file=sys.stderr)
        return ExitCode.ENVIRONMENT
    with os.fdopen(fd, "w", encoding="utf-8") as fh:
        os.fchmod(fh.fileno(), 0o600)
        fh.write(yaml.safe_dump(config, sort_keys=False))
    user = config["users"][0]["name"]
    print(f"wrote {out} (server {args.server}, user {user}, namespace "
          f"{config['contexts'][0]['context']['namespace']}); set [kubernetes] kubeconfig = "
          f"\"{out}\"")
    return ExitCode.OK


