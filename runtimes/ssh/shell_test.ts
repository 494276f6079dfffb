/**
 * The kill scripts run by /bin/sh on this machine against real process trees: both ways of
 * finding descendants (the kernel's children lists, and the PPid walk over /proc used where
 * there are none) kill every process of the tree, including one in a session of its own, and
 * return only once they are gone.
 */

import assert from "node:assert/strict";
import { killScript } from "../_sweep.ts";

/** Pids of the live (not zombie) processes whose command line is `sleep <marker>`. */
function sleepers(marker: number): number[] {
  const found: number[] = [];
  for (const entry of Deno.readDirSync("/proc")) {
    if (!/^\d+$/.test(entry.name)) continue;
    try {
      const cmdline = Deno.readTextFileSync(`/proc/${entry.name}/cmdline`);
      if (cmdline === `sleep\0${marker}\0`) found.push(Number(entry.name));
    } catch {
      // exited meanwhile
    }
  }
  return found;
}

/**
 * Starts a tree below a fresh process-group leader: background sleeps, one in a subshell,
 * one in a session of its own (it left the group, but is still a descendant), and a
 * foreground one. Resolves once all four sleeps run.
 */
async function startTree(marker: number) {
  const tree = `sleep ${marker} & (sleep ${marker}; :) & setsid sleep ${marker} & sleep ${marker}`;
  const leader = new Deno.Command("setsid", {
    args: ["sh", "-c", `sh -c '${tree}' & wait`],
    stdout: "null",
    stderr: "null",
  }).spawn();
  for (let i = 0; sleepers(marker).length < 4; i++) {
    assert.ok(i < 500, `the tree did not start: ${sleepers(marker).length} sleeps`);
    await new Promise((r) => setTimeout(r, 10));
  }
  return leader;
}

async function runKill(script: string, pid: number): Promise<number> {
  const { code } = await new Deno.Command("/bin/sh", {
    args: ["-c", script, "vf", String(pid)],
    stdout: "null",
    stderr: "null",
  }).output();
  return code;
}

/** Runs `body` on a fresh tree; whatever of it is left afterwards is killed. */
async function withTree(body: (marker: number, leader: Deno.ChildProcess) => Promise<void>) {
  const marker = 10_000 + Math.floor(Math.random() * 50_000);
  const leader = await startTree(marker);
  try {
    await body(marker, leader);
  } finally {
    for (const pid of sleepers(marker)) Deno.kill(pid, "SIGKILL");
    try {
      leader.kill("SIGKILL");
    } catch {
      // already gone
    }
  }
}

for (const childrenLists of [true, false]) {
  const how = childrenLists ? "children lists" : "the /proc walk";

  Deno.test(`kill script (${how}): a tree is gone, its root too, when the script returns`, () =>
    withTree(async (marker, leader) => {
      assert.equal(await runKill(killScript(true, childrenLists), leader.pid), 0);
      assert.deepEqual(sleepers(marker), []);
      const status = await leader.status;
      assert.equal(status.signal, "SIGKILL");
    }));

  Deno.test(`kill script (${how}): below a supervisor, everything but the supervisor`, () =>
    withTree(async (marker, leader) => {
      assert.equal(await runKill(killScript(false, childrenLists), leader.pid), 0);
      assert.deepEqual(sleepers(marker), []);
      // The supervisor (here the leader shell waiting for its child) lives on, and sees its
      // child end by the kill.
      const status = await leader.status;
      assert.equal(status.code, 0, "the supervisor ended on its own, not killed");
    }));
}
