import assert from "node:assert/strict";
import { open } from "node:fs/promises";
import { join } from "node:path";

const RESOLVE_URL = new URL("./resolve.ts", import.meta.url).href;
const COST_URL = new URL("../model/cost.ts", import.meta.url).href;

Deno.test("seedCosts(): a resumed run's saved rollouts are counted line by line, so a results file far larger than the heap still carries its spend and rollouts into --max-cost", async () => {
  const dir = await Deno.makeTempDir({ prefix: "vf_seed_costs_" });
  try {
    // 48 saved rollouts of 3 MB each (a long completion apiece): 144 MB, over twice the
    // 64 MB heap the reader below gets. Kept whole, the rows alone would not fit.
    const rows = 48;
    const fh = await open(join(dir, "results.jsonl"), "w");
    try {
      const pad = "x".repeat(3 * 1024 * 1024);
      for (let i = 0; i < rows; i++) {
        await fh.write(JSON.stringify({ example_id: i, completion: pad }) + "\n");
      }
    } finally {
      await fh.close();
    }
    await Deno.writeTextFile(
      join(dir, "metadata.json"),
      JSON.stringify({ cost: { usd: 96, input_tokens: 4800, output_tokens: 0, calls: rows } }),
    );
    const script = `
import { seedCosts } from "${RESOLVE_URL}";
import { CostBudget, CostMeter } from "${COST_URL}";
const meter = new CostMeter({} as never, { m: { input_per_mtok: 1, output_per_mtok: 1 } });
const budget = new CostBudget(meter, 100);
await seedCosts(meter, ${JSON.stringify(dir)}, { budget, linesFile: "results.jsonl" });
console.log(JSON.stringify({ carried: budget.carried, perRollout: budget.perRollout, next: budget.allows(1) }));
`;
    const out = await new Deno.Command(Deno.execPath(), {
      args: ["eval", "--v8-flags=--max-old-space-size=64", script],
      stdout: "piped",
      stderr: "piped",
    }).output();
    const stderr = new TextDecoder().decode(out.stderr);
    assert.equal(
      out.code,
      0,
      `the reader ran out of its 64 MB heap or failed:\n${stderr.slice(-2000)}`,
    );
    const result = JSON.parse(new TextDecoder().decode(out.stdout));
    // $96 over 48 rollouts is $2 each; $98 of $100 would be spent by the next, which fits.
    assert.deepEqual(result, { carried: { usd: 96, rollouts: rows }, perRollout: 2, next: true });
  } finally {
    await Deno.remove(dir, { recursive: true });
  }
});
