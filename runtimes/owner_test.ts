import assert from "node:assert/strict";
import { hostname } from "node:os";
import process from "node:process";
import { currentOwner, keepReason, ownerFromLabels, ownerLabels, ownerState } from "./owner.ts";

Deno.test("ownerState(): this process is alive; an exited child and a reused pid are gone; another host is unknown", async () => {
  const me = currentOwner();
  assert.equal(me.pid, process.pid);
  assert.equal(ownerState(me), "alive");

  const child = new Deno.Command("sleep", { args: ["0"] }).spawn();
  await child.status;
  assert.equal(ownerState({ ...me, pid: child.pid }), "gone", "an exited process");
  if (me.start !== undefined) {
    // Same pid, another start time: the pid was reused, the owner is gone.
    assert.equal(ownerState({ ...me, start: String(Number(me.start) + 1) }), "gone");
    assert.equal(ownerState({ ...me, boot: "another-boot" }), "gone", "before a reboot");
  }
  assert.equal(ownerState({ ...me, host: `not-${hostname()}` }), "unknown");
  assert.equal(ownerState(undefined), "unknown");
});

Deno.test("owner labels round-trip, and keepReason() keeps live and unknown owners unless forced or old enough", () => {
  const me = currentOwner();
  assert.deepEqual(ownerFromLabels(ownerLabels(me)), me);
  assert.equal(ownerFromLabels({ "vf.managed": "1" }), undefined);
  const now = Date.now();
  assert.match(keepReason(me, now, {})!, /still going \(pid \d+/);
  assert.equal(keepReason(me, now, { force: true }), undefined);
  assert.match(keepReason(undefined, now, {})!, /records no owner/);
  assert.equal(keepReason(undefined, now - 7_200_000, { olderThanMs: 3_600_000 }), undefined);
  assert.match(keepReason(undefined, now, { olderThanMs: 3_600_000 })!, /older-than/);
  assert.match(keepReason(me, now - 7_200_000, { olderThanMs: 3_600_000 })!, /still going/);
});
