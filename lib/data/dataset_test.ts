import assert from "node:assert/strict";
import { readFile, writeFile } from "node:fs/promises";
import { join } from "node:path";
import { Dataset } from "./dataset.ts";
import { ConfigError } from "../errors.ts";

const qa = () =>
  Dataset.fromList([
    { question: "What is 2+2?", answer: "4" },
    { question: "What is 3*5?", answer: "15" },
    { question: "What is 10-7?", answer: "3" },
  ]);

Deno.test("fromList() takes the union of columns in first-seen order and fills gaps with null", () => {
  const ds = Dataset.fromList([{ a: 1 }, { b: 2, a: 3 }, { c: 4 }]);
  assert.deepEqual(ds.columnNames, ["a", "b", "c"]);
  assert.equal(ds.length, 3);
  assert.deepEqual(ds.toList(), [
    { a: 1, b: null, c: null },
    { a: 3, b: 2, c: null },
    { a: null, b: null, c: 4 },
  ]);
});

Deno.test("fromList() copies its input, so later changes to the source rows do not leak in", () => {
  const source = [{ a: 1 }];
  const ds = Dataset.fromList(source);
  source[0].a = 99;
  assert.equal(ds.row(0).a, 1);
});

Deno.test("fromList() rejects a row that is not an object", () => {
  assert.throws(() => Dataset.fromList([{ a: 1 }, [1, 2] as never]), TypeError);
});

Deno.test("fromDict() builds rows from equal-length columns and rejects ragged ones", () => {
  const ds = Dataset.fromDict({ q: ["x", "y"], a: ["1", "2"] });
  assert.deepEqual(ds.toList(), [{ q: "x", a: "1" }, { q: "y", a: "2" }]);
  assert.throws(() => Dataset.fromDict({ q: ["x"], a: [] }), RangeError);
  assert.deepEqual(Dataset.fromDict({ q: [] }).columnNames, ["q"]);
});

Deno.test("rows handed out are deep copies: mutating them leaves the dataset unchanged", () => {
  const ds = Dataset.fromList([{ prompt: [{ role: "user", content: "hi" }] }]);
  const list = ds.toList();
  (list[0].prompt as { content: string }[])[0].content = "changed";
  const row = ds.row(0);
  (row.prompt as unknown[]).push("x");
  for (const r of ds) r.prompt = null;
  (ds.col("prompt")[0] as unknown[]).length = 0;
  assert.deepEqual(ds.row(0), { prompt: [{ role: "user", content: "hi" }] });
});

Deno.test("col() returns a column in row order and throws for an unknown column", () => {
  assert.deepEqual(qa().col("answer"), ["4", "15", "3"]);
  assert.throws(
    () => qa().col("nope"),
    /Column "nope" is not in the dataset; columns: question, answer/,
  );
});

Deno.test("row() throws RangeError outside 0..length-1", () => {
  assert.throws(() => qa().row(3), RangeError);
  assert.throws(() => qa().row(-1), RangeError);
});

Deno.test("map() merges the returned object over the row and keeps the original dataset", () => {
  const ds = qa();
  const mapped = ds.map(({ question }, i) => ({
    prompt: [{ role: "user", content: question }],
    answer: `#${i}`,
  }));
  assert.deepEqual(mapped.columnNames, ["question", "answer", "prompt"]);
  assert.deepEqual(mapped.row(1), {
    question: "What is 3*5?",
    answer: "#1",
    prompt: [{ role: "user", content: "What is 3*5?" }],
  });
  assert.equal(ds.row(1).answer, "15");
});

Deno.test("map() keeps a row unchanged when the function returns nothing", () => {
  const mapped = qa().map(() => undefined);
  assert.deepEqual(mapped.toList(), qa().toList());
});

Deno.test("map() lets the function mutate and return its row, Python style", () => {
  const ds = qa();
  const mapped = ds.map((row) => {
    row.answer = Number(row.answer);
    return row;
  });
  assert.deepEqual(mapped.col("answer"), [4, 15, 3]);
  assert.deepEqual(ds.col("answer"), ["4", "15", "3"]);
});

Deno.test("map() removeColumns drops inputs first, so an output of the same name survives", () => {
  const mapped = qa().map(({ answer }) => ({ answer: `${answer}!`, extra: 1 }), {
    removeColumns: ["question", "answer"],
    numProc: 4,
  });
  assert.deepEqual(mapped.columnNames, ["answer", "extra"]);
  assert.deepEqual(mapped.row(0), { answer: "4!", extra: 1 });
});

Deno.test("map() fills a column that only some rows return with null", () => {
  const mapped = qa().map((_row, i) => (i === 1 ? { flag: true } : undefined));
  assert.deepEqual(mapped.col("flag"), [null, true, null]);
});

Deno.test("map() rejects an async function and points to mapAsync()", () => {
  assert.throws(() => qa().map((() => Promise.resolve({ x: 1 })) as never), /use mapAsync\(\)/);
  assert.throws(() => qa().map(() => 5 as never), TypeError);
});

Deno.test("mapAsync() runs up to numProc calls at once and keeps row order", async () => {
  const ds = Dataset.fromList(Array.from({ length: 12 }, (_, i) => ({ i })));
  let running = 0;
  let peak = 0;
  const mapped = await ds.mapAsync(async ({ i }) => {
    running++;
    peak = Math.max(peak, running);
    await new Promise((resolve) => setTimeout(resolve, (12 - Number(i)) % 3));
    running--;
    return { double: Number(i) * 2 };
  }, { numProc: 4 });
  assert.equal(peak, 4);
  assert.deepEqual(mapped.col("double"), Array.from({ length: 12 }, (_, i) => i * 2));
});

Deno.test("mapAsync() runs one call at a time by default and rejects with the function's error", async () => {
  let running = 0;
  let peak = 0;
  await qa().mapAsync(async () => {
    peak = Math.max(peak, ++running);
    await Promise.resolve();
    running--;
  });
  assert.equal(peak, 1);
  await assert.rejects(
    qa().mapAsync((_row, i) => {
      if (i === 1) throw new Error("boom");
    }),
    /boom/,
  );
});

Deno.test("mapAsync() stops when its signal aborts", async () => {
  const controller = new AbortController();
  controller.abort();
  await assert.rejects(qa().mapAsync(() => undefined, { signal: controller.signal }));
});

Deno.test("filter() keeps rows the predicate accepts and passes the index", () => {
  const ds = qa();
  assert.deepEqual(ds.filter(({ answer }) => Number(answer) > 3).col("answer"), ["4", "15"]);
  assert.deepEqual(ds.filter((_row, i) => i !== 0).col("answer"), ["15", "3"]);
  assert.deepEqual(ds.filter(() => false).columnNames, ["question", "answer"]);
});

Deno.test("select() picks rows by index in the given order, from any iterable", () => {
  const ds = qa();
  assert.deepEqual(ds.select([2, 0, 2]).col("answer"), ["3", "4", "3"]);
  assert.deepEqual(ds.select(new Set([1])).col("answer"), ["15"]);
  assert.throws(() => ds.select([3]), RangeError);
});

Deno.test("take() returns the first min(n, length) rows", () => {
  assert.deepEqual(qa().take(2).col("answer"), ["4", "15"]);
  assert.equal(qa().take(10).length, 3);
  assert.equal(qa().take(0).length, 0);
  assert.throws(() => qa().take(-1), RangeError);
});

Deno.test("shuffle() is a seeded permutation: same seed same order, other seeds differ", () => {
  const ds = Dataset.fromList(Array.from({ length: 50 }, (_, i) => ({ i })));
  const a = ds.shuffle(42).col("i");
  assert.deepEqual(ds.shuffle(42).col("i"), a);
  assert.notDeepEqual(a, ds.col("i"));
  assert.notDeepEqual(ds.shuffle(43).col("i"), a);
  assert.deepEqual([...a].sort((x, y) => Number(x) - Number(y)), ds.col("i"));
  assert.notDeepEqual(ds.shuffle(2 ** 32).col("i"), ds.shuffle(0).col("i"));
  assert.deepEqual(ds.col("i"), Array.from({ length: 50 }, (_, i) => i));
  assert.throws(() => ds.shuffle(1.5), RangeError);
  assert.throws(() => ds.shuffle(-1), RangeError);
});

Deno.test("shuffle() order is pinned, so a seed means the same rows across vf versions", () => {
  const ds = Dataset.fromList(Array.from({ length: 8 }, (_, i) => ({ i })));
  assert.deepEqual(ds.shuffle(0).col("i"), [4, 7, 3, 5, 6, 1, 0, 2]);
  assert.deepEqual(ds.shuffle(42).col("i"), [2, 7, 1, 0, 6, 5, 3, 4]);
});

Deno.test("repeat() repeats the whole dataset, not each row", () => {
  const ds = Dataset.fromList([{ id: 0 }, { id: 1 }]);
  assert.deepEqual(ds.repeat(2).col("id"), [0, 1, 0, 1]);
  assert.equal(ds.repeat(0).length, 0);
  assert.throws(() => ds.repeat(-1), RangeError);
});

Deno.test("addColumn() appends a column and rejects a wrong length or an existing name", () => {
  const ds = qa().addColumn("example_id", [0, 1, 2]);
  assert.deepEqual(ds.columnNames, ["question", "answer", "example_id"]);
  assert.deepEqual(ds.col("example_id"), [0, 1, 2]);
  assert.throws(() => qa().addColumn("x", [1]), RangeError);
  assert.throws(() => qa().addColumn("answer", [1, 2, 3]), /already exists/);
});

Deno.test("renameColumn() keeps the column's position and values", () => {
  const ds = qa().renameColumn("question", "prompt");
  assert.deepEqual(ds.columnNames, ["prompt", "answer"]);
  assert.equal(ds.row(0).prompt, "What is 2+2?");
  assert.throws(() => qa().renameColumn("nope", "x"), RangeError);
  assert.throws(() => qa().renameColumn("question", "answer"), /two columns named "answer"/);
});

Deno.test("renameColumns() renames several at once, including a swap", () => {
  const ds = qa().renameColumns({ question: "answer", answer: "question" });
  assert.deepEqual(ds.columnNames, ["answer", "question"]);
  assert.equal(ds.row(0).answer, "What is 2+2?");
});

Deno.test("removeColumns() drops the named columns and throws for a missing one", () => {
  assert.deepEqual(qa().removeColumns(["question"]).toList()[0], { answer: "4" });
  assert.deepEqual(qa().removeColumns("answer").columnNames, ["question"]);
  assert.throws(() => qa().removeColumns(["nope"]), RangeError);
});

Deno.test("concatenate() stacks rows and fills columns a part lacks with null", () => {
  const ds = Dataset.concatenate([
    Dataset.fromList([{ a: 1, b: 2 }]),
    Dataset.fromList([{ c: 3, a: 4 }]),
    Dataset.fromDict({ d: [] }),
  ]);
  assert.deepEqual(ds.columnNames, ["a", "b", "c", "d"]);
  assert.deepEqual(ds.toList(), [
    { a: 1, b: 2, c: null, d: null },
    { a: 4, b: null, c: 3, d: null },
  ]);
  assert.equal(Dataset.concatenate([]).length, 0);
});

Deno.test("save() and load() round-trip rows, nested values and the columns of an empty dataset", async () => {
  const dir = await Deno.makeTempDir();
  try {
    const ds = Dataset.fromList([
      { prompt: [{ role: "user", content: "hi ✓" }], answer: "x", info: { k: [1, 2] } },
      { prompt: [], answer: null, info: {} },
    ]);
    await ds.save(join(dir, "saved"));
    const info = JSON.parse(await readFile(join(dir, "saved", "dataset_info.json"), "utf8"));
    assert.deepEqual(info, {
      format_version: 1,
      num_rows: 2,
      columns: ["prompt", "answer", "info"],
    });
    const loaded = await Dataset.load(join(dir, "saved"));
    assert.deepEqual(loaded.toList(), ds.toList());
    assert.deepEqual(loaded.columnNames, ds.columnNames);

    await Dataset.fromDict({ q: [], a: [] }).save(join(dir, "empty"));
    const empty = await Dataset.load(join(dir, "empty"));
    assert.equal(empty.length, 0);
    assert.deepEqual(empty.columnNames, ["q", "a"]);
  } finally {
    await Deno.remove(dir, { recursive: true });
  }
});

Deno.test("load() explains a missing directory, a bad line and a row count mismatch", async () => {
  const dir = await Deno.makeTempDir();
  try {
    await assert.rejects(Dataset.load(join(dir, "none")), ConfigError);
    await Dataset.fromList([{ a: 1 }, { a: 2 }]).save(dir);
    await writeFile(join(dir, "data.jsonl"), '{"a": 1}\n{"a": \n');
    await assert.rejects(Dataset.load(dir), /data\.jsonl: line 2: invalid JSON/);
    await writeFile(join(dir, "data.jsonl"), '{"a": 1}\n');
    await assert.rejects(
      Dataset.load(dir),
      /has 1 rows, but dataset_info\.json says num_rows is 2/,
    );
  } finally {
    await Deno.remove(dir, { recursive: true });
  }
});
