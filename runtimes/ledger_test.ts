import assert from "node:assert/strict";
import { join } from "node:path";
import {
  cleanupLedger,
  defaultLedgerPath,
  Ledger,
  type LedgerEntry,
  registerCleaner,
  replay,
} from "./ledger.ts";

async function withLedger(fn: (ledger: Ledger) => Promise<void>): Promise<void> {
  const dir = await Deno.makeTempDir({ prefix: "vf_ledger_unit_" });
  try {
    await fn(new Ledger(join(dir, "sub", "ledger.jsonl")));
  } finally {
    await Deno.remove(dir, { recursive: true });
  }
}

Deno.test("defaultLedgerPath() honours VF_LEDGER, off, XDG_CACHE_HOME and HOME", () => {
  assert.equal(defaultLedgerPath({ VF_LEDGER: "/x/l.jsonl" }), "/x/l.jsonl");
  assert.equal(defaultLedgerPath({ VF_LEDGER: "off" }), null);
  assert.equal(defaultLedgerPath({ XDG_CACHE_HOME: "/c" }), "/c/vf/ledger.jsonl");
  assert.equal(defaultLedgerPath({ HOME: "/h" }), "/h/.cache/vf/ledger.jsonl");
});

Deno.test("replay() keeps sandboxes without a stopped event and marks unconfirmed requests", () => {
  const at = (s: number) => new Date(Date.UTC(2026, 0, 1, 0, 0, s)).toISOString();
  const e = (event: LedgerEntry["event"], key: string, extra: Partial<LedgerEntry> = {}) =>
    ({ format_version: 1, event, type: "docker", key, at: at(0), pid: 1, ...extra }) as LedgerEntry;
  const live = replay([
    e("requested", "a", { run_id: "r1", at: at(1) }),
    e("created", "a", { id: "ida" }),
    e("requested", "b", { run_id: "r1" }),
    e("requested", "c", { run_id: "r2" }),
    e("created", "c", { id: "idc" }),
    e("stopped", "c"),
    e("created", "c", { id: "late" }), // a line after stopped changes nothing
  ]);
  assert.deepEqual(live.map((s) => [s.key, s.id, s.unconfirmed, s.run_id]), [
    ["a", "ida", false, "r1"],
    ["b", undefined, true, "r1"],
  ]);
  assert.equal(live[0].requested_at, at(1));
});

Deno.test("Ledger records, filters live sandboxes by run and age, skips torn lines, and compacts", async () => {
  await withLedger(async (ledger) => {
    await ledger.record({
      event: "requested",
      type: "t",
      key: "old",
      run_id: "r1",
      at: "2020-01-01T00:00:00.000Z",
    });
    await ledger.record({ event: "requested", type: "t", key: "new", run_id: "r2" });
    await ledger.record({ event: "requested", type: "t", key: "done", run_id: "r2" });
    await ledger.record({ event: "stopped", type: "t", key: "done", run_id: "r2" });
    await Deno.writeTextFile(ledger.path, '{"event":"requ', { append: true }); // a torn line
    assert.deepEqual((await ledger.live()).map((s) => s.key), ["old", "new"]);
    assert.deepEqual((await ledger.live({ runId: "r2" })).map((s) => s.key), ["new"]);
    assert.deepEqual((await ledger.live({ olderThanMs: 3_600_000 })).map((s) => s.key), ["old"]);
    assert.deepEqual(await ledger.compact(), { before: 4, after: 2 });
    assert.deepEqual((await ledger.live()).map((s) => s.key), ["old", "new"]);
    assert.equal((await ledger.entries()).length, 2);
  });
});

Deno.test("Ledger.record() fails with a remedy when the file cannot be written", async () => {
  const ledger = new Ledger("/proc/vf-no-such-dir/ledger.jsonl");
  await assert.rejects(
    () => ledger.record({ event: "requested", type: "t", key: "k" }),
    /Cannot write the sandbox ledger "\/proc\/vf-no-such-dir\/ledger.jsonl".*VF_LEDGER/,
  );
});

Deno.test("cleanupLedger() hands each type its live sandboxes, records stopped for removed and gone ones, reports types without a cleaner", async () => {
  await withLedger(async (ledger) => {
    for (const key of ["a", "b", "c"]) {
      await ledger.record({ event: "requested", type: "unit-test", key, run_id: "r" });
    }
    await ledger.record({ event: "requested", type: "nobody-cleans-me", key: "z", run_id: "r" });
    let given: string[] = [];
    registerCleaner("unit-test", (sandboxes) => {
      given = sandboxes.map((s) => s.key);
      return Promise.resolve({
        removed: ["a"],
        gone: ["b"],
        failed: [{ key: "c", error: "host down" }],
      });
    });
    const report = await cleanupLedger({ runId: "r" }, { ledger });
    assert.deepEqual(given, ["a", "b", "c"]);
    assert.deepEqual(report.removed, ["unit-test:a"]);
    assert.deepEqual(report.gone, ["unit-test:b"]);
    assert.deepEqual(report.failed.map((f) => [f.type, f.key]).sort(), [
      ["nobody-cleans-me", "z"],
      ["unit-test", "c"],
    ]);
    assert.deepEqual((await ledger.live()).map((s) => s.key).sort(), ["c", "z"]);
  });
});
