import assert from "node:assert/strict";
import { mkdir, readFile, writeFile } from "node:fs/promises";
import { join } from "node:path";
import { pathToFileURL } from "node:url";
// deno-lint-ignore no-import-prefix
import { parquetWriteBuffer } from "npm:hyparquet-writer@^0.17.0";
import { Dataset } from "./dataset.ts";
import { datasetFromBytes, loadDataset, saveDataset } from "./io.ts";
import { ConfigError } from "../errors.ts";

async function withTempDir(fn: (dir: string) => Promise<void>): Promise<void> {
  const dir = await Deno.makeTempDir();
  try {
    await fn(dir);
  } finally {
    await Deno.remove(dir, { recursive: true });
  }
}

Deno.test("loadDataset() reads JSONL, skipping blank lines and tolerating CRLF and a BOM", async () => {
  await withTempDir(async (dir) => {
    const file = join(dir, "rows.jsonl");
    await writeFile(file, '\ufeff{"q": "a", "n": 1}\r\n\r\n{"q": "b", "extra": [1]}\r\n');
    const ds = await loadDataset(file);
    assert.deepEqual(ds.columnNames, ["q", "n", "extra"]);
    assert.deepEqual(ds.toList(), [{ q: "a", n: 1, extra: null }, { q: "b", n: null, extra: [1] }]);
  });
});

Deno.test("loadDataset() names the JSONL file and line of invalid JSON or a non-object line", async () => {
  await withTempDir(async (dir) => {
    const file = join(dir, "bad.jsonl");
    await writeFile(file, '{"q": 1}\n\n{"q": oops}\n');
    await assert.rejects(loadDataset(file), (error) => {
      assert.ok(error instanceof ConfigError);
      assert.match(
        error.message,
        new RegExp(`^${file.replaceAll("/", "\\/")}: line 3: invalid JSON`),
      );
      return true;
    });
    await writeFile(file, '{"q": 1}\n[1, 2]\n');
    await assert.rejects(
      loadDataset(file),
      /bad\.jsonl: line 2: expected a JSON object, got an array/,
    );
  });
});

Deno.test("loadDataset() reads a JSON array, a {data: [...]} object, and column-oriented JSON", async () => {
  await withTempDir(async (dir) => {
    const rows = [{ q: "a", a: "1" }, { q: "b", a: "2" }];
    await writeFile(join(dir, "array.json"), JSON.stringify(rows));
    await writeFile(join(dir, "wrapped.json"), JSON.stringify({ data: rows }));
    await writeFile(join(dir, "meta.json"), JSON.stringify({ version: "1.1", data: rows }));
    await writeFile(join(dir, "columns.json"), JSON.stringify({ q: ["a", "b"], a: ["1", "2"] }));
    await writeFile(join(dir, "field.json"), JSON.stringify({ train: rows, test: [rows[0]] }));
    for (const name of ["array", "wrapped", "meta", "columns"]) {
      const ds = await loadDataset(join(dir, `${name}.json`));
      assert.deepEqual(ds.toList(), rows, name);
    }
    assert.equal((await loadDataset(join(dir, "field.json"), { field: "test" })).length, 1);
  });
});

Deno.test("loadDataset() reads JSON Lines saved with a .json extension", async () => {
  await withTempDir(async (dir) => {
    await writeFile(join(dir, "lines.json"), '{"q": "a"}\n{"q": "b"}\n');
    assert.deepEqual((await loadDataset(join(dir, "lines.json"))).col("q"), ["a", "b"]);
  });
});

Deno.test("loadDataset() explains JSON it cannot turn into rows", async () => {
  await withTempDir(async (dir) => {
    const file = join(dir, "x.json");
    await writeFile(file, "{not json");
    await assert.rejects(loadDataset(file), /x\.json: invalid JSON/);
    await writeFile(file, '{"question": "one row", "answer": "4"}');
    await assert.rejects(loadDataset(file), /x\.json: expected an array of rows/);
    await writeFile(file, '[{"q": 1}, 2]');
    await assert.rejects(loadDataset(file), /x\.json: item 1 is not an object/);
    await writeFile(file, '{"train": [{"q": 1}]}');
    await assert.rejects(loadDataset(file, { field: "test" }), /field "test" is not a key/);
  });
});

Deno.test("loadDataset() reads RFC 4180 CSV: quotes, doubled quotes, embedded commas and newlines", async () => {
  await withTempDir(async (dir) => {
    const file = join(dir, "q.csv");
    await writeFile(
      file,
      "\ufeffquestion,answer,note\r\n" +
        '"Add 2, then 3","5",plain\r\n' +
        '"She said ""hi""",7,"line one\nline two"\r\n' +
        ',"",\r\n',
    );
    const ds = await loadDataset(file);
    assert.deepEqual(ds.columnNames, ["question", "answer", "note"]);
    assert.deepEqual(ds.toList(), [
      { question: "Add 2, then 3", answer: "5", note: "plain" },
      { question: 'She said "hi"', answer: "7", note: "line one\nline two" },
      { question: "", answer: "", note: "" },
    ]);
  });
});

Deno.test("loadDataset() keeps a header-only CSV's columns and reads a last line without newline", async () => {
  await withTempDir(async (dir) => {
    await writeFile(join(dir, "h.csv"), "a,b\n");
    const header = await loadDataset(join(dir, "h.csv"));
    assert.equal(header.length, 0);
    assert.deepEqual(header.columnNames, ["a", "b"]);
    await writeFile(join(dir, "n.csv"), "a;b\n1;2");
    assert.deepEqual((await loadDataset(join(dir, "n.csv"), { delimiter: ";" })).toList(), [
      { a: "1", b: "2" },
    ]);
  });
});

Deno.test("loadDataset() names the CSV line of a ragged row or an unclosed quote", async () => {
  await withTempDir(async (dir) => {
    const file = join(dir, "bad.csv");
    await writeFile(file, 'a,b\n"multi\nline",1\n1,2,3\n');
    await assert.rejects(loadDataset(file), /bad\.csv: line 4: has 3 fields, the header has 2/);
    await writeFile(file, 'a,b\n1,"never closed\n2,3\n');
    await assert.rejects(loadDataset(file), /bad\.csv: line 2: a quoted field is never closed/);
    await writeFile(file, "a,a\n1,2\n");
    await assert.rejects(loadDataset(file), /column "a" appears twice/);
  });
});

Deno.test("loadDataset() reads Parquet rows as objects and turns safe INT64 into numbers", async () => {
  await withTempDir(async (dir) => {
    const file = join(dir, "t.parquet");
    const buffer = parquetWriteBuffer({
      columnData: [
        { name: "question", data: ["q1", "q2"], type: "STRING" },
        { name: "id", data: [1n, 2n ** 60n], type: "INT64" },
        { name: "score", data: [0.5, null], type: "DOUBLE" },
        { name: "info", data: [{ k: [1, 2] }, null], type: "JSON" },
      ],
    });
    await writeFile(file, new Uint8Array(buffer));
    const ds = await loadDataset(file);
    assert.deepEqual(ds.columnNames, ["question", "id", "score", "info"]);
    assert.deepEqual(ds.row(0), { question: "q1", id: 1, score: 0.5, info: { k: [1, 2] } });
    assert.equal(ds.row(1).id, 2n ** 60n);
    assert.equal(ds.row(1).score, null);
  });
});

Deno.test("saveDataset() round-trips through every format, keeping Parquet types", async () => {
  await withTempDir(async (dir) => {
    const ds = Dataset.fromList([
      {
        q: 'a, "quoted"\nline',
        n: 1,
        big: 2 ** 40,
        f: 1.5,
        ok: true,
        info: { tools: ["x"] },
        none: null,
      },
      { q: "b", n: -2, big: 3, f: 2, ok: false, info: { tools: [] }, none: null },
    ]);
    for (const ext of ["jsonl", "json", "parquet"]) {
      const file = join(dir, "out", `ds.${ext}`);
      await saveDataset(ds, file);
      const back = await loadDataset(file);
      assert.deepEqual(back.toList(), ds.toList(), ext);
      assert.deepEqual(back.columnNames, ds.columnNames, ext);
    }
    await saveDataset(ds, join(dir, "saved"));
    assert.deepEqual((await loadDataset(join(dir, "saved"))).toList(), ds.toList());

    await saveDataset(ds, join(dir, "ds.csv"));
    const csv = await loadDataset(join(dir, "ds.csv"));
    assert.deepEqual(csv.row(0), {
      q: 'a, "quoted"\nline',
      n: "1",
      big: String(2 ** 40),
      f: "1.5",
      ok: "true",
      info: '{"tools":["x"]}',
      none: "",
    });
  });
});

Deno.test("saveDataset() writes mixed-type Parquet columns as JSON and all-null ones as strings", async () => {
  await withTempDir(async (dir) => {
    const ds = Dataset.fromList([{ mixed: "x", empty: null }, { mixed: 2, empty: null }]);
    await saveDataset(ds, join(dir, "m.parquet"));
    assert.deepEqual((await loadDataset(join(dir, "m.parquet"))).toList(), ds.toList());
  });
});

Deno.test("loadDataset() gives a ConfigError for a missing file, an unknown extension, or a bad Parquet file", async () => {
  await withTempDir(async (dir) => {
    await assert.rejects(
      loadDataset(join(dir, "none.jsonl")),
      /Cannot read dataset ".*none\.jsonl"/,
    );
    await writeFile(join(dir, "x.txt"), "hello");
    await assert.rejects(loadDataset(join(dir, "x.txt")), /unknown extension "\.txt"/);
    await writeFile(join(dir, "bad.parquet"), "not parquet at all");
    await assert.rejects(
      loadDataset(join(dir, "bad.parquet")),
      /bad\.parquet: not a readable Parquet file/,
    );
    await mkdir(join(dir, "plain"));
    await assert.rejects(
      loadDataset(join(dir, "plain")),
      /must be one written by Dataset\.save\(\)/,
    );
    await assert.rejects(saveDataset(Dataset.fromList([]), join(dir, "x.txt")), ConfigError);
  });
});

Deno.test("loadDataset() accepts a file: URL and an explicit format", async () => {
  await withTempDir(async (dir) => {
    const file = join(dir, "rows.txt");
    await writeFile(file, '{"q": 1}\n');
    assert.equal((await loadDataset(pathToFileURL(file), { format: "jsonl" })).length, 1);
  });
});

Deno.test("datasetFromBytes() parses in-memory data and names it in errors", async () => {
  const ds = await datasetFromBytes(new TextEncoder().encode("a\n1\n"), { format: "csv" });
  assert.deepEqual(ds.toList(), [{ a: "1" }]);
  await assert.rejects(
    datasetFromBytes("{", { format: "jsonl", name: "mem.jsonl" }),
    /mem\.jsonl: line 1: invalid JSON/,
  );
});

Deno.test("saveDataset() to .jsonl writes one JSON object per line", async () => {
  await withTempDir(async (dir) => {
    await saveDataset(Dataset.fromList([{ a: 1 }, { a: 2 }]), join(dir, "x.jsonl"));
    assert.equal(await readFile(join(dir, "x.jsonl"), "utf8"), '{"a":1}\n{"a":2}\n');
  });
});
