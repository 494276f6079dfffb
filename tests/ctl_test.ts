/**
 * `vf ctl` against a real running `vf eval` on a loopback model: status, pause (in-flight
 * rollouts finish, no new ones start), a concurrency change down and up, resume; every action
 * lands in metadata.json and the run completes with all its rollouts.
 * @module
 */
import assert from "node:assert/strict";
import { join } from "node:path";
import { loadExampleDataset } from "../lib/data/examples.ts";
import { stripControl } from "../lib/cli/ctl.ts";
import { lastUserText, startModelServer } from "./model_server.ts";
import { cliCommand, collect, runCli, tempDir, transcript } from "./_cli.ts";

const ANSWERS = new Map(
  (loadExampleDataset("gsm8k-sample", { split: "test" }).toList() as Array<
    { question: string; answer: string }
  >).map((r) => [r.question, r.answer]),
);

async function until(what: string, check: () => boolean | Promise<boolean>, timeoutMs = 120_000) {
  const deadline = Date.now() + timeoutMs;
  while (!(await check())) {
    if (Date.now() > deadline) throw new Error(`timed out waiting for ${what}`);
    await new Promise((r) => setTimeout(r, 50));
  }
}

Deno.test("vf ctl pauses, resumes and changes the concurrency of a running vf eval, each action in its metadata", async () => {
  await using tmp = await tempDir("vf_ctl_");
  const ctlDir = join(tmp.path, "ctl");
  let inFlight = 0;
  let started = 0;
  /** The most requests in flight at once since the last reset. */
  let peak = 0;
  /**
   * While set, requests wait here: the run cannot finish while a ctl command starts (a second
   * or more at a load of 10), and how many pile up is what the run's limit lets through.
   */
  let open!: () => void;
  let gate: Promise<void> | null = new Promise<void>((r) => (open = r));
  await using model = await startModelServer({
    responder: async (request) => {
      started++;
      peak = Math.max(peak, ++inFlight);
      try {
        if (gate) await gate;
        await new Promise((r) => setTimeout(r, 300));
        return { content: `\\boxed{${ANSWERS.get(lastUserText(request)) ?? "0"}}` };
      } finally {
        inFlight--;
      }
    },
  });
  const env = { VF_CTL_DIR: ctlDir };
  const child = cliCommand(
    ["eval", "gsm8k", "-m", "m", "-b", model.url, "-n", "40", "-r", "1", "-c", "4", "-o", "out"],
    { cwd: tmp.path, env, registry: false },
  ).spawn();
  const ctl = (...args: string[]) =>
    runCli(["ctl", ...args], { cwd: tmp.path, env, registry: false });
  try {
    await until("the control socket", async () => {
      try {
        return (await Array.fromAsync(Deno.readDir(ctlDir))).some((e) => e.name.endsWith(".sock"));
      } catch {
        return false;
      }
    });
    await until("the first requests", () => started > 0);
    // Owner-only: the folder 0700, the socket 0600.
    const [sock] = (await Array.fromAsync(Deno.readDir(ctlDir))).map((e) => e.name);
    assert.equal((await Deno.stat(ctlDir)).mode! & 0o777, 0o700);
    assert.equal((await Deno.lstat(join(ctlDir, sock))).mode! & 0o777, 0o600);

    const status = await ctl("status");
    assert.equal(status.code, 0, transcript(status));
    assert.match(status.stdout, /in flight \d+ {2}queued \d+ {2}done \d+\/40 {2}errors 0/);
    assert.match(status.stdout, /max_concurrent 4/);

    // Pause: what is in flight finishes, nothing new starts.
    const paused = await ctl("pause");
    assert.equal(paused.code, 0, transcript(paused));
    assert.match(paused.stdout, /PAUSED/);
    gate = null;
    open();
    await until("in-flight requests to finish", () => inFlight === 0);
    const atPause = started;
    await new Promise((r) => setTimeout(r, 1500));
    assert.equal(started, atPause, "no request started while the run was paused");
    assert.ok(atPause < 40, `the run was paused before it finished (${atPause} started)`);

    // Down to one at a time, then resume.
    assert.equal((await ctl("concurrency", "1")).code, 0);
    peak = 0;
    assert.equal((await ctl("resume")).code, 0);
    await until("two more requests", () => started >= atPause + 2);
    assert.equal(peak, 1, "with max_concurrent 1 one request runs at a time");

    // Up past the starting -c 4, with requests held at the server again meanwhile.
    gate = new Promise<void>((r) => (open = r));
    peak = inFlight;
    const raised = await ctl("concurrency", "8");
    assert.match(raised.stdout, /max_concurrent 8/);
    await until("more than four requests at once", () => peak > 4, 60_000);
    assert.ok(peak <= 8, `max_concurrent 8 let ${peak} run at once`);
    gate = null;
    open();

    const res = await collect(child);
    assert.equal(res.code, 0, transcript(res));
    const dir = /^Saving results to (.+)$/m.exec(res.stderr)![1];
    const meta = JSON.parse(await Deno.readTextFile(join(dir, "metadata.json")));
    assert.deepEqual(
      meta.control.actions.map((a: { action: string; max_concurrent?: number }) =>
        a.max_concurrent ? `${a.action} ${a.max_concurrent}` : a.action
      ),
      ["pause", "set 1", "resume", "set 8"],
    );
    assert.equal(meta.control.paused, false);
    assert.equal(meta.num_rollouts, 40);
    const lines = (await Deno.readTextFile(join(dir, "results.jsonl"))).trim().split("\n");
    assert.equal(lines.length, 40);
    // The socket goes with the run.
    assert.deepEqual(await Array.fromAsync(Deno.readDir(ctlDir)), []);
    const gone = await ctl("status");
    assert.equal(gone.code, 1);
    assert.match(gone.stderr, /no run has a control socket/);
  } finally {
    try {
      child.kill();
    } catch { /* already ended */ }
  }
});

Deno.test("stripControl() removes terminal escapes and control characters a run's strings may carry", () => {
  assert.equal(
    stripControl("ok\x1b[2J\x1b]0;pwned\x07 run\x1b[31m red\x00\x7f\x9b"),
    "ok run red",
  );
  assert.equal(stripControl("tab\tand newline\n kept"), "tab\tand newline\n kept");
});
