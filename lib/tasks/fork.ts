/**
 * Fork-per-group: the first rollout of a group (one task, one role) runs the task's setup
 * and snapshots its sandbox; the group's other rollouts start from the snapshot and skip
 * setup. Opt in with `fork_group = true` under `[env]` or {@link Taskset.forkGroup}.
 * @module
 */
import type { RuntimeSnapshot } from "../../runtimes/runtime.ts";

/** What a group's members start from: the leader's sandbox right after its setup. */
export interface ForkSeed {
  /** The image a member's sandbox starts from. */
  image: string;
  /** The trace id of the rollout whose setup the members share. */
  leader: string;
  /** The leader's `trace.info` as setup left it (JSON). */
  info: Record<string, unknown>;
  /** A structured clone of the leader's state as setup left it. */
  state: Record<string, unknown>;
}

/** The first rollout of a group: it settles the group with a seed, or with null to let each member set up on its own. */
export interface ForkLead {
  lead: true;
  settle(seed: ForkSeed | null, snapshot?: RuntimeSnapshot): void;
}

/** Any later rollout of the group: it waits for the seed (null: set up on its own). */
export interface ForkMember {
  lead: false;
  seed: Promise<ForkSeed | null>;
}

interface Group {
  seed: Promise<ForkSeed | null>;
  snapshot?: RuntimeSnapshot;
}

/** The fork groups of one run; {@link GroupForks.close} deletes their snapshots. */
export class GroupForks {
  readonly #groups = new Map<string, Group>();
  #closed = false;

  /** Joins the group `key`: the first caller leads, every later one is a member. */
  join(key: string): ForkLead | ForkMember {
    const existing = this.#groups.get(key);
    if (existing) return { lead: false, seed: existing.seed };
    let resolve!: (seed: ForkSeed | null) => void;
    const group: Group = { seed: new Promise((r) => (resolve = r)) };
    this.#groups.set(key, group);
    let settled = false;
    return {
      lead: true,
      settle: (seed, snapshot) => {
        if (settled) {
          // Settled already (the leader's setup timed out while its commit ran on): nobody
          // will start from this snapshot.
          snapshot?.remove().catch(() => {});
          return;
        }
        settled = true;
        if (snapshot && this.#closed) {
          // The run ended while the leader was snapshotting: nobody will start from it.
          snapshot.remove().catch(() => {});
          seed = null;
        } else group.snapshot = snapshot;
        resolve(seed);
      },
    };
  }

  /** Deletes every snapshot; call once no sandbox started from one is left. */
  async close(): Promise<void> {
    this.#closed = true;
    const snapshots = [...this.#groups.values()].flatMap((g) => g.snapshot ? [g.snapshot] : []);
    this.#groups.clear();
    await Promise.all(snapshots.map((s) => s.remove().catch(() => {})));
  }
}

/** A member's seed, or the signal's reason once it aborts first (a setup timeout, an interrupt). */
export function awaitSeed(member: ForkMember, signal: AbortSignal): Promise<ForkSeed | null> {
  if (signal.aborted) return Promise.reject(signal.reason);
  return new Promise((resolve, reject) => {
    const onAbort = () => reject(signal.reason);
    signal.addEventListener("abort", onAbort, { once: true });
    member.seed.then((seed) => {
      signal.removeEventListener("abort", onAbort);
      resolve(seed);
    });
  });
}
