/**
 * Isolated grading on dedicated ssh hosts, through the real CLI against real sshd test hosts
 * (tests/_sshd_hosts.ts) and a scripted model on loopback. A dedicated host holds one sandbox
 * at a time, so a grader on its agent's host waits until the agent has handed the host back.
 * Each run must score every rollout (none lost to the host being busy), and no two sandboxes
 * may ever be on one host at once: checked on the host itself (each sandbox's setup looks for
 * another sandbox's workdir) and in the sandbox ledger (each sandbox's life, from its request
 * to its removal, ends before the next one on the host is requested). What the hosts cannot
 * serve is refused before any rollout starts.
 * @module
 */

import assert from "node:assert/strict";
import { join } from "node:path";
import { type CliResult, MOD_URL, runCli, transcript } from "./_cli.ts";
import { bashModel, type ModelServer, startModelServer } from "./model_server.ts";
import { type SshdHost, sshSpecFor, startSshdHosts } from "./_sshd_hosts.ts";
import { NullHarness, OpenAIChatClient, reward, runTaskRollout, Task } from "../mod.ts";
import { SshRuntime } from "../runtimes/mod.ts";

const [shared, agentOnly, graderOnly, limited] = await startSshdHosts(4);
globalThis.addEventListener("unload", () => {
  for (const host of [shared, agentOnly, graderOnly, limited]) host.closeSync();
});

/**
 * Sum tasks graded in isolation. Each sandbox's workdir is its own `/tmp/vf-<id>` (the ledger
 * records those), and its setup fails when another vf workdir is on the host: a sandbox still
 * there when the next one set up. The answer lives in /srv/sum, the declared artifact.
 */
const TASKSET = `
import { readText, reward, Task, type TaskHookContext, Taskset } from "${MOD_URL}";

class SumTask extends Task {
  override async setup({ runtime }: TaskHookContext) {
    const seen = await runtime.run(["sh", "-c", "pwd; ls -d /tmp/vf-* 2>/dev/null; true"]);
    const [own, ...dirs] = seen.stdout.trim().split("\\n");
    const others = dirs.filter((d) => d !== own);
    if (others.length) {
      throw new Error("another sandbox is on the host: " + others.join(", ") + " beside " + own);
    }
    await runtime.write("/srv/sum/input.txt", (this.data.numbers as number[]).join("\\n") + "\\n");
    await runtime.write("/srv/sum/out/answer.txt", "");
  }
  correct = reward(async ({ runtime }) => {
    const answer = await readText(runtime, "/srv/sum/out/answer.txt", 1024);
    const sum = (this.data.numbers as number[]).reduce((a, b) => a + b, 0);
    return answer.trim() === String(sum) ? 1 : 0;
  });
}

class SumTaskset extends Taskset {
  get id() {
    return "dedicated-sum";
  }
  load() {
    return [[1, 2, 3], [10, 20], [7, -2, 5]].map((numbers, i) => new SumTask({
      id: "sum-" + i,
      prompt: "Sum the integers in /srv/sum/input.txt into /srv/sum/out/answer.txt",
      scoring: { mode: "isolated" },
      artifacts: [{ source: "/srv/sum/out" }],
      numbers,
    }));
  }
}

export function loadTaskset(config: Record<string, unknown>) {
  return new SumTaskset(config);
}
`;

const solver = () =>
  bashModel(
    "cat /srv/sum/input.txt",
    "awk '{ s += $1 } END { print s }' /srv/sum/input.txt > /srv/sum/out/answer.txt",
  );

/** `--<prefix>.*` flags that reach `host` as a dedicated ssh runtime. */
function sshFlags(prefix: string, host: SshdHost): string[] {
  return [
    `--${prefix}.type`,
    "ssh",
    `--${prefix}.host`,
    host.host,
    `--${prefix}.port`,
    String(host.port),
    `--${prefix}.user`,
    host.user,
    `--${prefix}.private_key_path`,
    host.privateKeyPath,
    `--${prefix}.known_hosts_path`,
    host.knownHostsPath,
    `--${prefix}.dedicated`,
    "true",
  ];
}

// deno-lint-ignore no-explicit-any
type Json = any;

interface Run {
  res: CliResult;
  traces: Json[];
  ledger: Json[];
}

/** A JSONL file's records; none when it was never written. */
async function jsonLines(path: string): Promise<Json[]> {
  const text = await Deno.readTextFile(path).catch(() => "");
  return text.split("\n").filter(Boolean).map((line) => JSON.parse(line));
}

/** `vf run` of the taskset in a temp dir of its own, with a ledger of its own. */
async function vfRun(server: ModelServer, flags: string[]): Promise<Run> {
  const dir = await Deno.makeTempDir({ prefix: "vf_ssh_dedicated_" });
  try {
    const module = join(dir, "taskset.ts");
    await Deno.writeTextFile(module, TASKSET);
    const ledgerPath = join(dir, "ledger.jsonl");
    const res = await runCli(
      ["run", module, "-m", "vf-test", "-b", server.url, "-o", "out", ...flags],
      { cwd: dir, registry: false, env: { VF_LEDGER: ledgerPath } },
    );
    const runDir = /^Saving traces to (.+)$/m.exec(res.stderr)?.[1];
    const traces = runDir ? await jsonLines(join(runDir, "traces.jsonl")) : [];
    const ledger = await jsonLines(ledgerPath);
    return { res, traces, ledger };
  } finally {
    await Deno.remove(dir, { recursive: true });
  }
}

function describe(run: Run): string {
  const traces = run.traces.map((t) => ({ task: t.task.key, reward: t.reward, error: t.error }));
  return `${transcript(run.res)}\n${JSON.stringify(traces, null, 1)}`;
}

/** Every rollout of the three tasks scored 1, none with an error. */
function assertAllScored(run: Run): void {
  assert.equal(run.res.code, 0, describe(run));
  assert.equal(run.traces.length, 3, describe(run));
  for (const trace of run.traces) {
    assert.equal(trace.error ?? null, null, describe(run));
    assert.equal(trace.reward, 1, describe(run));
  }
  assert.doesNotMatch(run.res.stderr, /ConfigError|already holds/, describe(run));
}

/**
 * The ledger's sandboxes on `host`, each from its request to its removal, in order; none
 * begins before the one before it was removed. Returns how many there were.
 */
function assertOneAtATime(run: Run, host: SshdHost): number {
  const lives = new Map<string, { from: string; to?: string }>();
  for (const e of run.ledger) {
    if (e.type !== "ssh" || e.host?.host !== host.host) continue;
    const life: { from: string; to?: string } = lives.get(e.key) ?? { from: e.at };
    if (e.event === "stopped") life.to = e.at;
    lives.set(e.key, life);
  }
  const ordered = [...lives.entries()].sort((a, b) => a[1].from.localeCompare(b[1].from));
  for (const [key, life] of ordered) {
    assert.ok(life.to, `sandbox "${key}" on ${host.host} was never removed`);
  }
  for (let i = 1; i < ordered.length; i++) {
    const [prevKey, prev] = ordered[i - 1];
    const [key, life] = ordered[i];
    assert.ok(
      life.from >= prev.to!,
      `sandbox "${key}" was requested at ${life.from}, while "${prevKey}" was on ` +
        `${host.host} until ${prev.to}`,
    );
  }
  return ordered.length;
}

Deno.test("isolated grading on the agent's dedicated ssh host at -c 1: every rollout scored, one sandbox on the host at a time", async () => {
  await using server = await startModelServer({ responder: solver() });
  const run = await vfRun(server, ["-c", "1", ...sshFlags("env.agent.runtime", shared)]);
  assertAllScored(run);
  // An agent and a grader per rollout, one after another.
  assert.equal(assertOneAtATime(run, shared), 6, describe(run));
  assert.equal(
    await shared.exec(["sh", "-c", "ls -d /tmp/vf-* 2>/dev/null; true"]).then((o) => o.stdout),
    "",
    "no workdir left on the host",
  );
});

Deno.test("isolated grading on dedicated ssh hosts with max_sandboxes = 1, and with a grading host of its own: every rollout scored", async () => {
  await using server = await startModelServer({ responder: solver() });
  const [tight, apart] = await Promise.all([
    // The smallest sandbox limit a rollout graded in isolation can run under.
    vfRun(server, [
      "-c",
      "1",
      "--limits.max_sandboxes",
      "1",
      ...sshFlags("env.agent.runtime", limited),
    ]),
    // One agent host and one grading host: still one rollout at a time on each.
    vfRun(server, [
      "-c",
      "1",
      ...sshFlags("env.agent.runtime", agentOnly),
      ...sshFlags("env.agent.scoring.runtime", graderOnly),
    ]),
  ]);
  assertAllScored(tight);
  assert.equal(assertOneAtATime(tight, limited), 6, describe(tight));
  assertAllScored(apart);
  assert.equal(assertOneAtATime(apart, agentOnly), 3, describe(apart));
  assert.equal(assertOneAtATime(apart, graderOnly), 3, describe(apart));
});

Deno.test("what dedicated ssh hosts cannot serve is refused before any rollout starts", async () => {
  await using server = await startModelServer({ responder: solver() });
  const [graders, warmGrader] = await Promise.all([
    // Graders of concurrent rollouts would queue for one grading host.
    vfRun(server, [
      "-c",
      "2",
      "--env.agent.runtime.type",
      "subprocess",
      ...sshFlags("env.agent.scoring.runtime", graderOnly),
    ]),
    // A warm grader would sit on the host the next rollout's agent waits for.
    vfRun(server, [
      "-c",
      "1",
      ...sshFlags("env.agent.runtime", shared),
      "--env.agent.scoring.runtime.warm_pool",
      "1",
    ]),
  ]);
  assert.equal(graders.res.code, 1, describe(graders));
  assert.match(
    graders.res.stderr,
    new RegExp(
      `error: env\\.agent\\.scoring\\.runtime: ssh host "${
        graderOnly.host.replaceAll(".", "\\.")
      }"` +
        ` is dedicated, so it holds one sandbox at a time and grades one rollout at a time; ` +
        `run with -c 1 \\(max_concurrent = 1\\), got 2`,
    ),
  );
  assert.equal(warmGrader.res.code, 1, describe(warmGrader));
  assert.match(
    warmGrader.res.stderr,
    /error: env\.agent\.scoring\.runtime: ssh host "[0-9.]+" is dedicated and holds the agent's sandboxes too, so it cannot keep a warm grading sandbox/,
  );
  assert.equal(server.requests.length, 0, "refused before any rollout");
  assert.equal(graders.ledger.length + warmGrader.ledger.length, 0, "no sandbox was asked for");
});

/**
 * For \`vf validate\` on a dedicated host: a task checked in its own sandbox, and one whose
 * validate hook grades its gold answer with gradeSubmission in a fresh sandbox on that same
 * host, which its own sandbox holds until grading is done.
 */
function validateTaskset(host: SshdHost): string {
  const runtime = {
    type: "ssh",
    host: host.host,
    port: host.port,
    user: host.user,
    private_key_path: host.privateKeyPath,
    known_hosts_path: host.knownHostsPath,
    dedicated: true,
  };
  return `
import { gradeSubmission, readText, reward, Task, type TaskHookContext, Taskset } from "${MOD_URL}";

class Gold extends Task {
  override async setup({ runtime }: TaskHookContext) {
    await runtime.write("answer.txt", "");
  }
  correct = reward(async ({ runtime }) => (await readText(runtime, "answer.txt")).trim() === "42" ? 1 : 0);
  override async validate({ runtime }: TaskHookContext) {
    await runtime.write("answer.txt", "42\\n");
  }
}

class Graded extends Gold {
  override async validate(ctx: TaskHookContext) {
    await ctx.runtime.write("/srv/graded/answer.txt", "42\\n");
    return await gradeSubmission(ctx);
  }
}

class ValidateTaskset extends Taskset {
  get id() {
    return "dedicated-validate";
  }
  load() {
    return [
      new Gold({ id: "gold", prompt: "Write 42 to answer.txt" }),
      new Graded({
        id: "graded",
        prompt: "Write 42 to /srv/graded/answer.txt",
        scoring: { mode: "isolated", runtime: ${JSON.stringify(runtime)} },
        artifacts: [{ source: "/srv/graded" }],
      }),
    ];
  }
}

export function loadTaskset(config: Record<string, unknown>) {
  return new ValidateTaskset(config);
}
`;
}

Deno.test("vf validate on a dedicated ssh host: checks take turns on it, and a grader that could never have the host is refused at once", async () => {
  const dir = await Deno.makeTempDir({ prefix: "vf_ssh_validate_" });
  try {
    const module = join(dir, "taskset.ts");
    await Deno.writeTextFile(module, validateTaskset(shared));
    const flags = sshFlags("runtime", shared);
    const res = await runCli(["validate", module, ...flags], {
      cwd: dir,
      registry: false,
      env: { VF_LEDGER: join(dir, "ledger.jsonl") },
    });
    assert.equal(res.code, 1, transcript(res));
    const results = JSON.parse(res.stdout.trim().split("\n").at(-1)!).results;
    const [gold, graded] = results;
    // Its gold and untouched checks ran one after the other on the host.
    assert.deepEqual(
      [gold.task, gold.ok, gold.gold_reward, gold.empty_reward, gold.error],
      ["gold", true, 1, 0, null],
      transcript(res),
    );
    assert.equal(graded.task, "graded");
    assert.equal(graded.ok, false);
    assert.match(
      graded.error,
      /ConfigError: The grading sandbox of task "graded" would need dedicated ssh host "[0-9.]+", which sandbox "vf-[0-9a-f]+" holds until grading is done; .*give scoring\.runtime a host of its own/,
    );
    const ledger = await jsonLines(join(dir, "ledger.jsonl"));
    assert.equal(assertOneAtATime({ res, traces: [], ledger }, shared), 4, transcript(res));
  } finally {
    await Deno.remove(dir, { recursive: true });
  }
});

Deno.test("a rollout in a borrowed sandbox on a dedicated ssh host is refused a grader on that host at once, not left waiting for it", async () => {
  // The borrowed sandbox (a shared judge's box) stays up through grading: a grader on its
  // host could never have it.
  await using box = new SshRuntime(sshSpecFor(shared, { dedicated: true }));
  await box.start();
  const runtime = {
    type: "ssh",
    host: shared.host,
    port: shared.port,
    user: shared.user,
    private_key_path: shared.privateKeyPath,
    known_hosts_path: shared.knownHostsPath,
    dedicated: true,
  } as const;
  class Boxed extends Task {
    correct = reward(() => 1);
  }
  const task = new Boxed({
    id: "boxed",
    prompt: "Nothing to do",
    scoring: { mode: "isolated" },
  });
  await using server = await startModelServer({ responder: solver() });
  const trace = await runTaskRollout({
    task,
    tasksetId: "boxed",
    policy: { runtime, harness: new NullHarness() },
    client: new OpenAIChatClient({ base_url: server.url, api_key: "x" }),
    model: "vf-test",
    runId: `boxed-${crypto.randomUUID().slice(0, 8)}`,
    box: { runtime: box, spec: box.spec },
  });
  assert.equal(trace.reward, null, JSON.stringify(trace.error));
  assert.equal(trace.error?.phase, "scoring", JSON.stringify(trace.error));
  assert.match(
    trace.error?.message ?? "",
    new RegExp(
      `The grading sandbox of task "boxed" would need dedicated ssh host "${
        shared.host.replaceAll(".", "\\.")
      }", which sandbox "${box.id}" holds until grading is done; .*give ` +
        `--env\\.agent\\.scoring\\.runtime a host of its own`,
    ),
  );
  assert.equal((await box.run(["true"])).exit_code, 0, "the borrowed sandbox is still up");
});
