/**
 * The adaptive controller against an engine stand-in (a test double: an async operation that
 * answers 5xx when more than its capacity run at once, and slows as load grows): it ramps up
 * while healthy, backs off on the errors, never passes its maximum, and recovers after an
 * outage.
 */
import assert from "node:assert/strict";
import { AdaptiveController, allGates } from "./adaptive.ts";

/** The stand-in engine: `capacity` at once, 5xx beyond; down entirely while `down` is set. */
function engine(capacity: number) {
  let running = 0;
  let peak = 0;
  const state = { down: false };
  const call = async (): Promise<{ ok: boolean; latencyMs: number }> => {
    running++;
    peak = Math.max(peak, running);
    const latencyMs = 1 + running; // slower under load
    await new Promise((r) => setTimeout(r, latencyMs));
    const ok = !state.down && running <= capacity;
    running--;
    return { ok, latencyMs };
  };
  return { call, state, peak: () => peak };
}

async function drive(
  gate: AdaptiveController,
  work: () => Promise<{ ok: boolean; latencyMs: number }>,
  units: number,
  workers: number,
) {
  let next = 0;
  let maxInFlight = 0;
  await Promise.all(Array.from({ length: workers }, async () => {
    while (next < units) {
      await gate.allows();
      if (next >= units) {
        gate.finished(null);
        return;
      }
      next++;
      maxInFlight = Math.max(maxInFlight, gate.inFlight);
      assert.ok(gate.inFlight <= gate.max);
      gate.finished(await work());
    }
  }));
  return maxInFlight;
}

Deno.test("adaptive controller: ramps up while healthy, halves on 5xx, stays within its maximum", async () => {
  const e = engine(6);
  const gate = new AdaptiveController({ max: 16 });
  assert.equal(gate.limit, 4);
  const maxInFlight = await drive(gate, e.call, 400, 32);
  const s = gate.stats();
  assert.ok(s.increases >= 1, JSON.stringify(s));
  assert.ok(s.backoffs >= 1, JSON.stringify(s)); // it went past 6 and was told so
  assert.ok(maxInFlight <= 16 && e.peak() <= 16);
  assert.ok(s.limit <= 12, `settled at ${s.limit}, far above the engine's 6`);
});

Deno.test("adaptive controller: an outage drives it to 1, and it climbs back once the engine answers", async () => {
  const e = engine(8);
  const gate = new AdaptiveController({ max: 8, start: 8 });
  e.state.down = true;
  await drive(gate, e.call, 40, 8);
  assert.equal(gate.limit, 1);
  e.state.down = false;
  await drive(gate, e.call, 200, 8);
  assert.ok(gate.limit >= 4, `recovered only to ${gate.limit}`);
  assert.ok(gate.stats().highest === 8);
});

Deno.test("allGates: every gate is asked, and a refusal gives back what the others granted", async () => {
  const adaptive = new AdaptiveController({ max: 2, start: 2 });
  let budget = 1;
  const refusing = { allows: () => budget-- > 0, finished: () => {} };
  const both = allGates([adaptive, refusing])!;
  assert.equal(await both.allows(), true);
  assert.equal(adaptive.inFlight, 1);
  assert.equal(await both.allows(), false);
  assert.equal(adaptive.inFlight, 1); // the refused start's slot came back
  both.finished({ ok: true });
  assert.equal(adaptive.inFlight, 0);
  assert.equal(allGates([null, undefined]), undefined);
});

Deno.test("adaptive controller: latency that climbs well past its settled level backs it off without any error", async () => {
  let running = 0;
  const slowBeyond5 = async () => {
    running++;
    const latencyMs = running > 5 ? 120 : 2;
    await new Promise((r) => setTimeout(r, latencyMs));
    running--;
    return { ok: true, latencyMs };
  };
  const gate = new AdaptiveController({ max: 16 });
  await drive(gate, slowBeyond5, 300, 32);
  const s = gate.stats();
  assert.ok(s.backoffs >= 1, JSON.stringify(s));
  assert.ok(s.highest > 5, JSON.stringify(s)); // it did try past the knee
});

Deno.test("allGates(): a start no longer wanted once an earlier gate lets it through never reaches a later gate (a budget), and the earlier one is released", async () => {
  let release!: () => void;
  const held = new Promise<void>((resolve) => (release = resolve));
  const freed: Array<unknown> = [];
  const first = {
    allows: async () => (await held, true),
    finished: (outcome?: unknown) => void freed.push(outcome),
  };
  let asked = 0;
  const budget = { allows: () => (asked++, true), finished: () => {} };
  let queued = 1;
  const gate = allGates([first, budget])!;
  const waiting = gate.allows(1, () => queued > 0);
  queued = 0; // another worker took the last unit while this one waited
  release();
  assert.equal(await waiting, false);
  assert.equal(asked, 0);
  assert.deepEqual(freed, [null]);
  // Still wanted: every gate is asked, as before.
  queued = 1;
  assert.equal(await gate.allows(1, () => queued > 0), true);
  assert.equal(asked, 1);
});
