/**
 * Where a rollout's sandboxes come from: {@linkcode WarmPool} keeps `size` started sandboxes
 * ready per sandbox shape (the runtime spec without its labels: type, image, cpu, memory,
 * network, env, workdir, ...), so a rollout's first command is an exec, not a container
 * start. Each sandbox is used once: acquiring one takes it out of the pool and starts a
 * replacement in the background, within the sandbox limits (refills wait behind normal
 * requests for a slot). Pooled sandboxes carry the label `vf.pool=1` and the run id like
 * every other, so they are counted, recorded in the ledger and cleaned the same way.
 *
 * Grading sandboxes come from a pool of their own only when `graderSize` asks for one: they
 * are as fresh as ones started on demand (started for grading, never used before, never
 * reused), only started ahead of need; otherwise `acquire(spec, { role: "grader" })` starts
 * a fresh one. With `size: 0` and no `graderSize` the pool only applies the limits.
 * @module
 */

import { SandboxStateError } from "./errors.ts";
import type { LimitedRuntime, SandboxLimits, SandboxSlot } from "./limits.ts";
import { createRuntime } from "./create.ts";
import type { Runtime, RuntimeSpec } from "./runtime.ts";

/** Options of {@linkcode SandboxSource.acquire}. */
export interface AcquireOptions {
  /** Run id label of a fresh sandbox. */
  runId?: string;
  /** Task label of a fresh sandbox (pooled ones are started before their task is known). */
  task?: string;
  /** `grader` sandboxes are always fresh. Default `agent`. */
  role?: "agent" | "grader";
  /** The rollout's index in its group (a replay finds its record by it). */
  rollout?: number;
  /**
   * Started for this caller, never from or into a pool (the limits still apply): a sandbox of
   * a one-off shape, such as a fork group's snapshot, must not leave a pool of its kind behind.
   */
  unpooled?: boolean;
  /**
   * A live slot the caller already took for this sandbox ({@linkcode SandboxSource.reserve},
   * with the slots of what surrounds it): the sandbox starts fresh on it.
   */
  slot?: SandboxSlot;
  /**
   * Told when a sandbox started fresh starts waiting for its live slot (true) and when it
   * has it (false), before it is created: a caller timing the start can stop its clock
   * meanwhile.
   */
  onQueue?: (waiting: boolean) => void;
  signal?: AbortSignal;
}

/** A supplier of started sandboxes (what `AgentPolicy.sandboxes` takes). */
export interface SandboxSource {
  /** A started runtime for `spec`; the caller stops it. */
  acquire(spec: RuntimeSpec, options?: AcquireOptions): Promise<Runtime>;
  /** Stops what the source still holds. */
  close(): Promise<void>;
  /**
   * Takes `count` live slots of `type` at once, for a sandbox and what surrounds it (its
   * services, a relay); the sandbox's own goes to `acquire` as `slot`. Null when the source
   * applies no limit to that type. A source without it limits nothing of the kind.
   * @throws {SandboxLimitError} when `count` is more than the limit ever allows at once
   */
  reserve?(
    type: string,
    count: number,
    options?: { signal?: AbortSignal; onQueue?: (waiting: boolean) => void },
  ): Promise<SandboxSlot[] | null>;
  /**
   * A replay's source: its sandboxes answer from a record, so what surrounds a sandbox
   * (networks, services, relays) is not built again.
   */
  readonly replaying?: boolean;
  /** A replay's recorded toolset calls of a rollout (`tools` and `calls`), if any. */
  recordedTools?(
    task: string,
    rollout: number,
  ): { tools: unknown[]; calls: unknown[] } | null;
}

/** Builds a runtime (not started); default `createRuntime`. */
export type RuntimeFactory = (
  spec: RuntimeSpec,
  options: { runId?: string; task?: string },
) => Runtime;

/** Options of {@linkcode WarmPool}. */
export interface WarmPoolOptions {
  /** Started sandboxes kept ready per sandbox shape; default 0 (no pooling). */
  size?: number;
  /** Started, never-used grading sandboxes kept ready per shape; default 0 (started on demand). */
  graderSize?: number;
  /** Run id label of pooled sandboxes. */
  runId?: string;
  /** Live-count and creation-rate limits applied to every sandbox, pooled or fresh. */
  limits?: SandboxLimits;
  /** Default `createRuntime`. */
  create?: RuntimeFactory;
}

/** Counters of a pool's use. */
export interface WarmPoolStats {
  /** Acquires served by a sandbox that was already started. */
  hits: number;
  /** Agent acquires that had to start a sandbox (pool empty or not yet filled). */
  misses: number;
  /** Grading (never pooled) acquires. */
  fresh: number;
  /** Pooled starts that failed. */
  failures: number;
  /** Idle pooled sandboxes stopped to free a slot for a waiting request. */
  evicted: number;
  /** Sandboxes ready now, over all shapes. */
  ready: number;
  /** Pooled starts in flight. */
  starting: number;
}

interface Waiter {
  resolve: (runtime: Runtime | undefined) => void;
}

interface Bucket {
  key: string;
  /** Sandboxes kept ready or starting. */
  size: number;
  spec: RuntimeSpec;
  ready: Runtime[];
  starting: number;
  inflight: Set<Promise<void>>;
  waiters: Waiter[];
  failures: number;
  retryAt: number;
}

function canonical(value: unknown): string {
  if (Array.isArray(value)) return `[${value.map(canonical).join(",")}]`;
  if (value && typeof value === "object") {
    const entries = Object.entries(value as Record<string, unknown>)
      .filter(([, v]) => v !== undefined)
      .sort(([a], [b]) => (a < b ? -1 : a > b ? 1 : 0));
    return `{${entries.map(([k, v]) => `${JSON.stringify(k)}:${canonical(v)}`).join(",")}}`;
  }
  return JSON.stringify(value);
}

/**
 * A pooled sandbox counts as ready once whatever it opens beside its start is open too (a
 * Docker sandbox's command channel), so its first command is as fast as any other.
 */
async function fullyWarm(runtime: Runtime): Promise<void> {
  const inner = (runtime as { inner?: Runtime }).inner ?? runtime;
  await (inner as { channelReady?: () => Promise<boolean> }).channelReady?.();
}

/** The pool key of a spec: canonical JSON of everything but its labels. */
export function poolKey(spec: RuntimeSpec): string {
  const { labels: _labels, ...shape } = spec as RuntimeSpec & { labels?: unknown };
  return canonical(shape);
}

/** How long after a pooled sandbox is handed out its replacement starts. */
const REFILL_DELAY_MS = 25;

/** Keeps started sandboxes ready per sandbox shape. */
export class WarmPool implements SandboxSource {
  readonly size: number;
  readonly graderSize: number;
  readonly #options: WarmPoolOptions;
  readonly #create: RuntimeFactory;
  readonly #buckets = new Map<string, Bucket>();
  #closed = false;
  #hits = 0;
  #misses = 0;
  #fresh = 0;
  #failures = 0;
  #evicted = 0;
  readonly #retryTimers = new Map<Bucket, ReturnType<typeof setTimeout>>();

  constructor(options: WarmPoolOptions = {}) {
    this.size = Math.max(0, Math.floor(options.size ?? 0));
    this.graderSize = Math.max(0, Math.floor(options.graderSize ?? 0));
    this.#options = options;
    this.#create = options.create ?? ((spec, o) => createRuntime(spec, o));
  }

  /** The sandbox limits it applies (`[limits]`), if any. */
  get limits(): SandboxLimits | undefined {
    return this.#options.limits;
  }

  /** Use counters. */
  get stats(): WarmPoolStats {
    let ready = 0;
    let starting = 0;
    for (const b of this.#buckets.values()) {
      ready += b.ready.length;
      starting += b.starting;
    }
    return {
      hits: this.#hits,
      misses: this.#misses,
      fresh: this.#fresh,
      failures: this.#failures,
      evicted: this.#evicted,
      ready,
      starting,
    };
  }

  #wrap(runtime: Runtime, priority: "normal" | "low", slot?: SandboxSlot): Runtime {
    if (!this.#options.limits) {
      slot?.release();
      return runtime;
    }
    return this.#options.limits.wrap(runtime, { priority, slot });
  }

  /**
   * Takes `count` slots of `type` at once, stopping idle pooled sandboxes while it waits
   * (they could otherwise hold the slots it needs while nobody uses them).
   */
  async reserve(
    type: string,
    count: number,
    options: { signal?: AbortSignal; onQueue?: (waiting: boolean) => void } = {},
  ): Promise<SandboxSlot[] | null> {
    const limiter = this.#options.limits?.for(type);
    if (!limiter || limiter.limit.maxLive === undefined) return null;
    if (limiter.fits(count)) return await limiter.reserve(count, options);
    options.onQueue?.(true);
    const reserving = limiter.reserve(count, options);
    let done = false;
    reserving.then(() => {
      done = true;
      options.onQueue?.(false);
    }, () => (done = true));
    // Pooled sandboxes still starting are not evicted here: one that finds a request waiting
    // once started stops again instead of joining the pool (see #refill).
    while (!done && await this.#evictIdle(type));
    return await reserving;
  }

  /** Starts a sandbox now (outside the pool). */
  async #startFresh(spec: RuntimeSpec, options: AcquireOptions): Promise<Runtime> {
    const runtime = this.#wrap(
      this.#create(spec, { runId: options.runId ?? this.#options.runId, task: options.task }),
      "normal",
      options.slot,
    );
    const limiter = this.#options.limits?.for(spec.type);
    const full = !options.slot && limiter !== undefined && !limiter.hasFreeSlot;
    // Queue for a slot first, so a slot freed by an eviction comes to this request.
    const starting = (runtime as LimitedRuntime).start({
      signal: options.signal,
      onQueue: options.onQueue,
    });
    if (full) await this.#evictIdle(spec.type);
    await starting;
    return runtime;
  }

  /**
   * Stops one idle pooled sandbox of `type` so its slot goes to a request that is waiting:
   * otherwise idle pooled sandboxes (of another shape, or when a grader asks) could hold
   * every slot while nobody can use them.
   */
  async #evictIdle(type: string): Promise<boolean> {
    for (const bucket of this.#buckets.values()) {
      if (bucket.spec.type !== type) continue;
      const idle = bucket.ready.shift();
      if (idle) {
        this.#evicted++;
        await idle.stop().catch(() => {});
        return true;
      }
    }
    return false;
  }

  #bucket(spec: RuntimeSpec, role: "agent" | "grader" = "agent"): Bucket {
    const key = `${role}:${poolKey(spec)}`;
    let bucket = this.#buckets.get(key);
    if (!bucket) {
      const labels = { ...(spec as { labels?: Record<string, string> }).labels, "vf.pool": "1" };
      const pooled = (spec.type === "docker" || spec.type === "kubernetes" || "labels" in spec)
        ? { ...spec, labels } as RuntimeSpec
        : spec;
      bucket = {
        key,
        size: role === "grader" ? this.graderSize : this.size,
        spec: pooled,
        ready: [],
        starting: 0,
        inflight: new Set(),
        waiters: [],
        failures: 0,
        retryAt: 0,
      };
      this.#buckets.set(key, bucket);
    }
    return bucket;
  }

  /** Starts pooled sandboxes until `size` are ready or starting. */
  #refill(bucket: Bucket): void {
    if (this.#closed || bucket.size === 0) return;
    const wait = bucket.retryAt - Date.now();
    if (wait > 0) {
      if (!this.#retryTimers.has(bucket)) {
        this.#retryTimers.set(
          bucket,
          setTimeout(() => {
            this.#retryTimers.delete(bucket);
            this.#refill(bucket);
          }, wait),
        );
      }
      return;
    }
    while (bucket.ready.length + bucket.starting < bucket.size) {
      bucket.starting++;
      const runtime = this.#wrap(this.#create(bucket.spec, { runId: this.#options.runId }), "low");
      const started = runtime.start().then(() => fullyWarm(runtime)).then(
        () => {
          bucket.starting--;
          bucket.failures = 0;
          if (this.#closed) return runtime.stop().catch(() => {});
          const waiter = bucket.waiters.shift();
          if (waiter) {
            this.#hits++;
            waiter.resolve(runtime);
            this.#refill(bucket);
          } else if (this.#options.limits?.for(bucket.spec.type).wanted) {
            // A request waits for a slot (a fresh sandbox, a reservation): idle in the pool,
            // this one would hold it while nobody uses it.
            this.#evicted++;
            return runtime.stop().catch(() => {});
          } else bucket.ready.push(runtime);
        },
        () => {
          bucket.starting--;
          bucket.failures++;
          this.#failures++;
          // Back off so an unreachable backend is not hammered by refills.
          bucket.retryAt = Date.now() + Math.min(30_000, 500 * 2 ** (bucket.failures - 1));
          bucket.waiters.shift()?.resolve(undefined);
        },
      ).finally(() => bucket.inflight.delete(started));
      bucket.inflight.add(started);
    }
  }

  /**
   * A started sandbox for `spec`: a pooled one when ready, else one being started for the
   * pool, else a fresh one. Grading sandboxes are always fresh.
   */
  async acquire(spec: RuntimeSpec, options: AcquireOptions = {}): Promise<Runtime> {
    if (this.#closed) throw new SandboxStateError("The warm pool is closed");
    options.signal?.throwIfAborted();
    const role = options.role ?? "agent";
    if (
      options.unpooled || options.slot ||
      (role === "grader" ? this.graderSize === 0 : this.size === 0)
    ) {
      if (role === "grader") this.#fresh++;
      else this.#misses++;
      return await this.#startFresh(spec, options);
    }
    const bucket = this.#bucket(spec, role);
    const ready = bucket.ready.shift();
    if (ready) {
      this.#hits++;
      // The refill starts a moment later: its engine calls would otherwise share the event
      // loop with the borrower's first command (1.9x one command's round trip; 1.2x after).
      setTimeout(() => this.#refill(bucket), REFILL_DELAY_MS);
      return ready;
    }
    this.#refill(bucket);
    if (bucket.starting > bucket.waiters.length) {
      const runtime = await new Promise<Runtime | undefined>((resolve, reject) => {
        const waiter: Waiter = { resolve };
        bucket.waiters.push(waiter);
        options.signal?.addEventListener("abort", () => {
          const i = bucket.waiters.indexOf(waiter);
          if (i >= 0) bucket.waiters.splice(i, 1);
          reject(options.signal!.reason);
        }, { once: true });
      });
      if (runtime) return runtime;
    }
    this.#misses++;
    return await this.#startFresh(spec, options);
  }

  /**
   * Fills the pool for `spec` and waits until its sandboxes are started (or failed).
   * @param options.role `grader` fills the grading pool (`graderSize`); default `agent`
   */
  async prewarm(spec: RuntimeSpec, options: { role?: "agent" | "grader" } = {}): Promise<void> {
    const bucket = this.#bucket(spec, options.role ?? "agent");
    this.#refill(bucket);
    await Promise.allSettled([...bucket.inflight]);
  }

  /** Stops every pooled sandbox, including those still starting. Idempotent. */
  async close(): Promise<void> {
    this.#closed = true;
    for (const timer of this.#retryTimers.values()) clearTimeout(timer);
    this.#retryTimers.clear();
    const stops: Promise<unknown>[] = [];
    for (const bucket of this.#buckets.values()) {
      for (const waiter of bucket.waiters.splice(0)) waiter.resolve(undefined);
      for (const runtime of bucket.ready.splice(0)) stops.push(runtime.stop().catch(() => {}));
      stops.push(...bucket.inflight);
    }
    await Promise.allSettled(stops);
  }

  [Symbol.asyncDispose](): Promise<void> {
    return this.close();
  }
}
