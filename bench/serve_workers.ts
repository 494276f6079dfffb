/**
 * Rollouts per second through `vf serve` with one worker process (the baseline, measured in
 * the same run) and with up to two (`--workers 2`), for gsm8k (whose math-verifying rubric
 * gives each rollout real CPU work) against the loopback model. Both servers run as
 * `vf serve` child processes; a warm-up lets the front add its second worker first.
 *
 * `deno run -A bench/serve_workers.ts [--rollouts 400] [--per-example 2] [--concurrency 64] [--reps 3]`
 * @module
 */
import process from "node:process";
import { OpenAIChatClient } from "../lib/model/client.ts";
import { ServerEnvironment } from "../lib/serve/client.ts";
import { evaluate } from "../lib/eval/evaluate.ts";
import { startModelServer } from "../lib/model/local_server.ts";
import { loadExampleDataset } from "../lib/data/examples.ts";

function flag(name: string, fallback: string): string {
  const args = process.argv.slice(2);
  const i = args.indexOf(`--${name}`);
  return i >= 0 && i + 1 < args.length ? args[i + 1] : fallback;
}
const rollouts = Number(flag("rollouts", "400"));
const concurrency = Number(flag("concurrency", "64"));
const reps = Number(flag("reps", "3"));
const CLI = new URL("../cli.ts", import.meta.url).pathname;

const answers = new Map(
  (loadExampleDataset("gsm8k-sample", { split: "test" }).toList() as Array<
    { question: string; answer: string }
  >).map((r) => [r.question, r.answer]),
);
await using model = await startModelServer({
  record: false,
  responder: (req) => {
    const q = String(req.body.messages.at(-1)?.content ?? "");
    return { content: `Working it out.\n\n\\boxed{${answers.get(q) ?? "0"}}` };
  },
});
const client = new OpenAIChatClient({ base_url: model.url, max_retries: 0 });

async function serve(workers: number): Promise<{ url: string; stop: () => Promise<void> }> {
  const child = new Deno.Command(Deno.execPath(), {
    args: [
      "run",
      "-A",
      CLI,
      "serve",
      "gsm8k",
      "--port",
      "0",
      "--workers",
      String(workers),
      "-c",
      "8",
    ],
    stdout: "piped",
    stderr: "null",
  }).spawn();
  const reader = child.stdout.pipeThrough(new TextDecoderStream()).getReader();
  let out = "";
  while (!/http:\/\/127\.0\.0\.1:\d+/.test(out)) {
    const { value, done } = await reader.read();
    if (done) throw new Error(`vf serve exited: ${out}`);
    out += value;
  }
  const url = /http:\/\/127\.0\.0\.1:\d+/.exec(out)![0];
  return {
    url,
    stop: async () => {
      child.kill("SIGTERM");
      await reader.cancel().catch(() => {});
      await child.status;
    },
  };
}

// Small groups, so the in-flight limit is many groups (each worker runs 8 at once).
const perExample = Number(flag("per-example", "2"));
const examples = Math.min(answers.size, Math.ceil(rollouts / perExample));

async function measure(url: string): Promise<number> {
  const env = await ServerEnvironment.connect(url);
  const started = performance.now();
  const { outputs } = await evaluate(env, client, "m", {
    numExamples: examples,
    rolloutsPerExample: perExample,
    maxConcurrent: concurrency,
  });
  return outputs.length / ((performance.now() - started) / 1000);
}

const median = (xs: number[]) => [...xs].sort((a, b) => a - b)[Math.floor(xs.length / 2)];
const results: Record<number, number> = {};
for (const workers of [1, 2]) {
  const server = await serve(workers);
  try {
    await measure(server.url); // warm-up (and, with 2, time for the second worker to start)
    await measure(server.url);
    const runs: number[] = [];
    for (let i = 0; i < reps; i++) runs.push(await measure(server.url));
    results[workers] = median(runs);
    if (workers > 1) {
      const health = await (await fetch(`${server.url}/health`)).json();
      console.log(`workers running at the end: ${health.workers.length}`);
    }
  } finally {
    await server.stop();
  }
}
console.log(
  `${examples * perExample} gsm8k rollouts, ${concurrency} in flight, median of ${reps}: ` +
    `1 worker ${results[1].toFixed(0)} rollouts/s; up to 2 workers ${results[2].toFixed(0)} ` +
    `(${(results[2] / results[1]).toFixed(2)}x)`,
);
