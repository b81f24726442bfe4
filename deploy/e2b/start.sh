#!/bin/sh
# The E2B template's start command: starts computerd's agent with the settings the adapter passed
# as `envVars` when it created the sandbox.
#
# E2B runs a template's start command while it builds the template and snapshots the sandbox with
# it running; a sandbox made from the template resumes from that snapshot. So this process starts
# long before any create, and the create's `envVars` never reach its environment: envd receives
# them at the sandbox's start and serves them at GET /envs. This script waits for them there, then
# replaces itself with the agent. A sandbox paused and resumed keeps the running agent (E2B keeps
# memory and processes), so this runs once per sandbox.
set -eu

ENVD="${COMPUTERD_E2B_ENVD:-http://127.0.0.1:49983}"
AGENT="${COMPUTERD_E2B_AGENT:-/usr/local/bin/computer-agent}"

while :; do
    # A JSON object of names to values; the agent's settings are the COMPUTER_AGENT_* ones.
    if envs="$(python3 - "$ENVD/envs" <<'PY'
import json, shlex, sys, urllib.request
try:
    with urllib.request.urlopen(sys.argv[1], timeout=5) as r:
        env = json.load(r)
except Exception:
    sys.exit(1)
if not isinstance(env, dict) or "COMPUTER_AGENT_SERVER" not in env:
    sys.exit(1)
for k, v in env.items():
    if isinstance(k, str) and isinstance(v, str) and k.startswith("COMPUTER_AGENT_"):
        print("export %s=%s" % (k, shlex.quote(v)))
PY
)"; then
        eval "$envs"
        exec "$AGENT"
    fi
    sleep 1
done
