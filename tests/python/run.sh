#!/usr/bin/env bash
# Runs the foreign Python gRPC client in its own virtual environment
# (tests/python/.venv, created on first use). Arguments go to the client;
# `run.sh opi-wire ARGS` runs the OPI wire-compatibility check
# (opi_wire.py) instead, `run.sh opi-client ARGS` the OPI client
# (opi_client.py).
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
venv="$here/.venv"
# One caller at a time makes the environment (tests run in parallel).
exec 9>"${TMPDIR:-/tmp}/dpu-service-python-venv.lock"
flock 9
if [ ! -x "$venv/bin/python" ] || ! cmp -s "$here/requirements.txt" "$venv/.requirements"; then
  rm -rf "$venv"
  python3 -m venv "$venv"
  "$venv/bin/pip" install -q --disable-pip-version-check -r "$here/requirements.txt"
  cp "$here/requirements.txt" "$venv/.requirements"
fi
flock -u 9
script=foreign_client.py
case "${1:-}" in
  opi-wire | opi-client) script=${1//-/_}.py; shift ;;
esac
exec "$venv/bin/python" "$here/$script" "$@"
