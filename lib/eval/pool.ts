/**
 * The worker pool under `generate` and a taskset run: workers pull jobs from a queue, asking a
 * start gate (a budget, `vf ctl`'s control, an adaptive limit) before each; a job interrupted
 * by `vf ctl pause --now` goes back to the front of the queue; jobs a `vf ctl requeue` sends
 * back go to the front too, with new workers for them (up to the pool's size) when the others
 * have ended on an empty queue.
 * @module
 */
/** How a job went, as its gate hears it (null: let start, but it never ran). */
export type JobOutcome = { ok: boolean; latencyMs?: number } | null;

/**
 * What the pool asks before each job and tells after it (evaluate's `StartGate` is one):
 * `wanted` says whether the worker still has a job to start.
 */
export interface PoolGate {
  allows(size: number, wanted: () => boolean): boolean | Promise<boolean>;
  finished(outcome: JobOutcome, size: number): void;
}

/**
 * What a job's run returns: its outcome, or `"ok"`/`"infra"` for one whose latency is the
 * time it ran (`"infra"`: an infrastructure error, which backs an adaptive limit off);
 * `"interrupted"` to go back to the front of the queue (neither done nor counted); `"stop"` to
 * end this worker (the run is ending).
 */
export type JobResult = Exclude<JobOutcome, null> | "ok" | "infra" | "interrupted" | "stop";

/** Options of {@link WorkerPool}. */
export interface WorkerPoolOptions<J> {
  /** Workers at most, at the start and after a requeue; `Infinity` is one per job. */
  workers: number;
  /** No job starts once it is aborted. */
  signal: AbortSignal;
  /** Asked before each job starts, told when it ends. */
  gate?: PoolGate;
  /** Rollouts a job holds (what the gate hears); default 1. */
  sizeOf?: (job: J) => number;
  /** Runs one job; the gate hears how it went once it returns (`{ ok: false }` for `"stop"`). */
  run: (job: J) => Promise<JobResult>;
  /**
   * Hears what a job's run threw, and the worker ends (the gate hears `{ ok: false }`); without
   * it the first throw ends every worker and {@link WorkerPool.run} throws it.
   */
  onError?: (error: unknown) => void;
  /** Hears each job put back at the front of the queue after an interruption. */
  onInterrupted?: (job: J) => void;
}

/** A queue of jobs and the workers that run them; see the module doc. */
export class WorkerPool<J> {
  #queue: J[];
  #next = 0;
  #workers = new Set<Promise<void>>();
  #ended = false;
  #failure: { error: unknown } | null = null;
  #options: WorkerPoolOptions<J>;

  /** @param jobs the queue, in order; the pool owns it from here on */
  constructor(jobs: J[], options: WorkerPoolOptions<J>) {
    this.#queue = jobs;
    this.#options = options;
  }

  /** Whether a requeue can still be taken: the pool has not ended and the run goes on. */
  get open(): boolean {
    return !this.#ended && !this.#options.signal.aborted;
  }

  /**
   * Runs the queue until it is empty and every worker has ended (or the signal aborts).
   * @throws what a job's `run` threw, once every worker has ended
   */
  async run(): Promise<void> {
    try {
      this.#spawn(Math.min(this.#options.workers, this.#queue.length));
      while (this.#workers.size) await Promise.all([...this.#workers]);
    } finally {
      this.#ended = true;
    }
    if (this.#failure) throw this.#failure.error;
  }

  /**
   * Puts `jobs` at the front of the queue, in order, and starts workers for them up to the
   * pool's size. Returns false, taking nothing, once the pool is not {@link open}.
   */
  requeue(jobs: J[]): boolean {
    if (!this.open) return false;
    this.#queue.splice(this.#next, 0, ...jobs);
    const room = this.#options.workers - this.#workers.size;
    this.#spawn(Math.max(0, Math.min(room, jobs.length)));
    return true;
  }

  #spawn(count: number): void {
    for (let i = 0; i < count; i++) {
      const w: Promise<void> = this.#worker().finally(() => this.#workers.delete(w));
      this.#workers.add(w);
    }
  }

  /** Whether a worker may take the next job. */
  #wanted = (): boolean =>
    this.#next < this.#queue.length && !this.#options.signal.aborted && !this.#failure;

  async #worker(): Promise<void> {
    const { gate, run, onInterrupted, onError } = this.#options;
    const sizeOf = this.#options.sizeOf ?? (() => 1);
    const queue = this.#queue;
    while (this.#wanted()) {
      // The gate hears the size of the job this worker will take; a job another worker took
      // meanwhile (one of a different size in its place) is asked for again.
      const size = sizeOf(queue[this.#next]);
      if (gate && !(await gate.allows(size, this.#wanted))) return;
      if (!this.#wanted()) {
        gate?.finished(null, size);
        return;
      }
      if (sizeOf(queue[this.#next]) !== size) {
        gate?.finished(null, size);
        continue;
      }
      const job = queue[this.#next++];
      const t0 = gate ? performance.now() : 0;
      let result: JobResult = "stop";
      try {
        result = await run(job);
      } catch (error) {
        if (onError) onError(error);
        else this.#failure ??= { error };
      } finally {
        gate?.finished(
          result === "interrupted"
            ? null
            : result === "stop"
            ? { ok: false }
            : typeof result === "string"
            ? { ok: result === "ok", latencyMs: performance.now() - t0 }
            : result,
          size,
        );
      }
      if (result === "stop") return;
      if (result === "interrupted") {
        // Back to the front of the queue: it never ran as far as the gate is concerned.
        queue.splice(this.#next, 0, job);
        onInterrupted?.(job);
      }
    }
  }
}
