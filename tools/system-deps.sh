#!/usr/bin/env bash
# System packages the tests need: espeak-ng makes the speech the VAD tests hear,
# mosquitto is the real broker the agent's tests talk to, and mosquitto-clients gives them
# mosquitto_pub and mosquitto_sub to publish and watch from outside the agent.
# With --demo (make demo): mosquitto only, and its absence is not an error, since
# `edge-agent demo` falls back to its embedded broker.
set -euo pipefail
demo=false
[ "${1:-}" = "--demo" ] && demo=true
need=()
$demo || command -v espeak-ng >/dev/null 2>&1 || need+=(espeak-ng)
# Debian puts the broker in /usr/sbin, which a normal user's PATH may lack.
command -v mosquitto >/dev/null 2>&1 || [ -x /usr/sbin/mosquitto ] || need+=(mosquitto)
$demo || { command -v mosquitto_pub && command -v mosquitto_sub; } >/dev/null 2>&1 || need+=(mosquitto-clients)
[ ${#need[@]} -eq 0 ] && exit 0
if [ "$(id -u)" -eq 0 ] && command -v apt-get >/dev/null 2>&1; then
  echo "installing ${need[*]} with apt-get" >&2
  DEBIAN_FRONTEND=noninteractive apt-get update -qq
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${need[@]}" >/dev/null
elif $demo; then
  echo "mosquitto is not installed: the demo uses its embedded broker (MQTT 3.1.1)" >&2
  echo "for MQTT 5: sudo apt-get install -y ${need[*]}" >&2
else
  echo "missing system packages: ${need[*]}" >&2
  echo "install them with: sudo apt-get install -y ${need[*]}" >&2
  exit 1
fi
