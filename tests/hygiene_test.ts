/**
 * Sandbox hygiene, limits, warm pools and remote engines, against the real Docker engine:
 * the ledger is written before a container is requested; an evaluator killed with SIGKILL
 * mid-run leaves containers that `vf cleanup --run` removes (checked through the Engine API
 * and the ledger); warm pools hand out started containers (time-to-first-command printed with
 * and without a pool), are labelled and cleaned, and never supply grading sandboxes; sandbox
 * limits (live count, creation rate) and the model-connection limit hold; infrastructure
 * failures retry in a fresh sandbox and are recorded as errors, never reward 0; and the
 * engine is reached over TLS with client certificates (a TLS-terminating proxy in front of
 * the real engine) and over `ssh://` through a real sshd on loopback.
 * @module
 */
import assert from "node:assert/strict";
import { basename, join } from "node:path";
import {
  DockerEngine,
  DockerRuntime,
  Ledger,
  SandboxLimits,
  SandboxUnavailableError,
  WarmPool,
} from "../runtimes/mod.ts";
import { cleanupContainers } from "../runtimes/docker/mod.ts";
import { cleanupLedger } from "../runtimes/ledger.ts";
import type { Runtime, RuntimeSpec } from "../runtimes/runtime.ts";
import type { AcquireOptions, SandboxSource } from "../runtimes/pool.ts";
import { OpenAIChatClient } from "../lib/model/client.ts";
import { getHarness } from "../lib/tasks/harness_registry.ts";
import { runTaskRollout } from "../lib/tasks/rollout/mod.ts";
import { loadTaskset as loadFileSum } from "../environments/file_sum/mod.ts";
import {
  bashModel,
  type ModelServer,
  type Reply,
  type Responder,
  textReply,
  toolCallReply,
  withModelServer,
} from "./model_server.ts";
import { makeCertificates, startSshd, startTlsProxy } from "./_remote_docker.ts";
import { cliCommand, type CliResult, collect, transcript } from "./_cli.ts";
import { EngineEvents } from "./_engine_events.ts";

const DOCKER_SOCKET = "/var/run/docker.sock";
const MODEL = "vf-test";
const IMAGE = "busybox:latest";

// ---------------------------------------------------------------------------------------
// The CLI as a subprocess

/** The CLI with a bare environment plus DOCKER_HOST and `env`. */
function spawnCli(args: string[], cwd: string, env: Record<string, string>): Deno.ChildProcess {
  return cliCommand(args, { cwd, env, registry: false, docker: true }).spawn();
}

function cli(args: string[], cwd: string, env: Record<string, string>): Promise<CliResult> {
  return collect(spawnCli(args, cwd, env));
}

/** `vf run file-sum` on busybox against `server`, writing under ./out, plus `flags`. */
function fileSumRun(server: ModelServer, ...flags: string[]): string[] {
  const model = ["-m", MODEL, "-b", server.url];
  return ["run", "file-sum", ...model, "-o", "out", "--env.taskset.image", IMAGE, ...flags];
}

function runDirOf(stderr: string): string | undefined {
  return /^Saving traces to (.+)$/m.exec(stderr)?.[1];
}

/** `vf <args>` in the background: stdout discarded, stderr read as it comes. */
class BackgroundCli {
  stderr = "";
  readonly #child: Deno.ChildProcess;
  readonly #reading: Promise<void>;

  constructor(args: string[], cwd: string, env: Record<string, string>) {
    const child = this.#child = spawnCli(args, cwd, env);
    this.#reading = (async () => {
      for await (const chunk of child.stderr.pipeThrough(new TextDecoderStream())) {
        this.stderr += chunk;
      }
    })();
    child.stdout.cancel();
  }

  /**
   * Waits up to 60 s until the run announced its directory and `ready(runId)` holds; returns
   * the run id announced by then, if any.
   */
  async waitFor(ready: (runId: string) => Promise<boolean>): Promise<string | undefined> {
    let runId: string | undefined;
    const deadline = Date.now() + 60_000;
    while (Date.now() < deadline) {
      const runDir = runDirOf(this.stderr);
      runId = runDir ? basename(runDir) : undefined;
      if (runId && await ready(runId)) break;
      await new Promise((r) => setTimeout(r, 100));
    }
    return runId;
  }

  /** The exit status of a run left to finish, once stderr is read to its end. */
  async done(): Promise<Deno.CommandStatus> {
    const status = await this.#child.status;
    await this.#reading;
    return status;
  }

  /** Sends `signal`; the exit status, once stderr is read to its end. */
  async kill(signal: Deno.Signal): Promise<Deno.CommandStatus> {
    this.#child.kill(signal);
    const status = await this.#child.status;
    await this.#reading;
    return status;
  }
}

// deno-lint-ignore no-explicit-any
type Json = any;

async function readTraces(dir: string): Promise<Json[]> {
  const text = await Deno.readTextFile(join(dir, "traces.jsonl"));
  return text.split("\n").filter((l) => l).map((l) => JSON.parse(l));
}

/** Asserts that a `vf run` exited 0 with `n` traces, each of reward 1; returns its run id. */
async function solvedRun(res: CliResult, n: number): Promise<string> {
  assert.equal(res.code, 0, transcript(res));
  const runDir = runDirOf(res.stderr)!;
  const traces = await readTraces(runDir);
  assert.equal(traces.length, n);
  for (const t of traces) assert.equal(t.reward, 1, JSON.stringify(t.error));
  return basename(runDir);
}

// ---------------------------------------------------------------------------------------
// The Engine API, straight (not through vf's client)

async function engineGet(path: string): Promise<Json> {
  const client = Deno.createHttpClient({ proxy: { transport: "unix", path: DOCKER_SOCKET } });
  try {
    const res = await fetch(`http://docker${path}`, { client });
    assert.equal(res.status, 200, `GET ${path}: ${await res.clone().text()}`);
    return await res.json();
  } finally {
    client.close();
  }
}

/** Every vf container (any state) of a run. */
async function runContainers(runId: string): Promise<Json[]> {
  const filters = encodeURIComponent(
    JSON.stringify({ label: ["vf.managed=1", `vf.run_id=${runId}`] }),
  );
  return await engineGet(`/containers/json?all=1&filters=${filters}`);
}

// ---------------------------------------------------------------------------------------
// Scripted models

const SOLVE = "awk '{ s += $1 } END { print s }' /app/input.txt > /app/output/answer.txt";

async function tempDir(prefix: string): Promise<string> {
  return await Deno.makeTempDir({ prefix });
}

function median(values: number[]): number {
  const s = [...values].sort((a, b) => a - b);
  return s[Math.floor(s.length / 2)];
}

// ---------------------------------------------------------------------------------------
// The ledger

Deno.test("the ledger records a container as requested before the engine creates it, then created and stopped", async () => {
  const dir = await tempDir("vf_ledger_");
  const ledger = new Ledger(join(dir, "ledger.jsonl"));
  const runId = `ledger-${crypto.randomUUID().slice(0, 8)}`;
  const rt = new DockerRuntime({ type: "docker", image: IMAGE }, { runId, ledger });
  try {
    await rt.start();
    const info = await engineGet(`/containers/${rt.id}/json`);
    const entries = await ledger.entries();
    assert.deepEqual(entries.map((e) => e.event), ["requested", "created"]);
    const [requested, created] = entries;
    assert.equal(requested.key, rt.name);
    assert.equal(requested.id, undefined, "the id cannot be known before the request");
    assert.equal(requested.run_id, runId);
    assert.equal(requested.labels?.["vf.run_id"], runId);
    assert.equal(requested.host?.docker_host, "unix:///var/run/docker.sock");
    assert.equal(created.id, rt.id);
    // The engine's creation time (ns precision) is after the ledger line was written.
    const engineCreated = Date.parse(info.Created);
    assert.ok(
      Date.parse(requested.at) <= engineCreated,
      `requested at ${requested.at}, created by the engine at ${info.Created}`,
    );
    assert.deepEqual((await ledger.live({ runId })).map((s) => s.id), [rt.id]);
  } finally {
    await rt.stop();
  }
  assert.deepEqual((await ledger.entries()).map((e) => e.event), [
    "requested",
    "created",
    "stopped",
  ]);
  assert.deepEqual(await ledger.live(), []);
  await Deno.remove(dir, { recursive: true });
});

Deno.test("a start aborted while the engine is creating the container leaves no container behind", async () => {
  const dir = await tempDir("vf_abort_create_");
  const runId = `abort-${crypto.randomUUID().slice(0, 8)}`;
  try {
    for (let i = 0; i < 5; i++) {
      const controller = new AbortController();
      // Aborts the moment the create request goes out (the ledger's "requested" comes first).
      class AbortingLedger extends Ledger {
        override async record(entry: Parameters<Ledger["record"]>[0]): Promise<void> {
          await super.record(entry);
          if (entry.event === "requested") setTimeout(() => controller.abort(), 0);
        }
      }
      const ledger = new AbortingLedger(join(dir, `ledger-${i}.jsonl`));
      const rt = new DockerRuntime({ type: "docker", image: IMAGE }, { runId, ledger });
      await assert.rejects(() => rt.start({ signal: controller.signal }));
      await rt.stop();
    }
    // A create the engine finished after the removal would show up here, in state "created".
    await new Promise((r) => setTimeout(r, 500));
    assert.deepEqual((await runContainers(runId)).map((c) => `${c.Names} ${c.State}`), []);
  } finally {
    await cleanupContainers({ runId });
    await Deno.remove(dir, { recursive: true });
  }
});

Deno.test("vf cleanup --run removes what an evaluator killed with SIGKILL mid-run left behind, on the engine and in the ledger", async () => {
  const dir = await tempDir("vf_sigkill_");
  const ledgerPath = join(dir, "ledger.jsonl");
  const env = { VF_LEDGER: ledgerPath };
  await withModelServer(bashModel("sleep 30", SOLVE), async (server) => {
    const run = new BackgroundCli(fileSumRun(server, "-n", "2", "-c", "2"), dir, env);
    // Wait until both agents run `sleep 30` (each asked the model once) and their containers exist.
    const runId = await run.waitFor(async (id) =>
      server.requests.length >= 2 && (await runContainers(id)).length >= 2
    );
    assert.ok(runId, `the run never announced its directory:\n${run.stderr}`);
    await new Promise((r) => setTimeout(r, 500)); // the `sleep 30` execs are running
    const status = await run.kill("SIGKILL");
    assert.equal(status.signal, "SIGKILL");

    // SIGKILL skipped every teardown: the containers and the ledger's live entries remain.
    const leaked = await runContainers(runId!);
    assert.equal(leaked.length, 2, JSON.stringify(leaked.map((c: Json) => c.Names)));
    const ledger = new Ledger(ledgerPath);
    const lines = (await ledger.entries()).filter((e) => e.run_id === runId);
    for (const key of new Set(lines.map((e) => e.key))) {
      const events = lines.filter((e) => e.key === key).map((e) => e.event);
      assert.deepEqual(events.slice(0, 2), ["requested", "created"], key);
    }
    const live = await ledger.live({ runId });
    assert.deepEqual(
      live.map((s) => s.id).sort(),
      leaked.map((c: Json) => c.Id).sort(),
    );

    const res = await cli(["cleanup", "--run", runId!], dir, env);
    assert.equal(res.code, 0, transcript(res));
    assert.match(res.stdout, /removed 2 containers/);
    assert.deepEqual(await runContainers(runId!), []);
    assert.deepEqual(await ledger.live({ runId }), []);
  });
  await Deno.remove(dir, { recursive: true });
});

Deno.test("vf cleanup from another process leaves a live run's sandboxes alone, and the run scores every task", async () => {
  const dir = await tempDir("vf_live_cleanup_");
  const env = { VF_LEDGER: join(dir, "ledger.jsonl") };
  // The agents' second model call waits until the test has checked the containers: until
  // then the run cannot finish a rollout and remove a container itself (under load, a fixed
  // `sleep` in the agent was not always long enough, and the run's own teardown looked like
  // cleanup's doing).
  let release!: () => void;
  const gate = new Promise<void>((resolve) => (release = resolve));
  const solver = bashModel(SOLVE);
  const held: Responder = async (request, ctx) => {
    if (request.body.messages.some((m) => m.role === "assistant")) await gate;
    return solver(request, ctx);
  };
  await withModelServer(held, async (server) => {
    const run = new BackgroundCli(fileSumRun(server, "-n", "2", "-c", "2"), dir, env);
    try {
      const runId = await run.waitFor(async (id) =>
        server.requests.length >= 4 && (await runContainers(id)).length >= 2
      );
      assert.ok(runId, `the run never announced its directory:\n${run.stderr}`);
      const before = (await runContainers(runId!)).map((c: Json) => c.Id as string);
      // --run keeps this test clear of other tests' leftovers; without --force the owner check
      // applies exactly as for a plain `vf cleanup`.
      const res = await cli(["cleanup", "--run", runId!], dir, env);
      assert.equal(res.code, 0, transcript(res));
      assert.match(res.stdout, /removed 0 containers/, transcript(res));
      assert.match(res.stdout, /its run is still going \(pid \d+/, transcript(res));
      const after = (await runContainers(runId!)).map((c: Json) => c.Id as string);
      for (const id of before) assert.ok(after.includes(id), `container ${id} was removed`);
    } finally {
      release();
    }

    const status = await run.done();
    assert.equal(status.code, 0, run.stderr);
    const traces = await readTraces(runDirOf(run.stderr)!);
    assert.equal(traces.length, 2);
    for (const t of traces) {
      assert.equal(t.error, null, JSON.stringify(t.error));
      assert.equal(t.reward, 1);
    }
  });
  await Deno.remove(dir, { recursive: true });
});

Deno.test("vf cleanup --run takes run ids shaped like numbers (590143e8, 00123456) as the ids they are", async () => {
  const dir = await tempDir("vf_numeric_run_");
  const env = { VF_LEDGER: join(dir, "ledger.jsonl") };
  const digits = () => String(Math.floor(Math.random() * 900_000) + 100_000);
  // Random per test run, so no other test can hold containers with these ids.
  const ids = [`${digits()}e${Math.floor(Math.random() * 10)}`, `00${digits()}`];
  const runtimes = ids.map((runId) =>
    new DockerRuntime({ type: "docker", image: IMAGE }, { runId })
  );
  try {
    await Promise.all(runtimes.map((rt) => rt.start()));
    for (const runId of ids) {
      assert.equal((await runContainers(runId)).length, 1, runId);
      // This test process made them and still runs: kept without --force.
      const kept = await cli(["cleanup", "--run", runId], dir, env);
      assert.equal(kept.code, 0, transcript(kept));
      assert.match(kept.stdout, /removed 0 containers/, transcript(kept));
      assert.match(kept.stdout, /kept 1 sandbox:\n.*its run is still going/, transcript(kept));
      assert.equal((await runContainers(runId)).length, 1, runId);
      const res = await cli(["cleanup", "--run", runId, "--force"], dir, env);
      assert.equal(res.code, 0, transcript(res));
      assert.match(res.stdout, /removed 1 container\n/, transcript(res));
      assert.deepEqual(await runContainers(runId), [], `run ${runId} still has containers`);
    }
  } finally {
    await Promise.all(runtimes.map((rt) => rt.stop()));
  }
  await Deno.remove(dir, { recursive: true });
});

Deno.test("SIGINT mid-run tears down every live container, pooled ones included, and the ledger shows none live", async () => {
  const dir = await tempDir("vf_sigint_");
  const ledgerPath = join(dir, "ledger.jsonl");
  await withModelServer(bashModel("sleep 30", SOLVE), async (server) => {
    const run = new BackgroundCli(
      fileSumRun(server, "-n", "2", "-c", "2", "--env.agent.runtime.warm_pool", "2"),
      dir,
      { VF_LEDGER: ledgerPath },
    );
    // Two agents in `sleep 30` plus two pooled replacements.
    const runId = await run.waitFor(async (id) =>
      server.requests.length >= 2 && (await runContainers(id)).length >= 4
    );
    assert.ok(runId, `the run never announced its directory:\n${run.stderr}`);
    const before = await runContainers(runId!);
    assert.ok(before.some((c: Json) => c.Labels["vf.pool"] === "1"), "no pooled container seen");
    const status = await run.kill("SIGINT");
    assert.equal(status.code, 130, run.stderr);
    assert.deepEqual(await runContainers(runId!), []);
    assert.deepEqual(await new Ledger(ledgerPath).live({ runId }), []);
  });
  await Deno.remove(dir, { recursive: true });
});

// ---------------------------------------------------------------------------------------
// Warm pools

Deno.test("a warm pool hands out started containers: time-to-first-command with and without a pool", async () => {
  const dir = await tempDir("vf_pool_");
  const ledger = new Ledger(join(dir, "ledger.jsonl"));
  const runId = `pool-${crypto.randomUUID().slice(0, 8)}`;
  const spec: RuntimeSpec = { type: "docker", image: IMAGE, labels: { "vf.role": "agent" } };
  const rounds = 5;
  const create = (s: RuntimeSpec, o: { runId?: string; task?: string }) =>
    new DockerRuntime(s as never, { ...o, ledger });

  // Without a pool: create, start, first command.
  const cold: number[] = [];
  for (let i = 0; i < rounds; i++) {
    const t0 = performance.now();
    const rt = create(spec, { runId });
    await rt.start();
    assert.equal((await rt.run(["true"])).exit_code, 0);
    cold.push(performance.now() - t0);
    await rt.stop();
  }

  // With a pool: the container was started before acquire() was called.
  const pool = new WarmPool({ size: 1, runId, create });
  const warm: number[] = [];
  try {
    for (let i = 0; i < rounds; i++) {
      await pool.prewarm(spec);
      const before = new Date();
      const t0 = performance.now();
      const rt = await pool.acquire(spec, { runId, task: "t" });
      assert.equal((await rt.run(["true"])).exit_code, 0);
      warm.push(performance.now() - t0);
      const info = await engineGet(`/containers/${rt.id}/json`);
      assert.ok(
        Date.parse(info.State.StartedAt) < before.getTime(),
        `pooled container started at ${info.State.StartedAt}, acquired at ${before.toISOString()}`,
      );
      assert.equal(info.Config.Labels["vf.pool"], "1");
      assert.equal(info.Config.Labels["vf.run_id"], runId);
      assert.equal(info.Config.Labels["vf.managed"], "1");
      await rt.stop();
    }
    assert.equal(pool.stats.hits, rounds);
    assert.equal(pool.stats.misses, 0);
  } finally {
    await pool.close();
  }
  console.log(
    `time-to-first-command (create+start+exec vs pooled acquire+exec), median of ${rounds}: ` +
      `without pool ${median(cold).toFixed(1)} ms, with pool ${median(warm).toFixed(1)} ms`,
  );
  assert.deepEqual(await runContainers(runId), []);
  assert.deepEqual(await ledger.live({ runId }), []);
  await Deno.remove(dir, { recursive: true });
});

Deno.test("pooled containers are labelled, recorded in the ledger and removed by cleanup like any other", async () => {
  const dir = await tempDir("vf_pool_clean_");
  const ledger = new Ledger(join(dir, "ledger.jsonl"));
  const runId = `poolclean-${crypto.randomUUID().slice(0, 8)}`;
  const spec: RuntimeSpec = { type: "docker", image: IMAGE };
  const pool = new WarmPool({
    size: 2,
    runId,
    create: (s, o) => new DockerRuntime(s as never, { ...o, ledger }),
  });
  await pool.prewarm(spec);
  assert.equal(pool.stats.ready, 2);
  const pooled = await runContainers(runId);
  assert.equal(pooled.length, 2);
  for (const c of pooled) {
    assert.equal(c.Labels["vf.pool"], "1");
    assert.equal(c.State, "running");
  }
  assert.equal((await ledger.live({ runId })).length, 2);
  // The process "dies" without closing its pool: the ledger's cleaner removes both, and the
  // label sweep finds nothing left.
  const report = await cleanupLedger({ runId }, { ledger });
  assert.equal(report.removed.length, 2);
  assert.deepEqual(report.failed, []);
  assert.deepEqual(await ledger.live({ runId }), []);
  assert.deepEqual(await cleanupContainers({ runId }), []);
  await pool.close(); // already gone: still fine
  assert.deepEqual(await runContainers(runId), []);
  await Deno.remove(dir, { recursive: true });
});

Deno.test("vf run with a warm pool: agents get pooled containers, grading sandboxes are always fresh", async () => {
  const dir = await tempDir("vf_pool_run_");
  await using events = new EngineEvents();
  await events.ready();
  const res = await withModelServer(bashModel(SOLVE), (server) =>
    cli(
      fileSumRun(server, "-n", "3", "-r", "2", "-c", "2", "--env.agent.runtime.warm_pool", "2"),
      dir,
      { VF_LEDGER: join(dir, "ledger.jsonl") },
    ));
  const runId = await solvedRun(res, 6);
  await new Promise((r) => setTimeout(r, 300));
  const created = events.of(runId).filter((e) => e.action === "create");
  const graders = created.filter((e) => e.labels["vf.role"] === "grader");
  const agents = created.filter((e) => e.labels["vf.role"] === "agent");
  assert.equal(graders.length, 6);
  for (const g of graders) assert.equal(g.labels["vf.pool"], undefined, "a pooled grader");
  assert.ok(
    agents.filter((a) => a.labels["vf.pool"] === "1").length >= 4,
    `agents: ${JSON.stringify(agents.map((a) => a.labels))}`,
  );
  assert.deepEqual(await runContainers(runId), [], "the pool was not emptied at the end");
  await Deno.remove(dir, { recursive: true });
});

// ---------------------------------------------------------------------------------------
// Limits

Deno.test("[limits] max_sandboxes = 2 with 6 concurrent rollouts: the engine never holds more than 2 of the run's containers", async () => {
  const dir = await tempDir("vf_limits_");
  await Deno.writeTextFile(
    join(dir, "run.toml"),
    `model = "${MODEL}"\noutput_dir = "out"\nmax_concurrent = 6\nnum_examples = 3\n` +
      `rollouts_per_example = 2\n\n[limits]\nmax_sandboxes = 2\nsandbox_create_rate = 20\n\n` +
      `[env.taskset]\nid = "file-sum"\nimage = "${IMAGE}"\n\n[env.agent.runtime]\nwarm_pool = 1\n`,
  );
  await using events = new EngineEvents();
  await events.ready();
  // Sample the Engine API too, counting every vf container by run.
  let sampling = true;
  const peak = new Map<string, number>();
  const sampler = (async () => {
    while (sampling) {
      const all: Json[] = await engineGet(
        `/containers/json?all=1&filters=${
          encodeURIComponent(JSON.stringify({ label: ["vf.managed=1"] }))
        }`,
      );
      const counts = new Map<string, number>();
      for (const c of all) {
        const id = c.Labels["vf.run_id"];
        counts.set(id, (counts.get(id) ?? 0) + 1);
      }
      for (const [id, n] of counts) peak.set(id, Math.max(peak.get(id) ?? 0, n));
      await new Promise((r) => setTimeout(r, 20));
    }
  })();
  const res = await withModelServer(
    bashModel(SOLVE),
    (server) =>
      cli(["eval", "@", "run.toml", "-b", server.url], dir, {
        VF_LEDGER: join(dir, "ledger.jsonl"),
      }),
  );
  sampling = false;
  await sampler;
  const runId = await solvedRun(res, 6);
  await new Promise((r) => setTimeout(r, 300));
  const creates = events.of(runId).filter((e) => e.action === "create").length;
  assert.ok(creates >= 12, `only ${creates} containers created`); // 6 agents + 6 graders
  assert.ok(events.maxLive(runId) <= 2, `engine events show ${events.maxLive(runId)} live`);
  // A second witness, where it got a look: under a parallel test run the container list can
  // stall behind a busy container for the whole run, so the events above are what must see it.
  assert.ok((peak.get(runId) ?? 0) <= 2, `sampling saw ${peak.get(runId)} live`);
  assert.deepEqual(await runContainers(runId), []);
  await Deno.remove(dir, { recursive: true });
});

Deno.test("[limits]: a rollout waiting its turn for a sandbox slot is not timed out by its setup timeout", async () => {
  // One slot, two rollouts, an 8 s setup timeout: the second waits ~30 s for the first's slot.
  // Counted against its setup, that wait used to fail it (three attempts of 8 s each end
  // before the slot frees). The setup timeout also covers creating and starting the
  // container, which takes seconds at a load of 10: 8 s leaves it room, 30 s outlasts 3 x 8.
  const dir = await tempDir("vf_limits_wait_");
  // Only the rollout that gets the slot first holds it; the one after it solves at once.
  let started = 0;
  const res = await withModelServer(
    ({ body }) =>
      body.messages.some((m) => m.role === "assistant")
        ? textReply("done")
        : toolCallReply("bash", { command: started++ === 0 ? `sleep 30; ${SOLVE}` : SOLVE }),
    (server) =>
      cli(
        fileSumRun(
          server,
          "-n",
          "1",
          "-r",
          "2",
          "-c",
          "2",
          "--limits.max_sandboxes",
          "1",
          "--env.agent.timeout.setup",
          "8",
          "--env.agent.scoring.mode",
          "shared",
        ),
        dir,
        { VF_LEDGER: join(dir, "ledger.jsonl") },
      ),
  );
  const runId = await solvedRun(res, 2);
  const traces = await readTraces(runDirOf(res.stderr)!);
  // One of them did wait (its sandbox phase spans the other's whole rollout).
  const waited = Math.max(...traces.map((t) => t.timing.setup_ms ?? 0));
  assert.ok(waited >= 25_000, `the longest setup took ${waited} ms: nobody waited for the slot`);
  assert.deepEqual(await runContainers(runId), []);
  await Deno.remove(dir, { recursive: true });
});

Deno.test("sandbox_create_rate: container creations are spaced by the token bucket", async () => {
  const runId = `rate-${crypto.randomUUID().slice(0, 8)}`;
  const rate = 4;
  const n = 6;
  const limits = new SandboxLimits({ createRate: rate });
  // When the bucket lets each start through: what the limit governs. The engine's own
  // create times follow, shifted by however long each request then takes under load.
  const admitted: number[] = [];
  class TimedDocker extends DockerRuntime {
    override start(options?: { signal?: AbortSignal }) {
      admitted.push(performance.now());
      return super.start(options);
    }
  }
  await using events = new EngineEvents();
  await events.ready();
  const runtimes = Array.from(
    { length: n },
    () => limits.wrap(new TimedDocker({ type: "docker", image: IMAGE }, { runId, ledger: null })),
  );
  try {
    await Promise.all(runtimes.map((rt) => rt.start()));
  } finally {
    await Promise.all(runtimes.map((rt) => rt.stop()));
  }
  await new Promise((r) => setTimeout(r, 300));
  const created = events.of(runId).filter((e) => e.action === "create");
  assert.equal(created.length, n, "every admitted start created a container");
  const times = admitted.sort((a, b) => a - b);
  assert.equal(times.length, n);
  const gaps = times.slice(1).map((t, i) => t - times[i]);
  const span = times[n - 1] - times[0];
  // One token per 250 ms after the first (burst 1); timers may fire a little early or late.
  assert.ok(span >= (n - 1) * (1000 / rate) * 0.9, `starts spanned only ${span.toFixed(0)} ms`);
  assert.ok(Math.min(...gaps) >= (1000 / rate) * 0.6, `gaps ${gaps.map((g) => g.toFixed(0))}`);
  assert.equal(limits.for("docker").peak, n);
});

Deno.test("[limits] max_model_connections caps model requests in flight, separately from sandboxes", async () => {
  const dir = await tempDir("vf_modelconn_");
  let inflight = 0;
  let peak = 0;
  const responder: Responder = async ({ body }) => {
    inflight++;
    peak = Math.max(peak, inflight);
    await new Promise((r) => setTimeout(r, 150));
    inflight--;
    const turn = body.messages.filter((m) => m.role === "assistant").length;
    return (turn === 0 ? toolCallReply("bash", { command: SOLVE }) : textReply("done")) as Reply;
  };
  const res = await withModelServer(responder, (server) =>
    cli(
      fileSumRun(
        server,
        "-n",
        "4",
        "-c",
        "4",
        "--limits.max_model_connections",
        "1",
        "--env.agent.scoring.mode",
        "shared",
      ),
      dir,
      { VF_LEDGER: join(dir, "ledger.jsonl") },
    ));
  await solvedRun(res, 4);
  assert.equal(peak, 1, `model saw ${peak} concurrent requests`);
  await Deno.remove(dir, { recursive: true });
});

// ---------------------------------------------------------------------------------------
// Infrastructure failures

Deno.test("an unreachable engine is retried in fresh sandboxes and recorded as an infra error, never reward 0", async () => {
  const dir = await tempDir("vf_infra_");
  const res = await withModelServer(bashModel(SOLVE), (server) =>
    cli(
      fileSumRun(server, "-n", "1"),
      dir,
      {
        DOCKER_HOST: `unix://${join(dir, "no-such-docker.sock")}`,
        VF_LEDGER: join(dir, "ledger.jsonl"),
      },
    ));
  // Nothing was scored: exit 1, and no average that reads as a score of 0.
  assert.equal(res.code, 1, transcript(res));
  assert.match(res.stderr, /error: every rollout errored \(1 of 1\)/);
  assert.match(res.stdout, /reward n\/a \(every rollout \(1\) failed on infrastructure\)/);
  const runDir = runDirOf(res.stderr)!;
  const [trace] = await readTraces(runDir);
  assert.equal(trace.reward, null);
  assert.equal(trace.ok, false);
  assert.equal(trace.runtime.attempts, 3);
  assert.equal(trace.error.phase, "setup");
  assert.equal(trace.error.error, "SandboxUnavailableError");
  assert.equal(trace.error.infra, true);
  const metadata = JSON.parse(await Deno.readTextFile(join(runDir, "metadata.json")));
  assert.equal(metadata.num_errors, 1);
  assert.equal(metadata.num_infra_errors, 1);
  assert.equal(metadata.avg_reward, null);
  assert.equal(metadata.no_score_reason, "every rollout (1) failed on infrastructure");
  assert.equal(metadata.pass_at_k_excluded, 1);
  await Deno.remove(dir, { recursive: true });
});

Deno.test("a sandbox that fails to come up is replaced by a fresh one and the rollout scores normally", async () => {
  const runId = `retry-${crypto.randomUUID().slice(0, 8)}`;
  const pool = new WarmPool({ runId });
  let calls = 0;
  // The first agent sandbox's engine connection drops (as when dockerd restarts).
  const flaky: SandboxSource = {
    acquire(spec: RuntimeSpec, options?: AcquireOptions): Promise<Runtime> {
      if (options?.role === "agent" && calls++ === 0) {
        return Promise.reject(new SandboxUnavailableError("Cannot reach the Docker engine"));
      }
      return pool.acquire(spec, options);
    },
    close: () => pool.close(),
  };
  const [task] = await loadFileSum({ image: IMAGE }).tasks(1);
  await withModelServer(bashModel(SOLVE), async (server) => {
    const trace = await runTaskRollout({
      task,
      tasksetId: "file-sum",
      policy: { runtime: {}, harness: getHarness("bash"), sandboxes: flaky },
      client: new OpenAIChatClient({ base_url: server.url, api_key: "x" }),
      model: MODEL,
      runId,
    });
    assert.equal(trace.error, null);
    assert.equal(trace.reward, 1);
    assert.equal(trace.runtime.attempts, 2);
    assert.equal(calls, 2);
  });
  await flaky.close();
  assert.deepEqual(await runContainers(runId), []);
});

// ---------------------------------------------------------------------------------------
// Remote engines

Deno.test("DOCKER_HOST=tcp:// with DOCKER_TLS_VERIFY: the real engine answers through TLS with client certificates", async () => {
  const dir = await tempDir("vf_tls_");
  await makeCertificates(dir);
  const other = await tempDir("vf_tls_other_");
  await makeCertificates(other, { cn: "another CA" });
  await using proxy = await startTlsProxy(dir);
  const host = `tcp://127.0.0.1:${proxy.port}`;
  const runId = `tls-${crypto.randomUUID().slice(0, 8)}`;

  // Settings from the environment, as the CLI reads them.
  const engine = new DockerEngine(undefined, {
    env: { DOCKER_HOST: host, DOCKER_TLS_VERIFY: "1", DOCKER_CERT_PATH: dir },
  });
  try {
    assert.equal(engine.endpoint.origin, `https://127.0.0.1:${proxy.port}`);
    assert.ok(await engine.ping());
    const rt = new DockerRuntime({ type: "docker", image: IMAGE }, { engine, runId, ledger: null });
    try {
      await rt.start();
      const r = await rt.run(["sh", "-c", "echo over tls"]);
      assert.equal(r.stdout, "over tls\n");
    } finally {
      await rt.stop();
    }
    assert.ok(proxy.connections >= 1);
  } finally {
    await engine.close();
  }

  // An engine certificate from an unknown CA is refused by the client...
  const stranger = new DockerEngine(host, { tlsVerify: true, certPath: other });
  await assert.rejects(
    () => stranger.version(),
    (e: Error) =>
      e instanceof SandboxUnavailableError && /over TLS: self-signed/.test(e.message) &&
      e.message.includes(other),
  );
  await stranger.close();
  // ...and a client certificate from an unknown CA by the engine's side.
  const mixed = await tempDir("vf_tls_mixed_");
  await Deno.copyFile(join(dir, "ca.pem"), join(mixed, "ca.pem"));
  await Deno.copyFile(join(other, "cert.pem"), join(mixed, "cert.pem"));
  await Deno.copyFile(join(other, "key.pem"), join(mixed, "key.pem"));
  const accepted = proxy.connections;
  const impostor = new DockerEngine(host, { tlsVerify: true, certPath: mixed });
  await assert.rejects(
    () => impostor.version(),
    (e: Error) => e instanceof SandboxUnavailableError && /over TLS/.test(e.message),
  );
  await impostor.close();
  assert.ok(proxy.rejected >= 1, "the proxy never refused a client certificate");
  assert.equal(proxy.connections, accepted);

  // End to end: vf run against the TLS endpoint.
  const work = await tempDir("vf_tls_run_");
  const ledgerPath = join(work, "ledger.jsonl");
  const res = await withModelServer(bashModel(SOLVE), (server) =>
    cli(
      fileSumRun(server, "-n", "1"),
      work,
      {
        DOCKER_HOST: host,
        DOCKER_TLS_VERIFY: "1",
        DOCKER_CERT_PATH: dir,
        VF_LEDGER: ledgerPath,
      },
    ));
  assert.equal(res.code, 0, transcript(res));
  const [trace] = await readTraces(runDirOf(res.stderr)!);
  assert.equal(trace.reward, 1, JSON.stringify(trace.error));
  const requested = (await new Ledger(ledgerPath).entries()).filter((e) => e.event === "requested");
  assert.equal(requested.length, 2); // agent + grader
  for (const e of requested) {
    assert.deepEqual(e.host, { docker_host: host, tls_verify: true, cert_path: dir });
  }
  for (const d of [dir, other, mixed, work]) await Deno.remove(d, { recursive: true });
});

Deno.test("DOCKER_HOST=ssh://: the Engine API over a real sshd, with known-hosts checking and a dial-stdio fallback", async () => {
  const dir = await tempDir("vf_ssh_");
  await using sshd = await startSshd(dir);
  const host = `ssh://root@127.0.0.1:${sshd.port}`;
  const runId = `ssh-${crypto.randomUUID().slice(0, 8)}`;

  // A host missing from known_hosts is refused (no silent trust on first use).
  const emptyKnown = join(dir, "empty_known_hosts");
  await Deno.writeTextFile(emptyKnown, "");
  const refused = new DockerEngine(host, {
    ssh: { identityFile: sshd.keyFile, knownHostsFile: emptyKnown },
  });
  await assert.rejects(
    () => refused.version(),
    (e: Error) =>
      e instanceof SandboxUnavailableError && /not in known_hosts/.test(e.message) &&
      /DOCKER_SSH_HOST_KEY_CHECKING=accept-new/.test(e.message),
  );
  await refused.close();

  // accept-new records the key of a host seen for the first time.
  const fresh = join(dir, "fresh_known_hosts");
  const tofu = new DockerEngine(host, {
    ssh: { identityFile: sshd.keyFile, knownHostsFile: fresh, hostKeyChecking: "accept-new" },
  });
  assert.ok((await tofu.version()).ApiVersion);
  await tofu.close();
  assert.match(await Deno.readTextFile(fresh), new RegExp(`^\\[127\\.0\\.0\\.1\\]:${sshd.port} `));

  // A known host, configured from DOCKER_SSH_* variables: containers work end to end.
  const engine = new DockerEngine(undefined, {
    env: {
      DOCKER_HOST: host,
      DOCKER_SSH_KEY: sshd.keyFile,
      DOCKER_SSH_KNOWN_HOSTS: sshd.knownHosts,
    },
  });
  try {
    const rt = new DockerRuntime({ type: "docker", image: IMAGE }, { engine, runId, ledger: null });
    try {
      await rt.start();
      const r = await rt.run(["sh", "-c", "echo out; echo err >&2; exit 3"], { timeoutMs: 10_000 });
      assert.deepEqual([r.exit_code, r.stdout, r.stderr], [3, "out\n", "err\n"]);
      await rt.write("/tmp/f.txt", "through ssh");
      assert.equal(new TextDecoder().decode(await rt.read("/tmp/f.txt")), "through ssh");
      // Several commands at once: several channels over one SSH connection.
      const many = await Promise.all(
        Array.from({ length: 6 }, (_, i) => rt.run(["echo", String(i)])),
      );
      assert.deepEqual(many.map((m) => m.stdout), ["0\n", "1\n", "2\n", "3\n", "4\n", "5\n"]);
    } finally {
      await rt.stop();
    }
  } finally {
    await engine.close();
  }
  assert.match(await sshd.log(), /Accepted publickey for root/);

  // vf run over ssh:// end to end.
  const work = await tempDir("vf_ssh_run_");
  const res = await withModelServer(bashModel(SOLVE), (server) =>
    cli(
      fileSumRun(server, "-n", "1"),
      work,
      {
        DOCKER_HOST: host,
        DOCKER_SSH_KEY: sshd.keyFile,
        DOCKER_SSH_KNOWN_HOSTS: sshd.knownHosts,
        VF_LEDGER: join(work, "ledger.jsonl"),
      },
    ));
  assert.equal(res.code, 0, transcript(res));
  const [trace] = await readTraces(runDirOf(res.stderr)!);
  assert.equal(trace.reward, 1, JSON.stringify(trace.error));
  assert.deepEqual(await runContainers(basename(runDirOf(res.stderr)!)), []);

  // A server that refuses stream-local forwarding: `docker system dial-stdio` carries the API.
  const dir2 = await tempDir("vf_ssh_stdio_");
  await using noForward = await startSshd(dir2, { streamLocal: false });
  const stdio = new DockerEngine(`ssh://root@127.0.0.1:${noForward.port}`, {
    ssh: { identityFile: noForward.keyFile, knownHostsFile: noForward.knownHosts },
  });
  try {
    const rt = new DockerRuntime({ type: "docker", image: IMAGE }, {
      engine: stdio,
      runId,
      ledger: null,
    });
    try {
      await rt.start();
      assert.equal((await rt.run(["echo", "stdio"])).stdout, "stdio\n");
    } finally {
      await rt.stop();
    }
  } finally {
    await stdio.close();
  }
  const log = await noForward.log();
  assert.match(log, /refused streamlocal port forward/);
  assert.match(log, /Starting session: command/);
  assert.deepEqual(await runContainers(runId), []);
  for (const d of [dir, dir2, work]) await Deno.remove(d, { recursive: true }).catch(() => {});
});
