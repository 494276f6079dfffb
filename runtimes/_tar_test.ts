import assert from "node:assert/strict";
import { spawnSync } from "node:child_process";
import { excludeMatcher, joinTars, packTar, readTar, TarCollector } from "./_tar.ts";

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

Deno.test("joinTars() places each archive below its directory and GNU tar extracts links, modes and long names", () => {
  const src = Deno.makeTempDirSync();
  const dest = Deno.makeTempDirSync();
  try {
    const deep = `out/${"d".repeat(70)}/${"f".repeat(40)}.txt`;
    Deno.mkdirSync(`${src}/out/${"d".repeat(70)}`, { recursive: true });
    Deno.writeTextFileSync(`${src}/out/run.sh`, "#!/bin/sh\n");
    Deno.chmodSync(`${src}/out/run.sh`, 0o751);
    Deno.writeTextFileSync(`${src}/${deep}`, "deep\n");
    Deno.linkSync(`${src}/out/run.sh`, `${src}/out/hard`);
    Deno.symlinkSync("run.sh", `${src}/out/soft`);
    Deno.mkdirSync(`${src}/artifacts`);
    Deno.writeTextFileSync(`${src}/artifacts/log.txt`, "log\n");
    const archive = (name: string) => {
      const made = spawnSync("tar", ["-C", src, "-cf", "-", name]);
      assert.equal(made.status, 0, String(made.stderr));
      return new Uint8Array(made.stdout);
    };
    const joined = joinTars([
      { under: "/workspace/task/", tar: archive("out") },
      { under: "logs", tar: archive("artifacts") },
    ]);
    const extracted = spawnSync("tar", ["-C", dest, "-xpf", "-"], { input: joined });
    assert.equal(extracted.status, 0, String(extracted.stderr));
    const base = `${dest}/workspace/task/out`;
    assert.equal(Deno.readTextFileSync(`${base}/run.sh`), "#!/bin/sh\n");
    assert.equal(Deno.statSync(`${base}/run.sh`).mode! & 0o777, 0o751);
    assert.equal(Deno.readTextFileSync(`${dest}/workspace/task/${deep}`), "deep\n");
    assert.equal(Deno.statSync(`${base}/hard`).ino, Deno.statSync(`${base}/run.sh`).ino);
    assert.equal(Deno.readLinkSync(`${base}/soft`), "run.sh");
    assert.equal(Deno.readTextFileSync(`${dest}/logs/artifacts/log.txt`), "log\n");
    assert.deepEqual(
      [...readTar(joined)].map((e) => e.name).filter((n) => n.startsWith("logs/")),
      ["logs/artifacts/", "logs/artifacts/log.txt"],
    );
  } finally {
    Deno.removeSync(src, { recursive: true });
    Deno.removeSync(dest, { recursive: true });
  }
});
