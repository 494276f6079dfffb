/**
 * Rollouts per second through the env server against the same run in-process (the baseline,
 * measured in the same run): single-turn rollouts of a small exact-match environment against
 * the loopback model server. The env server runs in a child process (as `vf serve` would)
 * and, for comparison, in this process, where its work shares one event loop with the
 * evaluator's.
 *
 * `deno run -A bench/env_server.ts [--rollouts 200] [--concurrency 32] [--reps 5]`
 * @module
 */

import process from "node:process";
import { OpenAIChatClient } from "../lib/model/client.ts";
import { ServerEnvironment } from "../lib/serve/client.ts";
import { startEnvServer } from "../lib/serve/server.ts";
import { SingleTurnEnv } from "../lib/legacy/multi_turn.ts";
import { type EnvironmentHandle, evaluate } from "../lib/eval/evaluate.ts";
import { startModelServer } from "../lib/model/local_server.ts";
import { contentText } from "../lib/messages.ts";
import { Rubric } from "../lib/scoring/rubric.ts";

function flag(name: string, fallback: string): string {
  const args = process.argv.slice(2);
  const i = args.indexOf(`--${name}`);
  return i >= 0 && i + 1 < args.length ? args[i + 1] : fallback;
}

const rollouts = Number(flag("rollouts", "200"));
const child = process.argv.includes("--child");
const concurrency = Number(flag("concurrency", "32"));
const reps = Number(flag("reps", "5"));

function makeEnv(n: number): SingleTurnEnv {
  return new SingleTurnEnv({
    envId: "bench-echo",
    evalDataset: Array.from({ length: n }, (_, i) => ({ question: `q${i}`, answer: `a${i}` })),
    systemPrompt: "Answer with the letter a and the number.",
    rubric: new Rubric({
      funcs: [({ completion, answer }) => contentText(completion.at(-1)?.content ?? "") === answer],
    }),
  });
}

if (child) {
  // The child: serve the environment and print the URL.
  const server = await startEnvServer(makeEnv(rollouts), { maxConcurrent: 1024 });
  console.log(server.url);
  await new Promise(() => {});
}

await using model = await startModelServer({
  record: false,
  responder: (req) => {
    const last = req.body.messages.at(-1);
    return { content: String(last?.content ?? "").replace("q", "a") };
  },
});
const client = new OpenAIChatClient({ base_url: model.url, max_retries: 0 });
const local = makeEnv(rollouts);
await using server = await startEnvServer(makeEnv(rollouts), { maxConcurrent: 1024 });
const sameProcess = await ServerEnvironment.connect(server.url);
const childProcess = new Deno.Command(Deno.execPath(), {
  args: ["run", "-A", new URL(import.meta.url).pathname, "--child", "--rollouts", String(rollouts)],
  stdout: "piped",
  stderr: "inherit",
}).spawn();
const reader = childProcess.stdout.pipeThrough(new TextDecoderStream()).getReader();
let childUrl = "";
while (!childUrl.includes("\n")) {
  const { value, done } = await reader.read();
  if (done) throw new Error("The env server child exited");
  childUrl += value;
}
const otherProcess = await ServerEnvironment.connect(childUrl.trim());

async function measure(env: EnvironmentHandle, r: number): Promise<number> {
  const started = performance.now();
  const { outputs, metadata } = await evaluate(env, client, "m", {
    numExamples: rollouts / r,
    rolloutsPerExample: r,
    maxConcurrent: concurrency,
  });
  const seconds = (performance.now() - started) / 1000;
  if (outputs.length !== rollouts || metadata.avg_reward !== 1) {
    throw new Error(`Bad run: ${outputs.length} outputs, reward ${metadata.avg_reward}`);
  }
  return rollouts / seconds;
}

function median(xs: number[]): number {
  const s = [...xs].sort((a, b) => a - b);
  return s[Math.floor(s.length / 2)];
}

console.log(
  `${rollouts} single-turn rollouts, ${concurrency} in flight, median of ${reps} (after a warm-up)`,
);
for (const r of [1, 4]) {
  if (rollouts % r !== 0) continue;
  const envs = [local, otherProcess, sameProcess];
  for (const env of envs) await measure(env, r);
  const runs: number[][] = envs.map(() => []);
  for (let i = 0; i < reps; i++) {
    for (const [j, env] of envs.entries()) runs[j].push(await measure(env, r));
  }
  const [base, other, same] = runs.map(median);
  console.log(
    `groups of ${r}: in-process ${base.toFixed(0)} rollouts/s; through the env server in a child ` +
      `process ${other.toFixed(0)} (${(other / base).toFixed(2)}x), in this process ${
        same.toFixed(0)
      } ` +
      `(${(same / base).toFixed(2)}x)`,
  );
}
await reader.cancel();
childProcess.kill("SIGTERM");
await childProcess.status;
