/**
 * Evaluation throughput: single-turn rollouts per second through `evaluate` (dataset
 * formatting, model call, parsing, rubric, results written to disk) against a loopback
 * OpenAI-compatible server in a separate process, beside the raw rate of the same HTTP
 * requests from a tight `fetch` loop at the same concurrency, measured in the same run.
 * Also reports event-loop lag, peak RSS and memory per finished rollout.
 *
 * `deno run -A bench/throughput.ts [--rollouts 20000] [--concurrency 1,64,256,1024]
 * [--memory 10000,100000] [--repeats 3]`
 * @module
 */
import process from "node:process";
import { mkdtemp, rm } from "node:fs/promises";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { evaluate, OpenAIChatClient, Rubric, SingleTurnEnv } from "../mod.ts";

function flag(name: string, fallback: string): string {
  const args = process.argv.slice(2);
  const i = args.indexOf(`--${name}`);
  return i >= 0 && i + 1 < args.length ? args[i + 1] : fallback;
}

const ROLLOUTS = Number(flag("rollouts", "20000"));
const LEVELS = flag("concurrency", "1,64,256,1024").split(",").map(Number);
const MEMORY_SIZES = flag("memory", "10000,100000").split(",").map(Number).filter((n) => n > 0);
const REPEATS = Number(flag("repeats", "3"));

const SERVER = `
const body = JSON.stringify({
  id: "c", object: "chat.completion", created: 0, model: "bench",
  choices: [{ index: 0, message: { role: "assistant", content: "The answer is 4." }, finish_reason: "stop" }],
  usage: { prompt_tokens: 12, completion_tokens: 5, total_tokens: 17 },
});
const s = Deno.serve({ port: 0, hostname: "127.0.0.1", onListen: ({ port }) => console.log(port) }, async (req) => {
  await req.arrayBuffer();
  return new Response(body, { headers: { "content-type": "application/json" } });
});
`;

async function startServer(): Promise<{ url: string; kill: () => void }> {
  const child = new Deno.Command(Deno.execPath(), {
    args: ["eval", SERVER],
    stdout: "piped",
    stderr: "inherit",
  }).spawn();
  const reader = child.stdout.getReader();
  const { value } = await reader.read();
  const port = Number(new TextDecoder().decode(value).trim());
  reader.releaseLock();
  return { url: `http://127.0.0.1:${port}/v1`, kill: () => child.kill("SIGTERM") };
}

const REQUEST = JSON.stringify({
  model: "bench",
  messages: [{ role: "user", content: "What is 2+2?" }],
});

async function raw(url: string, n: number, concurrency: number): Promise<number> {
  let next = 0;
  const t0 = performance.now();
  const worker = async () => {
    while (next < n) {
      next++;
      const res = await fetch(`${url}/chat/completions`, {
        method: "POST",
        headers: { "content-type": "application/json", authorization: "Bearer x" },
        body: REQUEST,
      });
      await res.json();
    }
  };
  await Promise.all(Array.from({ length: concurrency }, worker));
  return n / ((performance.now() - t0) / 1000);
}

function makeEnv(n: number): SingleTurnEnv {
  const rows = Array.from({ length: n }, (_, i) => ({ question: `What is 2+2? (#${i})`, answer: "4" }));
  return new SingleTurnEnv({
    evalDataset: rows,
    systemPrompt: "Answer briefly.",
    rubric: new Rubric({
      funcs: [({ completion, answer, parser }) => (parser.parseAnswer(completion) ?? "").includes(answer)],
    }),
  });
}

async function vf(url: string, n: number, concurrency: number, keepOutputs = true) {
  const dir = await mkdtemp(join(tmpdir(), "vf-bench-"));
  const env = makeEnv(n);
  const client = new OpenAIChatClient({ base_url: url, max_retries: 0 });
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
  const rss0 = process.memoryUsage().rss;
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
  if (result.metadata.avg_reward !== 1) throw new Error(`unexpected reward ${result.metadata.avg_reward}`);
  const rssAfter = process.memoryUsage().rss;
  await rm(dir, { recursive: true, force: true });
  return {
    perSecond: n / seconds,
    maxLagMs: maxLag,
    meanLagMs: lagN ? lagSum / lagN : 0,
    peakMb: peak / 2 ** 20,
    grownBytes: rssAfter - rss0,
    outputs: result.outputs,
  };
}

function median(xs: number[]): number {
  const s = [...xs].sort((a, b) => a - b);
  return s[Math.floor(s.length / 2)];
}

const server = await startServer();
try {
  await raw(server.url, 2000, 64); // warm-up
  await vf(server.url, 2000, 64);
  const lines = [
    `Machine: ${navigator.hardwareConcurrency} cores, ${Math.round(Deno.systemMemoryInfo().total / 2 ** 30)} GiB; ` +
    `Deno ${Deno.version.deno}; ${ROLLOUTS} rollouts per measurement, median of ${REPEATS}.`,
    "",
    "| concurrency | raw fetch req/s | vf evaluate rollouts/s | vf / raw | max loop lag ms | peak RSS MiB |",
    "| ---: | ---: | ---: | ---: | ---: | ---: |",
  ];
  for (const c of LEVELS) {
    const n = c === 1 ? Math.min(ROLLOUTS, 3000) : ROLLOUTS;
    const raws: number[] = [];
    const vfs: Array<Awaited<ReturnType<typeof vf>>> = [];
    for (let i = 0; i < REPEATS; i++) {
      raws.push(await raw(server.url, n, c));
      vfs.push(await vf(server.url, n, c));
    }
    const r = median(raws);
    const v = median(vfs.map((x) => x.perSecond));
    lines.push(
      `| ${c} | ${r.toFixed(0)} | ${v.toFixed(0)} | ${(v / r).toFixed(2)} | ${
        median(vfs.map((x) => x.maxLagMs)).toFixed(1)
      } | ${Math.max(...vfs.map((x) => x.peakMb)).toFixed(0)} |`,
    );
    console.error(lines.at(-1));
  }
  if (MEMORY_SIZES.length) {
    lines.push("", "| rollouts kept in memory | concurrency | RSS growth MiB | bytes per rollout | serialized bytes per rollout |", "| ---: | ---: | ---: | ---: | ---: |");
    for (const n of MEMORY_SIZES) {
      for (const c of [64, 1024]) {
        const r = await vf(server.url, n, c);
        const serialized = r.outputs.reduce((a, o) => a + JSON.stringify(o).length, 0) / r.outputs.length;
        lines.push(
          `| ${n} | ${c} | ${(r.grownBytes / 2 ** 20).toFixed(0)} | ${(r.grownBytes / n).toFixed(0)} | ${serialized.toFixed(0)} |`,
        );
        console.error(lines.at(-1));
      }
    }
  }
  console.log(lines.join("\n"));
} finally {
  server.kill();
}
