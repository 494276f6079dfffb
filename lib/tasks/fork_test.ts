/**
 * GroupForks' bookkeeping: when a group's snapshot is deleted. The snapshot here is a record
 * of remove() calls (what it deletes is the Docker runtime's, tested in tests/fork_test.ts).
 */
import assert from "node:assert/strict";
import { type ForkLead, type ForkMember, type ForkSeed, GroupForks } from "./fork.ts";
import type { RuntimeSnapshot } from "../../runtimes/runtime.ts";

function snapshot(): RuntimeSnapshot & { removals: number } {
  const s = {
    image: `vf-fork:${crypto.randomUUID().slice(0, 8)}`,
    removals: 0,
    remove() {
      s.removals++;
      return Promise.resolve();
    },
  };
  return s;
}

const seedOf = (image: string): ForkSeed => ({ image, leader: "t0", info: {}, state: {} });

Deno.test("GroupForks deletes a group's snapshot once all its members are done with it, not at run end", async () => {
  const forks = new GroupForks({ members: 2 });
  const lead = forks.join("agent\0a") as ForkLead;
  assert.ok(lead.lead && lead.wanted);
  const [m1, m2] = [forks.join("agent\0a"), forks.join("agent\0a")] as ForkMember[];
  const snap = snapshot();
  lead.settle(seedOf(snap.image), snap);
  assert.equal((await m1.seed)?.image, snap.image);
  m1.released();
  m1.released(); // counted once
  assert.equal(snap.removals, 0, "one member still runs from it");
  m2.released();
  assert.equal(snap.removals, 1);
  // A rollout beyond the group's size sets up on its own: the image is gone.
  const late = forks.join("agent\0a") as ForkMember;
  assert.equal(await late.seed, null);
  await forks.close();
  assert.equal(snap.removals, 1, "close() does not delete it again");
});

Deno.test("GroupForks keeps the snapshot while a member that joined is not done with it, and until run end if one never is", async () => {
  const forks = new GroupForks({ members: 1 });
  const lead = forks.join("agent\0b") as ForkLead;
  // More members joined than the group's size says (two agents of one role, say).
  const [m1, m2] = [forks.join("agent\0b"), forks.join("agent\0b")] as ForkMember[];
  const snap = snapshot();
  lead.settle(seedOf(snap.image), snap);
  m1.released();
  assert.equal(snap.removals, 0, "m2 joined and may still run from it");
  assert.equal((await m2.seed)?.image, snap.image);
  await forks.close(); // m2 never released it (its sandbox failed to start): deleted at run end
  assert.equal(snap.removals, 1);
});

Deno.test("GroupForks with no members: the leader is told snapshotting is no use, and one taken is deleted at once", async () => {
  const forks = new GroupForks({ members: 0 });
  const lead = forks.join("agent\0c") as ForkLead;
  assert.equal(lead.wanted, false);
  const snap = snapshot();
  lead.settle(seedOf(snap.image), snap);
  assert.equal(snap.removals, 1);
  await forks.close();
  assert.equal(snap.removals, 1);
});

Deno.test("GroupForks without a known group size keeps snapshots until close()", async () => {
  const forks = new GroupForks();
  const lead = forks.join("agent\0d") as ForkLead;
  assert.ok(lead.wanted);
  const member = forks.join("agent\0d") as ForkMember;
  const snap = snapshot();
  lead.settle(seedOf(snap.image), snap);
  member.released();
  assert.equal(snap.removals, 0);
  await forks.close();
  assert.equal(snap.removals, 1);
});

Deno.test("GroupForks.close() waits for a deletion a member's release started", async () => {
  const forks = new GroupForks({ members: 1 });
  const lead = forks.join("agent\0e") as ForkLead;
  const member = forks.join("agent\0e") as ForkMember;
  let finish!: () => void;
  let deleted = false;
  const slow: RuntimeSnapshot = {
    image: "vf-fork:slow",
    remove: () => new Promise<void>((r) => (finish = r)).then(() => void (deleted = true)),
  };
  lead.settle(seedOf(slow.image), slow);
  member.released();
  let closed = false;
  const closing = forks.close().then(() => (closed = true));
  await new Promise((r) => setTimeout(r, 20));
  assert.equal(closed, false, "close() returned while the image was being deleted");
  finish();
  await closing;
  assert.ok(deleted);
});
