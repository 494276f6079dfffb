import assert from "node:assert/strict";
import { spawnSync } from "node:child_process";
import { excludeMatcher, packTar, readTar, TarCollector } from "./_tar.ts";

const longName = `${"a".repeat(90)}/${"b".repeat(90)}/ünïcode-✓.txt`;

Deno.test("packTar() output reads back with readTar(), long and UTF-8 names included", () => {
  const tar = packTar([
    { name: "dir", type: "directory" },
    { name: "dir/x.txt", type: "file", data: new TextEncoder().encode("hello"), mode: 0o755 },
    { name: longName, type: "file", data: new Uint8Array(1000).fill(7) },
  ]);
  assert.equal(tar.length % 512, 0);
  const entries = [...readTar(tar)];
  assert.deepEqual(entries.map((e) => [e.name, e.typeflag, e.size]), [
    ["dir/", "5", 0],
    ["dir/x.txt", "0", 5],
    [longName, "0", 1000],
  ]);
  assert.equal(entries[1].mode, 0o755);
  assert.equal(new TextDecoder().decode(entries[1].data), "hello");
  assert.ok(entries[2].data.every((b) => b === 7));
});

Deno.test("packTar() output is a valid archive for GNU tar", () => {
  const tar = packTar([
    { name: "d/f.txt", type: "file", data: new TextEncoder().encode("x") },
    { name: longName, type: "file", data: new Uint8Array(3) },
  ]);
  const listed = spawnSync("tar", ["-tf", "-"], { input: tar, encoding: "utf8" });
  assert.equal(listed.status, 0, listed.stderr);
  assert.deepEqual(listed.stdout.trim().split("\n"), ["d/f.txt", longName]);
});

Deno.test("readTar() reads what GNU tar writes", () => {
  const dir = Deno.makeTempDirSync();
  try {
    Deno.mkdirSync(`${dir}/${longName.split("/").slice(0, 2).join("/")}`, { recursive: true });
    Deno.writeTextFileSync(`${dir}/${longName}`, "from gnu tar");
    const made = spawnSync("tar", ["-C", dir, "-cf", "-", "a".repeat(90)]);
    assert.equal(made.status, 0);
    const file = [...readTar(new Uint8Array(made.stdout))].find((e) => e.typeflag === "0")!;
    assert.equal(file.name, longName);
    assert.equal(new TextDecoder().decode(file.data), "from gnu tar");
  } finally {
    Deno.removeSync(dir, { recursive: true });
  }
});

Deno.test("TarCollector keeps the spared members byte for byte across any chunking, long names included", () => {
  const long = `out/${"d".repeat(80)}/${"f".repeat(60)}.txt`; // over 100 bytes: a pax header
  const tar = packTar([
    { name: "out/", type: "directory" },
    { name: "out/keep.txt", type: "file", data: new TextEncoder().encode("keep\n") },
    { name: long, type: "file", data: new TextEncoder().encode("long\n") },
    { name: "out/a/node_modules/x.js", type: "file", data: new Uint8Array(3000) },
    { name: "out/debug.log", type: "file", data: new TextEncoder().encode("log\n") },
  ]);
  for (const size of [1, 7, 512, 100_000]) {
    const c = new TarCollector({ exclude: excludeMatcher(["node_modules", "*.log"]) });
    for (let i = 0; i < tar.length; i += size) c.push(tar.subarray(i, i + size));
    const names = [...readTar(c.finish())].map((r) => r.name);
    assert.deepEqual(names, ["out/", "out/keep.txt", long], `chunks of ${size}`);
  }
  const limited = new TarCollector({ maxBytes: 2048, tooLarge: (n) => new RangeError(`${n}`) });
  assert.throws(() => limited.push(tar), RangeError);
});
