#!/usr/bin/env bash
# The real-node tier (docs/development.md, "Real-node tier") for CI: `python3 -m tox -e node`, with its
# wall time printed so runs can be compared. The node image is cached under
# ~/.cache/runtimeproxy/node (RUNTIMEPROXY_NODE_CACHE), so only a machine's first run
# builds it.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
python3 -m pip install -q tox
began=$SECONDS
status=0
python3 -m tox -e node || status=$?
echo "node tier: $((SECONDS - began)) s (exit $status)"
exit "$status"
