import assert from "node:assert/strict";
import { pairedComparison, type RewardsByExample } from "./compare.ts";

const runOf = (rows: Array<[string, number[]]>): RewardsByExample => new Map(rows);

Deno.test("pairedComparison: the mean difference over paired examples, a seeded interval that holds it, and the examples left out", () => {
  const a = runOf([["1", [1, 0]], ["2", [1]], ["3", [0, 0]], ["4", [1, 1]], ["only-a", [1]]]);
  const b = runOf([["1", [1, 1]], ["2", [0]], ["3", [0, 1]], ["4", [1, 1]], ["only-b", [0]]]);
  const r = pairedComparison(a, b, { seed: 7 });
  assert.equal(r.paired, 4);
  assert.equal(r.onlyA, 1);
  assert.equal(r.onlyB, 1);
  assert.equal(r.meanA, (0.5 + 1 + 0 + 1) / 4);
  assert.equal(r.meanB, (1 + 0 + 0.5 + 1) / 4);
  assert.equal(r.delta, (0.5 - 1 + 0.5 + 0) / 4);
  assert.ok(r.ci[0] <= r.delta && r.delta <= r.ci[1], JSON.stringify(r.ci));
  assert.deepEqual([r.better, r.worse, r.ties], [2, 1, 1]);
  assert.deepEqual(r.perExample[0], { example: "2", a: 1, b: 0, delta: -1 });
  assert.deepEqual(pairedComparison(a, b, { seed: 7 }).ci, r.ci); // same seed, same interval
  assert.throws(() => pairedComparison(runOf([["x", [1]]]), runOf([["y", [1]]])), RangeError);
});

Deno.test("pairedComparison: a consistent drop has an interval wholly below zero; identical runs have [0, 0]", () => {
  const rows = Array.from({ length: 40 }, (_, i) => String(i));
  const a = runOf(rows.map((k) => [k, [1]]));
  const b = runOf(rows.map((k, i) => [k, [i % 4 === 0 ? 1 : 0]]));
  const worse = pairedComparison(a, b);
  assert.equal(worse.delta, -0.75);
  assert.ok(worse.ci[1] < -0.5, JSON.stringify(worse.ci));
  const same = pairedComparison(a, a);
  assert.deepEqual([same.delta, ...same.ci], [0, 0, 0]);
});

Deno.test("bootstrapMeans: the means of draws from the sorted values, whether a draw is placed by counts (few distinct values) or read", async () => {
  const { bootstrapMeans } = await import("./compare.ts");
  const { mulberry32 } = await import("../random.ts");
  const naive = (xs: number[], resamples: number, random: () => number) => {
    const means = new Float64Array(resamples);
    for (let r = 0; r < resamples; r++) {
      let sum = 0;
      for (let i = 0; i < xs.length; i++) sum += xs[Math.floor(random() * xs.length)];
      means[r] = sum / xs.length;
    }
    return means;
  };
  const rng = mulberry32(3);
  const few = Array.from({ length: 70_000 }, () => [-1, 0, 1, 0.5][Math.floor(rng() * 4)]);
  const sixteen = Array.from({ length: 70_000 }, (_, i) => (i % 16) / 7 - 1);
  const small = few.slice(0, 5000);
  const many = Array.from({ length: 3000 }, () => rng());
  for (const xs of [few, sixteen, small, many, [0.25], Array(70_000).fill(1)]) {
    const got = bootstrapMeans(xs, 20, mulberry32(11));
    const sorted = [...xs].sort((a, b) => a - b);
    assert.deepEqual([...got], [...naive(sorted, 20, mulberry32(11))]);
  }
});
