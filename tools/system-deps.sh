#!/usr/bin/env bash
# System packages the tests need: espeak-ng makes the speech the VAD tests hear,
# mosquitto is the real broker the agent's tests talk to.
set -euo pipefail
need=()
command -v espeak-ng >/dev/null 2>&1 || need+=(espeak-ng)
# Debian puts the broker in /usr/sbin, which a normal user's PATH may lack.
command -v mosquitto >/dev/null 2>&1 || [ -x /usr/sbin/mosquitto ] || need+=(mosquitto)
[ ${#need[@]} -eq 0 ] && exit 0
if [ "$(id -u)" -eq 0 ] && command -v apt-get >/dev/null 2>&1; then
  echo "installing ${need[*]} with apt-get" >&2
  DEBIAN_FRONTEND=noninteractive apt-get update -qq
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${need[@]}" >/dev/null
else
  echo "missing system packages: ${need[*]}" >&2
  echo "install them with: sudo apt-get install -y ${need[*]}" >&2
  exit 1
fi
