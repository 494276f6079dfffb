/**
 * `results.jsonl` (one {@linkcode RolloutOutput} a line) and the run metadata: pass@k, the
 * metadata builder, the streaming writer, and the readers.
 * @module
 */
import { mkdir, open, readFile, rename, writeFile } from "node:fs/promises";
import type { FileHandle } from "node:fs/promises";
import { dirname, join } from "node:path";
import { ConfigError } from "../errors.ts";
import type { RolloutOutput } from "../state.ts";
import type { Tool } from "../types.ts";
import { type CorruptLine, readJsonLines, repairTrailingLine } from "./jsonl.ts";

export {
  type CorruptLine,
  readJsonLines,
  type ReadJsonLinesOptions,
  repairTrailingLine,
} from "./jsonl.ts";

/** pass@k and pass^k for one example with `c` correct of `n`. */
export function passAtK(n: number, c: number, k: number): { pass: number; passAll: number } {
  const comb = (a: number, b: number): number => {
    if (b < 0 || b > a) return 0;
    let r = 1;
    for (let i = 1; i <= b; i++) r = (r * (a - b + i)) / i;
    return r;
  };
  const total = comb(n, k);
  return {
    pass: n - c < k ? 1 : 1 - comb(n - c, k) / total,
    passAll: comb(c, k) / total,
  };
}

/**
 * Errors the model itself caused (malformed or failing tool calls an environment chose to stop
 * on): such a rollout was scored, and its reward counts like any other.
 */
const MODEL_CAUSED = new Set(["ToolError", "ToolParseError", "ToolCallError"]);

/** An output that errored without being scored: it stays out of averages and pass@k. */
export function isUnscoredOutput(o: RolloutOutput): boolean {
  return o.error !== null && o.error !== undefined && !MODEL_CAUSED.has(o.error.error);
}

/** The fixed part of the metadata, known before any rollout finishes. */
export interface MetadataBase {
  format_version: number;
  env_id: string;
  env_args: Record<string, unknown>;
  model: string;
  base_url: string;
  num_examples: number;
  rollouts_per_example: number;
  sampling_args: Record<string, unknown>;
  pass_threshold: number;
  vf_version: string;
  [extra: string]: unknown;
}

/** Run-level aggregates, as written to `metadata.json`. */
export interface RunMetadata extends MetadataBase {
  date: string;
  time_ms: number;
  num_rollouts: number;
  /**
   * Mean reward of the rollouts that were scored: errored rollouts (model, sandbox, a reward
   * function that failed) are left out, never counted as 0. null when none was scored
   * (`avg_reward_reason` says why).
   */
  avg_reward: number | null;
  /** Why `avg_reward` is null. */
  avg_reward_reason?: string;
  /** Means over the scored rollouts, like `avg_reward`. */
  avg_metrics: Record<string, number>;
  /** Fraction of rollouts that errored. */
  avg_error: number;
  /** Rollouts that errored. */
  num_errors: number;
  /**
   * Errored rollouts that were never scored (model endpoint, sandbox, a reward that failed,
   * a denied permission): left out of `avg_reward`, `avg_metrics` and `pass_at_k`. Errors the
   * model caused itself (its tool calls, for an env that stops on them) count as scored.
   */
  num_unscored: number;
  /** Model-request retries summed over the rollouts (`model_retries` of each). */
  num_model_retries: number;
  /** pass@k over each example's scored rollouts (examples with fewer than k left out of k). */
  pass_at_k: Record<string, number>;
  pass_all_k: Record<string, number>;
  /** Unscored rollouts of finished examples, left out of `pass_at_k` and `pass_all_k`. */
  pass_at_k_excluded: number;
  usage: {
    input_tokens: number;
    output_tokens: number;
    total_input_tokens: number;
    total_output_tokens: number;
  } | null;
  tools: Tool[] | null;
}

const NONE_YET = Symbol("none yet");

/** Incrementally aggregates outputs into {@link RunMetadata}. */
export class MetadataBuilder {
  #base: MetadataBase;
  #started = Date.now();
  #n = 0;
  #scored = 0;
  #rewardSum = 0;
  #errors = 0;
  #unscored = 0;
  #retries = 0;
  #metricSums = new Map<string, { sum: number; n: number }>();
  #usage = { n: 0, input: 0, output: 0 };
  #byExample = new Map<number, { n: number; scored: number; correct: number }>();
  #toolKey: string | null | undefined = undefined;
  #tools: Tool[] | null = null;
  /** The last output's tool list (`NONE_YET` before any): the same list needs no new key. */
  #lastToolDefs: RolloutOutput["tool_defs"] | undefined | typeof NONE_YET = NONE_YET;

  constructor(base: MetadataBase) {
    this.#base = base;
  }

  /** The fixed part of the metadata. */
  get base(): MetadataBase {
    return this.#base;
  }

  /** Count of outputs added. */
  get count(): number {
    return this.#n;
  }

  /** Mean reward of the scored outputs so far (0 before any; errored ones left out). */
  get meanReward(): number {
    return this.#scored ? this.#rewardSum / this.#scored : 0;
  }

  /** Fold outputs in. */
  add(outputs: RolloutOutput[]): void {
    // pass@k needs each example's counts only when there are several rollouts of it.
    const perExample = this.#base.rollouts_per_example > 1;
    for (const o of outputs) {
      this.#n++;
      this.#retries += Number(o.model_retries ?? 0);
      let ex = perExample ? this.#byExample.get(o.example_id) : undefined;
      if (perExample && !ex) {
        this.#byExample.set(o.example_id, ex = { n: 0, scored: 0, correct: 0 });
      }
      if (ex) ex.n++;
      this.#addTools(o);
      if (o.token_usage) {
        this.#usage.n++;
        this.#usage.input += o.token_usage.input_tokens;
        this.#usage.output += o.token_usage.output_tokens;
      }
      if (o.error) this.#errors++;
      if (isUnscoredOutput(o)) {
        this.#unscored++;
        continue;
      }
      this.#scored++;
      if (ex) {
        ex.scored++;
        if (Number(o.reward ?? 0) >= this.#base.pass_threshold) ex.correct++;
      }
      this.#rewardSum += Number(o.reward ?? 0);
      const metrics = o.metrics ?? {};
      for (const k in metrics) {
        const v = metrics[k];
        if (typeof v !== "number") continue;
        let m = this.#metricSums.get(k);
        if (!m) this.#metricSums.set(k, m = { sum: 0, n: 0 });
        m.sum += v;
        m.n++;
      }
    }
  }

  /** Takes back outputs {@link add} folded in (a requeued rollout's errored first run). */
  remove(outputs: RolloutOutput[]): void {
    const perExample = this.#base.rollouts_per_example > 1;
    for (const o of outputs) {
      this.#n--;
      this.#retries -= Number(o.model_retries ?? 0);
      const ex = perExample ? this.#byExample.get(o.example_id) : undefined;
      if (ex) ex.n--;
      if (o.token_usage) {
        this.#usage.n--;
        this.#usage.input -= o.token_usage.input_tokens;
        this.#usage.output -= o.token_usage.output_tokens;
      }
      if (o.error) this.#errors--;
      if (isUnscoredOutput(o)) {
        this.#unscored--;
        continue;
      }
      this.#scored--;
      if (ex) {
        ex.scored--;
        if (Number(o.reward ?? 0) >= this.#base.pass_threshold) ex.correct--;
      }
      this.#rewardSum -= Number(o.reward ?? 0);
      const metrics = o.metrics ?? {};
      for (const k in metrics) {
        const v = metrics[k];
        const m = this.#metricSums.get(k);
        if (typeof v !== "number" || !m) continue;
        m.sum -= v;
        m.n--;
        if (m.n === 0) this.#metricSums.delete(k);
      }
    }
  }

  /** The tool list, kept while every output had the same one. */
  #addTools(o: RolloutOutput): void {
    // Rollouts of one environment mostly share one list: nothing to compare then.
    if (o.tool_defs === this.#lastToolDefs) return;
    this.#lastToolDefs = o.tool_defs;
    const key = o.tool_defs?.length ? o.tool_defs.map((t) => t.name).sort().join(",") : "";
    if (this.#toolKey === undefined) {
      this.#toolKey = key;
      this.#tools = o.tool_defs && o.tool_defs.length ? o.tool_defs : null;
    } else if (this.#toolKey !== key) {
      this.#toolKey = null;
      this.#tools = null;
    }
  }

  /** The metadata as of now. */
  build(): RunMetadata {
    const r = this.#base.rollouts_per_example;
    const passAt: Record<string, number> = {};
    const passAll: Record<string, number> = {};
    let excluded = 0;
    if (r > 1) {
      const complete = [...this.#byExample.values()].filter((e) => e.n === r);
      for (const e of complete) excluded += e.n - e.scored;
      for (let k = 1; k <= r; k *= 2) {
        const counted = complete.filter((e) => e.scored >= k);
        if (counted.length === 0) continue;
        let p = 0;
        let pa = 0;
        for (const e of counted) {
          const v = passAtK(e.scored, e.correct, k);
          p += v.pass;
          pa += v.passAll;
        }
        passAt[String(k)] = p / counted.length;
        passAll[String(k)] = pa / counted.length;
      }
    }
    const avgMetrics: Record<string, number> = {};
    for (const [k, m] of this.#metricSums) avgMetrics[k] = m.sum / m.n;
    return {
      ...this.#base,
      date: new Date().toISOString(),
      time_ms: Date.now() - this.#started,
      num_rollouts: this.#n,
      avg_reward: this.#scored ? this.meanReward : null,
      ...(this.#scored ? {} : {
        avg_reward_reason: this.#n
          ? `no rollout (of ${this.#n}) was scored: every one errored`
          : "no rollout has finished",
      }),
      avg_metrics: avgMetrics,
      avg_error: this.#n ? this.#errors / this.#n : 0,
      num_errors: this.#errors,
      num_unscored: this.#unscored,
      num_model_retries: this.#retries,
      pass_at_k: passAt,
      pass_all_k: passAll,
      pass_at_k_excluded: excluded,
      usage: this.#usage.n
        ? {
          input_tokens: this.#usage.input / this.#usage.n,
          output_tokens: this.#usage.output / this.#usage.n,
          total_input_tokens: this.#usage.input,
          total_output_tokens: this.#usage.output,
        }
        : null,
      tools: this.#tools,
    };
  }
}

/** How long `results.jsonl` stays open after the last append. */
const IDLE_CLOSE_MS = 1000;
/** What `writeMetadata` returns when nothing was written now (it never rejects). */
export const RESOLVED: Promise<void> = Promise.resolve();
/** Appends within this long of the last write wait for it, to be written together. */
const COALESCE_MS = 10;
/** A batch buffer up to this size is kept for the next batch; a larger one is let go. */
const KEEP_BUFFER_BYTES = 1 << 20;
/** A batch buffer's first size. */
const BATCH_BUFFER_BYTES = 64 * 1024;
const encoder = new TextEncoder();

/** Appends outputs to `results.jsonl` and rewrites `metadata.json` atomically. */
export class ResultsWriter {
  readonly dir: string;
  /** Minimum time between metadata rewrites; pending metadata is written by `flush()`. */
  readonly metadataIntervalMs: number;
  /** Appends within this many ms of the last write wait to be written with the next ones. */
  readonly coalesceMs: number;
  #repaired = false;
  #dirReady = false;
  /** `results.jsonl`, open for appending while appends keep coming (see `#writeLines`). */
  #handle: FileHandle | undefined;
  #idleTimer: ReturnType<typeof setTimeout> | undefined;
  #lastWriteAt = 0;
  #queue: Promise<void> = Promise.resolve();
  /**
   * The lines appended since the last write began, as UTF-8 with their newlines: each line is
   * encoded as it is appended, so its string dies young instead of waiting (and surviving a
   * scavenge) until the batch is written.
   */
  #pending = new Uint8Array(BATCH_BUFFER_BYTES);
  #pendingAt = 0;
  #pendingCount = 0;
  /** The buffer of the write in flight, which becomes the next batch's once it is done. */
  #spare: Uint8Array<ArrayBuffer> | null = new Uint8Array(BATCH_BUFFER_BYTES);
  /** Lines appended but not yet on disk (queued or being written). */
  #unwritten = 0;
  /**
   * The promise of the batch being gathered, shared by all its appends (one promise per
   * batch, not one and its resolvers per append); null until the batch's first append.
   */
  #batchDone: PromiseWithResolvers<void> | null = null;
  #flushScheduled = false;
  #flushTimer: ReturnType<typeof setTimeout> | undefined;
  #lastFlushAt = -Infinity;
  #pendingMetadata: Record<string, unknown> | (() => Record<string, unknown>) | null = null;
  #metadataTimer: ReturnType<typeof setTimeout> | undefined;
  #lastMetadataAt = 0;

  constructor(dir: string, options: { metadataIntervalMs?: number; coalesceMs?: number } = {}) {
    this.dir = dir;
    this.metadataIntervalMs = options.metadataIntervalMs ?? 500;
    this.coalesceMs = options.coalesceMs ?? COALESCE_MS;
  }

  /** Outputs appended whose lines are not on disk yet. */
  get unwritten(): number {
    return this.#unwritten;
  }

  get resultsPath(): string {
    return join(this.dir, "results.jsonl");
  }

  get metadataPath(): string {
    return join(this.dir, "metadata.json");
  }

  #enqueue(job: () => Promise<void>): Promise<void> {
    const next = this.#queue.then(job);
    this.#queue = next.catch(() => {});
    return next;
  }

  /**
   * Append outputs (serialised one per line), repairing a torn last line first. Appends
   * that arrive together are written with one call, and so are appends that arrive within
   * `coalesceMs` (10 ms) of the last write (rollouts finishing one by one, as replies come in, would
   * otherwise cost a write each); the promise resolves once on disk. Appends written in the
   * same batch get the same promise.
   */
  append(outputs: RolloutOutput[]): Promise<void> {
    for (const o of outputs) {
      const line = this.#lineOf(o);
      if (line === null) continue;
      this.#push(line);
      this.#unwritten++;
    }
    const done = (this.#batchDone ??= Promise.withResolvers<void>()).promise;
    if (!this.#flushScheduled) {
      this.#flushScheduled = true;
      const wait = this.#lastFlushAt + this.coalesceMs - performance.now();
      if (wait <= 0) queueMicrotask(() => this.#enqueue(this.#writePending));
      else {
        this.#flushTimer = setTimeout(() => {
          this.#flushTimer = undefined;
          this.#enqueue(this.#writePending);
        }, wait);
      }
    }
    return done;
  }

  /**
   * The output's line, or null when it cannot be saved: a row without an integer
   * `example_id`, or with a column JSON cannot hold, is refused with a warning naming the
   * file and the column, and the run goes on (upstream logs and skips such a row too).
   */
  #lineOf(o: RolloutOutput): string | null {
    // The warnings' text is built only when one is given (this runs once per rollout).
    if (!Number.isInteger(o.example_id)) {
      return this.#refuse(
        `without an integer "example_id" (got ${describe(o.example_id)}); ` +
          `format rows with env.getEvalDataset()`,
      );
    }
    for (const key in o) {
      const kind = typeof o[key];
      if (kind === "function" || kind === "symbol") {
        return this.#refuse(
          `of example_id ${o.example_id}: column "${key}" is a ${kind}, which JSON cannot hold`,
        );
      }
    }
    try {
      return JSON.stringify(o);
    } catch (error) {
      const column = Object.keys(o).find((key) => {
        try {
          JSON.stringify(o[key]);
          return false;
        } catch {
          return true;
        }
      });
      return this.#refuse(
        `of example_id ${o.example_id}: column "${column}" cannot be serialised (${
          (error as Error).message
        }); ` +
          `keep only JSON values (numbers, strings, lists, objects) in it`,
      );
    }
  }

  #refuse(why: string): null {
    console.warn(`${this.resultsPath}: not saving a rollout ${why}`);
    return null;
  }

  /** Write the lines appended so far (on the queue). */
  #writePending = async (): Promise<void> => {
    this.#flushScheduled = false;
    this.#lastFlushAt = performance.now();
    const count = this.#pendingCount;
    const waiters = this.#batchDone;
    const batch = this.#pending;
    const bytes = batch.subarray(0, this.#pendingAt);
    // Appends made while this batch is written go to the other buffer (writes never overlap,
    // so the last write's buffer is free by now).
    this.#pending = this.#spare ?? new Uint8Array(BATCH_BUFFER_BYTES);
    this.#spare = null;
    this.#pendingAt = 0;
    this.#pendingCount = 0;
    this.#batchDone = null;
    try {
      await this.#writeLines(bytes);
      waiters?.resolve();
    } catch (error) {
      waiters?.reject(error);
    } finally {
      this.#unwritten -= count;
      if (batch.length <= KEEP_BUFFER_BYTES) this.#spare = batch;
    }
  };

  /** One line, encoded onto the pending batch. */
  #push(line: string): void {
    // UTF-8 takes at most three bytes per UTF-16 unit.
    const room = line.length * 3 + 1;
    let buffer = this.#pending;
    const at = this.#pendingAt;
    if (buffer.length - at < room) {
      const grown = new Uint8Array(Math.max(buffer.length * 2, at + room));
      grown.set(buffer.subarray(0, at));
      this.#pending = buffer = grown;
    }
    const end = at + encoder.encodeInto(line, buffer.subarray(at)).written;
    buffer[end] = 10;
    this.#pendingAt = end + 1;
    this.#pendingCount++;
  }

  async #ensureDir(): Promise<void> {
    await mkdir(this.dir, { recursive: true });
    this.#dirReady = true;
  }

  /**
   * Appends through a file handle kept open between appends: opening and closing the file
   * for every append cost more than the write itself. The handle is closed by `flush()` and
   * after `IDLE_CLOSE_MS` without appends. Runs on the queue, so writes never interleave.
   */
  async #writeLines(lines: Uint8Array): Promise<void> {
    if (!this.#handle) {
      if (!this.#dirReady) await this.#ensureDir();
      if (!this.#repaired) {
        await repairTrailingLine(this.resultsPath);
        this.#repaired = true;
      }
      try {
        this.#handle = await open(this.resultsPath, "a");
      } catch (error) {
        // The directory was removed since: make it again.
        if ((error as { code?: string }).code !== "ENOENT") throw error;
        await this.#ensureDir();
        this.#handle = await open(this.resultsPath, "a");
      }
      this.#armIdleClose(IDLE_CLOSE_MS);
    }
    try {
      await this.#handle.writeFile(lines);
    } catch (error) {
      await this.#closeHandle().catch(() => {}); // the next append opens the file afresh
      throw error;
    }
    this.#lastWriteAt = Date.now();
  }

  #armIdleClose(ms: number): void {
    const timer = setTimeout(() => {
      this.#idleTimer = undefined;
      const idle = Date.now() - this.#lastWriteAt;
      if (idle < IDLE_CLOSE_MS) this.#armIdleClose(IDLE_CLOSE_MS - idle);
      else this.#enqueue(() => this.#closeHandle()).catch(() => {});
    }, ms);
    // Never keep the process alive just to close a file.
    (timer as { unref?: () => void }).unref?.();
    this.#idleTimer = timer;
  }

  async #closeHandle(): Promise<void> {
    clearTimeout(this.#idleTimer);
    this.#idleTimer = undefined;
    const handle = this.#handle;
    this.#handle = undefined;
    await handle?.close();
  }

  /**
   * Rewrite `metadata.json` (temp file, then rename), at most every `metadataIntervalMs`.
   * A function is called only when the file is written, so callers can pass a builder
   * instead of building metadata for every call.
   */
  writeMetadata(
    metadata: Record<string, unknown> | (() => Record<string, unknown>),
  ): Promise<void> {
    this.#pendingMetadata = metadata;
    const wait = this.#lastMetadataAt + this.metadataIntervalMs - Date.now();
    if (wait <= 0) return this.#writePendingMetadata();
    // A write already due takes the newest metadata: nothing more to arrange (called per group).
    if (this.#metadataTimer !== undefined) return RESOLVED;
    this.#metadataTimer = setTimeout(() => {
      this.#metadataTimer = undefined;
      this.#writePendingMetadata().catch(() => {});
    }, wait);
    return RESOLVED;
  }

  #writePendingMetadata(): Promise<void> {
    clearTimeout(this.#metadataTimer);
    this.#metadataTimer = undefined;
    return this.#enqueue(async () => {
      const pending = this.#pendingMetadata;
      if (!pending) return;
      this.#pendingMetadata = null;
      this.#lastMetadataAt = Date.now();
      const metadata = typeof pending === "function" ? pending() : pending;
      await writeJsonAtomic(this.metadataPath, metadata);
    });
  }

  /** Wait for queued writes, writing any pending metadata now, and close `results.jsonl`. */
  async flush(): Promise<void> {
    if (this.#flushTimer !== undefined) {
      // Lines waiting to be coalesced with later ones: there are none to wait for.
      clearTimeout(this.#flushTimer);
      this.#flushTimer = undefined;
      this.#enqueue(this.#writePending).catch(() => {}); // their appends hear of a failure
    }
    await this.#queue;
    if (this.#pendingMetadata) await this.#writePendingMetadata();
    await this.#enqueue(() => this.#closeHandle());
  }
}

/** Write JSON through a temp file and a rename, so readers never see half a file. */
export async function writeJsonAtomic(path: string, value: unknown): Promise<void> {
  await mkdir(dirname(path), { recursive: true });
  const tmp = `${path}.${crypto.randomUUID().slice(0, 8)}.tmp`;
  await writeFile(tmp, JSON.stringify(value, null, 2) + "\n");
  await rename(tmp, path);
}

/**
 * Read `results.jsonl`; corrupt lines are skipped and reported (see {@linkcode readJsonLines}),
 * and so is a row without an integer `example_id` (upstream ignores one too): it belongs to
 * no example, so no resume, summary or comparison can place it.
 */
export async function loadOutputs(
  dir: string,
  options: { onCorrupt?: (corrupt: CorruptLine) => void } = {},
): Promise<RolloutOutput[]> {
  const outputs = await readJsonLines<RolloutOutput>(join(dir, "results.jsonl"), {
    onCorrupt: options.onCorrupt,
    check: (o) => Number.isInteger(o.example_id) ? null : 'no integer "example_id"',
  });
  return latestOutputs(outputs);
}

/**
 * The outputs without those a later line ran again (`vf ctl requeue` writes the retry with
 * `retry_of`: the errored one's `trajectory_id`). The same array when nothing was retried.
 */
export function latestOutputs(outputs: RolloutOutput[]): RolloutOutput[] {
  let replaced: Set<unknown> | null = null;
  for (const o of outputs) {
    if (typeof o.retry_of === "string") (replaced ??= new Set()).add(o.retry_of);
  }
  return replaced ? outputs.filter((o) => !replaced.has(o.trajectory_id)) : outputs;
}

/** Read a run's `metadata.json`. */
export async function loadMetadata(dir: string): Promise<RunMetadata> {
  const path = join(dir, "metadata.json");
  let text: string;
  try {
    text = await readFile(path, "utf8");
  } catch {
    throw new ConfigError(`"${dir}" is not a results directory: "${path}" is missing`);
  }
  try {
    const value = JSON.parse(text);
    if (typeof value !== "object" || value === null || Array.isArray(value)) {
      throw new Error("not an object");
    }
    return value as RunMetadata;
  } catch (error) {
    throw new ConfigError(`${path}: invalid metadata: ${(error as Error).message}`);
  }
}

/** A value for a message: JSON where it can be, else its type. */
function describe(value: unknown): string {
  if (value === undefined) return "none";
  try {
    return JSON.stringify(value) ?? typeof value;
  } catch {
    return typeof value;
  }
}
