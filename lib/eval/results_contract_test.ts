/**
 * Upstream's contract for saved results: a row that cannot be saved (no integer
 * `example_id`, a column JSON cannot hold) is refused by name and skipped while the run goes
 * on, and a saved row without `example_id` is left out on reading, resume included.
 */
import assert from "node:assert/strict";
import { join } from "node:path";
import { OpenAIChatClient } from "../model/client.ts";
import { generate } from "./evaluate.ts";
import { lastUserText, type Responder, startModelServer } from "../../tests/model_server.ts";
import { loadOutputs, ResultsWriter } from "./results.ts";
import { echoEnv } from "../../tests/_echo_env.ts";
import { captureWarnings } from "../../tests/_warnings.ts";
import { SingleTurnEnv } from "../legacy/multi_turn.ts";
import type { ChatClient } from "../model/client.ts";
import type { RolloutOutput } from "../state.ts";
import type { Row } from "../types.ts";

const rightAnswer: Responder = (request) => ({ content: lastUserText(request).replace("q", "a") });

function lines(path: string): Record<string, unknown>[] {
  return Deno.readTextFileSync(path).split("\n").filter((l) => l.trim()).map((l) => JSON.parse(l));
}

function row(exampleId: unknown, extra: Record<string, unknown> = {}): RolloutOutput {
  return {
    format_version: 1,
    example_id: exampleId,
    task: "default",
    prompt: [],
    completion: [],
    reward: 1,
    metrics: {},
    timing: {},
    is_completed: true,
    is_truncated: false,
    stop_condition: null,
    tool_defs: null,
    error: null,
    trajectory_id: crypto.randomUUID(),
    ...extra,
  } as RolloutOutput;
}

Deno.test("ResultsWriter refuses a row without an integer example_id or with a column JSON cannot hold, naming the column, and writes the rest", async () => {
  const dir = await Deno.makeTempDir({ prefix: "vf_contract_" });
  try {
    const writer = new ResultsWriter(dir);
    const cyclic: Record<string, unknown> = {};
    cyclic.self = cyclic;
    const warnings = await captureWarnings(async () => {
      await writer.append([
        row(0),
        row(undefined),
        row(Number.NaN),
        row(1, { big: 10n }),
        row(2, { loop: cyclic }),
        row(3, { hook: () => 1 }),
        row(4),
      ]);
      await writer.flush();
    });
    assert.deepEqual(lines(writer.resultsPath).map((o) => o.example_id), [0, 4]);
    assert.equal(writer.unwritten, 0);
    assert.equal(warnings.length, 5, warnings.join("\n"));
    const file = writer.resultsPath;
    assert.ok(
      warnings[0].startsWith(`${file}: not saving a rollout without an integer "example_id"`),
    );
    assert.match(warnings[1], /"example_id" \(got null\)/);
    assert.match(warnings[2], /of example_id 1: column "big" cannot be serialised \(.*BigInt/);
    assert.match(warnings[3], /of example_id 2: column "loop" cannot be serialised/);
    assert.match(
      warnings[4],
      /of example_id 3: column "hook" is a function, which JSON cannot hold/,
    );
  } finally {
    await Deno.remove(dir, { recursive: true });
  }
});

/** An environment whose outputs carry a column of its own: a BigInt for example 1. */
class CountingEnv extends SingleTurnEnv {
  override async runGroupOutputs(
    inputs: Row[],
    client: ChatClient,
    model: string,
    options: Parameters<SingleTurnEnv["runGroupOutputs"]>[3] = {},
  ): Promise<{ outputs: RolloutOutput[]; retryable: boolean }> {
    const result = await super.runGroupOutputs(inputs, client, model, options);
    for (const o of result.outputs) o.tokens_seen = o.example_id === 1 ? 7n : 7;
    return result;
  }
}

Deno.test("generate() skips an output it cannot save instead of throwing, and the other rollouts are saved", async () => {
  const dir = await Deno.makeTempDir({ prefix: "vf_contract_" });
  try {
    await using server = await startModelServer({ responder: rightAnswer });
    const client = new OpenAIChatClient({ base_url: server.url, max_retries: 0, timeout: 5 });
    const env = new CountingEnv({
      envId: "counting",
      evalDataset: ["q0", "q1", "q2"].map((q) => ({ question: q, answer: q.replace("q", "a") })),
    });
    const inputs = (await env.getEvalDataset()).toList();
    let result!: Awaited<ReturnType<typeof generate>>;
    const warnings = await captureWarnings(async () => {
      result = await generate(env, inputs, client, "m", { resultsDir: dir });
    });
    assert.equal(result.outputs.length, 3, "every rollout ran and is in the result");
    assert.deepEqual(lines(join(dir, "results.jsonl")).map((o) => o.example_id), [0, 2]);
    assert.equal(
      warnings.filter((w) => /column "tokens_seen" cannot be serialised/.test(w)).length,
      1,
    );
  } finally {
    await Deno.remove(dir, { recursive: true });
  }
});

Deno.test("resume leaves out a saved row without example_id (reported by file and line) and runs that example again", async () => {
  const dir = await Deno.makeTempDir({ prefix: "vf_contract_" });
  try {
    await using server = await startModelServer({ responder: rightAnswer });
    const client = new OpenAIChatClient({ base_url: server.url, max_retries: 0, timeout: 5 });
    await generate(echoEnv(2), (await echoEnv(2).getEvalDataset()).toList(), client, "m", {
      resultsDir: dir,
    });
    assert.equal(server.requests.length, 2);
    // Strip example 1's id from its saved row, as a hand edit or another writer might.
    const path = join(dir, "results.jsonl");
    const saved = lines(path);
    const strip = saved.findIndex((o) => o.example_id === 1);
    delete saved[strip].example_id;
    Deno.writeTextFileSync(path, saved.map((o) => JSON.stringify(o)).join("\n") + "\n");

    const warnings = await captureWarnings(async () => {
      assert.deepEqual((await loadOutputs(dir)).map((o) => o.example_id), [0]);
    });
    assert.deepEqual(warnings, [
      `${path}:${strip + 1}: skipping a corrupt line (no integer "example_id")`,
    ]);
    const resumed = await captureWarnings(async () => {
      const { outputs } = await generate(
        echoEnv(2),
        (await echoEnv(2).getEvalDataset()).toList(),
        client,
        "m",
        { resultsDir: dir, resume: true },
      );
      assert.deepEqual(outputs.map((o) => o.example_id), [0, 1]);
    });
    assert.ok(resumed.some((w) => w.includes("no integer")), resumed.join("\n"));
    // Only example 1 ran again: its saved row belonged to no example.
    assert.deepEqual(server.requests.slice(2).map(lastUserText), ["q1"]);
  } finally {
    await Deno.remove(dir, { recursive: true });
  }
});
