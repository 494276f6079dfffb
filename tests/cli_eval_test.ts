/**
 * End-to-end tests of `vf eval` and `vf demo`: the real CLI runs in a subprocess against a
 * real OpenAI-compatible server on loopback (tests/model_server.ts); the tests assert on
 * exit codes, messages and the files the run writes.
 * @module
 */
import assert from "node:assert/strict";
import { join } from "node:path";
import { loadExampleDataset } from "../lib/data/examples.ts";
import { VERSION } from "../lib/version.ts";
import {
  type ChatRequest,
  lastUserText,
  rateLimitReply,
  type Reply,
  type Responder,
  startModelServer,
  textReply,
  toolCallReply,
} from "./model_server.ts";
import { cliCommand, type CliResult, collect, MOD_URL, tempDir, transcript } from "./_cli.ts";

// ---------------------------------------------------------------------------------------
// Running the CLI

interface CliOptions {
  /** Working directory of the CLI (a temp dir, so `./outputs` lands there). */
  cwd: string;
  /** Extra environment variables; the rest of the parent environment is not inherited. */
  env?: Record<string, string>;
}

/** The CLI with a bare environment: no OPENAI_* variables leak in from the machine. */
function spawnCli(args: string[], options: CliOptions): Deno.ChildProcess {
  return cliCommand(args, { ...options, registry: false }).spawn();
}

function runCli(args: string[], options: CliOptions): Promise<CliResult> {
  return collect(spawnCli(args, options));
}

// ---------------------------------------------------------------------------------------
// Run directories

// deno-lint-ignore no-explicit-any
type Json = any;

interface Run {
  dir: string;
  /** The raw text of results.jsonl. */
  text: string;
  rows: Json[];
  metadata: Json;
  config: Json;
}

/** The single run directory under `<outputDir>/evals/<env>--<model>/`. */
async function findRunDir(outputDir: string, envId: string, model: string): Promise<string> {
  const base = join(outputDir, "evals", `${envId}--${model}`);
  const dirs: string[] = [];
  for await (const entry of Deno.readDir(base)) if (entry.isDirectory) dirs.push(entry.name);
  assert.equal(dirs.length, 1, `expected one run directory in ${base}, found ${dirs.join(", ")}`);
  return join(base, dirs[0]);
}

/** Read a run's files; every results line must be complete, newline-terminated JSON. */
async function readRun(dir: string): Promise<Run> {
  const text = await Deno.readTextFile(join(dir, "results.jsonl")).catch(() => "");
  assert.ok(
    text === "" || text.endsWith("\n"),
    `results.jsonl ends mid-line:\n${text.slice(-200)}`,
  );
  const rows = text.split("\n").filter((l) => l !== "").map((line, i) => {
    try {
      return JSON.parse(line);
    } catch (error) {
      throw new Error(`results.jsonl line ${i + 1} is not JSON (${error}): ${line.slice(0, 200)}`);
    }
  });
  const metadata = JSON.parse(await Deno.readTextFile(join(dir, "metadata.json")));
  const config = JSON.parse(await Deno.readTextFile(join(dir, "config.json")));
  return { dir, text, rows, metadata, config };
}

/** The lines of stderr that report a fatal error (the CLI prefixes them with "error: "). */
function errorLines(stderr: string): string[] {
  return stderr.split("\n").filter((l) => l.startsWith("error: "));
}

function countBy<T>(items: T[], key: (item: T) => string | number): Map<string | number, T[]> {
  const out = new Map<string | number, T[]>();
  for (const item of items) {
    const k = key(item);
    out.set(k, [...(out.get(k) ?? []), item]);
  }
  return out;
}

/** pass@k of one example with `c` correct out of `n` (the unbiased estimator). */
function passAtK(n: number, c: number, k: number): number {
  if (n - c < k) return 1;
  let fail = 1;
  for (let i = n - c + 1; i <= n; i++) fail *= 1 - k / i;
  return 1 - fail;
}

// ---------------------------------------------------------------------------------------
// Responders

const GSM8K = loadExampleDataset("gsm8k-sample", { split: "test" }).toList() as Array<
  { question: string; answer: string }
>;
const GSM8K_ANSWERS = new Map(GSM8K.map((row) => [row.question, row.answer]));

function wrongAnswer(answer: string): string {
  return String(Number(answer.replaceAll(",", "")) + 1);
}

/**
 * Answers gsm8k questions from the bundled answer key. `correct(exampleIndex, attempt)`
 * decides each reply, `attempt` counting the requests seen for that question so far.
 */
function gsm8kResponder(
  correct: (exampleIndex: number, attempt: number) => boolean,
  extra: Partial<Reply> = {},
): Responder {
  const attempts = new Map<string, number>();
  return (request) => {
    const question = lastUserText(request);
    const answer = GSM8K_ANSWERS.get(question);
    if (answer === undefined) return textReply("I do not know this question.");
    const attempt = attempts.get(question) ?? 0;
    attempts.set(question, attempt + 1);
    const index = GSM8K.findIndex((row) => row.question === question);
    const given = correct(index, attempt) ? answer : wrongAnswer(answer);
    return { ...textReply(`Let me think.\n\n\\boxed{${given}}`), ...extra } as Reply;
  };
}

/** Replies from `script(attempt)` per distinct last user message, else a correct reversal. */
function perQuestionResponder(script: (attempt: number) => Reply | null): Responder {
  const attempts = new Map<string, number>();
  return (request) => {
    const question = lastUserText(request);
    const attempt = attempts.get(question) ?? 0;
    attempts.set(question, attempt + 1);
    return script(attempt) ??
      textReply(`<reversed_text>\n${[...question].reverse().join("")}\n</reversed_text>`);
  };
}

function questionsOf(requests: ChatRequest[]): string[] {
  return requests.map(lastUserText);
}

// ---------------------------------------------------------------------------------------
// Scoring and saving

Deno.test("vf eval gsm8k saves n×r correct rollouts, metadata and a summary when every answer is right", async () => {
  await using tmp = await tempDir("vf_cli_eval_");
  await using server = await startModelServer({
    responder: gsm8kResponder(() => true, { usage: { prompt_tokens: 100, completion_tokens: 10 } }),
  });
  const res = await runCli(
    ["eval", "gsm8k", "-m", "test-model", "-b", server.url, "-n", "4", "-r", "2", "-o", "outputs"],
    { cwd: tmp.path },
  );
  assert.equal(res.code, 0, transcript(res));
  const run = await readRun(await findRunDir(join(tmp.path, "outputs"), "gsm8k", "test-model"));

  assert.equal(run.rows.length, 8);
  const byExample = countBy(run.rows, (r) => r.example_id);
  assert.deepEqual([...byExample.keys()].sort(), [0, 1, 2, 3]);
  for (const rows of byExample.values()) assert.equal(rows.length, 2);
  for (const row of run.rows) {
    assert.equal(typeof row.example_id, "number");
    assert.ok(Array.isArray(row.prompt) && row.prompt.length > 0);
    assert.equal(row.prompt.at(-1).role, "user");
    assert.equal(row.prompt.at(-1).content, GSM8K[row.example_id].question);
    assert.equal(row.completion.length, 1);
    assert.equal(row.completion[0].role, "assistant");
    assert.ok(row.completion[0].content.includes(`\\boxed{${GSM8K[row.example_id].answer}}`));
    assert.equal(row.reward, 1);
    assert.equal(row.metrics.correct_answer, 1);
    assert.equal(row.metrics.num_turns, 1);
    assert.equal(typeof row.timing, "object");
    assert.ok(row.timing.total > 0, `timing.total ${row.timing.total}`);
    assert.equal(row.error, null);
    assert.equal(row.answer, GSM8K[row.example_id].answer);
  }

  const meta = run.metadata;
  assert.equal(meta.env_id, "gsm8k");
  assert.equal(meta.model, "test-model");
  assert.equal(meta.base_url, server.url);
  assert.equal(meta.num_examples, 4);
  assert.equal(meta.rollouts_per_example, 2);
  assert.equal(meta.num_rollouts, 8);
  assert.equal(meta.avg_reward, 1);
  assert.equal(meta.avg_error, 0);
  assert.deepEqual(meta.pass_at_k, { "1": 1, "2": 1 });
  assert.deepEqual(meta.pass_all_k, { "1": 1, "2": 1 });
  assert.deepEqual(meta.usage, {
    input_tokens: 100,
    output_tokens: 10,
    total_input_tokens: 800,
    total_output_tokens: 80,
  });

  assert.equal(server.requests.length, 8);
  for (const req of server.requests) assert.equal(req.body.model, "test-model");
  assert.match(res.stdout, /env gsm8k {2}model test-model {2}examples 4 {2}rollouts\/example 2/);
  assert.match(res.stdout, /^reward\s+1\.0000/m);
  assert.match(res.stdout, /^pass@k\s+1\.000\s+1\.000/m);
  assert.match(res.stdout, /errors: 0 of 8/);
  assert.ok(res.stdout.includes(join(run.dir, "results.jsonl")));
});

Deno.test("vf eval gsm8k scores wrong answers 0 and a mix with pass@1 and pass@2 from per-example counts", async () => {
  await using tmp = await tempDir("vf_cli_eval_");
  // Example 0: both rollouts right; 1: the first right, the second wrong; 2 and 3: both wrong.
  await using mixed = await startModelServer({
    responder: gsm8kResponder((i, attempt) => i === 0 || (i === 1 && attempt === 0)),
  });
  await using wrong = await startModelServer({ responder: gsm8kResponder(() => false) });
  const common = ["-n", "4", "-r", "2", "-q"];
  const [mixedRes, wrongRes] = await Promise.all([
    runCli(["eval", "gsm8k", "-m", "mixed", "-b", mixed.url, ...common, "-o", "out"], {
      cwd: tmp.path,
    }),
    runCli(["eval", "gsm8k", "-m", "wrong", "-b", wrong.url, ...common, "-o", "out"], {
      cwd: tmp.path,
    }),
  ]);
  assert.equal(wrongRes.code, 0, transcript(wrongRes));
  assert.equal(mixedRes.code, 0, transcript(mixedRes));

  const wrongRun = await readRun(await findRunDir(join(tmp.path, "out"), "gsm8k", "wrong"));
  assert.equal(wrongRun.rows.length, 8);
  for (const row of wrongRun.rows) {
    assert.equal(row.reward, 0);
    assert.equal(row.metrics.correct_answer, 0);
    assert.equal(row.error, null, "a wrong answer is not an error");
  }
  assert.equal(wrongRun.metadata.avg_reward, 0);
  assert.deepEqual(wrongRun.metadata.pass_at_k, { "1": 0, "2": 0 });
  assert.match(wrongRes.stdout, /^reward\s+0\.0000/m);

  const run = await readRun(await findRunDir(join(tmp.path, "out"), "gsm8k", "mixed"));
  assert.equal(run.rows.length, 8);
  const correct = new Map<number, number>();
  for (const row of run.rows) {
    assert.ok(row.reward === 0 || row.reward === 1, `reward ${row.reward}`);
    correct.set(row.example_id, (correct.get(row.example_id) ?? 0) + row.reward);
  }
  assert.deepEqual([...correct].sort((a, b) => a[0] - b[0]), [[0, 2], [1, 1], [2, 0], [3, 0]]);
  const expected = (k: number) =>
    [...correct.values()].reduce((sum, c) => sum + passAtK(2, c, k), 0) / correct.size;
  assert.equal(run.metadata.avg_reward, 3 / 8);
  assert.ok(Math.abs(run.metadata.pass_at_k["1"] - expected(1)) < 1e-9);
  assert.ok(Math.abs(run.metadata.pass_at_k["2"] - expected(2)) < 1e-9);
  assert.ok(Math.abs(run.metadata.pass_at_k["1"] - 0.375) < 1e-9);
  assert.ok(Math.abs(run.metadata.pass_at_k["2"] - 0.5) < 1e-9);
  assert.ok(Math.abs(run.metadata.pass_all_k["2"] - 0.25) < 1e-9);
  assert.match(mixedRes.stdout, /^reward\s+0\.3750/m);
  assert.match(mixedRes.stdout, /^pass@k\s+0\.375\s+0\.500/m);
});

Deno.test("vf eval calculator runs the model's calculator tool call and scores the boxed tool result", async () => {
  await using tmp = await tempDir("vf_cli_eval_");
  await using server = await startModelServer({
    responder: (request) => {
      const tool = request.body.messages.findLast((m) => m.role === "tool");
      if (tool) return textReply(`The calculator says ${tool.content}.\n\\boxed{${tool.content}}`);
      const expression = /What is (.+)\?/.exec(lastUserText(request))?.[1] ?? "0";
      return toolCallReply("calculator", { expression });
    },
  });
  const res = await runCli(
    ["eval", "calculator", "-m", "tool-model", "-b", server.url, "-n", "3", "-r", "1", "-q"],
    { cwd: tmp.path },
  );
  assert.equal(res.code, 0, transcript(res));
  const run = await readRun(
    await findRunDir(join(tmp.path, "outputs"), "calculator", "tool-model"),
  );
  assert.equal(run.rows.length, 3);
  for (const row of run.rows) {
    assert.equal(row.error, null);
    assert.deepEqual(row.completion.map((m: Json) => m.role), ["assistant", "tool", "assistant"]);
    const [call, toolMessage, final] = row.completion;
    assert.equal(call.tool_calls.length, 1);
    assert.equal(call.tool_calls[0].name, "calculator");
    assert.equal(toolMessage.tool_call_id, call.tool_calls[0].id);
    assert.equal(toolMessage.content, row.answer, "the tool computed the reference answer");
    assert.ok(final.content.includes(`\\boxed{${row.answer}}`));
    assert.equal(row.reward, 1);
    assert.equal(row.metrics.total_tool_calls, 1);
    assert.equal(row.metrics.calculator_calls, 1);
    assert.equal(row.stop_condition, "no_tools_called");
    assert.deepEqual(row.tool_defs.map((t: Json) => t.name), ["calculator"]);
  }
  assert.equal(run.metadata.avg_reward, 1);
  assert.equal(run.metadata.avg_metrics.total_tool_calls, 1);
  assert.deepEqual(run.metadata.tools.map((t: Json) => t.name), ["calculator"]);

  // Two requests per rollout; every one offers the tool; the second carries the tool result.
  assert.equal(server.requests.length, 6);
  for (const req of server.requests) {
    assert.deepEqual(req.body.tools?.map((t) => t.function?.name), ["calculator"]);
  }
  const followUps = server.requests.filter((r) => r.body.messages.some((m) => m.role === "tool"));
  assert.equal(followUps.length, 3);
  for (const req of followUps) {
    const [assistant, tool] = req.body.messages.slice(-2);
    assert.equal(assistant.role, "assistant");
    assert.equal(tool.tool_call_id, assistant.tool_calls?.[0].id);
  }
});

Deno.test("vf eval --save-tokens with return_token_ids writes each rollout's token graph; a bad return_token_ids value is one clear error", async () => {
  await using tmp = await tempDir("vf_cli_eval_");
  await using server = await startModelServer({
    responder: (request) => {
      const tool = request.body.messages.findLast((m) => m.role === "tool");
      if (tool) return textReply(`\\boxed{${tool.content}}`);
      const expression = /What is (.+)\?/.exec(lastUserText(request))?.[1] ?? "0";
      return toolCallReply("calculator", { expression });
    },
  });
  const args = ["eval", "calculator", "-m", "tool-model", "-b", server.url, "-n", "2", "-q"];
  const res = await runCli(
    [...args, "-r", "2", "-S", '{"return_token_ids": "required"}', "--save-tokens"],
    { cwd: tmp.path },
  );
  assert.equal(res.code, 0, transcript(res));
  const run = await readRun(
    await findRunDir(join(tmp.path, "outputs"), "calculator", "tool-model"),
  );
  assert.equal(run.rows.length, 4);
  assert.ok(server.requests.every((r) => r.body.return_token_ids === true));
  for (const row of run.rows) {
    assert.equal(row.error, null);
    const sampled = row.nodes.filter((n: Json) => n.sampled);
    assert.equal(sampled.length, 2, "one node per model call");
    for (const node of sampled) {
      assert.equal(node.mask.length, node.token_ids.length);
      assert.equal(node.logprobs.length, node.mask.filter(Boolean).length);
    }
    assert.equal(row.advantage, 0, "every rollout of an example scored alike");
  }

  const bad = await runCli([...args, "-S", '{"return_token_ids": "yes"}'], { cwd: tmp.path });
  assert.notEqual(bad.code, 0);
  assert.deepEqual(errorLines(bad.stderr), [
    'error: command line: sampling_args.return_token_ids: must be true, false or "required", got "yes"',
  ]);
});

Deno.test("vf eval wordle plays a scripted game over several turns and scores solved and unsolved games", async () => {
  await using tmp = await tempDir("vf_cli_eval_");
  const guesses = ["crane", "plate", "apple", "apple", "apple", "apple"];
  await using server = await startModelServer({
    responder: (request) => {
      const turn = request.body.messages.filter((m) => m.role === "assistant").length;
      return textReply(`My guess: <guess>${guesses[turn] ?? "apple"}</guess>`);
    },
  });
  // The first two secret words are "apple" and "brave".
  const res = await runCli(
    ["eval", "wordle", "-m", "player", "-b", server.url, "-n", "2", "-r", "1", "-q"],
    { cwd: tmp.path },
  );
  assert.equal(res.code, 0, transcript(res));
  const run = await readRun(await findRunDir(join(tmp.path, "outputs"), "wordle", "player"));
  assert.equal(run.rows.length, 2);
  const apple = run.rows.find((r) => r.answer === "apple");
  const brave = run.rows.find((r) => r.answer === "brave");
  assert.ok(apple && brave, `answers: ${run.rows.map((r) => r.answer)}`);

  assert.equal(apple.error, null);
  assert.equal(apple.metrics.num_turns, 3);
  assert.equal(apple.metrics.solved, 1);
  assert.equal(apple.stop_condition, "has_final_env_response");
  // solved 1 + 0.2 × partial credit 1 + 0.2 × efficiency (6 - 2) / 6
  assert.ok(Math.abs(apple.reward - (1 + 0.2 + 0.2 * (4 / 6))) < 1e-9, `reward ${apple.reward}`);
  const appleTexts = apple.completion.map((m: Json) => `${m.role}: ${m.content}`);
  assert.deepEqual(appleTexts.filter((t: string) => t.startsWith("user")), [
    "user: crane → XXYXG (5 left)",
    "user: plate → YYYXG (4 left)",
    "user: GGGGG\nSolved in 3!",
  ]);

  assert.equal(brave.error, null);
  assert.equal(brave.metrics.num_turns, 6);
  assert.equal(brave.metrics.solved, 0);
  assert.equal(brave.stop_condition, "max_turns_reached");
  // The last guess "apple" against "brave" is YXXXG: partial credit 0.1 + 0.2.
  assert.ok(Math.abs(brave.reward - 0.2 * 0.3) < 1e-9, `reward ${brave.reward}`);
  assert.equal(brave.completion.filter((m: Json) => m.role === "assistant").length, 6);
  assert.ok(brave.completion.some((m: Json) => m.content === "crane → XGGXG (5 left)"));

  assert.equal(server.requests.length, 3 + 6);
  assert.equal(run.metadata.avg_metrics.num_turns, 4.5);
});

// ---------------------------------------------------------------------------------------
// Endpoint failures

Deno.test("vf eval retries 429s (retry-after 0) and 500s and then succeeds", async () => {
  await using tmp = await tempDir("vf_cli_eval_");
  await using server = await startModelServer({
    responder: perQuestionResponder((attempt) =>
      attempt === 0 ? rateLimitReply(0) : attempt === 1 ? { status: 500 } : null
    ),
  });
  const res = await runCli(
    ["eval", "reverse-text", "-m", "flaky", "-b", server.url, "-n", "2", "-r", "1", "-q"],
    { cwd: tmp.path },
  );
  assert.equal(res.code, 0, transcript(res));
  const run = await readRun(await findRunDir(join(tmp.path, "outputs"), "reverse-text", "flaky"));
  assert.equal(run.rows.length, 2);
  for (const row of run.rows) {
    assert.equal(row.error, null);
    assert.equal(row.reward, 1);
    assert.equal(row.model_retries, 2, "the 429 and the 500 were retried");
  }
  assert.equal(server.requests.length, 6, "a 429, a 500 and a success per rollout");
  assert.match(res.stdout, /errors: 0 of 2/);
  // Retries are visible per rollout, per run and in the summary.
  assert.equal(run.metadata.num_model_retries, 4);
  assert.match(res.stdout, /model retries: 4 \(in 2 of 2 rollouts\)/);
});

Deno.test("vf eval records endpoint failures on the rollouts, and a run where every rollout errored exits 1: 500s, timeouts, malformed JSON", async () => {
  await using tmp = await tempDir("vf_cli_eval_");
  await using failing = await startModelServer({ responder: () => ({ status: 500 }) });
  await using slow = await startModelServer({
    responder: () => textReply("<reversed_text>\nlate\n</reversed_text>", { delay_ms: 5_000 }),
  });
  await using malformed = await startModelServer({ responder: () => ({ raw: '{"choices": [' }) });
  const args = (
    model: string,
    url: string,
    ...extra: string[]
  ) => [..."eval reverse-text -n 2 -r 1".split(" "), "-m", model, "-b", url, ...extra];
  const [failingRes, slowRes, malformedRes] = await Promise.all([
    runCli(args("failing", failing.url, "--client.max_retries", "1"), { cwd: tmp.path }),
    runCli(args("slow", slow.url, "--client.timeout", "1", "--client.max_retries", "0"), {
      cwd: tmp.path,
    }),
    runCli(args("malformed", malformed.url), { cwd: tmp.path }),
  ]);
  const out = join(tmp.path, "outputs");

  // Every rollout errored: the results are kept, and the run says so with exit 1.
  assert.equal(failingRes.code, 1, transcript(failingRes));
  assert.match(failingRes.stderr, /error: every rollout errored \(2 of 2\)/);
  const failingRun = await readRun(await findRunDir(out, "reverse-text", "failing"));
  assert.equal(failingRun.rows.length, 2);
  for (const row of failingRun.rows) {
    assert.equal(row.error?.error, "ModelError");
    assert.match(row.error.message, /answered HTTP 500/);
    assert.equal(row.reward, 0);
    assert.deepEqual(row.completion, []);
  }
  assert.equal(failingRun.metadata.avg_error, 1);
  for (const row of failingRun.rows) {
    assert.equal(row.model_retries, 1, "retried once, then failed");
  }
  assert.equal(failingRun.metadata.num_model_retries, 2);
  assert.equal(failing.requests.length, 4, "one try and one retry per rollout");
  assert.match(failingRes.stdout, /errors: 2 of 2 \(100\.0%\)/);
  assert.match(failingRes.stdout, /2 × ModelError: .*HTTP 500/);

  // Every rollout errored: the results are kept, and the run says so with exit 1.
  assert.equal(slowRes.code, 1, transcript(slowRes));
  assert.match(slowRes.stderr, /error: every rollout errored \(2 of 2\)/);
  const slowRun = await readRun(await findRunDir(out, "reverse-text", "slow"));
  assert.equal(slowRun.rows.length, 2);
  for (const row of slowRun.rows) {
    assert.equal(row.error?.error, "ModelError");
    assert.match(row.error.message, /timed out after 1s/);
  }
  assert.match(slowRes.stdout, /errors: 2 of 2/);

  // Every rollout errored: the results are kept, and the run says so with exit 1.
  assert.equal(malformedRes.code, 1, transcript(malformedRes));
  assert.match(malformedRes.stderr, /error: every rollout errored \(2 of 2\)/);
  const malformedRun = await readRun(await findRunDir(out, "reverse-text", "malformed"));
  assert.equal(malformedRun.rows.length, 2);
  for (const row of malformedRun.rows) {
    assert.equal(row.error?.error, "InvalidModelResponseError");
    assert.match(row.error.message, /malformed JSON/);
  }
  assert.match(malformedRes.stdout, /2 × InvalidModelResponseError/);
});

Deno.test("vf eval exits 0 when some rollouts errored, and 1 when more than --max-error-rate did", async () => {
  await using tmp = await tempDir("vf_cli_eval_");
  let calls = 0;
  // The first request fails with a 400 (not retried), every other one answers correctly.
  await using server = await startModelServer({
    responder: (request) =>
      calls++ === 0 ? { status: 400 } : textReply(
        `<reversed_text>\n${[...lastUserText(request)].reverse().join("")}\n</reversed_text>`,
      ),
  });
  const args = [
    "eval",
    "reverse-text",
    "-n",
    "2",
    "-r",
    "1",
    "-c",
    "1",
    "-m",
    "m",
    "-b",
    server.url,
  ];
  const lenient = await runCli(args, { cwd: tmp.path });
  assert.equal(lenient.code, 0, transcript(lenient));
  assert.match(lenient.stdout, /errors: 1 of 2 \(50\.0%\), 1 never scored and left out/);
  // The failed request is not a 0 in the average: the other rollout's reward stands alone.
  const runDir = /^results: (.+)\/results\.jsonl$/m.exec(lenient.stdout)![1];
  const meta = JSON.parse(await Deno.readTextFile(join(runDir, "metadata.json")));
  const rows = (await Deno.readTextFile(join(runDir, "results.jsonl"))).trim().split("\n")
    .map((l) => JSON.parse(l));
  const scored = rows.find((r) => r.error === null);
  assert.ok(scored.reward > 0, `the scored rollout earned ${scored.reward}`);
  assert.equal(meta.num_unscored, 1);
  assert.equal(meta.avg_reward, scored.reward);
  calls = 0;
  const strict = await runCli([...args, "--max-error-rate", "0.25"], { cwd: tmp.path });
  assert.equal(strict.code, 1, transcript(strict));
  assert.match(strict.stdout, /errors: 1 of 2/);
  assert.match(
    strict.stderr,
    /error: 1 of 2 rollouts errored \(50\.0%\), more than max_error_rate 0\.25/,
  );
});

// ---------------------------------------------------------------------------------------
// Bad input

interface BadInputCase {
  name: string;
  args: string[];
  env?: Record<string, string>;
  /** Substrings of the one "error: " line. */
  message: Array<string | RegExp>;
  code?: number;
  /** The message may continue on further lines (a code frame). */
  multiline?: boolean;
  /** The failure comes from the model endpoint, after the run directory was created. */
  afterStart?: boolean;
}

Deno.test("vf eval rejects bad input with one clear error line naming the file or field and a non-zero exit", async () => {
  await using tmp = await tempDir("vf_cli_eval_");
  const file = (name: string, text: string) => {
    Deno.writeTextFileSync(join(tmp.path, name), text);
    return join(tmp.path, name);
  };
  file("bad.toml", 'env_id = "gsm8k"\nmodel = \n');
  file("typo.toml", 'env_id = "gsm8k"\nnum_exampels = 3\n');
  file("nested_typo.toml", 'env_id = "gsm8k"\n[client]\ntimout = 5\n');
  file("wrong_type.toml", 'env_id = "gsm8k"\nnum_examples = "five"\n');
  const throwsEnv = file(
    "throws_env.ts",
    `import { SingleTurnEnv } from "${MOD_URL}";\n` +
      `export function loadEnvironment() {\n` +
      `  if (SingleTurnEnv) throw new Error("boom: the dataset file is missing");\n}\n`,
  );
  const noPromptEnv = file(
    "no_prompt_env.ts",
    `import { SingleTurnEnv } from "${MOD_URL}";\n` +
      `export function loadEnvironment() {\n` +
      `  return new SingleTurnEnv({ evalDataset: [{ text: "hi", answer: "x" }] });\n}\n`,
  );
  const lazyNoPromptEnv = file(
    "lazy_no_prompt_env.ts",
    `import { SingleTurnEnv } from "${MOD_URL}";\n` +
      `export function loadEnvironment() {\n` +
      `  return new SingleTurnEnv({ evalDataset: () => [{ text: "hi", answer: "x" }] });\n}\n`,
  );
  // Mixed rows: row 0 (a question) and row 1 (a prompt) are fine, row 2 has neither.
  const badRows = file(
    "bad_rows.jsonl",
    '{"question":"q0","answer":"0"}\n{"prompt":[{"role":"user","content":"p1"}],"answer":"1"}\n' +
      '{"answer":"2"}\n',
  );
  const badRowEnv = file(
    "bad_row_env.ts",
    `import { loadDataset, SingleTurnEnv } from "${MOD_URL}";\n` +
      `export async function loadEnvironment() {\n` +
      `  const ds = await loadDataset(new URL("./bad_rows.jsonl", import.meta.url));\n` +
      `  return new SingleTurnEnv({ evalDataset: ds });\n}\n`,
  );
  const brokenEnv = file("broken_env.ts", "export function loadEnvironment( {\n");

  // A port that was just free: nothing listens there.
  const listener = Deno.listen({ hostname: "127.0.0.1", port: 0 });
  const closedPort = (listener.addr as Deno.NetAddr).port;
  listener.close();
  await using keyed = await startModelServer({
    apiKey: "the-right-key",
    responder: () => textReply("unreachable"),
  });

  const cases: BadInputCase[] = [
    {
      name: "malformed TOML",
      args: ["eval", "@", "bad.toml"],
      message: ["bad.toml", "invalid TOML"],
    },
    {
      name: "unknown key in TOML",
      args: ["eval", "@", "typo.toml"],
      message: ["typo.toml", 'unknown key "num_exampels"'],
    },
    {
      name: "unknown key in a TOML table",
      args: ["eval", "@", "nested_typo.toml"],
      message: ["nested_typo.toml", 'client: unknown key "timout"'],
    },
    {
      name: "wrong type in TOML",
      args: ["eval", "@", "wrong_type.toml"],
      message: ["wrong_type.toml", "num_examples:"],
    },
    {
      name: "missing config file",
      args: ["eval", "@", "missing.toml"],
      message: ['Cannot read config "missing.toml"'],
    },
    {
      name: "unknown environment",
      args: ["eval", "nosuchenv"],
      message: ['Unknown environment "nosuchenv"', "calculator, gsm8k, reverse-text, wordle"],
    },
    {
      name: "environment module whose loadEnvironment throws",
      args: ["eval", throwsEnv],
      message: [throwsEnv, "boom: the dataset file is missing"],
    },
    {
      name: "environment module whose dataset has neither prompt nor question",
      args: ["eval", noPromptEnv],
      message: [noPromptEnv, 'eval_dataset: no "question" (or "prompt") column'],
    },
    {
      name: "environment module whose lazily built dataset has neither prompt nor question",
      args: ["eval", lazyNoPromptEnv],
      message: [lazyNoPromptEnv, 'eval_dataset: no "question" (or "prompt") column'],
    },
    {
      name: "environment module whose data file has a row with neither prompt nor question",
      args: ["eval", badRowEnv],
      message: [`${badRows}: row 2: no "question" (or "prompt") column`],
    },
    {
      name: "environment module with a syntax error",
      args: ["eval", brokenEnv],
      message: [`Environment module "${brokenEnv}" failed to load: SyntaxError`],
      // Deno's message goes on with a code frame pointing at the error.
      multiline: true,
    },
    {
      name: "unreachable endpoint",
      args: [
        "eval",
        "reverse-text",
        "-b",
        `http://127.0.0.1:${closedPort}/v1`,
        "-n",
        "1",
        "-r",
        "1",
        "--client.max_retries",
        "1",
        "-q",
      ],
      message: [
        `Cannot reach the model endpoint "http://127.0.0.1:${closedPort}/v1"`,
        /Connection refused/i,
      ],
      afterStart: true,
    },
    {
      name: "rejected API key",
      args: ["eval", "reverse-text", "-b", keyed.url, "-k", "VF_WRONG_KEY", "-n", "1", "-r", "1"],
      env: { VF_WRONG_KEY: "a-wrong-key" },
      message: ["rejected the API key (HTTP 401)", "check the key in $VF_WRONG_KEY"],
      afterStart: true,
    },
    {
      name: "unset API key variable",
      args: ["eval", "reverse-text", "-b", keyed.url, "-k", "VF_UNSET_KEY", "-n", "1", "-r", "1"],
      message: ["rejected the API key (HTTP 401)", "$VF_UNSET_KEY is not set"],
      afterStart: true,
    },
    {
      name: "invalid JSON in -a",
      args: ["eval", "reverse-text", "-a", "{temperature: 0.5"],
      message: [/^error: -a: "\{temperature: 0\.5" is not valid JSON$/],
    },
    {
      name: "invalid JSON in --env-args",
      args: ["eval", "reverse-text", "--env-args", "[1,"],
      message: ["--env-args", "is not valid JSON"],
    },
  ];

  const results = await Promise.all(
    cases.map((c) => runCli(c.args, { cwd: tmp.path, env: c.env })),
  );
  for (const [i, c] of cases.entries()) {
    const res = results[i];
    const where = `${c.name}\n${transcript(res)}`;
    assert.equal(res.code, c.code ?? 1, where);
    const lines = errorLines(res.stderr);
    assert.equal(lines.length, 1, where);
    for (const part of c.message) {
      if (typeof part === "string") assert.ok(lines[0].includes(part), `${part}\n${where}`);
      else assert.match(lines[0], part, where);
    }
    if (!c.multiline) {
      assert.ok(!/^\s+at /m.test(res.stderr), `no stack trace without -v\n${where}`);
    }
    if (!c.afterStart) {
      assert.ok(!res.stderr.includes("Saving results to"), `fails before the run starts\n${where}`);
    }
    const runDir = /^Saving results to (.+)$/m.exec(res.stderr)?.[1];
    if (runDir) {
      // A run that stopped before any rollout finished has no average, not an average of 0.
      const metadata = JSON.parse(await Deno.readTextFile(join(runDir, "metadata.json")));
      assert.equal(metadata.num_rollouts, 0, where);
      assert.equal(metadata.avg_reward, null, where);
      assert.equal(metadata.avg_reward_reason, "no rollout has finished", where);
    }
  }
  assert.equal(keyed.requests.length, 0, "a rejected key never reaches the responder");
});

// ---------------------------------------------------------------------------------------
// TOML config

Deno.test("vf eval @ config.toml applies flag and dotted overrides, records them in config.json and never the key", async () => {
  await using tmp = await tempDir("vf_cli_eval_");
  const secret = "sk-test-0123456789-very-secret";
  await using server = await startModelServer({
    apiKey: secret,
    responder: perQuestionResponder(() => null),
  });
  await Deno.writeTextFile(
    join(tmp.path, "cfg.toml"),
    [
      'env_id = "reverse-text"',
      'model = "toml-model"',
      "num_examples = 5",
      "rollouts_per_example = 3",
      "",
      "[client]",
      `base_url = "${server.url}"`,
      'api_key_var = "VF_TEST_SECRET"',
      "timeout = 10",
      "",
      "[sampling_args]",
      "temperature = 0.25",
      "",
    ].join("\n"),
  );
  const res = await runCli(
    ["eval", "@", "cfg.toml", "-n", "2", "-r", "2", "--client.timeout", "30", "-t", "64"],
    { cwd: tmp.path, env: { VF_TEST_SECRET: secret } },
  );
  assert.equal(res.code, 0, transcript(res));
  const run = await readRun(
    await findRunDir(join(tmp.path, "outputs"), "reverse-text", "toml-model"),
  );
  assert.equal(run.rows.length, 4);
  for (const row of run.rows) assert.equal(row.reward, 1);

  const config = run.config;
  assert.equal(config.env_id, "reverse-text");
  assert.equal(config.model, "toml-model");
  assert.equal(config.num_examples, 2);
  assert.equal(config.rollouts_per_example, 2);
  assert.equal(config.base_url, server.url);
  assert.equal(config.api_key_var, "VF_TEST_SECRET");
  assert.deepEqual(config.client, {
    base_url: server.url,
    api_key_var: "VF_TEST_SECRET",
    timeout: 30,
  });
  assert.deepEqual(config.sampling_args, { temperature: 0.25, max_tokens: 64 });
  assert.equal(run.metadata.num_examples, 2);
  assert.equal(run.metadata.rollouts_per_example, 2);

  // The key reached the server (it checks it) with the sampling args...
  assert.equal(server.requests.length, 4);
  for (const req of server.requests) {
    assert.equal(req.headers.authorization, `Bearer ${secret}`);
    assert.equal(req.body.temperature, 0.25);
    assert.equal(req.body.max_completion_tokens, 64);
  }
  // ...but its value is in no file the run wrote and nowhere in the output.
  for await (const entry of Deno.readDir(run.dir)) {
    const text = await Deno.readTextFile(join(run.dir, entry.name));
    assert.ok(!text.includes(secret), `${entry.name} contains the API key`);
  }
  assert.ok(!res.stdout.includes(secret) && !res.stderr.includes(secret));
});

// ---------------------------------------------------------------------------------------
// Interrupt and resume

Deno.test("vf eval saves finished rollouts on SIGINT (exit 130) and --resume (sizes from the run) runs only the missing ones", async () => {
  await using tmp = await tempDir("vf_cli_eval_");
  await using slow = await startModelServer({
    responder: (request) => ({
      content: `<reversed_text>\n${
        [...lastUserText(request)].reverse().join("")
      }\n</reversed_text>`,
      delay_ms: 300,
    }),
  });
  const args = [
    "eval",
    "reverse-text",
    "-m",
    "slow",
    "-b",
    slow.url,
    "-n",
    "6",
    "-r",
    "1",
    "-c",
    "1",
  ];
  const child = spawnCli([...args, "-o", "out"], { cwd: tmp.path });
  const stdoutP = new Response(child.stdout).text();
  const stderrP = new Response(child.stderr).text();
  const base = join(tmp.path, "out", "evals", "reverse-text--slow");

  // Wait until at least two rollouts are on disk, then interrupt.
  let runDir = "";
  const deadline = Date.now() + 20_000;
  while (Date.now() < deadline) {
    try {
      runDir = await findRunDir(join(tmp.path, "out"), "reverse-text", "slow");
      const text = await Deno.readTextFile(join(runDir, "results.jsonl"));
      if (text.split("\n").filter(Boolean).length >= 2) break;
    } catch { /* not written yet */ }
    await new Promise((r) => setTimeout(r, 50));
  }
  child.kill("SIGINT");
  const status = await child.status;
  const first = { code: status.code, stdout: await stdoutP, stderr: await stderrP };
  assert.equal(first.code, 130, transcript(first));
  assert.ok(runDir.startsWith(base), transcript(first));
  assert.match(first.stderr, /SIGINT: stopping; finished rollouts are saved/);
  assert.ok(first.stderr.includes(`--resume ${runDir}`), transcript(first));

  const interrupted = await readRun(runDir);
  const saved = interrupted.rows.length;
  assert.ok(saved >= 2 && saved < 6, `${saved} rollouts saved`);
  assert.match(first.stderr, new RegExp(`Interrupted: ${saved} rollouts saved`));
  const savedQuestions = new Set(interrupted.rows.map((r) => r.prompt.at(-1).content as string));

  const before = slow.requests.length;
  // Without -n/-r: the run's own sizes (6 × 1), not the environment's defaults.
  const second = await runCli(
    ["eval", "reverse-text", "-m", "slow", "-b", slow.url, "-c", "1", "--resume", runDir],
    { cwd: tmp.path },
  );
  assert.equal(second.code, 0, transcript(second));
  const done = await readRun(runDir);
  assert.equal(done.rows.length, 6);
  assert.deepEqual(done.rows.map((r) => r.example_id).sort(), [0, 1, 2, 3, 4, 5]);
  assert.deepEqual(done.rows.slice(0, saved), interrupted.rows, "saved rows are kept as they were");
  for (const row of done.rows) assert.equal(row.error, null);
  assert.equal(done.metadata.num_rollouts, 6);
  assert.equal(done.metadata.avg_reward, 1);

  const resumedQuestions = questionsOf(slow.requests.slice(before));
  assert.equal(resumedQuestions.length, 6 - saved, "only the missing rollouts are requested");
  for (const q of resumedQuestions) {
    assert.ok(!savedQuestions.has(q), `re-ran a saved rollout: ${q}`);
  }
});

// ---------------------------------------------------------------------------------------
// Help, version, demo

Deno.test("vf --help, vf eval --help and vf --version exit 0; an unknown command exits non-zero", async () => {
  await using tmp = await tempDir("vf_cli_eval_");
  const [help, evalHelp, version, unknown] = await Promise.all([
    runCli(["--help"], { cwd: tmp.path }),
    runCli(["eval", "--help"], { cwd: tmp.path }),
    runCli(["--version"], { cwd: tmp.path }),
    runCli(["frobnicate"], { cwd: tmp.path }),
  ]);
  assert.equal(help.code, 0, transcript(help));
  assert.match(help.stdout, /^vf \S+: /);
  for (const text of ["Usage:", "vf eval <env>", "vf demo", "gsm8k", "wordle"]) {
    assert.ok(help.stdout.includes(text), `${text}\n${help.stdout}`);
  }
  assert.equal(evalHelp.code, 0, transcript(evalHelp));
  for (
    const text of [
      "--model",
      "--base-url",
      "--rollouts-per-example",
      "--resume",
      "--client.timeout",
    ]
  ) {
    assert.ok(evalHelp.stdout.includes(text), `${text}\n${evalHelp.stdout}`);
  }
  assert.equal(version.code, 0, transcript(version));
  assert.equal(version.stdout, `vf ${VERSION}\n`);
  assert.notEqual(unknown.code, 0, transcript(unknown));
  assert.match(unknown.stderr, /unknown command "frobnicate"; run vf --help/);
  assert.equal(unknown.stdout, "");
});

Deno.test("vf demo -n 3 -r 2 evaluates gsm8k against the scripted local model with no key", async () => {
  await using tmp = await tempDir("vf_cli_eval_");
  const res = await runCli(["demo", "-n", "3", "-r", "2"], { cwd: tmp.path });
  assert.equal(res.code, 0, transcript(res));
  assert.match(
    res.stderr,
    /Demo model \(scripted, not an LLM\) listening at http:\/\/127\.0\.0\.1:\d+\/v1/,
  );
  assert.match(
    res.stdout,
    /env gsm8k {2}model vf-demo {2}examples 3 {2}rollouts\/example 2 {2}rollouts 6/,
  );
  assert.match(res.stdout, /^reward\s+\d\.\d{4}/m);
  assert.match(res.stdout, /^pass@k\s+\d\.\d{3}\s+\d\.\d{3}/m);
  const run = await readRun(await findRunDir(join(tmp.path, "outputs"), "gsm8k", "vf-demo"));
  assert.equal(run.rows.length, 6);
  assert.deepEqual(Object.keys(run.metadata.pass_at_k), ["1", "2"]);
});
