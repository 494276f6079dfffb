/**
 * The chaos scenarios. Each drives real `vf` processes against real parts — a private
 * dockerd, an sshd test host in its own network namespace, the loopback model server, a
 * tmpfs — breaks one of them at a randomised point, and then checks vf's promises:
 *
 * - `vf cleanup` leaves no sandbox of the run (containers on the engine, workdirs on the host);
 * - no rollout is scored below 1 for an infrastructure cause (the scripted model solves every
 *   task, so a reward below 1 without an infrastructure error is a fake zero);
 * - `--resume` completes the run, every rollout solved;
 * - every results file parses (a line torn by SIGKILL may only be the last one).
 *
 * The same seed replays the same breaking points (up to scheduling).
 * @module
 */
import { basename, join } from "node:path";
import { cliCommand, collect, transcript } from "../tests/_cli.ts";
import {
  demoResponder,
  type ModelServer,
  type Reply,
  type Responder,
  startModelServer,
} from "../lib/model/local_server.ts";
import { loadExampleDataset } from "../lib/data/examples.ts";
import { type CorruptLine, readJsonLines } from "../lib/eval/results.ts";
import { Ledger } from "../runtimes/ledger.ts";
import { mulberry32 } from "../lib/random.ts";
import { type SshdHost, startSshdHost } from "../tests/_sshd_hosts.ts";
import { PrivateDockerd } from "./_dockerd.ts";
import { SOLVE_RELATIVE } from "./sum_taskset.ts";

/** What one scenario run found. */
export interface Tally {
  scenario: string;
  seed: number;
  /** Rollouts the run asked for (n × r). */
  rollouts: number;
  /** Sandboxes of the run still there after `vf cleanup` (and after the resumed run). */
  leaked: number;
  /** Rollouts scored below 1 without an infrastructure error. */
  fakeZeros: number;
  /** Broken promises other than leaks and fake zeros (resume failed, a file did not parse). */
  problems: string[];
  /** What happened, for the report. */
  notes: string[];
}

/** Shared parts, started on first use and closed by {@link ChaosLab.close}. */
export class ChaosLab {
  #engine: Promise<PrivateDockerd> | undefined;
  #host: Promise<SshdHost> | undefined;
  readonly root: string;

  constructor(root: string) {
    this.root = root;
  }

  engine(): Promise<PrivateDockerd> {
    return this.#engine ??= PrivateDockerd.start(["busybox:latest"]);
  }

  host(): Promise<SshdHost> {
    return this.#host ??= startSshdHost();
  }

  async close(): Promise<void> {
    const engine = this.#engine;
    const host = this.#host;
    this.#engine = this.#host = undefined;
    await (await engine?.catch(() => undefined))?.close();
    await (await host?.catch(() => undefined))?.close();
  }
}

type Json = Record<string, unknown>;
type Rng = () => number;

const SOLVE_APP = "awk '{ s += $1 } END { print s }' /app/input.txt > /app/output/answer.txt";

function between(rng: Rng, lo: number, hi: number): number {
  return lo + (hi - lo) * rng();
}

const sleep = (ms: number) => new Promise((r) => setTimeout(r, ms));

/** `promise`'s value, or undefined once `ms` have passed (the timer is cleared either way). */
async function within<T>(promise: Promise<T>, ms: number): Promise<T | undefined> {
  let timer: ReturnType<typeof setTimeout> | undefined;
  try {
    return await Promise.race([
      promise,
      new Promise<undefined>((r) => (timer = setTimeout(() => r(undefined), ms))),
    ]);
  } finally {
    clearTimeout(timer);
  }
}

/** A `vf` child whose stderr is read as it comes. */
class Vf {
  stderr = "";
  stdout = "";
  readonly #child: Deno.ChildProcess;
  readonly #reading: Promise<void>;

  constructor(args: string[], cwd: string, env: Record<string, string>) {
    const child = this.#child = cliCommand(args, { cwd, env, registry: false, docker: false })
      .spawn();
    const read = async (stream: ReadableStream<Uint8Array>, into: "stderr" | "stdout") => {
      for await (const chunk of stream.pipeThrough(new TextDecoderStream())) this[into] += chunk;
    };
    this.#reading = Promise.all([read(child.stderr, "stderr"), read(child.stdout, "stdout")])
      .then(() => {});
  }

  async announced(timeoutMs = 90_000): Promise<boolean> {
    const deadline = Date.now() + timeoutMs;
    while (Date.now() < deadline) {
      if (/^Saving (traces|results) to /m.test(this.stderr)) return true;
      if (await Promise.race([this.#child.status.then(() => true), sleep(100).then(() => false)])) {
        return /^Saving (traces|results) to /m.test(this.stderr);
      }
    }
    return false;
  }

  async kill(): Promise<Deno.CommandStatus> {
    try {
      this.#child.kill("SIGKILL");
    } catch { /* already ended */ }
    return await this.done();
  }

  async done(): Promise<Deno.CommandStatus> {
    const status = await this.#child.status;
    await this.#reading;
    return status;
  }
}

function absolute(cwd: string, path: string): string {
  return path.startsWith("/") ? path : join(cwd, path);
}

/** The run directory a `vf` process announced on stderr. */
function announcedDir(stderr: string, cwd: string): string | undefined {
  const m = /^Saving (?:traces|results) to (.+)$/m.exec(stderr);
  return m ? absolute(cwd, m[1].trim()) : undefined;
}

/** Reads a JSON-lines file; a corrupt line that is not the last is a problem. */
async function readChecked(path: string, problems: string[]): Promise<Json[]> {
  const corrupt: CorruptLine[] = [];
  const rows = await readJsonLines<Json>(path, (c) => corrupt.push(c));
  let lines = 0;
  try {
    lines = (await Deno.readTextFile(path)).split("\n").filter((l) => l.trim()).length;
  } catch { /* missing: no rows */ }
  for (const c of corrupt) {
    if (c.line < lines) problems.push(`${basename(path)} line ${c.line} is corrupt: ${c.reason}`);
  }
  return rows;
}

/** A task-run trace scored below 1 without an infrastructure error. */
function isFakeZeroTrace(t: Json): boolean {
  const error = t.error as { infra?: boolean } | null;
  return t.reward !== 1 && !error?.infra;
}

/** Waits until the model server has had a request: the run's rollouts are under way. */
async function underWay(server: ModelServer, vf: Vf): Promise<boolean> {
  const deadline = Date.now() + 90_000;
  while (server.requests.length === 0 && Date.now() < deadline) {
    const ended = await Promise.race([vf.done().then(() => true), sleep(50).then(() => false)]);
    if (ended) return false;
  }
  return server.requests.length > 0;
}

/** The scripted agent: one bash call (a random pause, then `solve`), then "done". */
function agentModel(rng: Rng, solve: string, maxPause: number): Responder {
  return ({ body }) => {
    const turn = body.messages.filter((m) => m.role === "assistant").length;
    if (turn > 0) return { content: "done" };
    const pause = between(rng, 0.3, maxPause).toFixed(2);
    return {
      content: null,
      tool_calls: [{ name: "bash", arguments: { command: `sleep ${pause}; ${solve}` } }],
    };
  };
}

interface TaskTarget {
  /** `vf run` arguments naming the taskset and runtime. */
  args: string[];
  env: Record<string, string>;
  solve: string;
  /** Sandboxes of `runId` that still exist. */
  remaining(runId: string): Promise<number>;
}

async function dockerTarget(lab: ChaosLab, ledger: string): Promise<TaskTarget> {
  const engine = await lab.engine();
  return {
    args: ["file-sum", "--env.taskset.image", "busybox:latest"],
    env: { DOCKER_HOST: engine.dockerHost, VF_LEDGER: ledger },
    solve: SOLVE_APP,
    remaining: async (runId) => (await engine.runContainers(runId)).length,
  };
}

async function sshTarget(lab: ChaosLab, ledger: string): Promise<TaskTarget> {
  const host = await lab.host();
  const taskset = new URL("./sum_taskset.ts", import.meta.url).pathname;
  return {
    args: [
      taskset,
      "--env.agent.runtime.type",
      "ssh",
      "--env.agent.runtime.host",
      host.host,
      "--env.agent.runtime.port",
      String(host.port),
      "--env.agent.runtime.user",
      host.user,
      "--env.agent.runtime.private_key_path",
      host.privateKeyPath,
      "--env.agent.runtime.known_hosts_path",
      host.knownHostsPath,
      "--env.agent.runtime.ssh_config_path",
      "",
    ],
    env: { VF_LEDGER: ledger },
    solve: SOLVE_RELATIVE,
    // Per-rollout workdirs are /tmp/vf-<id>; the ledger keys them by host:port:workdir.
    remaining: async (runId) => {
      const live = await new Ledger(ledger).live({ runId });
      let n = 0;
      for (const s of live) {
        const dir = String(
          (s as unknown as { workdir?: string }).workdir ?? s.key.split(":").pop(),
        );
        if (await host.exists(dir)) n++;
      }
      const all = await host.exec(["sh", "-c", "ls -d /tmp/vf-* 2>/dev/null | wc -l"]);
      return Math.max(n, Number(all.stdout.trim()) || 0);
    },
  };
}

/** The checks every task scenario ends with: cleanup, leaks, resume, final traces. */
async function finishTaskScenario(
  tally: Tally,
  target: TaskTarget,
  cwd: string,
  runDir: string,
  model: string[],
  n: number,
  r: number,
): Promise<void> {
  const runId = basename(runDir);
  const before = await readChecked(join(runDir, "traces.jsonl"), tally.problems);
  tally.fakeZeros += before.filter(isFakeZeroTrace).length;
  tally.notes.push(
    `${before.length} traces before resume (${
      before.filter((t) => (t.error as { infra?: boolean } | null)?.infra).length
    } infra errors)`,
  );

  const cleanup = await collect(cliCommand(["cleanup"], { cwd, env: target.env, registry: false }));
  if (cleanup.code !== 0) {
    tally.problems.push(`vf cleanup exited ${cleanup.code}: ${transcript(cleanup)}`);
  }
  tally.notes.push(
    `cleanup: ${/removed[^\n]*/.exec(cleanup.stdout)?.[0] ?? cleanup.stdout.trim()}`,
  );
  const afterCleanup = await target.remaining(runId);

  const resume = await collect(
    cliCommand(
      ["run", ...target.args, ...model, "-o", "out", "--resume", runDir, "-c", "4"],
      { cwd, env: target.env, registry: false },
    ),
  );
  if (resume.code !== 0) {
    tally.problems.push(`--resume exited ${resume.code}: ${transcript(resume).slice(-2000)}`);
  }
  const all = await readChecked(join(runDir, "traces.jsonl"), tally.problems);
  tally.fakeZeros += all.slice(before.length).filter(isFakeZeroTrace).length;
  const latest = new Map<string, Json>();
  for (const t of all) latest.set(`${(t.task as Json).key}#${t.rollout_index}`, t);
  const solved = [...latest.values()].filter((t) => t.reward === 1).length;
  if (latest.size !== n * r || solved !== n * r) {
    // What each unsolved rollout ended with, so a failure in CI says why.
    const why = [...latest.values()].filter((t) => t.reward !== 1).map((t) => {
      const e = t.error as { phase?: string; error?: string; message?: string } | null;
      return `${(t.task as Json).key}#${t.rollout_index}: ${
        e ? `${e.phase} ${e.error}: ${String(e.message).slice(0, 300)}` : `reward ${t.reward}`
      }`;
    });
    tally.problems.push(
      `after --resume: ${solved} of ${n * r} rollouts solved (${latest.size} present)` +
        (why.length ? `; ${why.join("; ")}` : ""),
    );
  }
  // The resumed run ended normally; whatever the first cleanup missed must be gone by now.
  await collect(cliCommand(["cleanup"], { cwd, env: target.env, registry: false }));
  tally.leaked += Math.max(afterCleanup, await target.remaining(runId));
}

/**
 * A task scenario: `vf run` on `on` (docker: the private engine; ssh: the test host) with
 * the scripted agent; once its rollouts are under way, `breakRun` does the damage; then the
 * shared checks (cleanup, leaks, resume, final traces).
 */
async function taskScenario(
  lab: ChaosLab,
  scenario: string,
  on: "docker" | "ssh",
  seed: number,
  size: { n: number; r: number },
  breakRun: (vf: Vf, rng: Rng, tally: Tally) => Promise<void>,
): Promise<Tally> {
  const rng = mulberry32(seed);
  const tally: Tally = {
    scenario,
    seed,
    rollouts: size.n * size.r,
    leaked: 0,
    fakeZeros: 0,
    problems: [],
    notes: [],
  };
  const cwd = await Deno.makeTempDir({ dir: lab.root, prefix: `${scenario}-` });
  const ledger = join(cwd, "ledger.jsonl");
  const target = on === "docker" ? await dockerTarget(lab, ledger) : await sshTarget(lab, ledger);
  const server = await startModelServer({ responder: agentModel(rng, target.solve, 3) });
  try {
    const model = ["-m", "chaos-agent", "-b", server.url];
    const sizes = ["-n", String(size.n), "-r", String(size.r), "-c", "2"];
    const vf = new Vf(["run", ...target.args, ...model, "-o", "out", ...sizes], cwd, target.env);
    if (!(await vf.announced()) || !(await underWay(server, vf))) {
      await vf.kill();
      tally.problems.push(`the run never started: ${vf.stderr.slice(-2000)}`);
      return tally;
    }
    await breakRun(vf, rng, tally);
    const runDir = announcedDir(vf.stderr, cwd)!;
    await finishTaskScenario(tally, target, cwd, runDir, model, size.n, size.r);
  } finally {
    await server.close();
  }
  return tally;
}

/** SIGKILL `vf run` at a random point; then cleanup, resume, check. */
export function sigkillRun(
  lab: ChaosLab,
  kind: "docker" | "ssh",
  seed: number,
  size = { n: 4, r: 2 },
): Promise<Tally> {
  return taskScenario(lab, `sigkill-${kind}`, kind, seed, size, async (vf, rng, tally) => {
    const after = between(rng, 0, 8);
    await sleep(after * 1000);
    const status = await vf.kill();
    tally.notes.push(
      status.signal === "SIGKILL"
        ? `SIGKILL ${after.toFixed(1)} s into the rollouts`
        : `ended before the kill (exit ${status.code})`,
    );
  });
}

/** Kill the engine (dockerd) or the host's sshd mid-run and bring it back; then check. */
export function killBackend(
  lab: ChaosLab,
  kind: "dockerd" | "sshd",
  seed: number,
  size = { n: 4, r: 2 },
): Promise<Tally> {
  const on = kind === "dockerd" ? "docker" : "ssh";
  return taskScenario(lab, `kill-${kind}`, on, seed, size, async (vf, rng, tally) => {
    const at = between(rng, 0, 6);
    const down = between(rng, 0.2, 5);
    await sleep(at * 1000);
    if (kind === "dockerd") {
      const engine = await lab.engine();
      await engine.kill();
      await sleep(down * 1000);
      await engine.restart();
    } else {
      const host = await lab.host();
      await host.stopSshd();
      await sleep(down * 1000);
      await host.startSshd();
    }
    tally.notes.push(`${kind} killed at ${at.toFixed(1)} s, back after ${down.toFixed(1)} s`);
    const ended = await within(vf.done(), 300_000);
    if (!ended) {
      await vf.kill();
      tally.problems.push(`the run did not end within 5 minutes of the ${kind} restart`);
    } else {
      tally.notes.push(`run exited ${ended.code}`);
    }
  });
}

/** gsm8k's sample answers, so the scripted model answers every question right. */
function gsm8kAnswers(): Map<string, string> {
  const answers = new Map<string, string>();
  for (const row of loadExampleDataset("gsm8k-sample", { split: "test" })) {
    answers.set(String(row.question), String(row.answer));
  }
  return answers;
}

/** A results row scored below 1 without an error: the model only ever answers correctly. */
function isFakeZeroOutput(o: Json): boolean {
  return !o.error && o.reward !== 1;
}

/**
 * The model endpoint fails (500), hangs, or is slow, at random; then vf is SIGKILLed at a
 * random point, and the run resumed against a healthy endpoint.
 */
export async function flakyModel(
  lab: ChaosLab,
  seed: number,
  size = { n: 6, r: 2 },
): Promise<Tally> {
  const rng = mulberry32(seed);
  const tally: Tally = {
    scenario: "model-fail-hang-slow",
    seed,
    rollouts: size.n * size.r,
    leaked: 0,
    fakeZeros: 0,
    problems: [],
    notes: [],
  };
  const cwd = await Deno.makeTempDir({ dir: lab.root, prefix: "model-" });
  const solver = demoResponder({ answers: gsm8kAnswers(), accuracy: 1 });
  const counts = { fail: 0, hang: 0, slow: 0, ok: 0 };
  const flaky: Responder = async (req, ctx) => {
    const x = rng();
    if (x < 0.25) {
      counts.fail++;
      return { status: 500, body: "chaos: internal error" };
    }
    if (x < 0.4) {
      counts.hang++;
      return { hang: true };
    }
    const reply = await solver(req, ctx);
    if (x < 0.6) {
      counts.slow++;
      return { ...reply, delay_ms: Math.round(between(rng, 200, 1500)) } as Reply;
    }
    counts.ok++;
    return reply;
  };
  const bad = await startModelServer({ responder: flaky });
  const good = await startModelServer({ responder: solver });
  try {
    const common = ["-o", "out", "--client.timeout", "3", "--max-retries", "1", "-c", "4"];
    const args = (server: ModelServer) => ["-m", "chaos-model", "-b", server.url];
    const vf = new Vf(
      ["eval", "gsm8k", ...args(bad), "-n", String(size.n), "-r", String(size.r), ...common],
      cwd,
      {},
    );
    if (!(await vf.announced())) {
      await vf.kill();
      tally.problems.push(`the run never started: ${vf.stderr.slice(-2000)}`);
      return tally;
    }
    // Half the runs are killed part-way; the rest end by themselves, errors recorded.
    const after = rng() < 0.5 ? between(rng, 1, 8) : 120;
    const ended = await within(vf.done(), after * 1000);
    const status = ended ?? await vf.kill();
    tally.notes.push(
      ended
        ? `ended by itself (exit ${status.code})`
        : `SIGKILL ${after.toFixed(1)} s into the rollouts`,
    );
    const runDir = announcedDir(vf.stderr, cwd)!;
    const before = await readChecked(join(runDir, "results.jsonl"), tally.problems);
    tally.fakeZeros += before.filter(isFakeZeroOutput).length;
    tally.notes.push(
      `${before.length} results (${before.filter((o) => o.error).length} errors); model ` +
        Object.entries(counts).map(([k, v]) => `${k} ${v}`).join(", "),
    );
    const resume = await collect(
      cliCommand(["eval", "gsm8k", ...args(good), "--resume", runDir, ...common], {
        cwd,
        registry: false,
      }),
    );
    if (resume.code !== 0) {
      tally.problems.push(`--resume exited ${resume.code}: ${transcript(resume).slice(-2000)}`);
    }
    const all = await readChecked(join(runDir, "results.jsonl"), tally.problems);
    tally.fakeZeros += all.slice(before.length).filter(isFakeZeroOutput).length;
    checkEvalComplete(tally, all, size);
    await checkMetadata(tally, runDir);
  } finally {
    await bad.close();
    await good.close();
  }
  return tally;
}

function checkEvalComplete(tally: Tally, rows: Json[], size: { n: number; r: number }): void {
  const perExample = new Map<number, number>();
  for (const o of rows) {
    perExample.set(Number(o.example_id), (perExample.get(Number(o.example_id)) ?? 0) + 1);
  }
  const short = [...perExample.values()].filter((c) => c < size.r).length;
  if (perExample.size !== size.n || short > 0) {
    tally.problems.push(
      `after --resume: ${perExample.size} of ${size.n} examples present, ${short} with fewer than ${size.r} rollouts`,
    );
  }
}

async function checkMetadata(tally: Tally, runDir: string): Promise<void> {
  try {
    const meta = JSON.parse(await Deno.readTextFile(join(runDir, "metadata.json")));
    if (meta.avg_reward !== 1 && !(meta.avg_reward === null && meta.avg_reward_reason)) {
      tally.problems.push(
        `metadata avg_reward is ${meta.avg_reward}: errors leaked into the average`,
      );
    }
  } catch (error) {
    tally.problems.push(`metadata.json does not parse: ${(error as Error).message}`);
  }
}

/** The results disk (a small tmpfs) fills mid-run; then it grows and the run is resumed. */
export async function diskFull(
  lab: ChaosLab,
  seed: number,
  size = { n: 20, r: 2 },
): Promise<Tally> {
  const rng = mulberry32(seed);
  const tally: Tally = {
    scenario: "results-disk-full",
    seed,
    rollouts: size.n * size.r,
    leaked: 0,
    fakeZeros: 0,
    problems: [],
    notes: [],
  };
  const cwd = await Deno.makeTempDir({ dir: lab.root, prefix: "disk-" });
  const mnt = join(cwd, "out");
  await Deno.mkdir(mnt);
  // Room for the run folder and a few results lines (each is about 2 KB), not for all of them.
  const kib = Math.round(between(rng, 12, 40));
  await mustRun(["mount", "-t", "tmpfs", "-o", `size=${kib}k`, "vf-chaos-results", mnt]);
  const server = await startModelServer({
    responder: demoResponder({ answers: gsm8kAnswers(), accuracy: 1 }),
  });
  try {
    const common = ["-o", "out", "-c", "2"];
    const model = ["-m", "chaos-model", "-b", server.url];
    const res = await collect(
      cliCommand(
        ["eval", "gsm8k", ...model, "-n", String(size.n), "-r", String(size.r), ...common],
        {
          cwd,
          registry: false,
        },
      ),
    );
    tally.notes.push(`${kib} KiB disk: exit ${res.code}`);
    if (res.code === 0) tally.problems.push("the run exited 0 although its results did not fit");
    if (!/no space left|ENOSPC/i.test(res.stderr)) {
      tally.problems.push(`the error does not say the disk is full: ${res.stderr.slice(-800)}`);
    }
    const runDir = announcedDir(res.stderr, cwd);
    if (!runDir) {
      tally.problems.push(`no run directory announced: ${res.stderr.slice(-800)}`);
      return tally;
    }
    const before = await readChecked(join(runDir, "results.jsonl"), tally.problems);
    tally.fakeZeros += before.filter(isFakeZeroOutput).length;
    tally.notes.push(`${before.length} results fitted`);
    await mustRun(["mount", "-o", "remount,size=16m", mnt]);
    const resume = await collect(
      cliCommand(["eval", "gsm8k", ...model, "--resume", runDir, ...common], {
        cwd,
        registry: false,
      }),
    );
    if (resume.code !== 0) {
      tally.problems.push(`--resume exited ${resume.code}: ${transcript(resume).slice(-2000)}`);
    }
    const all = await readChecked(join(runDir, "results.jsonl"), tally.problems);
    tally.fakeZeros += all.slice(before.length).filter(isFakeZeroOutput).length;
    checkEvalComplete(tally, all, size);
    await checkMetadata(tally, runDir);
  } finally {
    await server.close();
    await new Deno.Command("umount", { args: ["-l", mnt] }).output();
  }
  return tally;
}

async function mustRun(argv: string[]): Promise<void> {
  const out = await new Deno.Command(argv[0], { args: argv.slice(1), stderr: "piped" }).output();
  if (out.code !== 0) {
    throw new Error(
      `${argv.join(" ")} exited ${out.code}: ${new TextDecoder().decode(out.stderr)}`,
    );
  }
}

/** Every scenario, by name. */
export const SCENARIOS: Record<string, (lab: ChaosLab, seed: number) => Promise<Tally>> = {
  "sigkill-docker": (lab, seed) => sigkillRun(lab, "docker", seed),
  "sigkill-ssh": (lab, seed) => sigkillRun(lab, "ssh", seed),
  "kill-dockerd": (lab, seed) => killBackend(lab, "dockerd", seed),
  "kill-sshd": (lab, seed) => killBackend(lab, "sshd", seed),
  "model-fail-hang-slow": (lab, seed) => flakyModel(lab, seed),
  "results-disk-full": (lab, seed) => diskFull(lab, seed),
};

/** Sum of tallies, and the two figures per 10,000 rollouts. */
export function totals(tallies: Tally[]) {
  const rollouts = tallies.reduce((a, t) => a + t.rollouts, 0);
  const leaked = tallies.reduce((a, t) => a + t.leaked, 0);
  const fakeZeros = tallies.reduce((a, t) => a + t.fakeZeros, 0);
  const per10k = (x: number) => (rollouts ? (x * 10_000) / rollouts : 0);
  return {
    rollouts,
    leaked,
    fakeZeros,
    problems: tallies.reduce((a, t) => a + t.problems.length, 0),
    leakedPer10k: per10k(leaked),
    fakeZerosPer10k: per10k(fakeZeros),
  };
}
