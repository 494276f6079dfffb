import assert from "node:assert/strict";
import { existsSync } from "node:fs";
import { mkdtemp, rm } from "node:fs/promises";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { cleanupLedger, defaultLedger, Ledger, liveEntries, setDefaultLedger } from "./ledger.ts";
import { SubprocessRuntime } from "./subprocess.ts";

Deno.test("a subprocess workspace is in the ledger before it exists, and the ledger sweep removes a leftover one", async () => {
  const dir = await mkdtemp(join(tmpdir(), "vf-ledger-test-"));
  const before = defaultLedger();
  const ledger = new Ledger(join(dir, "ledger.jsonl"));
  setDefaultLedger(ledger);
  const runId = `sub-${crypto.randomUUID().slice(0, 8)}`;
  const rt = new SubprocessRuntime({ type: "subprocess" }, { runId });
  try {
    await rt.start();
    const root = rt.id;
    assert.ok(existsSync(root));
    const events = (await Deno.readTextFile(join(dir, "ledger.jsonl"))).trim().split("\n")
      .map((l) => JSON.parse(l)).filter((e) => e.key === root).map((e) => e.event);
    assert.deepEqual(events, ["requested", "created"]);
    // As if the evaluator had been killed: the runtime is never stopped.
    assert.deepEqual((await liveEntries({ runId })).map((l) => l.key), [root]);
    const report = await cleanupLedger({ runId }, { ledger });
    assert.deepEqual(report.removed, [`subprocess:${root}`]);
    assert.equal(existsSync(root), false);
    assert.deepEqual(await liveEntries({ runId }), []);
  } finally {
    await rt.stop();
    setDefaultLedger(before);
    await rm(dir, { recursive: true, force: true });
  }
});
