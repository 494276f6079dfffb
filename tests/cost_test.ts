/**
 * Costs and the budget through `vf eval` against a loopback model that reports usage: prices
 * from `[models."<id>"]`, the spend in metadata and the summary, `--max-cost` stopping new
 * rollouts at the budget (what runs finishes), and `--resume` completing the run with the
 * spend carried over.
 * @module
 */
import assert from "node:assert/strict";
import { join } from "node:path";
import { loadExampleDataset } from "../lib/data/examples.ts";
import { lastUserText, startModelServer } from "./model_server.ts";
import { cliCommand, collect, tempDir, transcript } from "./_cli.ts";

const ANSWERS = new Map(
  (loadExampleDataset("gsm8k-sample", { split: "test" }).toList() as Array<
    { question: string; answer: string }
  >).map((r) => [r.question, r.answer]),
);

Deno.test("cost: prices give the spend in metadata and the summary; --max-cost stops starting rollouts at the budget and --resume finishes the run", async () => {
  await using tmp = await tempDir("vf_cost_");
  await using model = await startModelServer({
    responder: (request) => ({
      content: `\\boxed{${ANSWERS.get(lastUserText(request)) ?? "0"}}`,
      usage: { prompt_tokens: 10, completion_tokens: 0 },
    }),
  });
  // $1 per input token: every call costs $10.
  await Deno.writeTextFile(
    join(tmp.path, "cost.toml"),
    `env_id = "gsm8k"\nmodel = "m"\nnum_examples = 6\nrollouts_per_example = 1\nmax_concurrent = 1\n` +
      `[client]\nbase_url = "${model.url}"\n` +
      `[models."m"]\ninput_per_mtok = 1000000\noutput_per_mtok = 0\n`,
  );
  const run = (args: string[]) =>
    collect(cliCommand(["eval", "@", "cost.toml", "-o", "out", ...args], {
      cwd: tmp.path,
      env: {},
      registry: false,
    }));

  const capped = await run(["--max-cost", "25"]);
  assert.equal(capped.code, 1, transcript(capped));
  const runDir = /^Saving results to (.+)$/m.exec(capped.stderr)![1];
  assert.match(capped.stderr, /Stopped at the cost budget \(\$25\): 2 rollouts done/);
  assert.match(capped.stdout, /cost: \$20\.0000 over 2 model calls \(budget \$25\)/);
  assert.equal(model.requests.length, 2);
  let meta = JSON.parse(await Deno.readTextFile(join(runDir, "metadata.json")));
  assert.equal(meta.cost.usd, 20);
  assert.equal(meta.cost.input_tokens, 20);
  assert.equal(meta.cost.stopped_at_budget, true);

  const resumed = await run(["--resume", runDir, "--max-cost", "100"]);
  assert.equal(resumed.code, 0, transcript(resumed));
  assert.equal(model.requests.length, 6); // only the four missing rollouts ran
  const rows = (await Deno.readTextFile(join(runDir, "results.jsonl"))).trim().split("\n");
  assert.equal(rows.length, 6);
  meta = JSON.parse(await Deno.readTextFile(join(runDir, "metadata.json")));
  assert.equal(meta.cost.usd, 60); // the first part's spend carried over
  assert.equal(meta.cost.calls, 6);
  assert.equal(meta.cost.stopped_at_budget, false);
  assert.equal(meta.avg_reward, 1);

  // A budget without prices cannot be kept.
  await Deno.writeTextFile(
    join(tmp.path, "noprice.toml"),
    `env_id = "gsm8k"\nmodel = "m"\nnum_examples = 1\n[client]\nbase_url = "${model.url}"\n`,
  );
  const bad = await collect(cliCommand(["eval", "@", "noprice.toml", "--max-cost", "1"], {
    cwd: tmp.path,
    env: {},
    registry: false,
  }));
  assert.notEqual(bad.code, 0);
  assert.match(bad.stderr, /--max-cost needs prices/);
});
