import assert from "node:assert/strict";
import { copyPlain, isJsonPlain, jsonCopy } from "./_plain.ts";

function replacer(_key: string, v: unknown): unknown {
  if (typeof v === "bigint") return Number(v);
  if (v instanceof Map) return Object.fromEntries(v);
  if (v instanceof Set) return [...v];
  return v;
}

const slowJson = (v: unknown) => JSON.parse(JSON.stringify(v, replacer) ?? "null");

const samples: unknown[] = [
  null,
  0,
  -0,
  1.5,
  NaN,
  Infinity,
  "text \ud800 lone",
  true,
  [],
  {},
  [1, "a", null, undefined, () => 1, { b: [undefined] }],
  { a: 1, b: undefined, c: () => 1, d: { e: [1, 2, { f: "g" }] }, 2: "int key first" },
  JSON.parse('{"__proto__": {"polluted": true}, "x": 1}'),
  Object.assign(Object.create(null), { a: 1 }),
  { when: new Date(0), big: 10n, map: new Map([["k", 1]]), set: new Set([1]) },
  { nested: { toJSON: () => "custom" } },
  { error: new RangeError("boom") },
  {
    prompt: [{ role: "system", content: "Answer." }, { role: "user", content: "2+2?" }],
    info: { tool_defs: [] },
  },
];

Deno.test("jsonCopy() equals a JSON round trip through the replacer", () => {
  for (const v of samples) assert.deepStrictEqual(jsonCopy(v, replacer), slowJson(v));
  assert.deepStrictEqual(jsonCopy(undefined, replacer), null);
  const o = JSON.parse('{"__proto__": 1}');
  assert.deepStrictEqual(Object.keys(jsonCopy(o, replacer) as object), ["__proto__"]);
});

Deno.test("jsonCopy() keeps cycles an error, as JSON.stringify does", () => {
  const a: Record<string, unknown> = {};
  a.self = a;
  assert.throws(() => jsonCopy(a, replacer), TypeError);
});

Deno.test("copyPlain() equals structuredClone for plain and non-plain data", () => {
  for (const v of samples) {
    let expected: unknown;
    try {
      expected = structuredClone(v);
    } catch {
      assert.throws(() => copyPlain(v));
      continue;
    }
    assert.deepStrictEqual(copyPlain(v), expected);
  }
  const d = { when: new Date(5), list: [1, [2, [3]]] };
  const c = copyPlain(d);
  assert.notStrictEqual(c.list, d.list);
  assert.deepStrictEqual(c.when.getTime(), 5);
  assert.strictEqual(Object.getPrototypeOf(copyPlain(Object.create(null))), Object.prototype);
});

Deno.test("copyPlain() hands cycles and holes to structuredClone", () => {
  const a: Record<string, unknown> = { n: 1 };
  a.self = a;
  const c = copyPlain(a);
  assert.strictEqual(c.self, c);
  // deno-lint-ignore no-sparse-arrays
  const holes = [1, , 3];
  assert.deepStrictEqual(copyPlain(holes), structuredClone(holes));
  assert.deepStrictEqual(1 in copyPlain(holes), false);
  assert.throws(() => copyPlain({ f: () => 1 }), DOMException);
});

Deno.test("isJsonPlain() holds only for values a JSON round trip returns deep-equal", () => {
  const plain = samples.filter((v) => isJsonPlain(v));
  for (const v of plain) assert.deepStrictEqual(v, slowJson(v));
  assert.deepStrictEqual(plain, [null, 0, 1.5, "text \ud800 lone", true, [], {}, samples.at(-1)]);
  assert.equal(isJsonPlain([1, , 2]), false); // a hole reads back as null
  assert.equal(isJsonPlain(undefined), false);
});
