/**
 * The permission sandbox's host process never outlives vf: environment code may keep its
 * event loop busy (a timer) and listen for SIGTERM without any permission, so the host ends
 * when the evaluator closes the channel, and is killed after a grace period otherwise. The
 * real CLI runs a local environment with `--sandbox` and is stopped by one SIGTERM, or by two
 * (vf then exits at once, without closing the host); afterwards the host's pid is gone.
 * @module
 */
import assert from "node:assert/strict";
import { join } from "node:path";
import { startModelServer } from "./model_server.ts";
import { cliCommand, collect, MOD_URL, tempDir, transcript } from "./_cli.ts";

const ENV = `
import { Rubric, SingleTurnEnv } from "${MOD_URL}";
// What sandboxed code may do without a permission: stay busy and ignore SIGTERM.
setInterval(() => {}, 1000);
Deno.addSignalListener("SIGTERM", () => {});
export function loadEnvironment() {
  return new SingleTurnEnv({
    evalDataset: [{ question: "hi", answer: "" }],
    rubric: new Rubric({ funcs: [function one() { return 1; }] }),
  });
}
`;

function statOf(pid: number): { ppid: number; state: string } | undefined {
  try {
    const text = Deno.readTextFileSync(`/proc/${pid}/stat`);
    const fields = text.slice(text.lastIndexOf(")") + 2).split(" ");
    return { state: fields[0], ppid: Number(fields[1]) };
  } catch {
    return undefined;
  }
}

function alive(pid: number): boolean {
  const stat = statOf(pid);
  return stat !== undefined && stat.state !== "Z";
}

function childrenOf(parent: number): number[] {
  const out: number[] = [];
  for (const entry of Deno.readDirSync("/proc")) {
    if (/^\d+$/.test(entry.name) && statOf(Number(entry.name))?.ppid === parent) {
      out.push(Number(entry.name));
    }
  }
  return out;
}

async function waitFor(what: string, ok: () => boolean, ms: number) {
  const deadline = Date.now() + ms;
  while (!ok()) {
    if (Date.now() > deadline) throw new Error(`timed out waiting for ${what}`);
    await new Promise((r) => setTimeout(r, 100));
  }
}

async function stopWith(signals: number) {
  await using tmp = await tempDir("vf_sandbox_exit_");
  await Deno.mkdir(join(tmp.path, "busy_env"));
  await Deno.writeTextFile(join(tmp.path, "busy_env", "mod.ts"), ENV);
  await using model = await startModelServer({ responder: () => ({ hang: true }) });
  const child = cliCommand(
    ["eval", "./busy_env", "-m", "m", "-b", model.url, "-n", "1", "-r", "1", "--sandbox"],
    { cwd: tmp.path, env: { HOME: tmp.path } },
  ).spawn();
  const result = collect(child);
  let exited = false;
  result.finally(() => (exited = true)).catch(() => {});
  let hosts: number[] = [];
  try {
    // The host runs the environment once the model is asked.
    await waitFor("the first model request", () => exited || model.requests.length > 0, 120_000);
    if (exited) assert.fail(`vf ended before it was signalled\n${transcript(await result)}`);
    hosts = childrenOf(child.pid);
    assert.equal(hosts.length, 1, `one host process under vf, got ${hosts}`);
    child.kill("SIGTERM");
    if (signals === 2) {
      await new Promise((r) => setTimeout(r, 50));
      try {
        child.kill("SIGTERM");
      } catch {
        // vf already exited
      }
    }
    // Generous: vf winds its run down first (the machine may be loaded).
    await waitFor("vf to exit after the signal", () => exited, 90_000);
    const res = await result;
    assert.notEqual(res.code, 0, transcript(res));
    await waitFor("the host to end", () => !alive(hosts[0]), 10_000).catch(() => {});
    assert.equal(alive(hosts[0]), false, `the sandbox host ${hosts[0]} outlived vf`);
  } finally {
    for (const pid of hosts) {
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

Deno.test("a sandboxed environment that stays busy and ignores SIGTERM does not keep its host alive after vf stops on SIGTERM", async () => {
  await stopWith(1);
});

Deno.test("the sandbox host ends when vf exits at once on a second SIGTERM, without closing it", async () => {
  await stopWith(2);
});
