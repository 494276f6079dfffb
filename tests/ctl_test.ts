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
import { RunControl, serveControl } from "../lib/eval/control.ts";
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
      meta.control.actions.map((a: { action: string; args: { max_concurrent?: number } }) =>
        a.args.max_concurrent ? `${a.action} ${a.args.max_concurrent}` : a.action
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

Deno.test("vf ctl status --stall N lists the rollouts of a running vf eval held at the model, by example, with what they last did", async () => {
  await using tmp = await tempDir("vf_ctl_stall_");
  const ctlDir = join(tmp.path, "ctl");
  let started = 0;
  let open!: () => void;
  const gate = new Promise<void>((r) => (open = r));
  await using model = await startModelServer({
    responder: async (request) => {
      started++;
      await gate;
      return { content: `\\boxed{${ANSWERS.get(lastUserText(request)) ?? "0"}}` };
    },
  });
  const env = { VF_CTL_DIR: ctlDir };
  const child = cliCommand(
    ["eval", "gsm8k", "-m", "m", "-b", model.url, "-n", "4", "-r", "1", "-c", "2", "-o", "out"],
    { cwd: tmp.path, env, registry: false },
  ).spawn();
  const ctl = async (...a: string[]) => {
    const res = await runCli(["ctl", ...a], { cwd: tmp.path, env, registry: false });
    assert.equal(res.code, 0, transcript(res));
    return res.stdout;
  };
  try {
    await until("two requests at the model", () => started === 2);
    assert.match(await ctl("status"), /0 of 2 rollouts in flight with no progress for 60s or more/);
    let status = "";
    await until(
      "both idle for 2 s",
      async () =>
        /2 of 2 rollouts in flight with no progress for 2s or more/.test(
          status = await ctl("status", "--stall", "2"),
        ),
      60_000,
    );
    const stalled = [
      ...status.matchAll(/stalled example (\d+) {2}last model call {2}idle (\d+)s/g),
    ];
    assert.equal(stalled.length, 2, status);
    assert.notEqual(stalled[0][1], stalled[1][1]);
    for (const m of stalled) assert.ok(Number(m[2]) >= 2, status);
    const bad = await runCli(["ctl", "status", "--stall", "soon"], {
      cwd: tmp.path,
      env,
      registry: false,
    });
    assert.equal(bad.code, 2);
    assert.match(bad.stderr, /--stall needs seconds ≥ 0, got "soon"/);
    open();
    const res = await collect(child);
    assert.equal(res.code, 0, transcript(res));
  } finally {
    open();
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

Deno.test("vf ctl pause --now sends in-flight rollouts back to the queue and requeue runs errored ones again, the results keeping the retries", async () => {
  await using tmp = await tempDir("vf_ctl_now_");
  const ctlDir = join(tmp.path, "ctl");
  const rows = loadExampleDataset("gsm8k-sample", { split: "test" }).toList() as Array<
    { question: string; answer: string }
  >;
  /** Calls per question, and requests in flight at the server. */
  const calls = new Map<string, number>();
  let inFlight = 0;
  let started = 0;
  /** Requests wait here while set (every one, then only the last example's). */
  let openAll!: () => void;
  let holdAll: Promise<void> | null = new Promise<void>((r) => (openAll = r));
  let openLast!: () => void;
  const holdLast = new Promise<void>((r) => (openLast = r));
  const last = rows[11].question;
  /** Questions whose calls fail with HTTP 400 (a rollout error nothing retries). */
  const failing = new Set<string>();
  await using model = await startModelServer({
    responder: async (request) => {
      const q = lastUserText(request);
      calls.set(q, (calls.get(q) ?? 0) + 1);
      started++;
      inFlight++;
      try {
        if (holdAll) await holdAll;
        if (q === last) await holdLast;
        if (failing.has(q)) return { status: 400, body: "the test refuses this question" };
        return { content: `\\boxed{${ANSWERS.get(q) ?? "0"}}` };
      } finally {
        inFlight--;
      }
    },
  });
  const env = { VF_CTL_DIR: ctlDir };
  const args = ["eval", "gsm8k", "-m", "m", "-b", model.url, "-n", "12", "-r", "1", "-c", "4"];
  const child = cliCommand([...args, "-o", "out"], { cwd: tmp.path, env, registry: false })
    .spawn();
  const ctl = (...a: string[]) => runCli(["ctl", ...a], { cwd: tmp.path, env, registry: false });
  const status = async () => {
    const s = await ctl("status");
    assert.equal(s.code, 0, transcript(s));
    return s.stdout;
  };
  try {
    // Four rollouts in flight, held at the server: pause now interrupts them.
    await until("four requests at the server", () => started >= 4);
    const paused = await ctl("pause", "--now");
    assert.equal(paused.code, 0, transcript(paused));
    assert.match(paused.stdout, /PAUSED/);
    await until(
      "the interrupted rollouts back in the queue",
      async () => /in flight 0 .*done 0\/12 {2}errors 0 {2}interrupted 4/.test(await status()),
    );
    const first = [...calls.keys()];
    assert.equal(first.length, 4);
    // The first two of them fail when they run again; the last example is held meanwhile.
    failing.add(first[0]).add(first[1]);
    holdAll = null;
    openAll();
    await new Promise((r) => setTimeout(r, 1000));
    assert.equal(started, 4, "nothing starts while paused");
    assert.equal((await ctl("resume")).code, 0);
    await until(
      "every example but the held one",
      async () => /in flight 1 .*done 11\/12 {2}errors 2 /.test(await status()),
    );
    for (const q of first) assert.equal(calls.get(q), 2, "an interrupted rollout ran again");

    // Requeue: the two errored rollouts run again, and succeed this time.
    failing.clear();
    const requeued = await ctl("requeue");
    assert.equal(requeued.code, 0, transcript(requeued));
    assert.match(requeued.stdout, /requeued 2/);
    await until(
      "the retried rollouts",
      async () => /in flight 1 .*done 11\/12 {2}errors 0 /.test(await status()),
    );
    assert.equal(calls.get(first[0]), 3);
    openLast();

    const res = await collect(child);
    assert.equal(res.code, 0, transcript(res));
    const dir = /^Saving results to (.+)$/m.exec(res.stderr)![1];
    const meta = JSON.parse(await Deno.readTextFile(join(dir, "metadata.json")));
    assert.deepEqual(
      meta.control.actions.map((a: { action: string; args: Record<string, unknown> }) =>
        `${a.action} ${JSON.stringify(a.args)}`
      ),
      ['pause {"mode":"now","in_flight":4}', "resume {}", 'requeue {"rollouts":2}'],
    );
    assert.equal(meta.control.interrupted, 4);
    assert.equal(meta.control.requeued, 2);
    // Counted once each: twelve rollouts, none errored, every one right.
    assert.equal(meta.num_rollouts, 12);
    assert.equal(meta.num_errors, 0);
    assert.equal(meta.avg_reward, 1);
    // The file keeps the errored lines; the retries come later and name what they replace.
    const lines = (await Deno.readTextFile(join(dir, "results.jsonl"))).trim().split("\n")
      .map((l) => JSON.parse(l));
    assert.equal(lines.length, 14);
    const errored = lines.filter((o) => o.error);
    assert.equal(errored.length, 2);
    const retries = lines.filter((o) => o.retry_of);
    assert.deepEqual(
      retries.map((o) => o.retry_of).sort(),
      errored.map((o) => o.trajectory_id).sort(),
    );
    for (const r of retries) assert.ok(lines.indexOf(r) > lines.indexOf(errored[0]));
    assert.equal(new Set(lines.filter((o) => !o.error).map((o) => o.example_id)).size, 12);

    // --resume reads the latest per rollout: the run is complete, nothing runs again.
    const before = started;
    const again = await runCli([...args, "--resume", dir], { cwd: tmp.path, env, registry: false });
    assert.equal(again.code, 0, transcript(again));
    assert.equal(started, before, "a finished run resumes with nothing to do");
    assert.doesNotMatch(again.stderr, /left out/);
    const resumed = JSON.parse(await Deno.readTextFile(join(dir, "metadata.json")));
    assert.equal(resumed.num_rollouts, 12);
    assert.equal(resumed.num_errors, 0);
  } finally {
    openAll();
    openLast();
    try {
      child.kill();
    } catch { /* already ended */ }
  }
});

Deno.test("vf ctl steers a vf run (file-sum in Docker): pause --now, new sandbox limit and agent timeout, requeue of the timed-out rollouts, with no run id given", async () => {
  await using tmp = await tempDir("vf_ctl_run_");
  const ctlDir = join(tmp.path, "ctl");
  let started = 0;
  /**
   * Requests at the server and the most at once, per phase of the test: a request the run
   * gave up on (interrupted, timed out) stays held at the server, counted in its own phase.
   */
  let phase = 0;
  const live = new Map<number, number>();
  const peaks = new Map<number, number>();
  /** Every request waits here while set: first to be interrupted, then to time out. */
  let openHeld!: () => void;
  let held: Promise<void> | null = new Promise<void>((r) => (openHeld = r));
  await using model = await startModelServer({
    responder: async ({ body }) => {
      started++;
      const p = phase;
      live.set(p, (live.get(p) ?? 0) + 1);
      peaks.set(p, Math.max(peaks.get(p) ?? 0, live.get(p)!));
      try {
        if (held) await held;
        await new Promise((r) => setTimeout(r, 300));
        const turn = body.messages.filter((m) => m.role === "assistant").length;
        const commands = [
          "cat /app/input.txt",
          "awk '{ s += $1 } END { print s }' /app/input.txt > /app/output/answer.txt",
        ];
        return turn < commands.length
          ? {
            content: null,
            tool_calls: [{ name: "bash", arguments: { command: commands[turn] } }],
          }
          : { content: "Done." };
      } finally {
        live.set(p, live.get(p)! - 1);
      }
    },
  });
  const env = { VF_CTL_DIR: ctlDir };
  const child = cliCommand(
    [
      "run",
      "file-sum",
      "-m",
      "m",
      "-b",
      model.url,
      "-n",
      "5",
      "-r",
      "1",
      "-c",
      "2",
      "-o",
      "out",
      "--limits.max_sandboxes",
      "2",
    ],
    { cwd: tmp.path, env, registry: false, docker: true },
  ).spawn();
  const ctl = async (...a: string[]) => {
    const res = await runCli(["ctl", ...a], { cwd: tmp.path, env, registry: false });
    assert.equal(res.code, 0, transcript(res));
    return res.stdout;
  };
  const traceLines = async (dir: string) => {
    const text = await Deno.readTextFile(join(dir, "traces.jsonl")).catch(() => "");
    return text.trim() ? text.trim().split("\n").map((l) => JSON.parse(l)) : [];
  };
  let dir = "";
  try {
    await until("two rollouts at the model", () => live.get(0) === 2, 240_000);
    const status = await ctl("status");
    assert.match(
      status,
      /settings max_concurrent=2 max_sandboxes=2 sandbox_create_rate=- timeout\.setup=- timeout\.agent=-/,
    );
    let last = "";
    // Pause now: both rollouts are interrupted, nothing is written.
    assert.match(await ctl("pause", "--now"), /PAUSED/);
    await until(
      "the interrupted rollouts back in the queue",
      async () =>
        /in flight 0 .*done 0\/5 {2}errors 0 {2}interrupted 2/.test(last = await ctl("status")),
    ).catch((error) => {
      throw new Error(`${error.message}; the last status:\n${last}`);
    });
    const runs = (await Array.fromAsync(Deno.readDir(join(tmp.path, "out", "evals"))))
      .map((e) => e.name);
    const base = join(tmp.path, "out", "evals", runs[0]);
    dir = join(base, (await Array.fromAsync(Deno.readDir(base)))[0].name);
    assert.deepEqual(await traceLines(dir), [], "an interrupted rollout is not a result");

    // One sandbox at a time and four seconds for the agent; the model hangs, so the next
    // rollout times out. Paused again after it starts: what times out is what was in flight.
    const set = await ctl("set", "max_sandboxes=1", "sandbox_create_rate=50", "timeout.agent=4");
    assert.match(set, /max_sandboxes=1 sandbox_create_rate=50 timeout\.setup=- timeout\.agent=4/);
    phase = 1;
    const before = started;
    await ctl("resume");
    await until("a rollout at the model again", () => started > before);
    await ctl("pause");
    await until("the timed-out rollouts", async () => {
      const s = await ctl("status");
      return /in flight 0 /.test(s) && !/errors 0 /.test(s);
    });
    const timedOut = await traceLines(dir);
    assert.ok(timedOut.length >= 1);
    for (const t of timedOut) assert.match(t.error.message, /Phase "agent" timed out after 4s/);

    // The model answers again; the timed-out rollouts run again with a longer limit.
    held = null;
    openHeld();
    await ctl("set", "timeout.agent=600");
    const requeued = await ctl("requeue");
    assert.match(requeued, new RegExp(`requeued ${timedOut.length}`));
    phase = 2;
    await ctl("resume");

    const res = await collect(child);
    assert.equal(res.code, 0, transcript(res));
    // Two would run at once (-c 2) but for max_sandboxes=1.
    assert.equal(peaks.get(2), 1, "max_sandboxes=1 lets one rollout run at a time");
    const lines = await traceLines(dir);
    assert.equal(lines.length, 5 + timedOut.length);
    // The file ends with the retries: each task's last line is a success.
    const latest = new Map(lines.map((t) => [t.task.key, t]));
    assert.equal(latest.size, 5);
    for (const t of latest.values()) assert.equal(t.reward, 1, JSON.stringify(t.error));
    const meta = JSON.parse(await Deno.readTextFile(join(dir, "metadata.json")));
    assert.equal(meta.num_rollouts, 5);
    assert.equal(meta.num_errors, 0);
    assert.equal(meta.avg_reward, 1);
    assert.deepEqual(
      meta.control.actions.map((a: { action: string; args: Record<string, unknown> }) =>
        `${a.action} ${JSON.stringify(a.args)}`
      ),
      [
        'pause {"mode":"now","in_flight":2}',
        'set {"max_sandboxes":1,"sandbox_create_rate":50,"timeout.agent":4}',
        "resume {}",
        'pause {"mode":"after"}',
        'set {"timeout.agent":600}',
        `requeue {"rollouts":${timedOut.length}}`,
        "resume {}",
      ],
    );
    assert.equal(meta.control.interrupted, 2);
  } finally {
    openHeld();
    try {
      child.kill();
    } catch { /* already ended */ }
  }
});

Deno.test("vf ctl on a running vf run (file-sum in Docker): status --stall lists the rollouts held at the model; max_model_connections and max_total_tokens set mid-run apply to the calls and rollouts after", async () => {
  await using tmp = await tempDir("vf_ctl_knobs_");
  const ctlDir = join(tmp.path, "ctl");
  /** Requests at the server and the most at once, per phase of the test. */
  let phase = 0;
  const live = new Map<number, number>();
  const peaks = new Map<number, number>();
  let openHeld!: () => void;
  let held: Promise<void> | null = new Promise<void>((r) => (openHeld = r));
  await using model = await startModelServer({
    responder: async ({ body }) => {
      const p = phase;
      live.set(p, (live.get(p) ?? 0) + 1);
      peaks.set(p, Math.max(peaks.get(p) ?? 0, live.get(p)!));
      try {
        if (held) await held;
        await new Promise((r) => setTimeout(r, 200));
        const turn = body.messages.filter((m) => m.role === "assistant").length;
        const commands = [
          "cat /app/input.txt",
          "awk '{ s += $1 } END { print s }' /app/input.txt > /app/output/answer.txt",
        ];
        return turn < commands.length
          ? {
            content: null,
            tool_calls: [{ name: "bash", arguments: { command: commands[turn] } }],
          }
          : { content: "Done." };
      } finally {
        live.set(p, live.get(p)! - 1);
      }
    },
  });
  const env = { VF_CTL_DIR: ctlDir };
  const child = cliCommand(
    [
      "run",
      "file-sum",
      "-m",
      "m",
      "-b",
      model.url,
      "-n",
      "5",
      "-r",
      "1",
      "-c",
      "3",
      "-o",
      "out",
      "--limits.max_model_connections",
      "3",
    ],
    { cwd: tmp.path, env, registry: false, docker: true },
  ).spawn();
  const ctl = async (...a: string[]) => {
    const res = await runCli(["ctl", ...a], { cwd: tmp.path, env, registry: false });
    assert.equal(res.code, 0, transcript(res));
    return res.stdout;
  };
  try {
    // Three rollouts, each held at its first model call.
    await until("three rollouts at the model", () => live.get(0) === 3, 240_000);
    assert.match(await ctl("status"), /0 of 3 rollouts in flight with no progress for 60s or more/);
    let stalled = "";
    await until(
      "the held rollouts idle for 2 s",
      async () =>
        /3 of 3 rollouts in flight with no progress for 2s or more/.test(
          stalled = await ctl("status", "--stall", "2"),
        ),
      60_000,
    );
    const held3 = [...stalled.matchAll(/stalled (\S+) {2}last model call {2}idle (\d+)s/g)];
    assert.equal(held3.length, 3, stalled);
    for (const m of held3) assert.ok(Number(m[2]) >= 2, stalled);
    const ids = new Set(held3.map((m) => m[1]));

    // One model call at a time and a one-token budget for the rollouts that start after.
    const set = await ctl("set", "max_model_connections=1", "max_total_tokens=1");
    assert.match(
      set,
      /max_model_connections=1 max_input_tokens=- max_output_tokens=- max_total_tokens=1/,
    );
    phase = 1;
    held = null;
    openHeld();

    const res = await collect(child);
    assert.equal(res.code, 0, transcript(res));
    assert.equal(peaks.get(0), 3, "max_model_connections 3 let three calls run at once");
    assert.equal(peaks.get(1), 1, "after set max_model_connections=1, one call at a time");
    const dir = /^Saving traces to (.+)$/m.exec(res.stderr)![1];
    const lines = (await Deno.readTextFile(join(dir, "traces.jsonl"))).trim().split("\n")
      .map((l) => JSON.parse(l));
    // file-sum has five tasks: three held at the model, two started after the set.
    assert.equal(lines.length, 5);
    let budgeted = 0;
    for (const t of lines) {
      const id = `${t.task.key}#${t.rollout_index}`;
      if (ids.has(id)) {
        // In flight when the budget was set: its agent had started without one.
        assert.equal(t.stop_condition, "no_tools_called", id);
        assert.equal(t.reward, 1, id);
      } else {
        assert.equal(t.stop_condition, "max_total_tokens", id);
        assert.equal(t.model_calls.length, 1, id);
        budgeted++;
      }
    }
    assert.equal(budgeted, 2);
    const meta = JSON.parse(await Deno.readTextFile(join(dir, "metadata.json")));
    assert.deepEqual(
      meta.control.actions.map((a: { action: string; args: Record<string, unknown> }) =>
        `${a.action} ${JSON.stringify(a.args)}`
      ),
      ['set {"max_model_connections":1,"max_total_tokens":1}'],
    );
    assert.equal(meta.control.knobs.max_model_connections, 1);
    assert.equal(meta.control.knobs.max_total_tokens, 1);
  } finally {
    openHeld();
    try {
      child.kill();
    } catch { /* already ended */ }
  }
});

Deno.test("vf ctl status --stall N: an agent program's model calls through the gateway are its own rollout's progress", async () => {
  await using tmp = await tempDir("vf_ctl_program_");
  const ctlDir = join(tmp.path, "ctl");
  let live = 0;
  let openHeld!: () => void;
  const held = new Promise<void>((r) => (openHeld = r));
  await using model = await startModelServer({
    responder: async ({ body }) => {
      live++;
      try {
        await held;
        const turn = body.messages.filter((m) => m.role === "assistant").length;
        const commands = [
          "awk '{ s += $1 } END { print s }' /app/input.txt > /app/output/answer.txt",
        ];
        return turn < commands.length
          ? {
            content: null,
            tool_calls: [{ name: "bash", arguments: { command: commands[turn] } }],
          }
          : { content: "Done." };
      } finally {
        live--;
      }
    },
  });
  const env = { VF_CTL_DIR: ctlDir };
  const child = cliCommand(
    [
      "run",
      "file-sum",
      "-m",
      "m",
      "-b",
      model.url,
      "-n",
      "2",
      "-r",
      "1",
      "-c",
      "2",
      "-o",
      "out",
      "--env.agent.harness.id",
      "program",
    ],
    { cwd: tmp.path, env, registry: false, docker: true },
  ).spawn();
  const ctl = async (...a: string[]) => {
    const res = await runCli(["ctl", ...a], { cwd: tmp.path, env, registry: false });
    assert.equal(res.code, 0, transcript(res));
    return res.stdout;
  };
  try {
    await until("both programs at the model", () => live === 2, 240_000);
    let status = "";
    await until(
      "both idle for 2 s",
      async () =>
        /2 of 2 rollouts in flight with no progress for 2s or more/.test(
          status = await ctl("status", "--stall", "2"),
        ),
      60_000,
    );
    // Each rollout's own call, not "phase agent" (nor both calls noted on one rollout).
    const lasts = [...status.matchAll(/stalled (\S+) {2}last (.+?) {2}idle/g)].map((m) => m[2]);
    assert.deepEqual(lasts, ["model call", "model call"], status);
    openHeld();
    const res = await collect(child);
    assert.equal(res.code, 0, transcript(res));
  } finally {
    openHeld();
    try {
      child.kill();
    } catch { /* already ended */ }
  }
});

Deno.test("vf ctl status prints counts, settings and actions of a run with terminal escapes stripped", async () => {
  await using tmp = await tempDir("vf_ctl_strip_");
  const dir = join(tmp.path, "ctl");
  const hostile = "\x1b]0;pwned\x07evil\x1b[2J";
  const control = new RunControl(`strip-${crypto.randomUUID().slice(0, 8)}`, {
    maxConcurrent: 2,
    live: () => ({ cost: { note: hostile } }),
  });
  control.knob(`knob${hostile}`, { get: () => 1, set: () => {} });
  control.pause();
  const served = await serveControl(control, { dir });
  try {
    const res = await runCli(["ctl", "status"], {
      cwd: tmp.path,
      env: { VF_CTL_DIR: dir },
      registry: false,
    });
    assert.equal(res.code, 0, transcript(res));
    assert.ok(!res.stdout.includes("\x1b") && !res.stdout.includes("\x07"), res.stdout);
    assert.match(res.stdout, /PAUSED/);
    assert.match(res.stdout, /settings max_concurrent=2 knobevil=1/);
    // JSON leaves escapes as text (\u001b), never as the bytes a terminal obeys.
    assert.match(res.stdout, /"note":"\\u001b\]0;pwned\\u0007evil\\u001b\[2J"/);
    assert.match(res.stdout, /action .*"action":"pause","args":\{"mode":"after"\}/);
  } finally {
    await served.close();
  }
});
