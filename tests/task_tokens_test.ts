/**
 * Token data in taskset runs, against the real loopback model server (its toy tokenizer
 * answers `return_token_ids` like vLLM) and the subprocess runtime: a bash-tool rollout's
 * message graph joins to exactly what the model saw, `runTaskset()` gives each trace its group
 * advantage, an endpoint without token data fails a `"required"` rollout as a model error, and
 * `traces.jsonl` carries the token graph only with `save_tokens` (`vf run --save-tokens`).
 * @module
 */
import assert from "node:assert/strict";
import { join } from "node:path";
import {
  assistantMessage,
  BashHarness,
  callModel,
  type Harness,
  type HarnessContext,
  MessageGraph,
  OpenAIChatClient,
  readText,
  reward,
  runTaskset,
  Task,
  type TaskHookContext,
  Taskset,
  type TaskTrace,
} from "../mod.ts";
import { TOY_TOKENS, toyLogprob, toyPromptTokens } from "../lib/model/local_server.ts";
import {
  bashModel,
  type ChatRequest,
  type ModelServer,
  type Responder,
  startModelServer,
  textReply,
  toolCallReply,
} from "./model_server.ts";
import { cliCommand, collect, MOD_URL, tempDir, transcript } from "./_cli.ts";

// deno-lint-ignore no-explicit-any
type Json = any;

/** Sums input.txt into answer.txt; needs no container, so the subprocess runtime runs it. */
class SumTask extends Task {
  override async setup({ runtime }: TaskHookContext) {
    await runtime.write("input.txt", "1\n2\n3\n");
  }
  correct = reward(async ({ runtime }) =>
    (await readText(runtime, "answer.txt").catch(() => "")).trim() === "6" ? 1 : 0
  );
}

class Sums extends Taskset {
  get id() {
    return "token-sums";
  }
  load() {
    return [new SumTask({ id: "sum", prompt: "Sum input.txt into answer.txt.", workdir: "/app" })];
  }
}

/** Three bash turns that solve the task, then a final text reply: four model calls. */
const SOLVE = [
  "cat input.txt",
  "awk '{ s += $1 } END { print s }' input.txt > answer.txt",
  "cat answer.txt",
];

const REQUIRED = { return_token_ids: "required" };

function client(server: ModelServer): OpenAIChatClient {
  return new OpenAIChatClient({ base_url: server.url, max_retries: 0, timeout: 30 });
}

function run(server: ModelServer, options: Partial<Parameters<typeof runTaskset>[0]> = {}) {
  return runTaskset({
    taskset: new Sums(),
    policy: {
      runtime: { type: "subprocess" },
      harness: new BashHarness(),
      scoring: { mode: "shared" },
    },
    client: client(server),
    model: "m",
    samplingArgs: REQUIRED,
    runId: `tokens-${crypto.randomUUID().slice(0, 8)}`,
    ...options,
  });
}

/** The toy tokenizer's completion of a plain text reply: its bytes, then the end token. */
function textCompletion(text: string): number[] {
  return [...new TextEncoder().encode(text), TOY_TOKENS.end];
}

/** The sampled tokens of a node (its true-mask tail). */
function sampledIds(node: { token_ids?: number[]; mask?: boolean[] }): number[] {
  return (node.token_ids ?? []).filter((_, i) => node.mask![i]);
}

function describe(trace: TaskTrace): string {
  return JSON.stringify({ reward: trace.reward, error: trace.error, tools: trace.tool_calls });
}

/** The lines of a run's traces.jsonl. */
async function traceLines(runDir: string): Promise<Json[]> {
  const text = await Deno.readTextFile(join(runDir, "traces.jsonl"));
  return text.split("\n").filter((l) => l !== "").map((l) => JSON.parse(l));
}

Deno.test('a 3-turn bash rollout with return_token_ids = "required": the nodes join to the last call\'s prompt + completion, masks mark only sampled tokens, logprobs line up', async () => {
  await using server = await startModelServer({ responder: bashModel(...SOLVE) });
  const { traces } = await run(server);

  assert.equal(traces.length, 1);
  const [trace] = traces;
  assert.equal(trace.reward, 1, describe(trace));
  assert.equal(server.requests.length, 4);
  assert.ok(trace.nodes, "the trace keeps its token graph");
  const graph = new MessageGraph(trace.nodes);
  assert.equal(graph.leaves().length, 1, "one branch: the history was never rewritten");
  const leaf = graph.leaves()[0];

  const last = server.requests.at(-1)!.body;
  const seq = graph.tokens(leaf);
  assert.deepEqual(seq.token_ids, [...toyPromptTokens(last), ...textCompletion("done")]);
  assert.equal(seq.mask.length, seq.token_ids.length);

  // Each reply node adds the prompt tokens new since its branch's last node (mask false),
  // then its completion (mask true, one logprob per token, as the endpoint sampled them).
  const replies = graph.path(leaf).filter((i) => trace.nodes![i].sampled);
  assert.equal(replies.length, 4);
  replies.forEach((node, call) => {
    const n = trace.nodes![node];
    const sampled = sampledIds(n);
    const firstSampled = n.mask!.indexOf(true);
    assert.ok(n.mask!.slice(firstSampled).every(Boolean), "sampled tokens end the node");
    assert.deepEqual(n.logprobs, sampled.map((id, i) => toyLogprob(id, i)));
    const upTo = graph.tokens(node).token_ids;
    assert.deepEqual(
      upTo.slice(0, upTo.length - sampled.length),
      toyPromptTokens(
        server.requests[call].body,
      ),
    );
  });
  for (const i of graph.path(leaf).filter((i) => !trace.nodes![i].sampled)) {
    assert.deepEqual(trace.nodes![i].token_ids, [], "prompt messages hold no tokens of their own");
  }
  const sampledTotal = replies.reduce((n, i) => n + sampledIds(trace.nodes![i]).length, 0);
  assert.equal(seq.mask.filter(Boolean).length, sampledTotal);
  assert.equal(seq.logprobs.length, sampledTotal);
  assert.deepEqual(graph.branches()[0].map((m) => m.role), trace.messages.map((m) => m.role));
});

Deno.test("runTaskset() gives each trace its task group's advantage: reward minus the mean of the scored rollouts, null for an unscored one", async () => {
  // Each rollout's first call decides its answer: right, wrong, wrong, then a reply with no
  // token data (a model error under "required"). Later turns only read the answer back.
  let starts = 0;
  const noTokens = JSON.stringify({
    id: "chatcmpl-x",
    object: "chat.completion",
    created: 0,
    model: "m",
    choices: [{
      index: 0,
      message: { role: "assistant", content: "done" },
      finish_reason: "stop",
      logprobs: null,
    }],
    usage: { prompt_tokens: 1, completion_tokens: 1, total_tokens: 2 },
  });
  const responder: Responder = ({ body }) => {
    if (body.messages.some((m) => m.role === "assistant")) {
      return body.messages.filter((m) => m.role === "assistant").length < 2
        ? toolCallReply("bash", { command: "cat answer.txt" })
        : textReply("done");
    }
    const start = starts++;
    if (start === 3) return { raw: noTokens };
    return toolCallReply("bash", { command: `echo ${start === 0 ? 6 : 5} > answer.txt` });
  };
  await using server = await startModelServer({ responder });
  const { traces } = await run(server, { rolloutsPerTask: 4, maxConcurrent: 2 });

  assert.equal(traces.length, 4);
  const rewards = traces.map((t) => t.reward).sort();
  assert.deepEqual(rewards, [0, 0, 1, null], traces.map(describe).join("\n"));
  // By hand: the scored rewards are 1, 0, 0, so the mean is 1/3.
  for (const t of traces) {
    if (t.reward === null) assert.equal(t.advantage, null);
    else assert.ok(Math.abs(t.advantage! - (t.reward - 1 / 3)) < 1e-12, describe(t));
  }
  assert.ok(Math.abs(traces.reduce((s, t) => s + (t.advantage ?? 0), 0)) < 1e-12);
});

Deno.test('an endpoint that returns no token data fails a "required" rollout with a model error naming the missing field; its reward is null, never 0', async () => {
  await using server = await startModelServer({
    responder: bashModel(...SOLVE),
    tokenIds: false,
  });
  await using tmp = await tempDir("vf_task_tokens_");
  const runDir = join(tmp.path, "run");
  const { traces } = await run(server, { runDir });

  const [trace] = traces;
  assert.equal(trace.ok, false);
  assert.equal(trace.reward, null);
  assert.equal(trace.advantage, null);
  assert.equal(trace.error?.error, "MissingTokenDataError", describe(trace));
  assert.match(trace.error!.message, /has no "prompt_token_ids"/);
  assert.match(trace.error!.message, /return_token_ids = "required"/);
  assert.equal(server.requests.length, 1, "the first call fails; nothing runs after it");
  const [line] = await traceLines(runDir);
  assert.equal(line.reward, null);
  assert.equal(line.error.error, "MissingTokenDataError");
});

/** Calls the model, then rewrites the history (a compaction) and calls it again: two branches. */
const compacting: Harness = {
  id: "compacting",
  executesCode: false,
  async run(ctx: HarnessContext) {
    ctx.recorder.messages.push({ role: "user", content: "Say something." });
    ctx.recorder.messages.push(assistantMessage(await callModel(ctx, 0, [])));
    ctx.recorder.messages.splice(0, Infinity, { role: "user", content: "Summary: nothing yet." });
    ctx.recorder.messages.push(assistantMessage(await callModel(ctx, 1, [])));
  },
};

Deno.test("traces.jsonl without saveTokens: a one-branch trace's token graph stays out, a rewritten history keeps its nodes without token data; the returned traces keep both", async () => {
  await using solver = await startModelServer({ responder: bashModel(...SOLVE) });
  await using talker = await startModelServer({ responder: () => textReply("ok") });
  await using tmp = await tempDir("vf_task_tokens_");
  const runDir = join(tmp.path, "run");
  const linear = await run(solver, { runDir: join(runDir, "linear") });
  const forked = await run(talker, {
    runDir: join(runDir, "forked"),
    policy: { runtime: { type: "subprocess" }, harness: compacting, scoring: { mode: "shared" } },
  });

  assert.ok(new MessageGraph(linear.traces[0].nodes).hasTokens, describe(linear.traces[0]));
  const [linearLine] = await traceLines(join(runDir, "linear"));
  assert.equal(linearLine.trace_id, linear.traces[0].trace_id);
  assert.equal("nodes" in linearLine, false);

  const kept = new MessageGraph(forked.traces[0].nodes);
  assert.equal(kept.leaves().length, 2, describe(forked.traces[0]));
  assert.ok(kept.hasTokens);
  const [forkedLine] = await traceLines(join(runDir, "forked"));
  const written = new MessageGraph(forkedLine.nodes);
  assert.equal(written.hasTokens, false);
  assert.deepEqual(written.branches(), kept.branches());
});

/** A taskset module for the CLI: the same sum task. */
const TASKSET_MODULE = `
import { readText, reward, Task, type TaskHookContext, Taskset } from "${MOD_URL}";

class SumTask extends Task {
  override async setup({ runtime }: TaskHookContext) {
    await runtime.write("input.txt", "1\\n2\\n3\\n");
  }
  correct = reward(async ({ runtime }) =>
    (await readText(runtime, "answer.txt").catch(() => "")).trim() === "6" ? 1 : 0
  );
}

class Sums extends Taskset {
  get id() {
    return "token-sums";
  }
  load() {
    return [new SumTask({ id: "sum", prompt: "Sum input.txt into answer.txt.", workdir: "/app" })];
  }
}

export function loadTaskset() {
  return new Sums();
}
`;

Deno.test("vf run writes the token graph to traces.jsonl with --save-tokens and leaves it out without", async () => {
  await using tmp = await tempDir("vf_task_tokens_cli_");
  const module = join(tmp.path, "sums.ts");
  await Deno.writeTextFile(module, TASKSET_MODULE);
  // One server per run, so each server's requests are one rollout's.
  await using plain = await startModelServer({ responder: bashModel(...SOLVE) });
  await using saving = await startModelServer({ responder: bashModel(...SOLVE) });
  const vfRun = (server: ModelServer, out: string, ...flags: string[]) =>
    collect(
      cliCommand([
        "run",
        module,
        "-m",
        "m",
        "-b",
        server.url,
        "-o",
        out,
        "-S",
        JSON.stringify(REQUIRED),
        "--env.agent.runtime.type",
        "subprocess",
        "--env.agent.scoring.mode",
        "shared",
        ...flags,
      ], { cwd: tmp.path, registry: false }),
    );
  const [without, withTokens] = await Promise.all([
    vfRun(plain, "plain"),
    vfRun(saving, "saving", "--save-tokens"),
  ]);

  const runDirOf = (res: { stderr: string }) => /^Saving traces to (.+)$/m.exec(res.stderr)?.[1];
  for (const res of [without, withTokens]) {
    assert.equal(res.code, 0, transcript(res));
    assert.ok(runDirOf(res), transcript(res));
  }
  const [bare] = await traceLines(runDirOf(without)!);
  assert.equal(bare.reward, 1, JSON.stringify(bare.error));
  assert.equal("nodes" in bare, false);

  const [full] = await traceLines(runDirOf(withTokens)!);
  assert.equal(full.reward, 1, JSON.stringify(full.error));
  const graph = new MessageGraph(full.nodes);
  const last: ChatRequest = saving.requests.at(-1)!;
  assert.deepEqual(graph.tokens().token_ids, [
    ...toyPromptTokens(last.body),
    ...textCompletion("done"),
  ]);
});

Deno.test('vf run refuses a return_token_ids that is neither true, false nor "required" before anything starts, naming the role\'s sampling table', async () => {
  await using tmp = await tempDir("vf_task_tokens_bad_");
  const module = join(tmp.path, "sums.ts");
  await Deno.writeTextFile(module, TASKSET_MODULE);
  const base = ["run", module, "-m", "m", "-b", "http://127.0.0.1:9/v1", "-o", "out"];
  const run = (...flags: string[]) =>
    collect(cliCommand([...base, ...flags], { cwd: tmp.path, registry: false }));
  const [top, role] = await Promise.all([
    run("-S", JSON.stringify({ return_token_ids: "yes" })),
    run("--env.agent.sampling", JSON.stringify({ return_token_ids: 1 })),
  ]);
  assert.equal(top.code, 1, transcript(top));
  assert.match(
    top.stderr,
    /sampling_args\.return_token_ids: must be true, false or "required", got "yes"/,
  );
  assert.equal(role.code, 1, transcript(role));
  assert.match(role.stderr, /env\.agent\.sampling\.return_token_ids: must be .* got 1/);
  for (const res of [top, role]) assert.doesNotMatch(res.stderr, /Saving traces to/);
});
