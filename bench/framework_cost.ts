/**
 * vf's own cost per single-turn rollout, with the network taken out: `evaluate` (formatting,
 * the rollout loop, parsing, the rubric, outputs, results written to disk) against an
 * in-process endpoint that serialises the request and parses a canned chat completion, beside
 * a bare loop making the same endpoint calls at the same concurrency. The difference per
 * rollout is the framework's cost (the target: ≤ 10 µs); the CPU profile shows where.
 *
 * The runs share one environment and follow a warm-up, as the rollouts of one long run do.
 *
 *   deno run -A bench/framework_cost.ts [rollouts=100000] [concurrency=256] [repeats=3]
 *   deno run -A --cpu-prof --cpu-prof-dir=/tmp/vf-prof bench/framework_cost.ts 100000 256 1
 * @module
 */
import process from "node:process";
import { evaluate, Rubric, SingleTurnEnv } from "../mod.ts";
import { inProcessCall, inProcessModel } from "./_in_process_model.ts";
import type { Messages } from "../lib/types.ts";

const n = Number(Deno.args[0] ?? 100_000);
const concurrency = Number(Deno.args[1] ?? 256);
const repeats = Number(Deno.args[2] ?? 3);

/** An endpoint in this process (a stand-in for the network, which this bench leaves out). */
const client = inProcessModel;

const median = (xs: number[]) => [...xs].sort((a, b) => a - b)[Math.floor(xs.length / 2)];

const prompts: Messages[] = Array.from({ length: n }, (_, i) => [
  { role: "system", content: "Answer briefly." },
  { role: "user", content: `What is 2+2? (#${i})` },
]);

async function bare(count = n): Promise<{ wall: number; cpu: number }> {
  let next = 0;
  const c0 = process.cpuUsage();
  const t0 = performance.now();
  await Promise.all(Array.from({ length: concurrency }, async () => {
    while (next < count) await inProcessCall(prompts[next++], "bench");
  }));
  const c = process.cpuUsage(c0);
  return { wall: (1e3 * (performance.now() - t0)) / count, cpu: (c.user + c.system) / count };
}

// One environment for every run, as one long `vf eval` has: its dataset is formatted once,
// before any timing.
const env = new SingleTurnEnv({
  evalDataset: Array.from(
    { length: n },
    (_, i) => ({ question: `What is 2+2? (#${i})`, answer: "4" }),
  ),
  systemPrompt: "Answer briefly.",
  rubric: new Rubric({
    funcs: [
      ({ completion, answer, parser }) => (parser.parseAnswer(completion) ?? "").includes(answer),
    ],
  }),
});

async function vf(
  keepOutputs: boolean,
  numExamples = -1,
): Promise<{ wall: number; cpu: number; rss: number }> {
  const dir = await Deno.makeTempDir({ prefix: "vf-bench-fw-" });
  const count = numExamples > 0 ? numExamples : n;
  try {
    const c0 = process.cpuUsage();
    const t0 = performance.now();
    const result = await evaluate(env, client, "bench", {
      maxConcurrent: concurrency,
      resultsDir: dir,
      keepOutputs,
      numExamples,
    });
    const c = process.cpuUsage(c0);
    if (result.metadata.avg_reward !== 1) throw new Error("unexpected reward");
    return {
      wall: (1e3 * (performance.now() - t0)) / count,
      cpu: (c.user + c.system) / count,
      rss: process.memoryUsage().rss / 2 ** 20,
    };
  } finally {
    await Deno.remove(dir, { recursive: true });
  }
}

// Warm-up (compilation, heap growth), not measured: what a long run pays once.
await bare(Math.min(n, 20_000));
await vf(false, Math.min(n, 20_000));

const bares: Array<{ wall: number; cpu: number }> = [];
const kept: Array<{ wall: number; cpu: number; rss: number }> = [];
const flat: Array<{ wall: number; cpu: number; rss: number }> = [];
for (let r = 0; r < repeats; r++) {
  bares.push(await bare());
  kept.push(await vf(true));
  flat.push(await vf(false));
}
const med = (xs: Array<{ wall: number; cpu: number }>) => ({
  wall: median(xs.map((x) => x.wall)),
  cpu: median(xs.map((x) => x.cpu)),
});
const b = med(bares);
console.log(
  `${n} single-turn rollouts at concurrency ${concurrency}, median of ${repeats}; load average ${
    Deno.loadavg().map((x) => x.toFixed(1)).join(", ")
  }\n`,
);
console.log("| | wall µs per rollout | CPU µs per rollout |");
console.log("| --- | ---: | ---: |");
console.log(`| bare endpoint calls | ${b.wall.toFixed(1)} | ${b.cpu.toFixed(1)} |`);
const variants = [["outputs kept (the default)", kept], ["keepOutputs: false (vf eval)", flat]];
for (const [name, runs] of variants as Array<[string, typeof kept]>) {
  const v = med(runs);
  console.log(`| vf evaluate, ${name} | ${v.wall.toFixed(1)} | ${v.cpu.toFixed(1)} |`);
  console.log(
    `| framework cost, ${name} | ${(v.wall - b.wall).toFixed(1)} | ${(v.cpu - b.cpu).toFixed(1)} |`,
  );
}
console.log(
  `\nRSS after a run: outputs kept ${median(kept.map((x) => x.rss)).toFixed(0)} MiB, not kept ${
    median(flat.map((x) => x.rss)).toFixed(0)
  } MiB (one process, the runs in turn)`,
);
