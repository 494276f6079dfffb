/**
 * On a dedicated ssh host nothing of a sandbox outlives it: an agent's daemon that left its
 * command's tree (`setsid` and a double fork, reparented to init, ignoring SIGTERM) is killed
 * by `killProcesses()` and, before the host is handed on, by `stop()`, so the next sandbox on
 * the host (an isolated grader) never meets it. Real sshd test hosts (tests/_sshd_hosts.ts).
 * @module
 */
import assert from "node:assert/strict";
import { type SshdHost, sshSpecFor, startSshdHost } from "./_sshd_hosts.ts";
import { SshRuntime } from "../runtimes/mod.ts";
import { traitsOf } from "../runtimes/config.ts";

const host: SshdHost = await startSshdHost();
globalThis.addEventListener("unload", () => host.closeSync());

/**
 * Starts a daemon (its own session, its parent gone, SIGTERM ignored) that writes its pid to
 * `file`, then rewrites `target` every 100 ms.
 */
async function startDaemon(rt: SshRuntime, file: string, target: string): Promise<void> {
  await rt.write(
    `${file}.sh`,
    `trap "" TERM HUP\necho $$ > ${file}\nwhile :; do echo planted > ${target}; sleep 0.1; done\n`,
  );
  const r = await rt.run([
    "sh",
    "-c",
    `setsid sh -c 'sh ${file}.sh </dev/null >/dev/null 2>&1 &'`,
  ]);
  assert.equal(r.exit_code, 0, r.stderr);
}

/** Whether `pid` runs on the host (and is not a zombie). */
async function alive(pid: string): Promise<boolean> {
  const r = await host.exec(["sh", "-c", `awk '/^State:/ { print $2 }' /proc/${pid}/status`]);
  return r.code === 0 && /^[^ZX\s]/.test(r.stdout.trim());
}

async function pidFrom(rt: SshRuntime, file: string): Promise<string> {
  for (let i = 0; i < 200; i++) {
    const r = await rt.run(["cat", file]);
    if (r.exit_code === 0 && /^\d+$/.test(r.stdout.trim())) return r.stdout.trim();
    await new Promise((resolve) => setTimeout(resolve, 50));
  }
  throw new Error(`the daemon never wrote ${file}`);
}

Deno.test("dedicated ssh host: a setsid double-fork daemon of the agent is gone once its sandbox stops, and the next sandbox's files stay its own", async () => {
  const spec = sshSpecFor(host, { dedicated: true });
  assert.equal(traitsOf(spec).killProcesses, true);
  const agent = new SshRuntime(spec);
  await agent.start();
  let pid = "";
  try {
    assert.equal(agent.capabilities.kill_processes, true);
    await startDaemon(agent, "/tmp/vf-sweep-pid-a", "/tmp/vf-sweep-verdict-a");
    pid = await pidFrom(agent, "/tmp/vf-sweep-pid-a");
    assert.ok(await alive(pid), "the daemon runs");
  } finally {
    await agent.stop();
  }
  assert.equal(await alive(pid), false, `the agent's daemon ${pid} outlived its sandbox`);
  // The grader's sandbox on the same host: its verdict is not rewritten behind its back.
  const grader = new SshRuntime(spec);
  await grader.start();
  try {
    await grader.write("/tmp/vf-sweep-verdict-a", "no\n");
    await new Promise((resolve) => setTimeout(resolve, 500));
    assert.equal((await grader.run(["cat", "/tmp/vf-sweep-verdict-a"])).stdout, "no\n");
  } finally {
    await grader.stop();
    await host.exec([
      "rm",
      "-f",
      "/tmp/vf-sweep-pid-a",
      "/tmp/vf-sweep-pid-a.sh",
      "/tmp/vf-sweep-verdict-a",
    ]);
  }
});

Deno.test("dedicated ssh host: killProcesses() ends the sandbox's daemon and nothing else, and the sandbox still runs commands", async () => {
  const spec = sshSpecFor(host, { dedicated: true });
  // A process on the host that is not the sandbox's: it must survive the sweep.
  await host.exec([
    "sh",
    "-c",
    "setsid sleep 600 </dev/null >/dev/null 2>&1 & echo $! > /tmp/vf-sweep-other",
  ]);
  const other = (await host.exec(["cat", "/tmp/vf-sweep-other"])).stdout.trim();
  const rt = new SshRuntime(spec);
  await rt.start();
  try {
    await startDaemon(rt, "/tmp/vf-sweep-pid-b", "/tmp/vf-sweep-verdict-b");
    const pid = await pidFrom(rt, "/tmp/vf-sweep-pid-b");
    assert.ok(await alive(pid), "the daemon runs");
    await rt.killProcesses!();
    assert.equal(await alive(pid), false, "the daemon survived killProcesses()");
    assert.ok(await alive(other), "a process that is not the sandbox's was killed");
    const after = await rt.run(["echo", "still here"]);
    assert.equal(after.stdout, "still here\n");
  } finally {
    await rt.stop();
    const other = (await host.exec(["cat", "/tmp/vf-sweep-other"])).stdout.trim();
    if (other) await host.exec(["kill", "-9", other]);
    await host.exec([
      "rm",
      "-f",
      "/tmp/vf-sweep-pid-b",
      "/tmp/vf-sweep-pid-b.sh",
      "/tmp/vf-sweep-verdict-b",
      "/tmp/vf-sweep-other",
    ]);
  }
});

Deno.test("shared ssh host: killProcesses() is not offered", async () => {
  const rt = new SshRuntime(sshSpecFor(host));
  await rt.start();
  try {
    assert.equal(rt.capabilities.kill_processes, false);
    assert.equal(traitsOf(rt.spec).killProcesses, false);
    await assert.rejects(rt.killProcesses!(), /is shared \(not dedicated\)/);
  } finally {
    await rt.stop();
  }
});
