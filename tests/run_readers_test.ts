/**
 * The readers of a `vf run`'s `traces.jsonl` (`vf compare`, `vf export`) skip a line whose
 * fields are not a trace's, naming the file and line, and read the rest: environment code or
 * a crash may leave such a line, and a TypeError from deep inside a reader named neither.
 * @module
 */
import assert from "node:assert/strict";
import { join } from "node:path";
import { MAX_JSON_LINE_BYTES } from "../lib/eval/jsonl.ts";
import { runCli, tempDir, transcript } from "./_cli.ts";
import { traceLine as trace } from "./_trace_fixture.ts";

// deno-lint-ignore no-explicit-any
type Json = any;

const episode = (key: string, traces: unknown, extra: Json = {}) => ({
  format_version: 3,
  kind: "episode",
  task: { key, idx: 0, hash: "h" },
  episode_index: 0,
  errors: [],
  traces,
  ...extra,
});

Deno.test("vf compare and vf export skip a traces.jsonl line that is not a trace or an episode of traces, naming the file and line, and read the others", async () => {
  await using tmp = await tempDir("vf_readers_");
  const a = join(tmp.path, "a");
  const b = join(tmp.path, "b");
  await Deno.mkdir(a);
  await Deno.mkdir(b);
  const bad: Array<[unknown, RegExp]> = [
    [episode("e1", [null]), /"traces\[0\]" is not an object/],
    [episode("e2", [trace("e2", 1, { task: null })]), /"traces\[0\]\.task\.key" is not a string/],
    [episode("e3", [trace("e3", 1)], { errors: null }), /"errors" is not a list/],
    [episode("e4", 7), /"traces" is not a list/],
    [trace("m", 1, { messages: "hi" }), /"messages" is not a list/],
    [trace("c", 1, { model_calls: {} }), /"model_calls" is not a list/],
    [trace("i", 1, { rollout_index: "/../x" }), /"rollout_index" is not a whole number/],
  ];
  const good = [trace("x", 1), trace("y", 1), episode("z", [trace("z", 0.5)])];
  await Deno.writeTextFile(
    join(a, "traces.jsonl"),
    [...good, ...bad.map(([line]) => line)].map((l) => JSON.stringify(l)).join("\n") + "\n",
  );
  await Deno.writeTextFile(
    join(b, "traces.jsonl"),
    [trace("x", 0), trace("y", 1), trace("z", 0.5)].map((l) => JSON.stringify(l)).join("\n") +
      "\n",
  );
  const opts = { cwd: tmp.path, registry: false } as const;
  const path = join(a, "traces.jsonl");
  const named = (stderr: string) => {
    for (const [i, [, why]] of bad.entries()) {
      const line = good.length + i + 1;
      const warning = stderr.split("\n").find((l) => l.startsWith(`${path}:${line}: skipping`));
      assert.ok(warning, `line ${line} is not named:\n${stderr}`);
      assert.match(warning, why);
    }
    assert.doesNotMatch(stderr, /TypeError/);
  };

  const cmp = await runCli(["compare", a, b], opts);
  assert.equal(cmp.code, 0, transcript(cmp));
  named(cmp.stderr);
  assert.match(cmp.stdout, /paired examples 3\n/);
  assert.match(cmp.stdout, /mean reward {2}A 0\.8333 {2}B 0\.5000/);

  const exp = await runCli(["export", "--format", "atif", a, "-o", join(tmp.path, "atif")], opts);
  assert.equal(exp.code, 0, transcript(exp));
  named(exp.stderr);
  assert.match(exp.stdout, /wrote 3 ATIF trajectories/);
});

Deno.test("vf compare skips a results.jsonl line over the record limit, naming the file and line, without holding or parsing it", async () => {
  await using tmp = await tempDir("vf_readers_huge_");
  const a = join(tmp.path, "a");
  const b = join(tmp.path, "b");
  await Deno.mkdir(a);
  await Deno.mkdir(b);
  const row = (example: number, reward: number, extra = "") =>
    `{"example_id": ${example}, "reward": ${reward}, "error": null${extra}}\n`;
  // A valid row just over the limit (it would parse and count), between ordinary ones.
  const out = await Deno.open(join(a, "results.jsonl"), { create: true, write: true });
  const enc = new TextEncoder();
  await out.write(enc.encode(row(0, 1) + `{"example_id": 1, "reward": 0, "error": null, "p": "`));
  const block = enc.encode("x".repeat(1 << 20));
  for (let n = 0; n <= MAX_JSON_LINE_BYTES >> 20; n++) await out.write(block);
  await out.write(enc.encode(`"}\n` + row(2, 1)));
  out.close();
  await Deno.writeTextFile(join(b, "results.jsonl"), row(0, 1) + row(1, 1) + row(2, 0));

  const cmp = await runCli(["compare", a, b], { cwd: tmp.path, registry: false });
  assert.equal(cmp.code, 0, transcript(cmp));
  assert.match(
    cmp.stderr,
    new RegExp(
      `${join(a, "results.jsonl")}:2: skipping a corrupt line \\(a line of \\d+ bytes, over ` +
        `the 256 MiB a record may hold\\)`,
    ),
  );
  // Example 1 is left out: only examples 0 and 2 pair.
  assert.match(cmp.stdout, /paired examples 2 \(left out: 0 only in A, 1 only in B\)/);
});
