/**
 * Scale run on the local Docker engine: N file-sum rollouts (agent sandbox + isolated grading
 * sandbox each) over C concurrent sandboxes, with a scripted model on loopback whose bash
 * tool call writes the answer. Runs twice in one process — without a warm pool (the baseline)
 * and with one — and for each prints wall time, rollouts/s, peak RSS (sampled
 * `process.memoryUsage().rss`), peak live containers (sampled from the Engine API), median
 * time from asking for the agent sandbox to having it started, and then checks that nothing
 * leaked (no containers of the run, no live ledger entries) and nothing was lost (N traces,
 * one per task × rollout, in traces.jsonl).
 *
 *   deno run -A bench/scale_docker.ts [rollouts=200] [concurrency=32] [warm_pool=4] [image=busybox]
 */

import { join } from "node:path";
import process from "node:process";
import { loadTaskset } from "../environments/file_sum/mod.ts";
import { OpenAIChatClient } from "../lib/model/client.ts";
import { getHarness } from "../lib/tasks/harness_registry.ts";
import { startModelServer, textReply, toolCallReply } from "../tests/model_server.ts";
import { runTaskset } from "../lib/agents/run.ts";
import { DockerEngine } from "../runtimes/docker/mod.ts";
import { Ledger, setDefaultLedger } from "../runtimes/ledger.ts";
import { SandboxLimits } from "../runtimes/limits.ts";
import { WarmPool } from "../runtimes/pool.ts";

const rollouts = Number(Deno.args[0] ?? 200);
const concurrency = Number(Deno.args[1] ?? 32);
const warmPool = Number(Deno.args[2] ?? 4);
const image = Deno.args[3] ?? "busybox:latest";
const TASKS = 5; // file-sum has five tasks
const perTask = Math.ceil(rollouts / TASKS);

const SOLVE = "awk '{ s += $1 } END { print s }' /app/input.txt > /app/output/answer.txt";
const server = await startModelServer({
  record: false,
  responder: ({ body }) =>
    body.messages.some((m) => m.role === "tool")
      ? textReply("done")
      : toolCallReply("bash", { command: SOLVE }),
});
const client = new OpenAIChatClient({ base_url: server.url, api_key: "bench" });
const engine = DockerEngine.shared();
const work = await Deno.makeTempDir({ prefix: "vf_scale_" });
const ledger = new Ledger(join(work, "ledger.jsonl"));
setDefaultLedger(ledger);

interface Result {
  label: string;
  seconds: number;
  peakRssMb: number;
  peakLive: number;
  sandboxMedianMs: number;
  errors: number;
  reward: number;
}

function median(values: number[]): number {
  const s = [...values].sort((a, b) => a - b);
  return s[Math.floor(s.length / 2)] ?? NaN;
}

async function scaleRun(label: string, pool: number): Promise<Result> {
  const runId = `scale-${label}-${crypto.randomUUID().slice(0, 6)}`;
  const runDir = join(work, runId);
  const sandboxes = new WarmPool({
    size: pool,
    runId,
    limits: new SandboxLimits({ maxLive: concurrency }),
  });
  let peakRss = process.memoryUsage().rss;
  let peakLive = 0;
  let sampling = true;
  const rssTimer = setInterval(() => {
    peakRss = Math.max(peakRss, process.memoryUsage().rss);
  }, 50);
  const liveSampler = (async () => {
    while (sampling) {
      const list = await engine.listContainers({ labels: [`vf.run_id=${runId}`] });
      peakLive = Math.max(peakLive, list.length);
      await new Promise((r) => setTimeout(r, 200));
    }
  })();
  const started = performance.now();
  let summary;
  try {
    ({ summary } = await runTaskset({
      taskset: loadTaskset({ image }),
      policy: { runtime: {}, harness: getHarness("bash"), sandboxes },
      client,
      model: "scripted",
      rolloutsPerTask: perTask,
      maxConcurrent: concurrency,
      runDir,
      runId,
    }));
  } finally {
    await sandboxes.close();
    sampling = false;
    await liveSampler;
    clearInterval(rssTimer);
  }
  const seconds = (performance.now() - started) / 1000;

  // No lost results: one trace per task × rollout on disk.
  const lines = (await Deno.readTextFile(join(runDir, "traces.jsonl"))).split("\n").filter(
    Boolean,
  );
  const traces = lines.map((l) => JSON.parse(l));
  const keys = new Set(traces.map((t) => `${t.task.key}#${t.rollout_index}`));
  const expected = TASKS * perTask;
  if (traces.length !== expected || keys.size !== expected) {
    throw new Error(
      `${label}: ${traces.length} traces (${keys.size} distinct), expected ${expected}`,
    );
  }
  // No leaks: no container of the run on the engine, nothing live in the ledger.
  const leftovers = await engine.listContainers({ labels: [`vf.run_id=${runId}`] });
  const live = await ledger.live({ runId });
  if (leftovers.length || live.length) {
    throw new Error(
      `${label}: leaked ${leftovers.length} containers, ${live.length} ledger entries`,
    );
  }
  return {
    label,
    seconds,
    peakRssMb: peakRss / 2 ** 20,
    peakLive,
    sandboxMedianMs: median(traces.map((t) => t.timing.sandbox_ms).filter((x) => x >= 0)),
    errors: summary.num_errors,
    reward: summary.avg_reward ?? NaN,
  };
}

await engine.ping();
const results: Result[] = [];
try {
  results.push(await scaleRun("no-pool", 0));
  if (warmPool > 0) results.push(await scaleRun(`pool${warmPool}`, warmPool));
} finally {
  await server.close();
  await DockerEngine.closeShared();
}

console.log(
  `scale: ${TASKS * perTask} file-sum rollouts (agent + isolated grader each, image ${image}), ` +
    `${concurrency} concurrent, max ${concurrency} live sandboxes`,
);
for (const r of results) {
  console.log(
    `  ${r.label.padEnd(8)} ${r.seconds.toFixed(1)} s  ${
      ((TASKS * perTask) / r.seconds).toFixed(2)
    } rollouts/s  peak RSS ${r.peakRssMb.toFixed(0)} MiB  peak live containers ${r.peakLive}  ` +
      `agent sandbox ready (median) ${r.sandboxMedianMs.toFixed(0)} ms  errors ${r.errors}  ` +
      `reward ${r.reward.toFixed(3)}  leaks 0  lost 0`,
  );
}
if (results.length === 2) {
  const [base, pooled] = results;
  console.log(
    `  pool/no-pool: wall time x${(pooled.seconds / base.seconds).toFixed(2)}, agent sandbox ` +
      `ready x${(pooled.sandboxMedianMs / base.sandboxMedianMs).toFixed(2)}`,
  );
}
await Deno.remove(work, { recursive: true });
