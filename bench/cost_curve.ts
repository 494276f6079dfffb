/**
 * How vf's cost grows with the size of a run: for each size, a fresh process runs the bare
 * HTTP/1.1-pool loop (the same-run baseline) and then `evaluate` as `vf eval` runs it
 * (`keepOutputs: false`, results on disk) against the loopback model at concurrency 256, and
 * reports rollouts/s, the framework's µs per rollout over the bare loop, peak RSS, the results
 * file's size, `--resume` start-up on the finished file, the viewer's index build, the first
 * ask of a sort or filter and the page latency after it, and `vf compare`'s time. Per-rollout figures that grow with the size are
 * superlinear costs (the last columns give each size's ratio to the smallest).
 *
 *   deno run -A bench/cost_curve.ts [sizes=10000,100000] (1000000 takes minutes)
 * @module
 */
import { join } from "node:path";
import { evaluate, OpenAIChatClient, Rubric, SingleTurnEnv } from "../mod.ts";
import { http1Request } from "../lib/model/http1.ts";
import { rewardsOf } from "../lib/cli/compare.ts";
import { pairedComparison } from "../lib/eval/compare.ts";
import { findRuns, serveView } from "../lib/view/server.ts";
import { startLoopbackModel } from "./_loopback_model.ts";

const CONCURRENCY = 256;
const question = (i: number) => `What is 2+2? (#${i})`;
const hwmMb = async () =>
  Number(/VmHWM:\s+(\d+)/.exec(await Deno.readTextFile("/proc/self/status"))![1]) / 1024;

interface Row {
  n: number;
  bareUs: number;
  evalUs: number;
  rssMb: number;
  resultsMb: number;
  resumeMs: number;
  indexMs: number;
  /** The slowest first ask of a sort or filter (its count, a sort's index made on first use). */
  firstMs: number;
  pageMs: number;
  compareMs: number;
}

async function bare(url: string, n: number): Promise<number> {
  const endpoint = new URL(`${url}/chat/completions`);
  const headers = { "content-type": "application/json", authorization: "Bearer x" };
  let next = 0;
  const t0 = performance.now();
  await Promise.all(Array.from({ length: CONCURRENCY }, async () => {
    while (next < n) {
      const i = next++;
      const body = JSON.stringify({
        model: "bench",
        messages: [{ role: "system", content: "Answer briefly." }, {
          role: "user",
          content: question(i),
        }],
      });
      const res = await http1Request({ method: "POST", url: endpoint, headers, body });
      if (!Array.isArray(JSON.parse(res.text).choices)) throw new Error("no choices");
    }
  }));
  return (1e3 * (performance.now() - t0)) / n;
}

/** One size, in this (fresh) process. */
async function child(url: string, n: number, root: string): Promise<Row> {
  const env = new SingleTurnEnv({
    evalDataset: Array.from({ length: n }, (_, i) => ({ question: question(i), answer: "4" })),
    systemPrompt: "Answer briefly.",
    rubric: new Rubric({
      funcs: [
        ({ completion, answer, parser }) => (parser.parseAnswer(completion) ?? "").includes(answer),
      ],
    }),
  });
  const client = new OpenAIChatClient({ base_url: url, max_retries: 0 });
  const dir = join(root, "evals", `bench--m`, `run${n}`);
  await Deno.mkdir(dir, { recursive: true });
  // Warm-up of both, then the baseline and the run of this size.
  await bare(url, Math.min(n, 5_000));
  const warm = await Deno.makeTempDir({ prefix: "vf-curve-warm-" });
  await evaluate(env, client, "bench", {
    maxConcurrent: CONCURRENCY,
    resultsDir: warm,
    keepOutputs: false,
    numExamples: Math.min(n, 5_000),
  });
  await Deno.remove(warm, { recursive: true });
  const bareUs = await bare(url, n);
  const t0 = performance.now();
  const result = await evaluate(env, client, "bench", {
    maxConcurrent: CONCURRENCY,
    resultsDir: dir,
    keepOutputs: false,
  });
  const evalUs = (1e3 * (performance.now() - t0)) / n;
  if (result.tally.count !== n) throw new Error(`${result.tally.count} of ${n} rollouts`);
  const rssMb = await hwmMb();
  const resultsMb = (await Deno.stat(join(dir, "results.jsonl"))).size / 2 ** 20;

  // --resume on the finished file: it reads every line and runs nothing.
  const r0 = performance.now();
  const resumed = await evaluate(env, client, "bench", {
    maxConcurrent: CONCURRENCY,
    resultsDir: dir,
    resume: true,
    keepOutputs: false,
  });
  const resumeMs = performance.now() - r0;
  if (resumed.tally.count !== n) throw new Error("resume lost rollouts");

  // vf compare of the run with itself: both results files read, paired by example.
  const c0 = performance.now();
  pairedComparison(await rewardsOf(dir), await rewardsOf(dir));
  const compareMs = performance.now() - c0;

  // The viewer: the first page builds the index, later pages are queries.
  const indexDir = await Deno.makeTempDir({ prefix: "vf-curve-index-" });
  const view = await serveView(root, { indexDir });
  let indexMs = 0;
  let firstMs = 0;
  let pageMs = 0;
  try {
    const run = findRuns(root).find((r) => r.dir === dir);
    if (!run) throw new Error(`the viewer does not list "${dir}"`);
    const id = run.id;
    const page = async (q: string) => {
      const p0 = performance.now();
      const res = await fetch(`${view.url}api/rollouts?id=${encodeURIComponent(id)}&${q}`);
      if (!res.ok) throw new Error(`viewer: HTTP ${res.status}`);
      await res.json();
      return performance.now() - p0;
    };
    indexMs = await page("page=0");
    // A sort or filter asked for the first time counts its rows (and makes a sort's index)
    // once; the page latency is the next page of the same query, as paging through it is.
    const queries = ["page=1", "sort=reward&desc=1", "errors=none&page=3", "page=50"];
    const firsts = [];
    for (const q of queries) firsts.push(await page(q));
    firstMs = Math.max(...firsts);
    const pages = [];
    // The next page of each (page n + 1, or page 1 of a query without one).
    const next = (q: string) =>
      /page=\d+/.test(q)
        ? q.replace(/page=(\d+)/, (_, p) => `page=${Number(p) + 1}`)
        : `${q}&page=1`;
    for (const q of queries) pages.push(await page(next(q)));
    pageMs = pages.sort((a, b) => a - b)[Math.floor(pages.length / 2)];
  } finally {
    await view.close();
    await Deno.remove(indexDir, { recursive: true });
  }
  return { n, bareUs, evalUs, rssMb, resultsMb, resumeMs, indexMs, firstMs, pageMs, compareMs };
}

if (Deno.args[0] === "--child") {
  const [, url, n, root] = Deno.args;
  console.log(JSON.stringify(await child(url, Number(n), root)));
  Deno.exit(0);
}

const sizes = (Deno.args[0] ?? "10000,100000").split(",").map(Number);
const { url, kill } = await startLoopbackModel();
const rows: Row[] = [];
try {
  for (const n of sizes) {
    const root = await Deno.makeTempDir({ prefix: "vf-curve-" });
    try {
      const out = await new Deno.Command(Deno.execPath(), {
        args: ["run", "-A", new URL(import.meta.url).pathname, "--child", url, String(n), root],
        stdout: "piped",
        stderr: "inherit",
      }).output();
      if (!out.success) throw new Error(`size ${n}: the child failed`);
      const row = JSON.parse(new TextDecoder().decode(out.stdout).trim().split("\n").at(-1)!);
      rows.push(row);
      console.error(`done ${n}: ${JSON.stringify(row)}`);
    } finally {
      await Deno.remove(root, { recursive: true });
    }
  }
} finally {
  kill();
}

const base = rows[0];
const f = (x: number, d = 1) => x.toFixed(d);
console.log(
  `Single-turn rollouts against the loopback model at concurrency ${CONCURRENCY}, one fresh ` +
    `process per size; load average ${Deno.loadavg().map((x) => x.toFixed(1)).join(", ")}\n`,
);
console.log(
  "| rollouts | rollouts/s | µs per rollout | bare loop µs | bare / evaluate | framework µs | " +
    "peak RSS MB | results MB | resume ms | viewer index ms | first sort/filter ms | " +
    "viewer page ms | compare ms | " +
    `µs/rollout vs ${base.n} | resume/rollout vs ${base.n} | index/rollout vs ${base.n} | ` +
    `compare/rollout vs ${base.n} |`,
);
console.log("|" + " ---: |".repeat(17));
for (const r of rows) {
  const per = (x: number, b: number) => f((x / r.n) / (b / base.n), 2);
  console.log(
    `| ${r.n} | ${f(1e6 / r.evalUs, 0)} | ${f(r.evalUs)} | ${f(r.bareUs)} | ${
      f(r.bareUs / r.evalUs, 2)
    } | ${f(r.evalUs - r.bareUs)} | ${f(r.rssMb, 0)} | ${f(r.resultsMb)} | ${f(r.resumeMs, 0)} | ${
      f(r.indexMs, 0)
    } | ${f(r.firstMs, 0)} | ${f(r.pageMs, 1)} | ${f(r.compareMs, 0)} | ${
      f(r.evalUs / base.evalUs, 2)
    } | ${per(r.resumeMs, base.resumeMs)} | ${per(r.indexMs, base.indexMs)} | ${
      per(r.compareMs, base.compareMs)
    } |`,
  );
}
