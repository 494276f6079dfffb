/**
 * The agent programs vf ships into sandboxes for the `program` harness when no command is
 * given: a shell-tool loop in Python 3 (standard library only) that speaks chat completions
 * to the gateway, and one in POSIX sh for images without Python (busybox is enough: it needs
 * `sh`, `wget` and `mktemp`), which asks the gateway for one command at a time.
 *
 * Either one that cannot work in its sandbox (a tool or Python module the image lacks, a
 * gateway it cannot reach) says why on a `vf-agent: cannot run: ` line of stderr and exits
 * {@link AGENT_CANNOT_RUN}, which the harness records as an infrastructure error: a broken
 * image is never an agent that did nothing and scored 0.
 * @module
 */

/** The exit code of a shipped agent that cannot run in its sandbox (`EX_UNAVAILABLE`). */
export const AGENT_CANNOT_RUN = 69;
/** What starts the stderr line that says why. */
export const CANNOT_RUN_PREFIX = "vf-agent: cannot run: ";

/** The Python agent: chat completions with a `bash` tool until the model stops calling it. */
export const PYTHON_AGENT = `#!/usr/bin/env python3
"""vf's agent program: a shell-tool loop over an OpenAI-compatible endpoint (stdlib only)."""
import os, sys

def cannot(why):
    print("${CANNOT_RUN_PREFIX}" + why, file=sys.stderr)
    sys.exit(${AGENT_CANNOT_RUN})

try:
    import http.client, json, subprocess, urllib.error, urllib.request
except ImportError as e:
    cannot('this agent needs the Python module "%s", which python3 in the image lacks; use '
           'an image with the full standard library, or --env.agent.harness.agent sh' % e.name)

BASE = os.environ["OPENAI_BASE_URL"].rstrip("/")
KEY = os.environ["OPENAI_API_KEY"]
MODEL = os.environ.get("OPENAI_MODEL", "vf")
MAX_TURNS = int(os.environ.get("VF_MAX_TURNS", "50"))
TIMEOUT = float(os.environ.get("VF_COMMAND_TIMEOUT", "600"))
LIMIT = 16000
SYSTEM = os.environ.get("VF_SYSTEM_PROMPT") or (
    "You are an autonomous agent in a Linux sandbox. Use the bash tool to run shell commands. "
    "When the task is done, reply with a short summary and no tool calls.")
TOOLS = [{"type": "function", "function": {
    "name": "bash", "description": "Run a shell command; returns its exit code and output.",
    "parameters": {"type": "object", "properties": {"command": {"type": "string"}},
                   "required": ["command"]}}}]

def call(messages):
    body = json.dumps({"model": MODEL, "messages": messages, "tools": TOOLS}).encode()
    req = urllib.request.Request(BASE + "/chat/completions", data=body, method="POST", headers={
        "Content-Type": "application/json", "Authorization": "Bearer " + KEY})
    with urllib.request.urlopen(req, timeout=3600) as r:
        return json.load(r)

def run(command):
    try:
        p = subprocess.run(["sh", "-c", command], capture_output=True, text=True,
                           timeout=TIMEOUT, errors="replace")
        out = "exit code: %d\\n%s%s" % (p.returncode, p.stdout, p.stderr)
    except subprocess.TimeoutExpired:
        out = "exit code: 124\\ncommand timed out after %gs" % TIMEOUT
    except OSError as e:
        cannot('this agent runs commands with "sh", which cannot start: %s' % e)
    if len(out) > LIMIT:
        out = out[:LIMIT // 2] + "\\n...[cut]...\\n" + out[-LIMIT // 2:]
    return out

def main():
    messages = [{"role": "system", "content": SYSTEM},
                {"role": "user", "content": os.environ.get("VF_INSTRUCTION", "")}]
    for _ in range(MAX_TURNS):
        try:
            reply = call(messages)
        except urllib.error.HTTPError as e:
            # 400/409: the rollout stopped (a limit or a stop condition); not a crash.
            text = e.read().decode(errors="replace")
            print("vf-agent: %s %s" % (e.code, text), file=sys.stderr)
            if e.code in (400, 409):
                return 0
            cannot("the model gateway at %s answered %s: %s" % (BASE, e.code, text[:300]))
        except (urllib.error.URLError, http.client.HTTPException, OSError) as e:
            cannot("cannot reach the model gateway at %s: %s" % (BASE, e))
        msg = reply["choices"][0]["message"]
        calls = msg.get("tool_calls") or []
        messages.append({"role": "assistant", "content": msg.get("content"),
                         **({"tool_calls": calls} if calls else {})})
        if not calls:
            print(msg.get("content") or "")
            return 0
        for c in calls:
            try:
                command = json.loads(c["function"]["arguments"] or "{}").get("command", "")
            except ValueError:
                command = None
            out = run(command) if isinstance(command, str) and command else \\
                "error: the bash tool needs a string \\"command\\""
            messages.append({"role": "tool", "tool_call_id": c["id"], "content": out})
    return 0

sys.exit(main())
`;

/**
 * The sh agent: the gateway keeps the conversation and answers each step with the next
 * command (an empty reply ends the loop); the agent runs it and posts back its output.
 */
export const SH_AGENT = `#!/bin/sh
# vf's agent program for images without Python: one command per step from the gateway.
set -u
cannot() {
  echo "${CANNOT_RUN_PREFIX}$*" >&2
  exit ${AGENT_CANNOT_RUN}
}
for tool in wget mktemp head; do
  command -v "$tool" > /dev/null 2>&1 ||
    cannot "this agent needs \\"$tool\\", which the image lacks; use an image with it (busybox has all three), or the python agent"
done
base="\${VF_GATEWAY_URL:?}"
key="\${OPENAI_API_KEY:?}"
dir=$(mktemp -d) || cannot "mktemp -d failed"
: > "$dir/out"
step=1
while [ "$step" -le "\${VF_MAX_TURNS:-50}" ]; do
  # A refusal because the rollout stopped (a limit) is known to the harness; anything else
  # means this sandbox cannot talk to the gateway.
  if ! err=$(wget -q -O "$dir/cmd" --header "Authorization: Bearer $key" \\
    --header "Content-Type: text/plain" --post-file "$dir/out" \\
    "$base/vf/shell/step?step=$step" 2>&1); then
    cannot "cannot reach the model gateway at $base (step $step): $err"
  fi
  [ -s "$dir/cmd" ] || exit 0
  sh "$dir/cmd" > "$dir/run" 2>&1
  code=$?
  { echo "exit code: $code"; head -c 16000 "$dir/run"; } > "$dir/out"
  step=$((step + 1))
done
`;
