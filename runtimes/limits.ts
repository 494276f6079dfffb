/**
 * Sandbox limits per runtime type: at most `maxLive` sandboxes alive at once (a slot is taken
 * before the create request and given back once the sandbox is removed) and at most
 * `createRate` creations per second (a token bucket of depth `createBurst`). Limits wrap
 * `start()`: {@linkcode SandboxLimits.wrap} returns a runtime whose `start()` waits for a
 * slot and a token and whose `stop()` frees the slot. Model-connection limits are separate
 * (`lib/model/limits.ts`).
 * @module
 */

import type {
  ArchiveOutOptions,
  RunOptions,
  RunResult,
  Runtime,
  RuntimeCapabilities,
} from "./runtime.ts";

/** The limits of one runtime type; unset means unlimited. */
export interface SandboxLimit {
  /** Sandboxes alive at once (requested and not yet removed). */
  maxLive?: number;
  /** Creations per second. */
  createRate?: number;
  /** Creations allowed back to back before the rate applies; default 1. */
  createBurst?: number;
}

/** More sandboxes asked for at once than a limit ever allows. */
export class SandboxLimitError extends RangeError {
  constructor(readonly count: number, readonly limit: number) {
    super(`${count} sandboxes at once cannot fit a limit of ${limit} alive at once`);
    this.name = "SandboxLimitError";
  }
}

function abortError(signal: AbortSignal): unknown {
  return signal.reason ?? new DOMException("Aborted", "AbortError");
}

/** A FIFO token bucket: `take()` resolves when a token is free. */
export class TokenBucket {
  rate: number;
  readonly burst: number;
  #tokens: number;
  #last = performance.now();
  #queue: Array<{ resolve: () => void; reject: (e: unknown) => void; signal?: AbortSignal }> = [];
  #timer: ReturnType<typeof setTimeout> | undefined;

  /**
   * @param rate tokens per second (> 0)
   * @param burst bucket depth (≥ 1); default 1
   */
  constructor(rate: number, burst = 1) {
    if (!(rate > 0)) throw new RangeError(`Token bucket rate must be > 0, got ${rate}`);
    this.rate = rate;
    this.burst = Math.max(1, burst);
    this.#tokens = this.burst;
  }

  #refill(): void {
    const now = performance.now();
    this.#tokens = Math.min(this.burst, this.#tokens + ((now - this.#last) / 1000) * this.rate);
    this.#last = now;
  }

  #drain = (): void => {
    this.#timer = undefined;
    this.#refill();
    while (this.#queue.length && this.#tokens >= 1) {
      const next = this.#queue.shift()!;
      if (next.signal?.aborted) continue;
      this.#tokens -= 1;
      next.resolve();
    }
    if (this.#queue.length) {
      const wait = ((1 - this.#tokens) / this.rate) * 1000;
      this.#timer = setTimeout(this.#drain, Math.max(1, Math.ceil(wait)));
    }
  };

  /** Changes the rate from now on (what accrued so far stays); waiters are rescheduled. */
  setRate(rate: number): void {
    if (!(rate > 0)) throw new RangeError(`Token bucket rate must be > 0, got ${rate}`);
    this.#refill();
    this.rate = rate;
    clearTimeout(this.#timer);
    this.#timer = undefined;
    if (this.#queue.length) this.#drain();
  }

  /** Waits for a token. */
  take(options: { signal?: AbortSignal } = {}): Promise<void> {
    const { signal } = options;
    if (signal?.aborted) return Promise.reject(abortError(signal));
    this.#refill();
    if (this.#queue.length === 0 && this.#tokens >= 1) {
      this.#tokens -= 1;
      return Promise.resolve();
    }
    return new Promise<void>((resolve, reject) => {
      const entry = { resolve, reject, signal };
      this.#queue.push(entry);
      signal?.addEventListener("abort", () => {
        const i = this.#queue.indexOf(entry);
        if (i >= 0) this.#queue.splice(i, 1);
        reject(abortError(signal));
      }, { once: true });
      if (!this.#timer) this.#drain();
    });
  }
}

/** A held live-sandbox slot. `release()` is idempotent. */
export interface SandboxSlot {
  release(): void;
}

interface Waiter {
  /** Slots wanted, all granted at once. */
  count: number;
  resolve: (slots: SandboxSlot[]) => void;
  reject: (e: unknown) => void;
  signal?: AbortSignal;
}

/** Live-count and creation-rate limits of one runtime type. */
export class SandboxLimiter {
  limit: Readonly<SandboxLimit>;
  #live = 0;
  #peak = 0;
  #high: Waiter[] = [];
  #low: Waiter[] = [];
  #bucket: TokenBucket | undefined;

  constructor(limit: SandboxLimit = {}) {
    if (limit.maxLive !== undefined && !(limit.maxLive >= 1)) {
      throw new RangeError(`maxLive must be at least 1, got ${limit.maxLive}`);
    }
    this.limit = { ...limit };
    if (limit.createRate !== undefined) {
      this.#bucket = new TokenBucket(limit.createRate, limit.createBurst ?? 1);
    }
  }

  /**
   * Changes the live limit while the run goes on (`vf ctl set max_sandboxes=N`): a lower one
   * stops nothing that runs, and waiters start as slots free below it.
   * @throws {RangeError} for a limit below 1
   */
  setMaxLive(n: number): void {
    if (!Number.isInteger(n) || n < 1) {
      throw new RangeError(`max_sandboxes must be a positive integer, got ${n}`);
    }
    this.limit = { ...this.limit, maxLive: n };
    this.#wake();
  }

  /** Changes the creation rate from now on (`vf ctl set sandbox_create_rate=R`). */
  setCreateRate(rate: number): void {
    if (!(rate > 0)) throw new RangeError(`sandbox_create_rate must be > 0, got ${rate}`);
    this.limit = { ...this.limit, createRate: rate };
    if (this.#bucket) this.#bucket.setRate(rate);
    else this.#bucket = new TokenBucket(rate, this.limit.createBurst ?? 1);
  }

  /** Slots held now. */
  get live(): number {
    return this.#live;
  }

  /** The most slots held at once. */
  get peak(): number {
    return this.#peak;
  }

  /** Callers waiting for a slot. */
  get waiting(): number {
    return this.#high.length + this.#low.length;
  }

  /** True when a slot is free now and nobody is queued for it. */
  get hasFreeSlot(): boolean {
    return this.fits(1);
  }

  /** True when `count` slots are free now and nobody is queued for them. */
  fits(count: number): boolean {
    return this.waiting === 0 &&
      (this.limit.maxLive === undefined || this.#live + count <= this.limit.maxLive);
  }

  /** True when a request at normal priority waits for a slot (a pool should not keep one idle). */
  get wanted(): boolean {
    return this.#high.length > 0;
  }

  #grant(): SandboxSlot {
    this.#live++;
    this.#peak = Math.max(this.#peak, this.#live);
    let released = false;
    return {
      release: () => {
        if (released) return;
        released = true;
        this.#live--;
        this.#wake();
      },
    };
  }

  #grantMany(count: number): SandboxSlot[] {
    const slots: SandboxSlot[] = [];
    for (let i = 0; i < count; i++) slots.push(this.#grant());
    return slots;
  }

  /** Grants waiters in order while the first one's slots are free (it is never overtaken). */
  #wake(): void {
    const max = this.limit.maxLive ?? Infinity;
    for (;;) {
      const queue = this.#high.length ? this.#high : this.#low;
      const next = queue[0];
      if (!next) return;
      if (next.signal?.aborted) {
        queue.shift();
        continue;
      }
      if (this.#live + next.count > max) return;
      queue.shift();
      next.resolve(this.#grantMany(next.count));
    }
  }

  /**
   * Waits for a live slot, then for a creation token. `low` priority (warm-pool refills)
   * only gets a slot nobody at normal priority is waiting for.
   */
  async acquire(
    options: { signal?: AbortSignal; priority?: "normal" | "low" } = {},
  ): Promise<SandboxSlot> {
    const [slot] = await this.#slots(1, options);
    if (this.#bucket) {
      try {
        await this.#bucket.take({ signal: options.signal });
      } catch (error) {
        slot.release();
        throw error;
      }
    }
    return slot;
  }

  /**
   * Waits until `count` slots are free and takes them all at once, with no creation token:
   * what one sandbox needs around it (its services, a relay) and the sandbox itself, so a
   * rollout never holds some of them while it waits for the rest (rollouts doing that could
   * hold every slot between them and wait forever). A waiter is served in turn: later ones,
   * even smaller, wait behind it. Each slot is released on its own.
   * @throws {SandboxLimitError} when `count` is more than the limit allows at all
   */
  reserve(count: number, options: { signal?: AbortSignal } = {}): Promise<SandboxSlot[]> {
    return this.#slots(count, { signal: options.signal, priority: "normal" });
  }

  /** A creation token (slots taken by {@link reserve} come without one). */
  async token(options: { signal?: AbortSignal } = {}): Promise<void> {
    await this.#bucket?.take(options);
  }

  #slots(
    count: number,
    options: { signal?: AbortSignal; priority?: "normal" | "low" },
  ): Promise<SandboxSlot[]> {
    const { signal } = options;
    if (signal?.aborted) return Promise.reject(abortError(signal));
    const max = this.limit.maxLive ?? Infinity;
    if (!(count >= 1) || count > max) {
      return Promise.reject(new SandboxLimitError(count, max));
    }
    const queue = options.priority === "low" ? this.#low : this.#high;
    const ahead = options.priority === "low" ? this.waiting : this.#high.length;
    if (this.#live + count <= max && ahead === 0) return Promise.resolve(this.#grantMany(count));
    return new Promise<SandboxSlot[]>((resolve, reject) => {
      const waiter: Waiter = { count, resolve, reject, signal };
      queue.push(waiter);
      signal?.addEventListener("abort", () => {
        const i = queue.indexOf(waiter);
        if (i >= 0) {
          queue.splice(i, 1);
          reject(abortError(signal));
          // The ones behind it may fit now.
          if (i === 0) this.#wake();
        }
      }, { once: true });
    });
  }
}

/** Limits for every runtime type: defaults plus per-type overrides. */
export class SandboxLimits {
  #defaults: SandboxLimit;
  readonly #perType: Record<string, SandboxLimit>;
  readonly #limiters = new Map<string, SandboxLimiter>();

  /**
   * @param defaults limits of every runtime type (`max_sandboxes`, `sandbox_create_rate`)
   * @param perType overrides by runtime type
   */
  constructor(defaults: SandboxLimit = {}, perType: Record<string, SandboxLimit> = {}) {
    this.#defaults = defaults;
    this.#perType = perType;
  }

  /** The live limit of every runtime type (none: unlimited). */
  get maxLive(): number | undefined {
    return this.#defaults.maxLive;
  }

  /** The creation rate of every runtime type (none: unlimited). */
  get createRate(): number | undefined {
    return this.#defaults.createRate;
  }

  /** Sets the creation rate of every runtime type, per-type ones too, from now on. */
  setCreateRate(rate: number): void {
    if (!(rate > 0)) throw new RangeError(`sandbox_create_rate must be > 0, got ${rate}`);
    this.#defaults = { ...this.#defaults, createRate: rate };
    for (const type in this.#perType) {
      this.#perType[type] = { ...this.#perType[type], createRate: rate };
    }
    for (const limiter of this.#limiters.values()) limiter.setCreateRate(rate);
  }

  /** Sets the live limit of every runtime type, per-type ones too, from now on. */
  setMaxLive(n: number): void {
    if (!Number.isInteger(n) || n < 1) {
      throw new RangeError(`max_sandboxes must be a positive integer, got ${n}`);
    }
    this.#defaults = { ...this.#defaults, maxLive: n };
    for (const type in this.#perType) this.#perType[type] = { ...this.#perType[type], maxLive: n };
    for (const limiter of this.#limiters.values()) limiter.setMaxLive(n);
  }

  /** The limiter of a runtime type (created on first use). */
  for(type: string): SandboxLimiter {
    let limiter = this.#limiters.get(type);
    if (!limiter) {
      limiter = new SandboxLimiter({ ...this.#defaults, ...this.#perType[type] });
      this.#limiters.set(type, limiter);
    }
    return limiter;
  }

  /**
   * Wraps a runtime (not started) so its `start()` first takes a slot and a creation token
   * of its type and its `stop()` gives the slot back.
   * @param options.priority `low` for warm-pool refills
   * @param options.slot a slot the caller already took for it ({@linkcode SandboxLimiter.reserve}):
   *   `start()` then takes only a creation token, and `stop()` still gives the slot back
   */
  wrap(
    runtime: Runtime,
    options: { priority?: "normal" | "low"; slot?: SandboxSlot } = {},
  ): LimitedRuntime {
    return new LimitedRuntime(
      runtime,
      this.for(runtime.type),
      options.priority ?? "normal",
      options.slot,
    );
  }
}

/** A runtime whose lifetime holds a live slot of a {@linkcode SandboxLimiter}. */
export class LimitedRuntime implements Runtime {
  /** The wrapped runtime. */
  readonly inner: Runtime;
  readonly #limiter: SandboxLimiter;
  readonly #priority: "normal" | "low";
  #slot: SandboxSlot | undefined;
  /** A slot taken for it beforehand, used instead of waiting for one. */
  readonly #held: SandboxSlot | undefined;
  #starting: Promise<void> | undefined;
  #stopped = false;

  /** The wrapped runtime's snapshot, where it has one. */
  readonly snapshot?: Runtime["snapshot"];
  /** The wrapped runtime's killProcesses, where it has one. */
  readonly killProcesses?: Runtime["killProcesses"];

  constructor(
    inner: Runtime,
    limiter: SandboxLimiter,
    priority: "normal" | "low" = "normal",
    slot?: SandboxSlot,
  ) {
    this.inner = inner;
    this.#held = this.#slot = slot;
    if (inner.snapshot) this.snapshot = (options) => inner.snapshot!(options);
    if (inner.killProcesses) this.killProcesses = (options) => inner.killProcesses!(options);
    this.#limiter = limiter;
    this.#priority = priority;
  }

  get type(): string {
    return this.inner.type;
  }
  get id(): string {
    return this.inner.id;
  }
  get capabilities(): RuntimeCapabilities {
    return this.inner.capabilities;
  }

  /**
   * Waits for a slot and a creation token, then starts the wrapped runtime.
   * @param options.onQueue told when it starts waiting for a slot (true) and when it has it
   *   and its token (false), before the start
   */
  start(
    options: { signal?: AbortSignal; onQueue?: (waiting: boolean) => void } = {},
  ): Promise<void> {
    return this.#starting ??= (async () => {
      // Only a wait for a slot is told (a creation token comes within 1/rate seconds).
      const waited = !this.#held && !this.#limiter.hasFreeSlot;
      if (waited) options.onQueue?.(true);
      if (this.#held) {
        try {
          await this.#limiter.token({ signal: options.signal });
        } catch (error) {
          this.#held.release();
          throw error;
        }
      } else {
        this.#slot = await this.#limiter.acquire({
          signal: options.signal,
          priority: this.#priority,
        });
      }
      if (this.#stopped) {
        this.#slot!.release();
        throw new DOMException("The runtime was stopped while waiting for a slot", "AbortError");
      }
      if (waited) options.onQueue?.(false);
      try {
        // The wrapped runtime may wait its turn too (a dedicated host another sandbox holds).
        await this.inner.start({ signal: options.signal, onQueue: options.onQueue });
      } catch (error) {
        await this.stop().catch(() => {});
        throw error;
      }
    })();
  }

  run(argv: string[], options?: RunOptions): Promise<RunResult> {
    return this.inner.run(argv, options);
  }
  read(path: string, options?: { maxBytes?: number }): Promise<Uint8Array> {
    return this.inner.read(path, options);
  }
  write(path: string, data: string | Uint8Array, options?: { mode?: number }): Promise<void> {
    return this.inner.write(path, data, options);
  }
  archiveOut(path: string, options?: ArchiveOutOptions): Promise<Uint8Array> {
    return this.inner.archiveOut(path, options);
  }
  archiveIn(dir: string, tar: Uint8Array): Promise<void> {
    return this.inner.archiveIn(dir, tar);
  }

  /** Stops the wrapped runtime, then frees the slot (even when stopping failed). */
  async stop(): Promise<void> {
    this.#stopped = true;
    try {
      await this.inner.stop();
    } finally {
      this.#slot?.release();
    }
  }

  [Symbol.asyncDispose](): Promise<void> {
    return this.stop();
  }
}

/** The sandbox part of a `[limits]` table (snake_case, as in TOML). */
export interface SandboxLimitsConfig {
  max_sandboxes?: number;
  sandbox_create_rate?: number;
  sandbox_create_burst?: number;
  /** Per runtime type overrides (`[limits.runtime.docker]`). */
  runtime?: Record<
    string,
    { max_sandboxes?: number; sandbox_create_rate?: number; sandbox_create_burst?: number }
  >;
}

/** {@linkcode SandboxLimits} from a `[limits]` table; undefined when it sets no sandbox limit. */
export function sandboxLimitsFromConfig(
  config: SandboxLimitsConfig | undefined,
): SandboxLimits | undefined {
  if (!config) return undefined;
  const toLimit = (t: Omit<SandboxLimitsConfig, "runtime">): SandboxLimit => {
    const limit: SandboxLimit = {};
    if (t.max_sandboxes !== undefined) limit.maxLive = t.max_sandboxes;
    if (t.sandbox_create_rate !== undefined) limit.createRate = t.sandbox_create_rate;
    if (t.sandbox_create_burst !== undefined) limit.createBurst = t.sandbox_create_burst;
    return limit;
  };
  const defaults = toLimit(config);
  const perType = Object.fromEntries(
    Object.entries(config.runtime ?? {}).map(([type, t]) => [type, toLimit(t)]),
  );
  const any = Object.keys(defaults).length > 0 ||
    Object.values(perType).some((l) => Object.keys(l).length > 0);
  return any ? new SandboxLimits(defaults, perType) : undefined;
}
