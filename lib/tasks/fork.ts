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
  /** False when the group has no members (one rollout per task): snapshotting is no use. */
  wanted: boolean;
  settle(seed: ForkSeed | null, snapshot?: RuntimeSnapshot): void;
}

/** Any later rollout of the group: it waits for the seed (null: set up on its own). */
export interface ForkMember {
  lead: false;
  seed: Promise<ForkSeed | null>;
  /**
   * Tells the group this member's sandbox, started from the seed, is removed: the snapshot's
   * image can be deleted once no container runs from it (deleted while one does, it would
   * only be untagged and left behind).
   */
  released(): void;
}

interface Group {
  seed: Promise<ForkSeed | null>;
  snapshot?: RuntimeSnapshot;
  /** Members that joined, and those of them whose sandbox from the snapshot is removed. */
  joined: number;
  released: number;
}

/** Options of {@link GroupForks}. */
export interface GroupForksOptions {
  /**
   * Members each group has besides its leader (rollouts per task − 1), when known: once that
   * many are done with the snapshot (their sandboxes removed) it is deleted, not kept until
   * the run ends.
   */
  members?: number;
}

/** The fork groups of one run; {@link GroupForks.close} deletes their snapshots. */
export class GroupForks {
  readonly #groups = new Map<string, Group>();
  readonly #members: number;
  /** Deletions under way, which {@link GroupForks.close} waits for. */
  readonly #removing = new Set<Promise<void>>();
  #closed = false;

  constructor(options: GroupForksOptions = {}) {
    this.#members = options.members ?? Infinity;
  }

  /** Joins the group `key`: the first caller leads, every later one is a member. */
  join(key: string): ForkLead | ForkMember {
    const existing = this.#groups.get(key);
    if (existing) {
      existing.joined++;
      let counted = false;
      return {
        lead: false,
        seed: existing.seed,
        released: () => {
          if (counted) return;
          counted = true;
          existing.released++;
          // Deleted once every member of the group is done with it and none that joined is
          // still running from it (one that joins later, beyond the group's size, sets up on
          // its own).
          if (existing.released < this.#members || existing.released < existing.joined) return;
          if (!existing.snapshot) return;
          const snapshot = existing.snapshot;
          existing.snapshot = undefined;
          existing.seed = Promise.resolve(null);
          this.#remove(snapshot);
        },
      };
    }
    let resolve!: (seed: ForkSeed | null) => void;
    const group: Group = { seed: new Promise((r) => (resolve = r)), joined: 0, released: 0 };
    this.#groups.set(key, group);
    let settled = false;
    return {
      lead: true,
      wanted: this.#members > 0,
      settle: (seed, snapshot) => {
        if (settled) {
          // Settled already (the leader's setup timed out while its commit ran on): nobody
          // will start from this snapshot.
          if (snapshot) this.#remove(snapshot);
          return;
        }
        settled = true;
        if (snapshot && (this.#closed || this.#members <= 0)) {
          // The run ended while the leader was snapshotting, or the group has no members:
          // nobody will start from it.
          this.#remove(snapshot);
          seed = null;
        } else group.snapshot = snapshot;
        resolve(seed);
      },
    };
  }

  #remove(snapshot: RuntimeSnapshot): void {
    const removing = snapshot.remove().catch(() => {});
    this.#removing.add(removing);
    removing.finally(() => this.#removing.delete(removing));
  }

  /**
   * Deletes every snapshot left, and waits for those being deleted; call once no sandbox
   * started from one is left.
   */
  async close(): Promise<void> {
    this.#closed = true;
    for (const g of this.#groups.values()) if (g.snapshot) this.#remove(g.snapshot);
    this.#groups.clear();
    await Promise.all(this.#removing);
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
