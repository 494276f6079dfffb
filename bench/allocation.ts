/**
 * Heap bytes the per-rollout steps allocate, beside baselines measured in the same run: what a
 * push onto an empty array costs (it reserves 17 slots), and, for a whole rollout, what bare
 * calls to the same in-process model allocate. Each row is the least over many rounds, so code
 * not yet optimised does not count. Not a test: allocation moves with V8's tiers and with what
 * else the process ran, so the figures are read here, as ratios.
 *
 *   deno run -A bench/allocation.ts
 * @module
 */
import { evaluate, Parser, Rubric, RubricGroup, SingleTurnEnv } from "../mod.ts";
import { inProcessCall, inProcessModel } from "./_in_process_model.ts";
import { groupAdvantages } from "../lib/scoring/advantages.ts";
import { roomForOne } from "../lib/state.ts";
import type { Messages } from "../lib/types.ts";
import { testState } from "../tests/_state.ts";
import { bytesPerCall, bytesPerUnit } from "./_allocated.ts";

const rows: Array<[string, number, string]> = [];
const row = (what: string, bytes: number, against: string) => rows.push([what, bytes, against]);

const span = { start: 1 };
const emptyPush = bytesPerCall(() => [].push(span as never));
row("baseline: `[]` and one push", emptyPush, "");
row("`roomForOne()` and one push", bytesPerCall(() => roomForOne().push(span)), "the baseline");

const parser = new Parser();
const messages: Messages = [
  { role: "user", content: "q" },
  { role: "assistant", content: "first" },
  { role: "user", content: "again" },
  { role: "assistant", content: "4" },
];
row("`parseAnswer()` of four messages", bytesPerCall(() => parser.parseAnswer(messages)), "");
const rewards = [1, null, 0, 0.5];
row(
  "`groupAdvantages()` of a group of four",
  bytesPerCall(() => groupAdvantages(rewards, { normalizeStd: true })),
  "",
);
const rubric = new RubricGroup([
  new Rubric({ funcs: [({ completion }) => (parser.parseAnswer(completion) === "4" ? 1 : 0)] }),
  new Rubric({ funcs: [({ completion }) => completion.length], weights: [0] }),
]);
const states = [testState({ completion: [{ role: "assistant", content: "4" }], answer: "4" })];
row(
  "`scoreGroup()` of a group of one (a function and a metric rubric)",
  bytesPerCall(() => rubric.scoreGroup(states), 5000, 60),
  "",
);

// A whole rollout: evaluate against a model in this process, beside bare calls to that model.
const client = inProcessModel;
const n = 4000;
const env = new SingleTurnEnv({
  evalDataset: Array.from({ length: n }, (_, i) => ({ question: `2+2? (#${i})`, answer: "4" })),
  systemPrompt: "Answer briefly.",
  parser,
  rubric: new Rubric({
    funcs: [({ completion, answer }) => (parser.parseAnswer(completion) ?? "").includes(answer)],
  }),
});
const prompts = (await env.getEvalDataset()).toList().map((r) => r.prompt as Messages);
const bare = await bytesPerUnit(async () => {
  let next = 0;
  await Promise.all(Array.from({ length: 256 }, async () => {
    while (next < n) await inProcessCall(prompts[next++], "m");
  }));
}, n);
row("baseline: bare calls to the in-process model, per call", bare, "");
const dir = await Deno.makeTempDir({ prefix: "vf-bench-alloc-" });
try {
  const perRollout = await bytesPerUnit(async () => {
    const result = await evaluate(env, client, "m", {
      maxConcurrent: 256,
      resultsDir: dir,
      keepOutputs: false,
    });
    if (result.metadata.avg_reward !== 1) throw new Error("unexpected reward");
  }, n);
  row("`evaluate`, `keepOutputs: false`, per rollout", perRollout, "bare calls");
} finally {
  await Deno.remove(dir, { recursive: true });
}

console.log("| step | bytes per call | against |");
console.log("| --- | ---: | --- |");
const bareRow = rows.find(([what]) => what.startsWith("baseline: bare"))![1];
for (const [what, bytes, against] of rows) {
  const ratio = against === "the baseline"
    ? ` ${(bytes / emptyPush).toFixed(2)}× the baseline`
    : against === "bare calls"
    ? ` ${(bytes / bareRow).toFixed(1)}× bare calls`
    : "";
  console.log(`| ${what} | ${Math.round(bytes)} |${ratio} |`);
}
