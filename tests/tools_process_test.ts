/**
 * stdio toolset servers never outlive vf: a hostile server tree, started through `sh -c` as
 * launchers do, with children in its process group and one that left it (`setsid`), all
 * ignoring SIGTERM and the end of their input, and a daemon (double fork: its parent exits, it
 * is reparented to init in a session of its own). The real CLI runs it and ends (a) normally,
 * (b) by an error in the handshake, (c) by a crash (an exception nothing caught), (d) by SIGINT,
 * (e) by SIGTERM, (f) by SIGHUP (its terminal closed: the tree, in a session of its own, is not
 * sent it); afterwards every pid of the tree is gone.
 * @module
 */
import assert from "node:assert/strict";
import { join } from "node:path";
import { startModelServer, type WireMessage } from "./model_server.ts";
import { cliCommand, collect, MOD_URL, tempDir, transcript } from "./_cli.ts";

/**
 * An MCP server in Python's standard library that ignores SIGTERM/SIGINT/SIGHUP, starts a
 * child of its own, records its pids, and stays after its input ends. With "bad" it answers
 * the handshake with a protocol version no client supports; its tool "quit" answers, then
 * exits at once (leaving its child behind).
 */
const SERVER = String.raw`import json, os, signal, subprocess, sys, time
for s in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
    signal.signal(s, signal.SIG_IGN)
child = subprocess.Popen(["sleep", "1000"])
with open(os.environ["PIDS"], "a") as f:
    f.write("%d\n%d\n" % (os.getpid(), child.pid))
bad = sys.argv[1:] == ["bad"]
for line in sys.stdin:
    msg = json.loads(line)
    if "id" not in msg:
        continue
    method, params = msg.get("method"), msg.get("params") or {}
    if method == "initialize":
        result = {"protocolVersion": "1999-01-01" if bad else params.get("protocolVersion"),
                  "capabilities": {"tools": {}}, "serverInfo": {"name": "hold", "version": "1"}}
    elif method == "tools/list":
        result = {"tools": [{"name": n, "description": n,
                             "inputSchema": {"type": "object", "properties": {}}} for n in ("ping", "quit")]}
    elif method == "tools/call":
        result = {"content": [{"type": "text", "text": "pong"}]}
        if params["name"] == "quit":
            sys.stdout.write(json.dumps({"jsonrpc": "2.0", "id": msg["id"], "result": result}) + "\n")
            sys.stdout.flush()
            os._exit(0)
    else:
        result = {}
    sys.stdout.write(json.dumps({"jsonrpc": "2.0", "id": msg["id"], "result": result}) + "\n")
    sys.stdout.flush()
while True:
    time.sleep(1)
`;

/**
 * The launcher: a shell that ignores SIGTERM, with a child in its group, one in a session of
 * its own, a daemon no longer below it, and the server as a child (a command after it keeps
 * the shell from exec'ing it).
 */
const LAUNCHER = `trap '' TERM INT HUP
sleep 1000 & echo $! >> "$PIDS"
setsid sleep 1000 & echo $! >> "$PIDS"
setsid sh -c 'trap "" TERM; sleep 1000 </dev/null >/dev/null 2>&1 & echo $! >> "$PIDS"'
echo $$ >> "$PIDS"
python3 -u server.py "$@"
wait`;

/** sh, its two sleeps, the daemon, python and python's sleep. */
const TREE_SIZE = 6;

const TASKSET = `
import { reward, Task, Taskset } from "${MOD_URL}";
class PingTask extends Task {
  static override HARNESS = "null";
  pinged = reward(({ trace }) => (trace.messages.some((m) => m.role === "tool" && m.content === "pong") ? 1 : 0));
}
class Pings extends Taskset {
  get id() { return "pings"; }
  *load() { yield new PingTask({ id: "p", prompt: "Ping the server." }); }
}
export function loadTaskset(config) { return new Pings(config); }
`;

/**
 * Code in the taskset's module that throws from a timer once the server tree is up and the
 * model is thinking: vf dies of an exception nothing caught, and no exit event comes.
 */
const CRASH = `
const crash = setInterval(() => {
  let text = "";
  try {
    text = Deno.readTextFileSync(new URL("./pids", import.meta.url));
  } catch { /* not yet */ }
  if (text.split("\\n").filter(Boolean).length < ${TREE_SIZE}) return;
  clearInterval(crash);
  setTimeout(() => { throw new Error("vf-test-crash"); }, 500);
}, 50);
`;

function toml(modelUrl: string, pids: string, mode: "good" | "bad"): string {
  return `model = "m"
[client]
base_url = "${modelUrl}"
[env.taskset]
id = "./pings.ts"
[env.agent.runtime]
type = "subprocess"
[[env.toolsets]]
name = "hold"
command = "sh"
args = ["-c", ${JSON.stringify(LAUNCHER)}, "sh"${mode === "bad" ? `, "bad"` : ""}]
cwd = "."
env = { PIDS = "${pids}" }
timeout = 30
`;
}

/** Alive and not a zombie (a zombie waits only for its parent to reap it). */
function alive(pid: number): boolean {
  try {
    const stat = Deno.readTextFileSync(`/proc/${pid}/stat`);
    return stat.slice(stat.lastIndexOf(")") + 2)[0] !== "Z";
  } catch {
    return false;
  }
}

async function readPids(file: string): Promise<number[]> {
  const text = await Deno.readTextFile(file).catch(() => "");
  return text.split("\n").filter(Boolean).map(Number);
}

async function waitFor(what: string, ok: () => Promise<boolean> | boolean, ms = 120_000) {
  const deadline = Date.now() + ms;
  while (!(await ok())) {
    if (Date.now() > deadline) throw new Error(`timed out waiting for ${what}`);
    await new Promise((r) => setTimeout(r, 100));
  }
}

type Ending = "normal" | "error" | "crash" | "SIGINT" | "SIGTERM" | "SIGHUP";

/** Whether vf is ended by a signal sent while the model is still thinking. */
function signalled(ending: Ending): ending is "SIGINT" | "SIGTERM" | "SIGHUP" {
  return ending === "SIGINT" || ending === "SIGTERM" || ending === "SIGHUP";
}

async function endsWithVf(ending: Ending) {
  await using tmp = await tempDir("vf_tools_tree_");
  const pids = join(tmp.path, "pids");
  await using model = await startModelServer({
    responder: ({ body }) => {
      const turn = body.messages.filter((m: WireMessage) => m.role === "assistant").length;
      if (turn === 0) return { content: null, tool_calls: [{ name: "hold_ping", arguments: {} }] };
      // Interrupted runs are stopped while the model is still thinking.
      return signalled(ending) || ending === "crash" ? { hang: true } : { content: "pong" };
    },
  });
  await Deno.writeTextFile(join(tmp.path, "server.py"), SERVER);
  await Deno.writeTextFile(join(tmp.path, "pings.ts"), TASKSET + (ending === "crash" ? CRASH : ""));
  await Deno.writeTextFile(
    join(tmp.path, "run.toml"),
    toml(model.url, pids, ending === "error" ? "bad" : "good"),
  );
  const child = cliCommand(["eval", "@", "run.toml", "-o", "out"], {
    cwd: tmp.path,
    env: {},
    registry: false,
  }).spawn();
  const result = collect(child);
  let exited = false;
  result.finally(() => (exited = true)).catch(() => {});
  let tree: number[] = [];
  try {
    if (signalled(ending)) {
      // The tree is up and has answered a call; the model is asked again and hangs.
      await waitFor(
        "the server tree and the second model request",
        async () =>
          exited || (await readPids(pids)).length === TREE_SIZE && model.requests.length >= 2,
      );
      if (exited) assert.fail(`vf ended before it was signalled\n${transcript(await result)}`);
      child.kill(ending);
    }
    const res = await result;
    tree = await readPids(pids);
    assert.equal(tree.length, TREE_SIZE, `the whole tree started\n${transcript(res)}`);
    if (ending === "normal") {
      assert.equal(res.code, 0, transcript(res));
      const runDir = /^Saving traces to (.+)$/m.exec(res.stderr)![1];
      const [trace] = (await Deno.readTextFile(join(runDir, "traces.jsonl"))).trim().split("\n")
        .map((l) => JSON.parse(l));
      assert.equal(trace.reward, 1, JSON.stringify(trace.error));
    } else if (ending === "crash") {
      assert.equal(res.code, 1, transcript(res));
      assert.match(res.stderr, /vf-test-crash/, transcript(res));
    } else if (ending === "error") {
      assert.equal(res.code, 1, transcript(res));
      assert.match(res.stderr + res.stdout, /Toolset "hold" did not start or list its tools/);
    } else {
      assert.notEqual(res.code, 0, transcript(res));
    }
    // vf has exited: nothing of the tree may be left (a SIGKILL lands at once; allow a moment
    // for the kernel to finish the processes).
    await waitFor("the tree to end", () => tree.every((pid) => !alive(pid)), 10_000).catch(
      () => {},
    );
    const left = tree.filter(alive);
    assert.deepEqual(left, [], `pids of the server tree still running after vf exited`);
  } finally {
    // On failure, end what this test started (by pid).
    for (const pid of tree.length ? tree : await readPids(pids)) {
      try {
        Deno.kill(pid, "SIGKILL");
      } catch {
        // gone
      }
    }
    try {
      child.kill("SIGKILL");
    } catch {
      // exited
    }
    await child.status;
  }
}

Deno.test("a stdio toolset's process tree (sh -c launcher, children in and out of its group, all ignoring SIGTERM) is gone after vf ends normally", async () => {
  await endsWithVf("normal");
});

Deno.test("a stdio toolset's process tree is gone after its handshake fails and vf exits with an error", async () => {
  await endsWithVf("error");
});

Deno.test("a stdio toolset's process tree is gone after vf crashes on an exception nothing caught", async () => {
  await endsWithVf("crash");
});

Deno.test("a stdio toolset's process tree is gone after vf is interrupted by SIGINT", async () => {
  await endsWithVf("SIGINT");
});

Deno.test("a stdio toolset's process tree is gone after vf is stopped by SIGTERM", async () => {
  await endsWithVf("SIGTERM");
});

Deno.test("a stdio toolset's process tree is gone after vf's terminal hangs up (SIGHUP)", async () => {
  await endsWithVf("SIGHUP");
});

Deno.test("a stdio toolset server that exits by itself takes the rest of its group with it while vf runs on", async () => {
  await using tmp = await tempDir("vf_tools_quit_");
  const pids = join(tmp.path, "pids");
  await using model = await startModelServer({
    responder: ({ body }) => {
      const turn = body.messages.filter((m: WireMessage) => m.role === "assistant").length;
      return turn === 0
        ? { content: null, tool_calls: [{ name: "hold_quit", arguments: {} }] }
        : { hang: true };
    },
  });
  await Deno.writeTextFile(join(tmp.path, "server.py"), SERVER);
  await Deno.writeTextFile(join(tmp.path, "pings.ts"), TASKSET);
  // python3 itself is the server (the leader); its sleep stays in its group when it quits.
  await Deno.writeTextFile(
    join(tmp.path, "run.toml"),
    toml(model.url, pids, "good").replace(
      /command = "sh"\nargs = .*\n/,
      `command = "python3"\nargs = ["-u", "server.py"]\n`,
    ),
  );
  const child = cliCommand(["eval", "@", "run.toml", "-o", "out"], {
    cwd: tmp.path,
    env: {},
    registry: false,
  }).spawn();
  const result = collect(child);
  let exited = false;
  result.finally(() => (exited = true)).catch(() => {});
  let tree: number[] = [];
  try {
    await waitFor(
      "the server to quit and the model to be asked again",
      async () =>
        exited || ((tree = await readPids(pids)).length === 2 && model.requests.length >= 2),
    );
    if (exited) assert.fail(`vf ended before the check\n${transcript(await result)}`);
    const [server, sleeper] = tree;
    await waitFor("the server to exit", () => !alive(server), 30_000);
    // The server's child is ended while vf still runs (the rollout waits on the model).
    await waitFor("the server's child to end", () => !alive(sleeper), 30_000).catch(() => {});
    assert.equal(exited, false, "vf is still running");
    assert.equal(alive(sleeper), false, `the server's child ${sleeper} outlived the server`);
    child.kill("SIGTERM");
    await result;
  } finally {
    for (const pid of tree) {
      try {
        Deno.kill(pid, "SIGKILL");
      } catch {
        // gone
      }
    }
    try {
      child.kill("SIGKILL");
    } catch {
      // exited
    }
    await child.status;
  }
});
