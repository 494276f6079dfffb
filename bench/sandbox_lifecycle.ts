/**
 * Sandbox lifecycle on the local Docker engine: create → start → exec `true` → write a
 * 1 KiB file → read it back → remove, per sandbox, at several concurrencies, in three ways
 * measured in the same run:
 *
 * - **vf**: `createRuntime({ type: "docker", image })` start / run / write / read / stop;
 * - **bare**: the same Engine API calls from a minimal client in this file (`node:http` on
 *   the unix socket with keep-alive, a hand-packed tar; no vf code) — the baseline;
 * - **cli**: the docker CLI (`docker run -d`, `docker exec`, `docker cp` in and out,
 *   `docker rm -f`).
 *
 * Then time-to-first-command (acquire a sandbox and run `true`) without and with a warm pool
 * (`WarmPool`), and the isolated-grading overhead per rollout on the file-sum task: collect
 * artifacts, start a fresh grading sandbox, setup, restore, stage a file, score, remove —
 * against scoring the same task in the agent's sandbox (stage + score).
 *
 * `deno run -A bench/sandbox_lifecycle.ts [--levels 1,8,32] [--lifecycles 8,32,64]
 * [--repeats 3] [--samples 8] [--image busybox]`
 * @module
 */
import http from "node:http";
import process from "node:process";
import { join } from "node:path";
import { Buffer } from "node:buffer";
import { loadTaskset } from "../environments/file_sum/mod.ts";
import { collectArtifacts, restoreArtifacts } from "../lib/tasks/rollout/mod.ts";
import type { Task, TaskHookContext, TraceView } from "../lib/tasks/task.ts";
import { cleanupContainers, DockerEngine } from "../runtimes/docker/mod.ts";
import { setDefaultLedger } from "../runtimes/ledger.ts";
import { WarmPool } from "../runtimes/pool.ts";
import { createRuntime } from "../runtimes/create.ts";
import type { Runtime, RuntimeSpec } from "../runtimes/runtime.ts";

function flag(name: string, fallback: string): string {
  const args = process.argv.slice(2);
  const i = args.indexOf(`--${name}`);
  return i >= 0 && i + 1 < args.length ? args[i + 1] : fallback;
}

const LEVELS = flag("levels", "1,8,32").split(",").map(Number);
const LIFECYCLES = flag("lifecycles", "8,32,64").split(",").map(Number);
const REPEATS = Number(flag("repeats", "3"));
const SAMPLES = Number(flag("samples", "8"));
const IMAGE = flag("image", "busybox");
const SOCKET = "/var/run/docker.sock";
const RUN_ID = `bench-lc-${crypto.randomUUID().slice(0, 8)}`;
const LABELS = { "vf.managed": "1", "vf.run_id": RUN_ID };
const FILE = "/tmp/vf-bench.txt";
const PAYLOAD = new Uint8Array(1024).map((_, i) => 97 + (i % 26));

type Steps = Record<string, number>;
type Lifecycle = (steps: Steps) => Promise<void>;

async function step(steps: Steps, name: string, fn: () => Promise<void>): Promise<void> {
  const t0 = performance.now();
  await fn();
  steps[name] = (steps[name] ?? 0) + performance.now() - t0;
}

function sameBytes(a: Uint8Array, b: Uint8Array): boolean {
  return a.length === b.length && a.every((v, i) => v === b[i]);
}

// ---- vf ----------------------------------------------------------------------------------

async function vfLifecycle(steps: Steps): Promise<void> {
  const rt = createRuntime({ type: "docker", image: IMAGE }, { runId: RUN_ID });
  try {
    await step(steps, "create+start", () => rt.start());
    await step(steps, "exec true", async () => {
      const r = await rt.run(["true"]);
      if (r.exit_code !== 0) throw new Error(`vf: true exited ${r.exit_code}`);
    });
    await step(steps, "write", () => rt.write(FILE, PAYLOAD));
    await step(steps, "read", async () => {
      if (!sameBytes(await rt.read(FILE), PAYLOAD)) throw new Error("vf: read back differs");
    });
  } finally {
    await step(steps, "remove", () => rt.stop());
  }
}

// ---- bare Engine API ---------------------------------------------------------------------

const agent = new http.Agent({ keepAlive: true, maxSockets: 256 });
let prefix = "";

function call(
  method: string,
  path: string,
  body?: { json?: unknown; tar?: Uint8Array },
): Promise<{ status: number; data: Buffer }> {
  return new Promise((resolve, reject) => {
    const data = body?.json !== undefined ? Buffer.from(JSON.stringify(body.json)) : body?.tar;
    const headers: Record<string, string | number> = {};
    if (data) {
      headers["content-type"] = body?.json !== undefined ? "application/json" : "application/x-tar";
      headers["content-length"] = data.length;
    }
    const req = http.request(
      { socketPath: SOCKET, path: prefix + path, method, agent, headers },
      (res) => {
        const chunks: Buffer[] = [];
        res.on("data", (c: Buffer) => chunks.push(c));
        res.on("end", () => {
          const out = { status: res.statusCode!, data: Buffer.concat(chunks) };
          if (out.status >= 300) {
            reject(new Error(`${method} ${path}: HTTP ${out.status} ${out.data}`));
          } else resolve(out);
        });
        res.on("error", reject);
      },
    );
    req.on("error", reject);
    req.end(data);
  });
}

/** `POST /exec/{id}/start` attached: the engine hijacks the connection until the process exits. */
function startAttached(execId: string): Promise<void> {
  return new Promise((resolve, reject) => {
    const data = JSON.stringify({ Detach: false, Tty: false });
    const req = http.request({
      socketPath: SOCKET,
      path: `${prefix}/exec/${execId}/start`,
      method: "POST",
      headers: {
        "content-type": "application/json",
        "content-length": data.length,
        connection: "Upgrade",
        upgrade: "tcp",
      },
    });
    req.on("upgrade", (_res, socket) => {
      socket.on("data", () => {});
      socket.once("end", () => resolve());
      socket.once("close", () => resolve());
      socket.once("error", reject);
    });
    req.on("response", (res) => {
      res.resume();
      res.on("end", () => reject(new Error(`exec start: HTTP ${res.statusCode}, no upgrade`)));
    });
    req.on("error", reject);
    req.end(data);
  });
}

function tarOf(name: string, data: Uint8Array): Uint8Array {
  const enc = new TextEncoder();
  const header = new Uint8Array(512);
  const field = (offset: number, text: string) => header.set(enc.encode(text), offset);
  const octal = (n: number, width: number) => n.toString(8).padStart(width - 1, "0") + "\0";
  field(0, name);
  field(100, octal(0o644, 8));
  field(108, octal(0, 8));
  field(116, octal(0, 8));
  field(124, octal(data.length, 12));
  field(136, octal(0, 12));
  field(148, "        ");
  field(156, "0");
  field(257, "ustar\u000000");
  field(148, octal(header.reduce((a, b) => a + b, 0), 7) + " ");
  const out = new Uint8Array(512 + Math.ceil(data.length / 512) * 512 + 1024);
  out.set(header);
  out.set(data, 512);
  return out;
}

function firstFileOf(tar: Uint8Array): Uint8Array {
  const size = parseInt(new TextDecoder().decode(tar.subarray(124, 136)).replace(/\0.*$/, ""), 8);
  return tar.subarray(512, 512 + size);
}

const TAR = tarOf("vf-bench.txt", PAYLOAD);

async function bareLifecycle(steps: Steps): Promise<void> {
  let id = "";
  try {
    await step(steps, "create+start", async () => {
      const created = await call("POST", "/containers/create", {
        json: {
          Image: IMAGE,
          Entrypoint: [""],
          Cmd: ["sleep", "infinity"],
          Labels: LABELS,
          HostConfig: { NetworkMode: "none", Init: true },
        },
      });
      id = JSON.parse(created.data.toString()).Id;
      await call("POST", `/containers/${id}/start`);
    });
    await step(steps, "exec true", async () => {
      const exec = await call("POST", `/containers/${id}/exec`, {
        json: { Cmd: ["true"], AttachStdout: true, AttachStderr: true },
      });
      const execId = JSON.parse(exec.data.toString()).Id;
      await startAttached(execId);
      for (let i = 0;; i++) {
        const info = JSON.parse((await call("GET", `/exec/${execId}/json`)).data.toString());
        if (!info.Running && info.ExitCode !== null) {
          if (info.ExitCode !== 0) throw new Error(`bare: true exited ${info.ExitCode}`);
          break;
        }
        if (i > 200) throw new Error("bare: no exit code");
        await new Promise((r) => setTimeout(r, 5));
      }
    });
    await step(steps, "write", async () => {
      await call("PUT", `/containers/${id}/archive?path=/tmp`, { tar: TAR });
    });
    await step(steps, "read", async () => {
      const got = await call("GET", `/containers/${id}/archive?path=${FILE}`);
      if (!sameBytes(firstFileOf(got.data), PAYLOAD)) throw new Error("bare: read back differs");
    });
  } finally {
    await step(steps, "remove", async () => {
      if (id) await call("DELETE", `/containers/${id}?force=1&v=1`);
    });
  }
}

// ---- docker CLI --------------------------------------------------------------------------

const DOCKER = (await Deno.stat("/usr/local/bin/docker").then(() => true, () => false))
  ? "/usr/local/bin/docker"
  : "docker";
const LOCAL_FILE = await Deno.makeTempFile({ prefix: "vf-bench-" });
await Deno.writeFile(LOCAL_FILE, PAYLOAD);

async function docker(...args: string[]): Promise<Uint8Array> {
  const { code, stdout, stderr } = await new Deno.Command(DOCKER, {
    args,
    stdout: "piped",
    stderr: "piped",
  })
    .output();
  if (code !== 0) {
    throw new Error(`docker ${args.join(" ")} exited ${code}: ${new TextDecoder().decode(stderr)}`);
  }
  return stdout;
}

async function cliLifecycle(steps: Steps): Promise<void> {
  let id = "";
  try {
    await step(steps, "create+start", async () => {
      const labels = Object.entries(LABELS).flatMap(([k, v]) => ["--label", `${k}=${v}`]);
      const out = await docker(
        "run",
        "-d",
        "--init",
        "--network",
        "none",
        ...labels,
        "--entrypoint",
        "",
        IMAGE,
        "sleep",
        "infinity",
      );
      id = new TextDecoder().decode(out).trim();
    });
    await step(steps, "exec true", async () => void await docker("exec", id, "true"));
    await step(steps, "write", async () => void await docker("cp", LOCAL_FILE, `${id}:${FILE}`));
    await step(steps, "read", async () => {
      const tar = await docker("cp", `${id}:${FILE}`, "-");
      if (!sameBytes(firstFileOf(tar), PAYLOAD)) throw new Error("cli: read back differs");
    });
  } finally {
    await step(steps, "remove", async () => {
      if (id) await docker("rm", "-f", id);
    });
  }
}

// ---- measurement ---------------------------------------------------------------------------

function median(xs: number[]): number {
  const s = [...xs].sort((a, b) => a - b);
  return s[Math.floor(s.length / 2)] ?? NaN;
}

/** Lifecycles per second for `total` lifecycles over `concurrency` workers, plus step sums. */
async function measure(fn: Lifecycle, total: number, concurrency: number) {
  const steps: Steps = {};
  let next = 0;
  const t0 = performance.now();
  await Promise.all(Array.from({ length: concurrency }, async () => {
    while (next < total) {
      next++;
      await fn(steps);
    }
  }));
  const seconds = (performance.now() - t0) / 1000;
  for (const k of Object.keys(steps)) steps[k] /= total;
  return { perSecond: total / seconds, steps };
}

const MODES: Array<[string, Lifecycle]> = [
  ["bare", bareLifecycle],
  ["vf", vfLifecycle],
  ["cli", cliLifecycle],
];

async function timeToFirstCommand(pooled: boolean): Promise<{ ms: number[]; hits: number }> {
  const spec: RuntimeSpec = { type: "docker", image: IMAGE };
  const pool = new WarmPool({ size: pooled ? 2 : 0, runId: RUN_ID });
  const ms: number[] = [];
  try {
    for (let i = 0; i < SAMPLES; i++) {
      if (pooled) await pool.prewarm(spec); // a full pool, as between a run's rollouts
      const t0 = performance.now();
      const rt = await pool.acquire(spec, { runId: RUN_ID });
      const r = await rt.run(["true"]);
      ms.push(performance.now() - t0);
      if (r.exit_code !== 0) throw new Error("true failed");
      await rt.stop();
    }
    return { ms, hits: pool.stats.hits };
  } finally {
    await pool.close();
  }
}

async function grading(task: Task) {
  const view: TraceView = { info: {}, messages: [], artifacts: new Map() };
  const ctx = (runtime: Runtime): TaskHookContext => ({
    runtime,
    task,
    data: task.data,
    trace: view,
    state: {},
  });
  const sum = String((task.data.numbers as number[]).reduce((a, b) => a + b, 0));
  const shared: number[] = [];
  const isolated: number[] = [];
  const parts: Record<string, number[]> = {};
  const part = async <T>(name: string, fn: () => Promise<T>): Promise<T> => {
    const t0 = performance.now();
    const out = await fn();
    (parts[name] ??= []).push(performance.now() - t0);
    return out;
  };
  // Today's path: a grader from a pool of started, never-used ones (channel open), every
  // artifact restored in one upload, the grader removed off the critical path.
  const pooled: number[] = [];
  const graders = new WarmPool({ size: 0, graderSize: 2, runId: RUN_ID });
  const removals: Promise<void>[] = [];
  for (let i = 0; i < SAMPLES; i++) {
    const spec: RuntimeSpec = { type: "docker", image: IMAGE, workdir: "/app" };
    await graders.prewarm(spec, { role: "grader" }); // refilled between rollouts
    const agentRt = createRuntime(spec, { runId: RUN_ID });
    await agentRt.start();
    try {
      await task.setup(ctx(agentRt));
      await agentRt.write("/app/output/answer.txt", `${sum}\n`); // what the agent did

      let t0 = performance.now();
      await task.stageVerifier(ctx(agentRt));
      await agentRt.write("/tests/test.sh", "#!/bin/sh\nexit 0\n", { mode: 0o755 });
      const a = await task.score(ctx(agentRt));
      shared.push(performance.now() - t0);
      if (a.reward !== 1) throw new Error(`shared scoring gave ${a.reward}`);

      t0 = performance.now();
      const artifacts = await part("collect", () => collectArtifacts(agentRt, task));
      const grader = createRuntime(spec, { runId: RUN_ID });
      try {
        await part("start", () => grader.start());
        await part("setup", async () => await task.setup(ctx(grader)));
        await part("restore", () => restoreArtifacts(grader, artifacts));
        await part("stage", async () => {
          await task.stageVerifier(ctx(grader));
          await grader.write("/tests/test.sh", "#!/bin/sh\nexit 0\n", { mode: 0o755 });
        });
        const b = await part("score", () => task.score(ctx(grader)));
        if (b.reward !== 1) throw new Error(`isolated scoring gave ${b.reward}`);
      } finally {
        await part("remove", () => grader.stop());
      }
      isolated.push(performance.now() - t0);

      // As a rollout grades: the artifacts are collected while the grader is acquired and
      // runs the task's setup (the parts' times overlap; "collect + setup" is their span).
      t0 = performance.now();
      let pooledGrader: Runtime | undefined;
      const [kept] = await part("pooled: collect + setup", () =>
        Promise.all([
          part("pooled: collect", () => collectArtifacts(agentRt, task)),
          (async () => {
            pooledGrader = await part(
              "pooled: acquire",
              () => graders.acquire(spec, { role: "grader", runId: RUN_ID }),
            );
            await part("pooled: setup", async () => await task.setup(ctx(pooledGrader!)));
          })(),
        ]));
      if (!pooledGrader) throw new Error("no grader");
      try {
        await part("pooled: restore", () => restoreArtifacts(pooledGrader!, kept));
        await part("pooled: stage", async () => {
          await task.stageVerifier(ctx(pooledGrader!));
          await pooledGrader!.write("/tests/test.sh", "#!/bin/sh\nexit 0\n", { mode: 0o755 });
        });
        const c = await part("pooled: score", () => task.score(ctx(pooledGrader!)));
        if (c.reward !== 1) throw new Error(`pooled isolated scoring gave ${c.reward}`);
      } finally {
        removals.push(pooledGrader!.stop().catch(() => {}));
      }
      pooled.push(performance.now() - t0);
    } finally {
      await agentRt.stop();
    }
  }
  await Promise.all(removals);
  await graders.close();
  return { shared, isolated, pooled, parts };
}

// ---- main --------------------------------------------------------------------------------

const work = await Deno.makeTempDir({ prefix: "vf-bench-lc-" });
setDefaultLedger(join(work, "ledger.jsonl")); // vf records every sandbox, as in a real run
try {
  const version = JSON.parse((await call("GET", "/version")).data.toString());
  prefix = `/v${version.ApiVersion}`;
  // Warm-up: image cache, connection pools, the CLI binary in the page cache.
  for (const [, fn] of MODES) await measure(fn, 2, 1);

  const lines: string[] = [];
  const load = Deno.loadavg().map((x) => x.toFixed(1)).join(", ");
  lines.push(
    `Docker ${version.Version} (API ${version.ApiVersion}), image ${IMAGE}; ${navigator.hardwareConcurrency} cores, ${
      Math.round(Deno.systemMemoryInfo().total / 2 ** 30)
    } GiB, load average at start ${load}; median of ${REPEATS} repeats, modes interleaved.`,
    "",
    "| concurrency | lifecycles per repeat | bare API /s | vf /s | docker CLI /s | vf time / bare | CLI time / bare |",
    "| ---: | ---: | ---: | ---: | ---: | ---: | ---: |",
  );
  const stepTable: Record<string, Steps[]> = {};
  for (const [li, c] of LEVELS.entries()) {
    const total = LIFECYCLES[li] ?? LIFECYCLES.at(-1)!;
    const rates: Record<string, number[]> = {};
    for (let r = 0; r < REPEATS; r++) {
      // Rotate the order so no mode always runs first (or right after another's cleanup).
      for (let k = 0; k < MODES.length; k++) {
        const [name, fn] = MODES[(k + r) % MODES.length];
        const m = await measure(fn, total, c);
        (rates[name] ??= []).push(m.perSecond);
        if (c === 1) (stepTable[name] ??= []).push(m.steps);
      }
    }
    const [bare, vf, cli] = ["bare", "vf", "cli"].map((k) => median(rates[k]));
    lines.push(
      `| ${c} | ${total} | ${bare.toFixed(2)} | ${vf.toFixed(2)} | ${cli.toFixed(2)} | ${
        (bare / vf).toFixed(2)
      } | ${(bare / cli).toFixed(2)} |`,
    );
    console.error(lines.at(-1));
  }
  if (Object.keys(stepTable).length) {
    const names = ["create+start", "exec true", "write", "read", "remove"];
    lines.push(
      "",
      "Per step at concurrency 1, median ms (of the per-repeat means):",
      "",
      `| mode | ${names.join(" | ")} | total |`,
      `| --- | ${names.map(() => "---:").join(" | ")} | ---: |`,
    );
    for (const [mode, list] of Object.entries(stepTable)) {
      const cells = names.map((n) => median(list.map((s) => s[n] ?? 0)));
      lines.push(
        `| ${mode} | ${cells.map((x) => x.toFixed(1)).join(" | ")} | ${
          cells.reduce((a, b) => a + b, 0).toFixed(1)
        } |`,
      );
    }
  }

  const cold = await timeToFirstCommand(false);
  const warm = await timeToFirstCommand(true);
  lines.push(
    "",
    `Time to first command (acquire a sandbox, run \`true\`), ${SAMPLES} samples each:`,
    "",
    "| source | median ms | min ms | max ms | pool hits |",
    "| --- | ---: | ---: | ---: | ---: |",
    `| no pool (start on demand) | ${median(cold.ms).toFixed(0)} | ${
      Math.min(...cold.ms).toFixed(0)
    } | ${Math.max(...cold.ms).toFixed(0)} | – |`,
    `| WarmPool size 2, prewarmed | ${median(warm.ms).toFixed(0)} | ${
      Math.min(...warm.ms).toFixed(0)
    } | ${Math.max(...warm.ms).toFixed(0)} | ${warm.hits}/${SAMPLES} |`,
    `| ratio warm / cold | ${(median(warm.ms) / median(cold.ms)).toFixed(3)} | | | |`,
  );
  console.error(lines.slice(-4).join("\n"));

  const [task] = await loadTaskset({ image: IMAGE }).tasks(1);
  const g = await grading(task);
  const partNames = Object.keys(g.parts);
  lines.push(
    "",
    `Isolated-grading overhead per rollout on file-sum (${SAMPLES} rollouts, concurrency 1), median ms:`,
    "",
    "| path | shared scoring (stage + score in the agent sandbox) | isolated scoring | overhead | isolated / shared |",
    "| --- | ---: | ---: | ---: | ---: |",
    `| fresh grader started on demand, removed in line | ${median(g.shared).toFixed(1)} | ${
      median(g.isolated).toFixed(1)
    } | ${(median(g.isolated) - median(g.shared)).toFixed(1)} | ${
      (median(g.isolated) / median(g.shared)).toFixed(1)
    } |`,
    `| pooled grader set up while the artifacts are collected, one-upload restore, removal off the path | ${
      median(g.shared).toFixed(1)
    } | ${median(g.pooled).toFixed(1)} | ${(median(g.pooled) - median(g.shared)).toFixed(1)} | ${
      (median(g.pooled) / median(g.shared)).toFixed(1)
    } |`,
    "",
    `| ${partNames.join(" | ")} |`,
    `| ${partNames.map(() => "---:").join(" | ")} |`,
    `| ${partNames.map((n) => median(g.parts[n]).toFixed(1)).join(" | ")} |`,
  );
  console.log(lines.join("\n"));
} finally {
  agent.destroy();
  await cleanupContainers({ runId: RUN_ID }).catch(() => {});
  await DockerEngine.closeShared();
  await Deno.remove(work, { recursive: true }).catch(() => {});
  await Deno.remove(LOCAL_FILE).catch(() => {});
}
