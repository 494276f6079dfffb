import assert from "node:assert/strict";
import { ConfigError } from "../errors.ts";
import { formatRows, parseInfo } from "./formatting.ts";
import type { Message } from "../types.ts";

/** Run `fn` with console.warn captured; returns the warnings. */
function captureWarnings(fn: () => void): string[] {
  const seen: string[] = [];
  const original = console.warn;
  console.warn = (...args: unknown[]) => void seen.push(args.map(String).join(" "));
  try {
    fn();
  } finally {
    console.warn = original;
  }
  return seen;
}

const fewShot: Message[] = [
  { role: "user", content: "What is 1+1?" },
  { role: "assistant", content: "1+1 equals 2." },
];

// ---- example_id -------------------------------------------------------------------------

Deno.test("formatRows() adds example_id 0..n-1 in row order when the column is missing", () => {
  const rows = formatRows([{ question: "What is 2+2?" }, { question: "What is 3*5?" }]);
  assert.deepEqual(rows.map((r) => r.example_id), [0, 1]);
});

Deno.test("formatRows() keeps existing integer example_ids, duplicates included", () => {
  const rows = formatRows([
    { question: "a", example_id: 7 },
    { question: "b", example_id: 7 },
    { question: "c", example_id: 2 },
  ]);
  assert.deepEqual(rows.map((r) => r.example_id), [7, 7, 2]);
  assert.ok(rows.every((r) => !("src_id" in r)));
});

Deno.test("formatRows() renames a non-integer example_id column to src_id and assigns new ids", () => {
  const rows = formatRows([
    { question: "a", example_id: "gsm8k-17" },
    { question: "b", example_id: "gsm8k-3" },
  ]);
  assert.deepEqual(rows.map((r) => r.src_id), ["gsm8k-17", "gsm8k-3"]);
  assert.deepEqual(rows.map((r) => r.example_id), [0, 1]);
});

Deno.test("formatRows() treats a fractional first example_id as a source id", () => {
  const rows = formatRows([{ question: "a", example_id: 1.5 }, { question: "b", example_id: 2 }]);
  assert.deepEqual(rows.map((r) => r.src_id), [1.5, 2]);
  assert.deepEqual(rows.map((r) => r.example_id), [0, 1]);
});

Deno.test("formatRows() decides on example_id from the first value only", () => {
  const rows = formatRows([{ question: "a", example_id: 4 }, { question: "b", example_id: "x" }]);
  assert.deepEqual(rows.map((r) => r.example_id), [4, "x"]);
  assert.ok(rows.every((r) => !("src_id" in r)));
});

Deno.test("formatRows() returns new row objects and leaves its input untouched", () => {
  const input = [{ question: "q", example_id: "s1" }];
  const rows = formatRows(input, { systemPrompt: "sys" });
  assert.deepEqual(input, [{ question: "q", example_id: "s1" }]);
  assert.notEqual(rows[0], input[0]);
});

// ---- prompt from question -----------------------------------------------------------------

Deno.test("formatRows() wraps question in a user message when there is no prompt column", () => {
  const [row] = formatRows([{ question: "What is 2+2?", answer: "4" }]);
  assert.deepEqual(row.prompt, [{ role: "user", content: "What is 2+2?" }]);
});

Deno.test("formatRows() keeps question, answer, info and other columns on the row", () => {
  const [row] = formatRows([{ question: "q", answer: "4", info: '{"a":1}', extra: 3 }]);
  assert.equal(row.question, "q");
  assert.equal(row.answer, "4");
  assert.equal(row.info, '{"a":1}');
  assert.equal(row.extra, 3);
});

Deno.test("formatRows() builds system, few-shot, then the question (the seed's example)", () => {
  const [row] = formatRows([{ question: "What is 2+2?" }], {
    systemPrompt: "You are a helpful math tutor.",
    fewShot,
  });
  assert.deepEqual(row.prompt, [
    { role: "system", content: "You are a helpful math tutor." },
    { role: "user", content: "What is 1+1?" },
    { role: "assistant", content: "1+1 equals 2." },
    { role: "user", content: "What is 2+2?" },
  ]);
});

Deno.test("formatRows() adds a system message in the question path only when it is truthy", () => {
  const [empty] = formatRows([{ question: "q" }], { systemPrompt: "" });
  assert.deepEqual(empty.prompt, [{ role: "user", content: "q" }]);
  const [nul] = formatRows([{ question: "q" }], { systemPrompt: null });
  assert.deepEqual(nul.prompt, [{ role: "user", content: "q" }]);
  const [set] = formatRows([{ question: "q" }], { systemPrompt: "You are helpful." });
  assert.deepEqual(set.prompt, [
    { role: "system", content: "You are helpful." },
    { role: "user", content: "q" },
  ]);
});

Deno.test("formatRows() skips an empty few-shot list in the question path without warning", () => {
  let rows: ReturnType<typeof formatRows> = [];
  const warnings = captureWarnings(() => (rows = formatRows([{ question: "q" }], { fewShot: [] })));
  assert.deepEqual(rows[0].prompt, [{ role: "user", content: "q" }]);
  assert.deepEqual(warnings, []);
});

Deno.test("formatRows() gives every row its own copy of the few-shot messages", () => {
  const rows = formatRows([{ question: "a" }, { question: "b" }], { fewShot });
  const first = rows[0].prompt as Message[];
  first[0].content = "mutated";
  assert.equal((rows[1].prompt as Message[])[0].content, "What is 1+1?");
  assert.equal(fewShot[0].content, "What is 1+1?");
});

Deno.test("formatRows() stringifies a non-string question", () => {
  const [row] = formatRows([{ question: 42 }]);
  assert.deepEqual(row.prompt, [{ role: "user", content: "42" }]);
});

Deno.test("formatRows() rejects a row whose question is null, naming the row", () => {
  assert.throws(
    () => formatRows([{ question: "ok" }, { question: null }], { label: "eval_dataset" }),
    (e: unknown) =>
      e instanceof ConfigError &&
      e.message ===
        'eval_dataset: row 1: no "question" (or "prompt") column; give every row one of them',
  );
});

Deno.test("formatRows() with mixed rows blames the first row that has neither, not row 0", () => {
  // The dataset normalises columns, so a question row has prompt null and vice versa.
  const rows = [
    { question: "q0", prompt: null },
    { question: null, prompt: [{ role: "user", content: "p1" }] },
    { question: "q2", prompt: null },
    { question: null, prompt: null },
  ];
  assert.throws(
    () => formatRows(rows),
    (e: unknown) =>
      e instanceof ConfigError &&
      e.message ===
        'dataset: row 3: no "question" (or "prompt") column; give every row one of them',
  );
  const ok = formatRows(rows.slice(0, 3));
  assert.deepEqual(ok.map((r) => r.prompt), [
    [{ role: "user", content: "q0" }],
    [{ role: "user", content: "p1" }],
    [{ role: "user", content: "q2" }],
  ]);
});

Deno.test("formatRows() names the row's file and its index there when origin is given", () => {
  assert.throws(
    () =>
      formatRows([{ question: "a" }, { question: null }], {
        origin: (i) => ({ source: "data/train.jsonl", row: i + 10 }),
      }),
    (e: unknown) =>
      e instanceof ConfigError &&
      e.message.startsWith('data/train.jsonl: row 11: no "question" (or "prompt") column'),
  );
  assert.throws(
    () => formatRows([{ text: "a" }], { origin: () => ({ source: "data/x.csv", row: 0 }) }),
    (e: unknown) =>
      e instanceof ConfigError &&
      e.message.startsWith('data/x.csv: no "question" (or "prompt") column (columns: "text")'),
  );
});

// ---- existing prompt column ---------------------------------------------------------------

Deno.test("formatRows() leaves an existing prompt untouched when no system prompt is given", () => {
  const prompt = [{ role: "user", content: "What is 2+2?" }];
  const [row] = formatRows([{ prompt, answer: "4" }]);
  assert.deepEqual(row.prompt, prompt);
});

Deno.test("formatRows() prepends the system prompt to a prompt list that lacks one", () => {
  const [row] = formatRows([{ prompt: [{ role: "user", content: "hi" }] }], {
    systemPrompt: "sys",
  });
  assert.deepEqual(row.prompt, [
    { role: "system", content: "sys" },
    { role: "user", content: "hi" },
  ]);
});

Deno.test("formatRows() keeps a prompt that already starts with a system message as it is", () => {
  const prompt = [
    { role: "system", content: "You are a math tutor." },
    { role: "user", content: "What is 2+2?" },
  ];
  const [row] = formatRows([{ prompt }], { systemPrompt: "other" });
  assert.deepEqual(row.prompt, prompt);
});

Deno.test("formatRows() prepends an empty-string system prompt in the prompt path", () => {
  const [row] = formatRows([{ prompt: [{ role: "user", content: "hi" }] }], { systemPrompt: "" });
  assert.deepEqual(row.prompt, [
    { role: "system", content: "" },
    { role: "user", content: "hi" },
  ]);
});

Deno.test("formatRows() does not mutate the input prompt list when prepending", () => {
  const prompt = [{ role: "user", content: "hi" }];
  formatRows([{ prompt }], { systemPrompt: "sys" });
  assert.deepEqual(prompt, [{ role: "user", content: "hi" }]);
});

Deno.test("formatRows() rejects a string prompt when a system prompt must be prepended", () => {
  assert.throws(
    () => formatRows([{ prompt: "plain text" }], { systemPrompt: "sys" }),
    (e: unknown) =>
      e instanceof ConfigError &&
      /^dataset: row 0: "prompt" must be a list of messages/.test(e.message),
  );
});

Deno.test("formatRows() accepts a string prompt when no system prompt is given", () => {
  const [row] = formatRows([{ prompt: "plain text" }]);
  assert.equal(row.prompt, "plain text");
});

Deno.test("formatRows() ignores few-shot with a console.warn when a prompt column exists", () => {
  let rows: ReturnType<typeof formatRows> = [];
  const warnings = captureWarnings(() => {
    rows = formatRows([{ prompt: [{ role: "user", content: "hi" }] }], {
      fewShot,
      label: "eval_dataset",
    });
  });
  assert.deepEqual(rows[0].prompt, [{ role: "user", content: "hi" }]);
  assert.equal(warnings.length, 1);
  assert.match(warnings[0], /few_shot is ignored/);
  assert.match(warnings[0], /eval_dataset/);
});

Deno.test("formatRows() warns about an empty few-shot list too when a prompt column exists", () => {
  const warnings = captureWarnings(() => {
    formatRows([{ prompt: [{ role: "user", content: "hi" }] }], { fewShot: [] });
  });
  assert.equal(warnings.length, 1);
});

Deno.test("formatRows() does not warn when few-shot is not given in the prompt path", () => {
  const warnings = captureWarnings(() => {
    formatRows([{ prompt: [{ role: "user", content: "hi" }] }], { fewShot: null });
  });
  assert.deepEqual(warnings, []);
});

Deno.test("formatRows() prefers the prompt column over question when both exist", () => {
  const [row] = formatRows([{ prompt: [{ role: "user", content: "p" }], question: "q" }], {
    fewShot,
  });
  assert.deepEqual(row.prompt, [{ role: "user", content: "p" }]);
});

Deno.test("formatRows() rejects a row with a null prompt, naming the row", () => {
  assert.throws(
    () => formatRows([{ prompt: [{ role: "user", content: "hi" }] }, { prompt: null }]),
    (e: unknown) =>
      e instanceof ConfigError &&
      e.message ===
        'dataset: row 1: no "question" (or "prompt") column; give every row one of them',
  );
});

Deno.test("formatRows() throws a ConfigError naming the columns when there is no prompt or question", () => {
  assert.throws(
    () => formatRows([{ text: "hi", answer: "4" }], { label: "eval_dataset" }),
    (e: unknown) =>
      e instanceof ConfigError &&
      e.message ===
        'eval_dataset: no "question" (or "prompt") column (columns: "text", "answer"); add one of them',
  );
});

Deno.test("formatRows() says 'none' when rows have no columns at all", () => {
  assert.throws(() => formatRows([{}]), /columns: none/);
});

// ---- task -------------------------------------------------------------------------------

Deno.test("formatRows() sets task to envId when the column is missing", () => {
  const rows = formatRows([{ question: "a" }, { question: "b" }], { envId: "math-qa" });
  assert.deepEqual(rows.map((r) => r.task), ["math-qa", "math-qa"]);
});

Deno.test("formatRows() defaults task to 'default' when envId is missing or empty", () => {
  assert.equal(formatRows([{ question: "a" }])[0].task, "default");
  assert.equal(formatRows([{ question: "a" }], { envId: "" })[0].task, "default");
});

Deno.test("formatRows() keeps an existing task value", () => {
  const [row] = formatRows([{ question: "a", task: "reverse-text" }], { envId: "other" });
  assert.equal(row.task, "reverse-text");
});

// ---- parseInfo --------------------------------------------------------------------------

Deno.test("parseInfo() parses a JSON-string info into an object", () => {
  assert.deepEqual(parseInfo('{"difficulty": 3, "topic": "algebra"}'), {
    difficulty: 3,
    topic: "algebra",
  });
});

Deno.test("parseInfo() passes an object through unchanged", () => {
  const info = { a: { b: [1, 2] } };
  assert.equal(parseInfo(info), info);
});

Deno.test("parseInfo() maps undefined, null and the empty string to an empty object", () => {
  assert.deepEqual(parseInfo(undefined), {});
  assert.deepEqual(parseInfo(null), {});
  assert.deepEqual(parseInfo(""), {});
});

Deno.test("parseInfo() throws a ConfigError naming the field for invalid JSON", () => {
  assert.throws(
    () => parseInfo("{not json", "row 3 info"),
    (e: unknown) =>
      e instanceof ConfigError && e.message.startsWith("row 3 info is not valid JSON"),
  );
});

Deno.test("parseInfo() rejects JSON that is not an object", () => {
  for (const text of ["[1,2]", "3", '"s"', "null"]) {
    assert.throws(() => parseInfo(text), /info must be a JSON object/, text);
  }
});

Deno.test("parseInfo() rejects values that are neither objects nor strings", () => {
  assert.throws(() => parseInfo(5), /info must be an object or a JSON string/);
  assert.throws(() => parseInfo([1]), /info must be an object or a JSON string/);
});
