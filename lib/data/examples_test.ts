import assert from "node:assert/strict";
import { GSM8K_TEST_SAMPLE, GSM8K_TRAIN_SAMPLE } from "./gsm8k_sample.ts";
import { ConfigError } from "../errors.ts";
import { loadExampleDataset } from "./examples.ts";

Deno.test("the bundled GSM8K sample holds real rows whose answers end in '#### N'", () => {
  assert.equal(GSM8K_TEST_SAMPLE.length, 50);
  assert.equal(GSM8K_TRAIN_SAMPLE.length, 20);
  assert.ok(GSM8K_TEST_SAMPLE[0].question.startsWith("Janet’s ducks lay 16 eggs per day."));
  assert.ok(GSM8K_TRAIN_SAMPLE[0].question.startsWith("Natalia sold clips to 48 of her friends"));
  for (const { question, answer } of [...GSM8K_TEST_SAMPLE, ...GSM8K_TRAIN_SAMPLE]) {
    assert.ok(question.length > 0);
    assert.match(answer, /\n#### -?[\d,.]+$/);
  }
});

Deno.test('loadExampleDataset("gsm8k-sample") gives the test split with question and the final answer', () => {
  const ds = loadExampleDataset("gsm8k-sample");
  assert.equal(ds.length, 50);
  assert.deepEqual(ds.columnNames, ["question", "answer"]);
  assert.deepEqual(ds.row(0), {
    question: GSM8K_TEST_SAMPLE[0].question,
    answer: "18",
  });
  assert.deepEqual(ds.col("answer").slice(0, 4), ["18", "3", "70000", "540"]);
});

Deno.test("loadExampleDataset() keeps the answer text after #### as written, commas included", () => {
  const ds = loadExampleDataset("gsm8k-sample", { split: "test" });
  for (const [i, answer] of ds.col("answer").entries()) {
    assert.equal(answer, GSM8K_TEST_SAMPLE[i].answer.split("####")[1].trim());
  }
});

Deno.test('loadExampleDataset() serves the train split and treats "gsm8k" as the sample', () => {
  const train = loadExampleDataset("gsm8k", { split: "train" });
  assert.equal(train.length, 20);
  assert.equal(train.row(0).answer, "72");
  assert.deepEqual(
    loadExampleDataset("gsm8k").toList(),
    loadExampleDataset("gsm8k-sample").toList(),
  );
});

Deno.test("loadExampleDataset() with n picks n rows after a seeded shuffle, reproducibly", () => {
  const a = loadExampleDataset("gsm8k-sample", { n: 5, seed: 3 });
  assert.equal(a.length, 5);
  assert.deepEqual(loadExampleDataset("gsm8k-sample", { n: 5, seed: 3 }).toList(), a.toList());
  assert.notDeepEqual(loadExampleDataset("gsm8k-sample", { n: 5, seed: 4 }).toList(), a.toList());
  const defaultSeed = loadExampleDataset("gsm8k-sample", { n: 5 });
  assert.deepEqual(
    defaultSeed.toList(),
    loadExampleDataset("gsm8k-sample", { n: 5, seed: 0 }).toList(),
  );
  const all = new Set(loadExampleDataset("gsm8k-sample").col("question"));
  for (const q of a.col("question")) assert.ok(all.has(q));
  assert.equal(loadExampleDataset("gsm8k-sample", { n: 500 }).length, 50);
  assert.equal(loadExampleDataset("gsm8k-sample", { n: -1 }).length, 50);
});

Deno.test("loadExampleDataset() rejects an unknown name, listing the known ones", () => {
  assert.throws(
    () => loadExampleDataset("math500"),
    (error) =>
      error instanceof ConfigError &&
      error.message === 'Unknown example dataset "math500"; known: gsm8k-sample, gsm8k',
  );
  assert.throws(
    () => loadExampleDataset("gsm8k", { split: "validation" as never }),
    /no split "validation"/,
  );
});
