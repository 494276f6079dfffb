/**
 * How close `evaluate` can get to the bare HTTP/1.1 loop at all: the floor. Three loops against
 * one loopback model server, alternating in one process under `deno task vf`'s V8 flags:
 *
 * - **bare**: `http1Request` with bodies built before the clock starts, the reply parsed
 *   (`bench/evaluate_http.ts`'s baseline);
 * - **floor**: the least `evaluate` has to do per rollout, with no framework layers: the
 *   formatted row's prompt sent through vf's `OpenAIChatClient`, the reply parsed into a
 *   `Response`, the bench's reward (the parser's answer contains "4"), an output object with
 *   the keys of a results line in their order (the timing record, token usage and metrics
 *   included), and the line appended through vf's `ResultsWriter`;
 * - **parts**: the floor with the environment's own steps in place of the hand-made ones:
 *   `initState`, `getModelResponse`, `addModelResponse`, `renderCompletion`, `scoreStates`,
 *   `releasedStateToOutput` (what `runGroupOutputs` calls) and the writer, called in a plain
 *   loop; what is left between it and `evaluate` is the turn loop, the group layers, the
 *   worker pool and the run's counts;
 * - **evaluate**: `evaluate(…, { keepOutputs: false })`, as `vf eval` runs it.
 *
 * The floor's line is checked to have the keys of `evaluate`'s line, so both write the same
 * thing. Prints wall and CPU µs per rollout (medians) and each loop's ratio to the bare one;
 * what `evaluate` can gain from restructuring its layers is at most the floor's ratio.
 *
 * With `--in-process` the model is a function in this process (`bench/framework_cost.ts`'s
 * endpoint: the body serialised, one await, the canned reply parsed) instead of the server,
 * and the bare loop is calls to it: no sockets and no second process, so the CPU split between
 * the layers is much less swayed by a busy machine (run it under `taskset -c 1`).
 *
 *   deno run -A bench/evaluate_floor.ts [rollouts=20000] [repeats=5] [--in-process]
 * @module
 */
import process from "node:process";
import v8 from "node:v8";
import { evaluate, OpenAIChatClient, Parser, Rubric, SingleTurnEnv } from "../mod.ts";
import { http1Request } from "../lib/model/http1.ts";
import type { ChatClient } from "../lib/model/client.ts";
import { inProcessModel } from "./_in_process_model.ts";
import { ResultsWriter } from "../lib/eval/results.ts";
import { trajectoryId } from "../lib/legacy/environment.ts";
import type { Messages, Row } from "../lib/types.ts";
import { nowSeconds, releasedStateToOutput, type RolloutOutput } from "../lib/state.ts";
import { startLoopbackModel } from "./_loopback_model.ts";

const launcher = JSON.parse(await Deno.readTextFile(new URL("../deno.json", import.meta.url)));
const v8Flags = String(launcher.tasks.vf).split(/\s+/).filter((a) => a.startsWith("--v8-flags="));
if (!Deno.args.includes("--as-vf")) {
  const { code } = await new Deno.Command(Deno.execPath(), {
    args: ["run", "-A", ...v8Flags, new URL(import.meta.url).pathname, ...Deno.args, "--as-vf"],
    stdout: "inherit",
    stderr: "inherit",
  }).output();
  Deno.exit(code);
}

const args = Deno.args.filter((a) => !a.startsWith("--"));
const n = Number(args[0] ?? 20_000);
const repeats = Number(args[1] ?? 5);
const CONCURRENCY = 256;
const inProcess = Deno.args.includes("--in-process");
/** An endpoint in this process: what a call costs the client besides the network. */
const inProcessClient: ChatClient = inProcessModel;
/** The client every loop but the bare one calls through. */
const clientFor = (url: string): ChatClient =>
  inProcess ? inProcessClient : new OpenAIChatClient({ base_url: url, max_retries: 0 });
const question = (i: number) => `What is 2+2? (#${i})`;
const parser = new Parser();
const reward = ({ completion, answer }: { completion: Messages; answer: string }) =>
  (parser.parseAnswer(completion) ?? "").includes(answer);
const env = new SingleTurnEnv({
  evalDataset: Array.from({ length: n }, (_, i) => ({ question: question(i), answer: "4" })),
  systemPrompt: "Answer briefly.",
  parser,
  rubric: new Rubric({ funcs: [reward], parser }),
});
const rows: Row[] = (await env.getEvalDataset(n)).toList();

interface Run {
  wallUs: number;
  cpuUs: number;
  /** Heap allocated per rollout, KB. */
  kb: number;
}

/** Bytes the heap has allocated so far (Deno's V8 reports it; the Node typings do not list it). */
const allocated = () =>
  (v8.getHeapStatistics() as { total_allocated_bytes?: number }).total_allocated_bytes ?? 0;

async function timed(work: () => Promise<void>): Promise<Run> {
  const a0 = allocated();
  const c0 = process.cpuUsage();
  const t0 = performance.now();
  await work();
  const wallUs = (1e3 * (performance.now() - t0)) / n;
  const cpu = process.cpuUsage(c0);
  return { wallUs, cpuUs: (cpu.user + cpu.system) / n, kb: (allocated() - a0) / n / 1024 };
}

/** Runs `body` on CONCURRENCY workers pulling indices 0..n-1. */
function workers(body: (i: number) => Promise<void>): Promise<unknown> {
  let next = 0;
  return Promise.all(Array.from({ length: CONCURRENCY }, async () => {
    while (next < n) await body(next++);
  }));
}

async function bare(url: string): Promise<Run> {
  const endpoint = new URL(`${url}/chat/completions`);
  const headers = { "content-type": "application/json", authorization: "Bearer x" };
  const bodies = rows.map((row) => JSON.stringify({ model: "bench", messages: row.prompt }));
  return await timed(async () => {
    await workers(async (i) => {
      if (inProcess) {
        await inProcessClient.getResponse(rows[i].prompt as Messages, "bench");
        return;
      }
      const res = await http1Request({ method: "POST", url: endpoint, headers, body: bodies[i] });
      if (!Array.isArray(JSON.parse(res.text).choices)) throw new Error("no choices");
    });
  });
}

const seconds = (ms: number) => ms / 1000;
const micro = (s: number) => Math.round(s * 1e6) / 1e6 || 0;

/**
 * Runs `rollout` for every row on the workers, appending what it returns through one
 * `ResultsWriter` (waiting when the disk falls behind, as `generate` does); returns the run and
 * the first line written, for the key check.
 */
async function writingLoop(
  rollout: (i: number) => Promise<RolloutOutput>,
): Promise<Run & { line: string }> {
  const dir = await Deno.makeTempDir({ prefix: "vf-bench-floor-" });
  const writer = new ResultsWriter(dir);
  try {
    const run = await timed(async () => {
      await workers(async (i) => {
        const written = writer.append([await rollout(i)]);
        if (writer.unwritten > 4096) await written;
      });
      await writer.flush();
    });
    const text = await Deno.readTextFile(`${dir}/results.jsonl`);
    return { ...run, line: text.slice(0, text.indexOf("\n")) };
  } finally {
    await Deno.remove(dir, { recursive: true });
  }
}

/** The minimum per rollout; returns the first line written, for the key check. */
async function floor(url: string): Promise<Run & { line: string }> {
  const client = clientFor(url);
  const noTools = { tools: [], samplingArgs: {} };
  return await writingLoop(async (i) => {
    const row = rows[i];
    const start = Date.now();
    const response = await client.getResponse(row.prompt as Messages, "bench", noTools);
    const end = Date.now();
    const { role, content } = response.message;
    const completion = [{ role, content }] as Messages;
    const score = reward({ completion, answer: String(row.answer) }) ? 1 : 0;
    const scored = Date.now();
    const usage = response.usage!;
    const output: RolloutOutput = {
      format_version: 1,
      example_id: Number(row.example_id),
      task: "default",
      prompt: row.prompt as Messages,
      completion,
      reward: score,
      advantage: 0,
      metrics: { reward: score, num_turns: 1 },
      timing: {
        start_time: seconds(start),
        setup: { start: seconds(start), end: seconds(start), duration: 0 },
        generation: {
          start: seconds(start),
          end: seconds(end),
          duration: micro(seconds(end - start)),
        },
        scoring: { start: seconds(end), end: seconds(scored), duration: 0 },
        model: {
          spans: [{ start: seconds(start), end: seconds(end) }],
          duration: micro(seconds(end - start)),
        },
        env: { spans: [], duration: 0 },
        total: micro(seconds(scored - start)),
        overhead: 0,
      },
      is_completed: true,
      is_truncated: false,
      stop_condition: "max_turns_reached",
      tool_defs: null,
      error: null,
      trajectory_id: trajectoryId(),
      model_retries: 0,
      answer: String(row.answer),
      num_turns: 1,
      token_usage: {
        input_tokens: usage.prompt_tokens,
        output_tokens: usage.completion_tokens,
        final_input_tokens: usage.prompt_tokens,
        final_output_tokens: usage.completion_tokens,
      },
    } as unknown as RolloutOutput;
    return output;
  });
}

/** The floor through the environment's own steps (no turn loop, group layers or pool). */
async function parts(url: string): Promise<Run & { line: string }> {
  const client = clientFor(url);
  return await writingLoop(async (i) => {
    const state = env.initState(rows[i], client, "bench");
    const timing = state.timing;
    timing.generation.start = timing.setup.start = timing.setup.end = nowSeconds();
    const t1 = nowSeconds();
    const response = await env.getModelResponse(state, state.prompt);
    timing.model.spans.push({ start: t1, end: nowSeconds() });
    env.addModelResponse(state, state.prompt, response);
    state.is_completed = true;
    state.stop_condition = "max_turns_reached";
    timing.generation.end = nowSeconds();
    env.renderCompletion(state);
    await env.scoreStates([state]);
    const output = releasedStateToOutput(state);
    output.advantage = 0;
    return output;
  });
}

async function viaEvaluate(url: string): Promise<Run & { line: string }> {
  const client = clientFor(url);
  const dir = await Deno.makeTempDir({ prefix: "vf-bench-floor-" });
  try {
    const run = await timed(async () => {
      const result = await evaluate(env, client, "bench", {
        maxConcurrent: CONCURRENCY,
        resultsDir: dir,
        keepOutputs: false,
        numExamples: n,
      });
      if (result.metadata.avg_reward !== 1) throw new Error("unexpected reward");
    });
    const text = await Deno.readTextFile(`${dir}/results.jsonl`);
    return { ...run, line: text.slice(0, text.indexOf("\n")) };
  } finally {
    await Deno.remove(dir, { recursive: true });
  }
}

/** The keys of a line, nested objects' keys included, in order. */
function shape(line: string): string {
  return JSON.stringify(JSON.parse(line), (_k, v) => typeof v === "object" ? v : typeof v);
}

const { url, kill } = inProcess
  ? { url: "http://in-process/v1", kill: () => {} }
  : await startLoopbackModel();
try {
  // Warm-up: compilation and heap growth.
  await bare(url);
  const first = await floor(url);
  const viaParts = await parts(url);
  const reference = await viaEvaluate(url);
  for (const [name, line] of [["floor", first.line], ["parts", viaParts.line]]) {
    if (shape(line) !== shape(reference.line)) {
      throw new Error(
        `the ${name} loop's line differs in shape from evaluate's:\n${line}\n${reference.line}`,
      );
    }
  }
  const runs: Record<string, Run[]> = { bare: [], floor: [], parts: [], evaluate: [] };
  for (let r = 0; r < repeats; r++) {
    runs.bare.push(await bare(url));
    runs.floor.push(await floor(url));
    runs.parts.push(await parts(url));
    runs.evaluate.push(await viaEvaluate(url));
  }
  const median = (xs: number[]) => [...xs].sort((a, b) => a - b)[Math.floor(xs.length / 2)];
  const wall = (k: string) => median(runs[k].map((x) => x.wallUs));
  const cpu = (k: string) => median(runs[k].map((x) => x.cpuUs));
  console.log(
    `${n} single-turn rollouts at concurrency ${CONCURRENCY}, ${repeats} runs of each in turn; ` +
      `${inProcess ? "model in process" : "loopback model server"}; ` +
      `V8 flags ${v8Flags.join(" ") || "none"}; load ${
        Deno.loadavg().map((x) => x.toFixed(1)).join(", ")
      }\n`,
  );
  console.log(
    "| loop | median µs per rollout | bare / loop | median CPU µs per rollout | bare / loop (CPU) | KB allocated per rollout |",
  );
  console.log("| --- | ---: | ---: | ---: | ---: | ---: |");
  const names: Record<string, string> = {
    bare: inProcess ? "bare calls to the in-process model" : "bare HTTP/1.1-pool loop",
    floor: "floor: vf's client, the reward, the results line",
    parts: "parts: the environment's steps, no loop or pool",
    evaluate: "`evaluate`, `keepOutputs: false`",
  };
  for (const k of ["bare", "floor", "parts", "evaluate"]) {
    console.log(
      `| ${names[k]} | ${wall(k).toFixed(1)} | ${(wall("bare") / wall(k)).toFixed(2)} | ${
        cpu(k).toFixed(1)
      } | ${(cpu("bare") / cpu(k)).toFixed(2)} | ${median(runs[k].map((x) => x.kb)).toFixed(1)} |`,
    );
  }
  console.log(
    `\nfloor/bare = ${(wall("bare") / wall("floor")).toFixed(2)}, evaluate/bare = ${
      (wall("bare") / wall("evaluate")).toFixed(2)
    } (CPU ${(cpu("bare") / cpu("floor")).toFixed(2)} and ${
      (cpu("bare") / cpu("evaluate")).toFixed(2)
    }); CPU µs per rollout over the floor: the environment's steps ${
      (cpu("parts") - cpu("floor")).toFixed(1)
    }, the loop, group layers, pool and counts ${(cpu("evaluate") - cpu("parts")).toFixed(1)}`,
  );
} finally {
  kill();
}
