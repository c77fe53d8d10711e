#!/usr/bin/env bash
# Install edge-agent as a systemd service on a Debian/Ubuntu box. Run as root from a source
# checkout or with a wheel: `sudo bash systemd/install.sh [path/to/edge_agent-*.whl]`.
# Idempotent: re-running upgrades the package, restarts a running agent on it, and keeps
# the config, keys and state.
set -euo pipefail

# install_package PYTHON PACKAGE: PACKAGE (a wheel or a source folder) into PYTHON's venv.
# Every build says version 0.1.0, and pip keeps an installed version it is given again
# (exit 0, nothing said): an upgrade, or a rollback to another build, left the old code in
# place. So the package itself is always reinstalled; its dependencies are only brought to
# what it asks for. The plain install goes first: if it cannot get a dependency, the old
# build stays whole, rather than new code over old dependencies.
install_package() {
  "$1" -m pip install --quiet --upgrade "$2"
  "$1" -m pip install --quiet --force-reinstall --no-deps "$2"
}

# restart_running: the agent, if it runs, restarts on the build just installed; a stopped
# one stays stopped (`try-restart`). The package is replaced on every run, under a running
# agent too: left running, it kept the old build in memory while its lazy imports loaded
# the new build's modules, and `edge-fleet status` showed the old build until some later
# restart. Returns 1 if the agent does not come up again.
restart_running() {
  local was_running=0
  if systemctl is-active --quiet edge-agent.service; then was_running=1; fi
  if ! systemctl try-restart edge-agent.service; then
    echo "install.sh: edge-agent did not start again on the new build;" \
      "see journalctl -u edge-agent" >&2
    return 1
  fi
  if [ "$was_running" -eq 1 ]; then
    echo "install.sh: edge-agent restarted on the new build; logs: journalctl -u edge-agent" >&2
  else
    echo "install.sh: edge-agent is not running. Start it with: systemctl start edge-agent;" \
      "logs: journalctl -u edge-agent" >&2
  fi
}

# make_venv PREFIX: a venv with pip at PREFIX. Debian and Ubuntu ship python3 without
# ensurepip (it is in python3-venv): `venv` then left bin/python without pip and failed,
# and every re-run, seeing bin/python, kept that venv and failed at pip, with python3-venv
# long installed. So the venv is judged by its pip, and one without it is made anew.
make_venv() {
  if ! python3 -c 'import ensurepip, venv' 2>/dev/null; then
    apt-get update && apt-get install -y --no-install-recommends python3 python3-venv
  fi
  "$1/bin/python" -m pip --version >/dev/null 2>&1 || python3 -m venv --clear "$1"
}

# Sourced (tests/integration/test_install_script.py drives install_package, make_venv and
# restart_running), stop here.
# Told by whether `return` works, which it does only in a sourced file (or a function):
# comparing ${BASH_SOURCE[0]} with $0 took `bash -c 'source "$0" ...' install.sh`, the
# tests' own call, for a run, and as root they installed the service on the test host.
if (return 0 2>/dev/null); then return 0; fi

[ "$(id -u)" -eq 0 ] || { echo "install.sh: run as root (sudo)" >&2; exit 1; }
here="$(cd "$(dirname "$0")" && pwd)"
source_dir="$(dirname "$here")"
package="${1:-$source_dir}"
prefix=/opt/edge-agent

# A system user with no login, in the groups that open GPUs, NPUs and cameras.
getent group render >/dev/null || groupadd --system render
getent group video >/dev/null || groupadd --system video
if ! id edge-agent >/dev/null 2>&1; then
  useradd --system --home-dir /var/lib/edge-agent --no-create-home \
    --shell /usr/sbin/nologin --groups render,video edge-agent
fi

make_venv "$prefix"
"$prefix/bin/python" -m pip install --quiet --upgrade pip
install_package "$prefix/bin/python" "$package"
echo "install.sh: now installed: $("$prefix/bin/edge-agent" --version)" >&2

install -d -m 0750 -o root -g edge-agent /etc/edge-agent
if [ ! -e /etc/edge-agent/agent.toml ]; then
  install -m 0640 -o root -g edge-agent "$here/agent.example.toml" /etc/edge-agent/agent.toml
  # Three things before a start: the agent refuses to run without the key the config
  # names, and systemd would restart it every 10 s.
  echo "install.sh: wrote /etc/edge-agent/agent.toml: set device_id and [mqtt].host, and" \
    "copy the fleet's public key (edge-fleet keygen) to /etc/edge-agent/fleet.pub" \
    "(or remove trusted_keys to take unsigned releases)" >&2
fi
# The unit names a credential file; an empty one means "no password".
[ -e /etc/edge-agent/mqtt-password ] || install -m 0600 /dev/null /etc/edge-agent/mqtt-password

install -m 0644 "$here/edge-agent.service" /etc/systemd/system/edge-agent.service
systemctl daemon-reload
systemctl enable edge-agent.service
restart_running
