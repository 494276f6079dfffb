/**
 * `vf ctl` against a real running `vf eval` on a loopback model: status, pause (in-flight
 * rollouts finish, no new ones start), a concurrency change down and up, resume; every action
 * lands in metadata.json and the run completes with all its rollouts.
 * @module
 */
import assert from "node:assert/strict";
import { join } from "node:path";
import { loadExampleDataset } from "../lib/data/examples.ts";
import { RunControl, serveControl } from "../lib/eval/control.ts";
import { type ChatRequest, lastUserText, type Reply, startModelServer } from "./model_server.ts";
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

/** `vf ctl` in `dir`, and the control folder the runs started there serve their sockets in. */
function ctlIn(dir: string) {
  const ctlDir = join(dir, "ctl");
  const env = { VF_CTL_DIR: ctlDir };
  const raw = (...a: string[]) => runCli(["ctl", ...a], { cwd: dir, env, registry: false });
  /** Its stdout; it must succeed. */
  const ok = async (...a: string[]) => {
    const res = await raw(...a);
    assert.equal(res.code, 0, transcript(res));
    return res.stdout;
  };
  return { ctlDir, env, raw, ok };
}

/** What file-sum's agent runs: read the numbers, write their sum. */
const FILE_SUM_COMMANDS = [
  "cat /app/input.txt",
  "awk '{ s += $1 } END { print s }' /app/input.txt > /app/output/answer.txt",
];

/**
 * A loopback model playing file-sum's agent (one command a turn, then "Done."). While held,
 * every request waits at the server: a run cannot finish while a `vf ctl` command starts (a
 * second or more at a load of 10), and what piles up is what the run's limits let through.
 * Requests are counted live and at most at once per `phase` of the test; a request the run
 * gave up on (interrupted, timed out) stays held, counted in its own phase.
 */
async function fileSumModel(options: {
  /** Each turn waits this long once let through; default 0. */
  delayMs?: number;
  commands?: string[];
  /** Whether requests are held from the start; default true. */
  held?: boolean;
  /** Usage every scripted reply reports. */
  usage?: { prompt_tokens: number; completion_tokens: number };
  /** A reply to a request instead of the script's (it may wait), given its turn. */
  reply?: (turn: number, request: ChatRequest) => Reply | Promise<Reply> | undefined;
} = {}) {
  const commands = options.commands ?? FILE_SUM_COMMANDS;
  let open!: () => void;
  let held: Promise<void> | null = options.held === false
    ? null
    : new Promise<void>((r) => (open = r));
  const state = {
    phase: 0,
    started: 0,
    live: new Map<number, number>(),
    peaks: new Map<number, number>(),
    /** Lets every held request go, and those after through. */
    release: () => {
      held = null;
      open?.();
    },
  };
  const server = await startModelServer({
    responder: async (request) => {
      state.started++;
      const p = state.phase;
      state.live.set(p, (state.live.get(p) ?? 0) + 1);
      state.peaks.set(p, Math.max(state.peaks.get(p) ?? 0, state.live.get(p)!));
      try {
        if (held) await held;
        if (options.delayMs) await new Promise((r) => setTimeout(r, options.delayMs));
        const turn = request.body.messages.filter((m) => m.role === "assistant").length;
        const own = options.reply?.(turn, request);
        if (own) return await own;
        const usage = options.usage ? { usage: options.usage } : {};
        return turn < commands.length
          ? {
            content: null,
            tool_calls: [{ name: "bash", arguments: { command: commands[turn] } }],
            ...usage,
          }
          : { content: "Done.", ...usage };
      } finally {
        state.live.set(p, state.live.get(p)! - 1);
      }
    },
  });
  return Object.assign(state, {
    url: server.url,
    async [Symbol.asyncDispose]() {
      state.release();
      await server[Symbol.asyncDispose]();
    },
  });
}

/** `vf run file-sum` in `dir` against `url`, `-n N -r R -c C` and more flags, under Docker. */
function vfRun(
  dir: string,
  url: string,
  env: Record<string, string>,
  options: { n: number; r?: number; c: number; flags?: string[] },
): Deno.ChildProcess {
  const { n, r = 1, c, flags = [] } = options;
  const args = ["run", "file-sum", "-m", "m", "-b", url, "-n", `${n}`, "-r", `${r}`];
  return cliCommand([...args, "-c", `${c}`, "-o", "out", ...flags], {
    cwd: dir,
    env,
    registry: false,
    docker: true,
  }).spawn();
}

/** The lines of a run's traces.jsonl (none before it exists). */
async function traceLines(dir: string) {
  const text = await Deno.readTextFile(join(dir, "traces.jsonl")).catch(() => "");
  return text.trim() ? text.trim().split("\n").map((l) => JSON.parse(l)) : [];
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
      ...status.matchAll(/stalled example (\d+) rollout 0 {2}last model call {2}idle (\d+)s/g),
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

Deno.test("vf ctl status --stall N on a vf eval with -r 3: of an example's three rollouts, the one held at the model is listed alone, by example id and rollout index; status has the run's counts, rate and spend", async () => {
  await using tmp = await tempDir("vf_ctl_stall_r3_");
  const { env, ok: ctl } = ctlIn(tmp.path);
  /** Calls per question: the second call of the first question asked is held. */
  const calls = new Map<string, number>();
  let heldQuestion: string | null = null;
  let openHeld!: () => void;
  const held = new Promise<void>((r) => (openHeld = r));
  await using model = await startModelServer({
    responder: async (request) => {
      const q = lastUserText(request);
      heldQuestion ??= q;
      const n = (calls.get(q) ?? 0) + 1;
      calls.set(q, n);
      // $1 an input token: $10 a call.
      const usage = { prompt_tokens: 10, completion_tokens: 0 };
      if (q === heldQuestion && n === 2) {
        await held;
        // A wrong answer tells the held rollout's line apart once it is written.
        return { content: "\\boxed{-1}", usage };
      }
      return { content: `\\boxed{${ANSWERS.get(q) ?? "0"}}`, usage };
    },
  });
  const prices = ["--models.m.input_per_mtok", "1000000", "--models.m.output_per_mtok", "0"];
  const child = cliCommand(
    ["eval", "gsm8k", "-m", "m", "-b", model.url, "-n", "2", "-r", "3", "-c", "6", ...prices],
    { cwd: tmp.path, env, registry: false },
  ).spawn();
  try {
    await until("the held call", () => heldQuestion !== null && calls.get(heldQuestion) === 3);
    // Five rollouts answered (one group written), the held one idle past the threshold.
    let status = "";
    await until(
      "the other group done and the held rollout idle for 2 s",
      async () =>
        /done 3\/6 [^]*1 of 1 rollouts in flight with no progress for 2s or more/.test(
          status = await ctl("status", "--stall", "2"),
        ),
      120_000,
    );
    const stalled = [
      ...status.matchAll(/stalled example (\d+) rollout (\d) {2}last model call {2}idle (\d+)s/g),
    ];
    assert.equal(stalled.length, 1, status);
    assert.ok(Number(stalled[0][3]) >= 2, status);
    const json = JSON.parse(await ctl("status", "--stall", "2", "--json"));
    assert.deepEqual(
      json.stalled_rollouts.map((r: Record<string, unknown>) => [r.example_id, r.rollout_index]),
      [[Number(stalled[0][1]), Number(stalled[0][2])]],
    );
    assert.equal(json.tracked, 1);
    // Counts and labels only: no prompt, no completion.
    assert.ok(!JSON.stringify(json).includes(heldQuestion!), "status carries no prompt");
    assert.ok(!status.includes(heldQuestion!.slice(0, 40)), "status carries no prompt");
    // One group written; the other in flight as a unit of three; five calls paid.
    assert.equal(json.done, 3);
    assert.equal(json.total, 6);
    assert.equal(json.in_flight, 3);
    assert.equal(json.queued, 0);
    assert.equal(json.errors, 0);
    assert.ok(json.rollouts_per_s > 0, JSON.stringify(json));
    assert.equal(json.live.cost.usd, 50);
    assert.equal(json.live.cost.calls, 5);
    assert.match(status, /\d+\.\d\d rollouts\/s/);
    assert.match(status, /"cost":\{[^}]*"usd":50/);
    openHeld();
    const res = await collect(child);
    assert.equal(res.code, 0, transcript(res));
    const dir = /^Saving results to (.+)$/m.exec(res.stderr)![1];
    const lines = (await Deno.readTextFile(join(dir, "results.jsonl"))).trim().split("\n")
      .map((l) => JSON.parse(l));
    assert.equal(lines.length, 6);
    // The listed rollout is the held one: a group's lines are in rollout order.
    const group = lines.filter((o) => o.example_id === Number(stalled[0][1]));
    assert.equal(group.length, 3);
    assert.deepEqual(
      group.map((o) => o.reward),
      [0, 1, 2].map((i) => (i === Number(stalled[0][2]) ? 0 : 1)),
    );
  } finally {
    openHeld();
    try {
      child.kill();
    } catch { /* already ended */ }
  }
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

Deno.test("vf ctl requeue on a vf eval with -r 3 runs again each errored rollout of an example, not one per example", async () => {
  await using tmp = await tempDir("vf_ctl_requeue_r3_");
  const { env, ok: ctl } = ctlIn(tmp.path);
  /** The first two calls of the first question fail (HTTP 400, nothing retries it). */
  const calls = new Map<string, number>();
  let failing: string | null = null;
  let failures = true;
  /** The other example is held until the requeue has run, so the run is still live. */
  let openOther!: () => void;
  const other = new Promise<void>((r) => (openOther = r));
  await using model = await startModelServer({
    responder: async (request) => {
      const q = lastUserText(request);
      failing ??= q;
      const n = (calls.get(q) ?? 0) + 1;
      calls.set(q, n);
      if (q !== failing) await other;
      if (q === failing && failures && n <= 2) {
        return { status: 400, body: "the test refuses this call" };
      }
      return { content: `\\boxed{${ANSWERS.get(q) ?? "0"}}` };
    },
  });
  const child = cliCommand(
    ["eval", "gsm8k", "-m", "m", "-b", model.url, "-n", "2", "-r", "3", "-c", "6", "-o", "out"],
    { cwd: tmp.path, env, registry: false },
  ).spawn();
  try {
    await until("the failing example written", async () => {
      try {
        return /done 3\/6 {2}errors 2 /.test(await ctl("status"));
      } catch {
        return false;
      }
    });
    failures = false;
    assert.match(await ctl("requeue"), /requeued 2/);
    await until("the retried rollouts", async () => /errors 0 /.test(await ctl("status")));
    assert.equal(calls.get(failing!), 5);
    openOther();
    const res = await collect(child);
    assert.equal(res.code, 0, transcript(res));
    const dir = /^Saving results to (.+)$/m.exec(res.stderr)![1];
    const meta = JSON.parse(await Deno.readTextFile(join(dir, "metadata.json")));
    assert.equal(meta.num_rollouts, 6);
    assert.equal(meta.num_errors, 0);
    assert.equal(meta.avg_reward, 1);
    const lines = (await Deno.readTextFile(join(dir, "results.jsonl"))).trim().split("\n")
      .map((l) => JSON.parse(l));
    assert.equal(lines.length, 8);
    const errored = lines.filter((o) => o.error);
    assert.deepEqual(
      lines.filter((o) => o.retry_of).map((o) => o.retry_of).sort(),
      errored.map((o) => o.trajectory_id).sort(),
    );
  } finally {
    openOther();
    try {
      child.kill();
    } catch { /* already ended */ }
  }
});

Deno.test("vf ctl steers a vf run (file-sum in Docker): pause --now, new sandbox limit and agent timeout, requeue of the timed-out rollouts, with no run id given", async () => {
  await using tmp = await tempDir("vf_ctl_run_");
  const { ctlDir, env, ok: ctl } = ctlIn(tmp.path);
  // Held first to be interrupted, then to time out.
  await using model = await fileSumModel({ delayMs: 300 });
  const child = vfRun(tmp.path, model.url, env, {
    n: 5,
    c: 2,
    flags: ["--limits.max_sandboxes", "2"],
  });
  let dir = "";
  try {
    await until("two rollouts at the model", () => model.live.get(0) === 2, 240_000);
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
    assert.equal((await Array.fromAsync(Deno.readDir(ctlDir))).length, 1);

    // One sandbox at a time and four seconds for the agent; the model hangs, so the next
    // rollout times out. Paused again after it starts: what times out is what was in flight.
    const set = await ctl("set", "max_sandboxes=1", "sandbox_create_rate=50", "timeout.agent=4");
    assert.match(set, /max_sandboxes=1 sandbox_create_rate=50 timeout\.setup=- timeout\.agent=4/);
    model.phase = 1;
    const before = model.started;
    await ctl("resume");
    await until("a rollout at the model again", () => model.started > before);
    await ctl("pause");
    await until("the timed-out rollouts", async () => {
      const s = await ctl("status");
      return /in flight 0 /.test(s) && !/errors 0 /.test(s);
    });
    const timedOut = await traceLines(dir);
    assert.ok(timedOut.length >= 1);
    for (const t of timedOut) assert.match(t.error.message, /Phase "agent" timed out after 4s/);

    // The model answers again; the timed-out rollouts run again with a longer limit.
    model.release();
    await ctl("set", "timeout.agent=600");
    const requeued = await ctl("requeue");
    assert.match(requeued, new RegExp(`requeued ${timedOut.length}`));
    model.phase = 2;
    await ctl("resume");

    const res = await collect(child);
    assert.equal(res.code, 0, transcript(res));
    // Two would run at once (-c 2) but for max_sandboxes=1.
    assert.equal(model.peaks.get(2), 1, "max_sandboxes=1 lets one rollout run at a time");
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
    model.release();
    try {
      child.kill();
    } catch { /* already ended */ }
  }
});

Deno.test("vf ctl on a running vf run (file-sum in Docker): status --stall lists the rollouts held at the model; max_model_connections and max_total_tokens set mid-run apply to the calls and rollouts after", async () => {
  await using tmp = await tempDir("vf_ctl_knobs_");
  const { env, ok: ctl } = ctlIn(tmp.path);
  await using model = await fileSumModel({ delayMs: 200 });
  const child = vfRun(tmp.path, model.url, env, {
    n: 5,
    c: 3,
    flags: ["--limits.max_model_connections", "3"],
  });
  try {
    // Three rollouts, each held at its first model call.
    await until("three rollouts at the model", () => model.live.get(0) === 3, 240_000);
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
    model.phase = 1;
    model.release();

    const res = await collect(child);
    assert.equal(res.code, 0, transcript(res));
    assert.equal(model.peaks.get(0), 3, "max_model_connections 3 let three calls run at once");
    assert.equal(model.peaks.get(1), 1, "after set max_model_connections=1, one call at a time");
    const dir = /^Saving traces to (.+)$/m.exec(res.stderr)![1];
    const lines = await traceLines(dir);
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
    model.release();
    try {
      child.kill();
    } catch { /* already ended */ }
  }
});

Deno.test("vf ctl concurrency on a running vf run (file-sum in Docker): lowered to 1 while three rollouts are in flight, the rollouts after run one at a time", async () => {
  await using tmp = await tempDir("vf_ctl_run_c_");
  const { env, ok: ctl } = ctlIn(tmp.path);
  await using model = await fileSumModel({ delayMs: 100 });
  const child = vfRun(tmp.path, model.url, env, { n: 5, c: 3 });
  try {
    await until("three rollouts at the model", () => model.live.get(0) === 3, 240_000);
    assert.match(await ctl("concurrency", "1"), /max_concurrent 1/);
    model.release();
    const res = await collect(child);
    assert.equal(res.code, 0, transcript(res));
    assert.equal(model.peaks.get(0), 3, "-c 3 let three rollouts run at once");
    const dir = /^Saving traces to (.+)$/m.exec(res.stderr)![1];
    const lines = await traceLines(dir);
    assert.equal(lines.length, 5);
    for (const t of lines) assert.equal(t.reward, 1, JSON.stringify(t.error));
    // The three in flight finished as they were; the two after ran one at a time, each
    // starting once the one before it had ended (-c 3 would have run them together).
    const spans = lines
      .map((t) => [t.timing.started_at, t.timing.started_at + t.timing.total_ms / 1000])
      .sort((a, b) => a[0] - b[0]);
    const firstEnd = Math.max(...spans.slice(0, 3).map((s) => s[1]));
    const [fourth, fifth] = spans.slice(3);
    assert.ok(fourth[0] >= firstEnd - 0.05, JSON.stringify(spans));
    assert.ok(fifth[0] >= fourth[1] - 0.05, JSON.stringify(spans));
    const meta = JSON.parse(await Deno.readTextFile(join(dir, "metadata.json")));
    assert.deepEqual(meta.control.actions.map((a: { args: unknown }) => a.args), [
      { max_concurrent: 1 },
    ]);
    assert.equal(meta.control.max_concurrent, 1);
  } finally {
    model.release();
    try {
      child.kill();
    } catch { /* already ended */ }
  }
});

Deno.test("vf ctl status --stall N: an agent program's model calls through the gateway are its own rollout's progress", async () => {
  await using tmp = await tempDir("vf_ctl_program_");
  const { env, ok: ctl } = ctlIn(tmp.path);
  await using model = await fileSumModel({ commands: FILE_SUM_COMMANDS.slice(1) });
  const child = vfRun(tmp.path, model.url, env, {
    n: 2,
    c: 2,
    flags: ["--env.agent.harness.id", "program"],
  });
  try {
    await until("both programs at the model", () => model.live.get(0) === 2, 240_000);
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
    model.release();
    const res = await collect(child);
    assert.equal(res.code, 0, transcript(res));
  } finally {
    model.release();
    try {
      child.kill();
    } catch { /* already ended */ }
  }
});

Deno.test("vf ctl status --stall N on a vf run with -r 3 (file-sum in Docker): of a task's three rollouts, the one held at the model is listed alone, with its example and rollout index; status has the run's rate and spend", async () => {
  await using tmp = await tempDir("vf_ctl_run_r3_");
  const { env, ok: ctl } = ctlIn(tmp.path);
  /** The second rollout to ask is held at its first call; then it ends without an answer. */
  let firstCalls = 0;
  let openHeld!: () => void;
  const held = new Promise<void>((r) => (openHeld = r));
  await using model = await fileSumModel({
    held: false,
    // $1 an input token: $10 a call.
    usage: { prompt_tokens: 10, completion_tokens: 0 },
    reply: (turn) =>
      turn === 0 && ++firstCalls === 2 ? held.then(() => ({ content: "Done." })) : undefined,
  });
  const child = vfRun(tmp.path, model.url, env, {
    n: 1,
    r: 3,
    c: 3,
    flags: ["--models.m.input_per_mtok", "1000000", "--models.m.output_per_mtok", "0"],
  });
  try {
    await until("the held call", () => firstCalls >= 2, 240_000);
    let status = "";
    await until(
      "two rollouts done and the held one idle for 2 s",
      async () =>
        /done 2\/3 .*\n[^]*1 of 1 rollouts in flight with no progress for 2s or more/.test(
          status = await ctl("status", "--stall", "2"),
        ),
      240_000,
    );
    const stalled = [...status.matchAll(/stalled (\S+)#(\d) {2}last model call {2}idle (\d+)s/g)];
    assert.equal(stalled.length, 1, status);
    assert.ok(Number(stalled[0][3]) >= 2, status);
    const json = JSON.parse(await ctl("status", "--stall", "2", "--json"));
    assert.equal(json.stalled_rollouts.length, 1);
    const [one] = json.stalled_rollouts;
    assert.equal(one.id, `${stalled[0][1]}#${stalled[0][2]}`);
    assert.equal(one.rollout_index, Number(stalled[0][2]));
    // Two rollouts done (three calls each, the held call not yet paid), one in flight.
    assert.equal(json.done, 2);
    assert.equal(json.in_flight, 1);
    assert.equal(json.queued, 0);
    assert.ok(json.rollouts_per_s > 0, JSON.stringify(json));
    assert.equal(json.live.cost.usd, 60);
    assert.equal(json.live.cost.calls, 6);
    assert.match(status, /\d+\.\d\d rollouts\/s/);
    assert.match(status, /"cost":\{[^}]*"usd":60/);
    openHeld();
    const res = await collect(child);
    assert.equal(res.code, 0, transcript(res));
    const dir = /^Saving traces to (.+)$/m.exec(res.stderr)![1];
    const lines = await traceLines(dir);
    assert.equal(lines.length, 3);
    // The rollout listed is the one that was held: the only one without an answer.
    const unanswered = lines.filter((t) => t.reward !== 1);
    assert.equal(unanswered.length, 1, JSON.stringify(lines.map((t) => t.reward)));
    assert.equal(unanswered[0].task.key, stalled[0][1]);
    assert.equal(unanswered[0].rollout_index, one.rollout_index);
    assert.equal(unanswered[0].example_id, one.example_id);
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
    // --json escapes every control character, the C1 ones JSON itself leaves raw too.
    control.knob("c1\x9b2J", { get: () => 1, set: () => {} });
    const json = await runCli(["ctl", "status", "--json"], {
      cwd: tmp.path,
      env: { VF_CTL_DIR: dir },
      registry: false,
    });
    assert.equal(json.code, 0, transcript(json));
    // deno-lint-ignore no-control-regex
    assert.doesNotMatch(json.stdout, /[\x00-\x09\x0b-\x1f\x7f-\x9f]/);
    const parsed = JSON.parse(json.stdout);
    assert.equal(parsed.live.cost.note, hostile, "the text is kept, escaped");
    assert.equal(parsed.knobs["c1\x9b2J"], 1);
  } finally {
    await served.close();
  }
});

Deno.test("vf ctl needs a run id only when more than one run is live", async () => {
  await using tmp = await tempDir("vf_ctl_ids_");
  const dir = join(tmp.path, "ctl");
  const ids = ["a", "b"].map((x) => `ids-${x}-${crypto.randomUUID().slice(0, 8)}`);
  const served = await Promise.all(
    ids.map((id) => serveControl(new RunControl(id, { maxConcurrent: 1 }), { dir })),
  );
  const ctl = (...a: string[]) =>
    runCli(["ctl", ...a], { cwd: tmp.path, env: { VF_CTL_DIR: dir }, registry: false });
  try {
    const list = await ctl("list");
    assert.deepEqual(list.stdout.trim().split("\n"), [...ids].sort());
    const two = await ctl("status");
    assert.equal(two.code, 1);
    assert.match(two.stderr, /2 runs are live \(.+\); name one: vf ctl RUN_ID status/);
    const named = await ctl(ids[1], "pause");
    assert.equal(named.code, 0, transcript(named));
    assert.match(named.stdout, new RegExp(`run ${ids[1]} .*PAUSED`));
    await served[0].close();
    const one = await ctl("status");
    assert.equal(one.code, 0, transcript(one));
    assert.match(one.stdout, new RegExp(`run ${ids[1]} .*PAUSED`));
  } finally {
    for (const s of served) await s.close();
  }
});
