/**
 * The viewer's index of a run: one SQLite row per rollout of its results file
 * (`results.jsonl` of `vf eval`, `traces.jsonl` of `vf run`; an episode line holds one per
 * trainable trace) with the line's place in the file and what the tables filter and sort by, so a 100k-rollout run pages without loading whole. The index
 * follows the file as it grows (a live run), reading only the new tail; a line that does not
 * parse is indexed as corrupt, never a crash. Indexes live under `~/.cache/vf/view`.
 * @module
 */
import { Buffer } from "node:buffer";
import { createHash } from "node:crypto";
import { closeSync, fstatSync, mkdirSync, openSync, readSync } from "node:fs";
import { homedir } from "node:os";
import { join } from "node:path";
import process from "node:process";
import { isUnscoredOutput } from "../eval/results.ts";
import type { RolloutOutput } from "../state.ts";

interface Statement {
  get(...args: unknown[]): Record<string, unknown> | undefined;
  all(...args: unknown[]): Array<Record<string, unknown>>;
  run(...args: unknown[]): unknown;
}
interface Database {
  exec(sql: string): void;
  prepare(sql: string): Statement;
  close(): void;
}

/**
 * One indexed rollout. A line of `results.jsonl` or a single-trace line of `traces.jsonl` is
 * one rollout; an episode line holds one per trainable trace (best-of-n's attempts), the way
 * `vf run` counts them, or one carrying the episode's error when it has none.
 */
export interface IndexedRow {
  /** The line of the file (counting non-empty lines from 0). */
  line: number;
  /** The trace within the line's episode, or null for a line that is one rollout. */
  trace: number | null;
  example: string;
  /**
   * The rollout's index within its example: `rollout_index` when the line has it, else (a
   * `vf eval` row) its place among the rows of the same example, in file order.
   */
  rollout: number;
  /** The attempt within an episode (best-of-n), or null. */
  attempt: number | null;
  reward: number | null;
  error: string | null;
  stop: string | null;
  turns: number;
  tokens: number;
  corrupt: boolean;
}

/** Scored rollouts in ten equal bars from `lo` to `hi`, and what was not scored. */
export interface Histogram {
  buckets: number[];
  /** The reward range the bars span: 0 … 1, widened to whole numbers around rewards outside it. */
  lo: number;
  hi: number;
  unscored: number;
  errors: Record<string, number>;
}

/** What the rollouts table asks for. */
export interface RowQuery {
  errors?: "only" | "none";
  errorType?: string;
  example?: string;
  stop?: string;
  minReward?: number;
  maxReward?: number;
  sort?: "line" | "reward" | "example" | "turns" | "tokens";
  desc?: boolean;
  page?: number;
  pageSize?: number;
}

function cacheDir(env = process.env): string {
  return join(env.XDG_CACHE_HOME || join(env.HOME || homedir(), ".cache"), "vf", "view");
}

function numberOr(value: unknown, fallback: number | null): number | null {
  return typeof value === "number" && Number.isFinite(value) ? value : fallback;
}

type Json = Record<string, unknown>;

const objectOr = (v: unknown): Json =>
  v !== null && typeof v === "object" && !Array.isArray(v) ? v as Json : {};

/** A value from a file as text: a string as it is, another value as its JSON. */
function label(v: unknown): string | null {
  if (v === null || v === undefined) return null;
  if (typeof v === "string") return v;
  try {
    return JSON.stringify(v) ?? String(v);
  } catch {
    return String(v);
  }
}

/** What the index keeps of one rollout, before its place in the file is known. */
export type RowSummary = Omit<IndexedRow, "line" | "trace" | "corrupt" | "rollout"> & {
  trace: number | null;
  /** The rollout's index when the line names it (null: count it by example). */
  rollout: number | null;
};

/**
 * Which earlier lines a line stands in for, the way the run's own readers pick the lines that
 * count: a `vf eval` row names the errored row it re-ran (`retry_of`, that row's
 * `trajectory_id`, written by `vf ctl requeue`); a `vf run` line is the latest of its
 * (task, episode index) and stands in for every earlier line of the same pair.
 */
export interface LineKeys {
  /** What names this line: a `vf eval` row's `trajectory_id`, a `vf run` line's task#index. */
  key: string | null;
  /** The key of the lines this one replaces (a `vf run` line: its own key), or null. */
  replaces: string | null;
  /** Whether a later line can name this one by `retry_of` (a `vf eval` row). */
  retryable: boolean;
}

/** The {@link LineKeys} of one parsed line of either layout; nothing for a hostile line. */
export function lineKeys(line: unknown): LineKeys {
  const rec = objectOr(line);
  if (rec.kind === "episode" || typeof rec.trace_id === "string") {
    const task = objectOr(rec.task).key;
    const index = rec.kind === "episode" ? rec.episode_index : rec.rollout_index ?? 0;
    const key = typeof task === "string" ? `${task}#${label(index)}` : null;
    return { key, replaces: key, retryable: false };
  }
  return {
    key: typeof rec.trajectory_id === "string" ? rec.trajectory_id : null,
    replaces: typeof rec.retry_of === "string" ? rec.retry_of : null,
    retryable: true,
  };
}

const intOr = (v: unknown): number | null =>
  typeof v === "number" && Number.isInteger(v) && v >= 0 ? v : null;

/** Whether a `vf eval` row's error left it unscored, as the run's own summary decides. */
function unscoredRow(err: unknown): boolean {
  if (err === null || err === undefined || err === false) return false;
  return isUnscoredOutput({ error: { error: objectOr(err).error } } as unknown as RolloutOutput);
}

function traceSummary(t: Json, trace: number | null, fallback: Json): RowSummary {
  const task = objectOr(t.task);
  const err = t.error;
  // vf eval writes token_usage, vf run usage.
  const usage = objectOr(t.usage ?? t.token_usage);
  const messages = t.messages ?? t.completion;
  return {
    trace,
    example: label(task.key ?? t.example_id ?? fallback.example_id) ?? "",
    rollout: intOr(t.rollout_index) ?? intOr(fallback.episode_index),
    attempt: trace === null ? null : intOr(t.attempt),
    // A vf eval row that errored unscored holds reward 0 (upstream's column), which its run
    // leaves out of the mean and pass@k: it is unscored here too, never a 0 in the histogram.
    reward: typeof t.trace_id !== "string" && unscoredRow(err) ? null : numberOr(t.reward, null),
    error: err === null || err === undefined || err === false
      ? null
      : label(objectOr(err).error ?? objectOr(err).type) ?? "Error",
    stop: typeof t.stop_condition === "string" ? t.stop_condition : null,
    turns: Array.isArray(messages)
      ? messages.filter((m) => objectOr(m).role === "assistant").length
      : 0,
    tokens: numberOr(usage.input_tokens, 0)! + numberOr(usage.output_tokens, 0)!,
  };
}

/**
 * The rollouts of one parsed line of either layout. The line may hold anything (environment
 * code wrote it): every field is typed here, so a hostile line is indexed with what makes
 * sense of it, never a crash. An episode counts as `vf run` counts it: one rollout per
 * trainable trace, the episode's first error on each when it failed, and one errored rollout
 * when it has no trainable trace.
 */
export function summarizeLine(line: unknown): RowSummary[] {
  const rec = objectOr(line);
  if (!Array.isArray(rec.traces)) return [traceSummary(rec, null, {})];
  const traces = rec.traces.map(objectOr);
  const errors = Array.isArray(rec.errors) ? rec.errors : [];
  const failure = errors.length ? errors[0] : null;
  const failed = (s: RowSummary): RowSummary =>
    failure === null || s.error !== null ? s : {
      ...s,
      reward: null,
      error: label(objectOr(failure).error ?? objectOr(failure).type) ?? "Error",
    };
  const own = traces.map((t, i) => [t, i] as const).filter(([t]) => t.trainable !== false);
  if (own.length === 0) {
    const s = traceSummary({ task: rec.task, example_id: rec.example_id }, null, rec);
    return [{
      ...failed(s),
      error: failed(s).error ?? "EnvError",
      tokens: 0,
    }];
  }
  return own.map(([t, i]) => failed(traceSummary(t, i, rec)));
}

const INDEX_VERSION = "5";

/**
 * The longest line the viewer reads, in bytes (64 MiB): a longer one is indexed as an
 * `OversizeLine` without being held or parsed, so a hostile file cannot make every request
 * buffer it, and its page shows the start of it.
 */
export const MAX_LINE_BYTES = 64 << 20;

function rowOf(r: Record<string, unknown>): IndexedRow {
  return {
    line: Number(r.line),
    trace: r.trace === null ? null : Number(r.trace),
    example: String(r.example ?? ""),
    rollout: Number(r.rollout ?? 0),
    attempt: r.attempt === null ? null : Number(r.attempt),
    reward: r.reward === null ? null : Number(r.reward),
    error: r.error === null ? null : String(r.error),
    stop: r.stop === null ? null : String(r.stop),
    turns: Number(r.turns),
    tokens: Number(r.tokens),
    corrupt: Number(r.corrupt) === 1,
  };
}

/** Options of {@link RunIndex.open}. */
export interface RunIndexOptions {
  /**
   * Opens the results file for reading: a descriptor the index reads through and closes, or
   * null when it is not there (default: `openSync(file, "r")`, null when it does not exist).
   * The viewer passes one that refuses a file swapped for a link out of the run root.
   */
  openFile?: (file: string) => number | null;
}

function openPlain(file: string): number | null {
  try {
    return openSync(file, "r");
  } catch (error) {
    if ((error as { code?: string }).code === "ENOENT") return null;
    throw error;
  }
}

/** The index of one run's results file. */
export class RunIndex {
  readonly file: string;
  readonly #db: Database;
  readonly #openFile: (file: string) => number | null;
  #indexed = 0;
  #lines = 0;
  #rows = 0;
  /** Rows seen per example, for the rollout index of a row that does not carry one. */
  #perExample = new Map<string, number>();
  /**
   * Counts and aggregates over the whole index (a filter's total, the histogram, the tokens),
   * kept until rows are added: each is a scan of every row, and a page of a million-rollout
   * run asked for them again on every request.
   */
  #cache = new Map<string, unknown>();
  /** Sort indexes made so far (made on the first page sorted that way). */
  #sortIndexes = new Set<string>();

  private constructor(file: string, db: Database, openFile: (file: string) => number | null) {
    this.file = file;
    this.#db = db;
    this.#openFile = openFile;
    this.#load();
  }

  #load(): void {
    const meta = this.#db.prepare("SELECT v FROM meta WHERE k = 'bytes'").get();
    this.#indexed = Number(meta?.v ?? 0);
    const counts = this.#db.prepare(
      "SELECT COALESCE(MAX(line) + 1, 0) AS lines, COALESCE(SUM(live), 0) AS n FROM rows",
    ).get()!;
    this.#lines = Number(counts.lines);
    this.#rows = Number(counts.n);
    this.#cache.clear();
    this.#perExample = new Map();
    for (
      const r of this.#db.prepare(
        `SELECT example, COUNT(*) AS n FROM rows WHERE corrupt = 0 AND trace IS NULL AND live = 1
         GROUP BY example`,
      ).all()
    ) this.#perExample.set(String(r.example), Number(r.n));
  }

  /** Open (or create) the index of `file`, kept in `dir` (default ~/.cache/vf/view). */
  static async open(
    file: string,
    dir = cacheDir(),
    options: RunIndexOptions = {},
  ): Promise<RunIndex> {
    const { DatabaseSync } = await import("node:sqlite") as unknown as {
      DatabaseSync: new (path: string) => Database;
    };
    mkdirSync(dir, { recursive: true });
    const name = createHash("sha256").update(file).digest("hex").slice(0, 24);
    const db = new DatabaseSync(join(dir, `${name}.sqlite`));
    db.exec("PRAGMA busy_timeout = 2000");
    db.exec("CREATE TABLE IF NOT EXISTS meta (k TEXT PRIMARY KEY, v TEXT)");
    // An index written by another version of this code is built again.
    if (db.prepare("SELECT v FROM meta WHERE k = 'version'").get()?.v !== INDEX_VERSION) {
      db.exec("DROP TABLE IF EXISTS rows");
      db.exec("DELETE FROM meta");
      db.prepare("INSERT INTO meta (k, v) VALUES ('version', ?)").run(INDEX_VERSION);
    }
    db.exec(
      `CREATE TABLE IF NOT EXISTS rows (id INTEGER PRIMARY KEY, line INTEGER NOT NULL,
        trace INTEGER, offset INTEGER NOT NULL, length INTEGER NOT NULL, example TEXT,
        rollout INTEGER, attempt INTEGER, reward REAL, error TEXT, stop TEXT, turns INTEGER,
        tokens INTEGER, corrupt INTEGER NOT NULL, ukey TEXT, replaces TEXT,
        retryable INTEGER NOT NULL DEFAULT 0, live INTEGER NOT NULL DEFAULT 1)`,
    );
    db.exec("CREATE INDEX IF NOT EXISTS rows_ukey ON rows (ukey)");
    db.exec("CREATE INDEX IF NOT EXISTS rows_replaces ON rows (replaces)");
    db.exec("CREATE INDEX IF NOT EXISTS rows_line ON rows (line)");
    db.exec("CREATE INDEX IF NOT EXISTS rows_reward ON rows (reward)");
    db.exec("CREATE INDEX IF NOT EXISTS rows_example ON rows (example)");
    const index = new RunIndex(file, db, options.openFile ?? openPlain);
    // A file that shrank was rewritten (a repaired tail): index it again from the start.
    const size = index.#size();
    if (size !== null && size < index.#indexed) index.#reset();
    return index;
  }

  /** The file's size, read through a descriptor it opens; null when it is not there. */
  #size(): number | null {
    const fd = this.#openFile(this.file);
    if (fd === null) return null;
    try {
      return fstatSync(fd).size;
    } finally {
      closeSync(fd);
    }
  }

  #reset(): void {
    this.#db.exec("DELETE FROM rows");
    this.#db.exec("DELETE FROM meta WHERE k = 'bytes'");
    this.#load();
  }

  /** Index what was appended since the last call; returns the number of new lines. */
  refresh(): number {
    const fd = this.#openFile(this.file);
    if (fd === null) return 0;
    let size: number;
    try {
      size = fstatSync(fd).size;
      if (size < this.#indexed) this.#reset();
    } catch (error) {
      closeSync(fd);
      throw error;
    }
    if (size === this.#indexed) {
      closeSync(fd);
      return 0;
    }
    const insert = this.#db.prepare(
      `INSERT INTO rows (line, trace, offset, length, example, rollout, attempt, reward, error,
        stop, turns, tokens, corrupt, ukey, replaces, retryable, live)
        VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)`,
    );
    let added = 0;
    const before = { lines: this.#lines, rows: this.#rows, perExample: new Map(this.#perExample) };
    try {
      this.#db.exec("BEGIN");
      // The line being read: where it starts, its bytes so far (held only up to the limit).
      let offset = this.#indexed;
      let parts: Buffer[] = [];
      let held = 0;
      let length = 0;
      const chunk = Buffer.alloc(1 << 20);
      let position = offset;
      while (position < size) {
        const n = readSync(fd, chunk, 0, Math.min(chunk.length, size - position), position);
        if (n <= 0) break;
        position += n;
        const data = chunk.subarray(0, n);
        let start = 0;
        for (;;) {
          const nl = data.indexOf(10, start);
          const end = nl < 0 ? n : nl;
          length += end - start;
          if (length <= MAX_LINE_BYTES) {
            // The chunk is reused: a line that goes on past it keeps a copy of its piece.
            if (nl < 0 || parts.length) {
              parts.push(Buffer.from(data.subarray(start, end)));
              held += end - start;
            }
          } else if (parts.length) (parts = [], held = 0);
          if (nl < 0) break;
          // A whole line: decoded from the chunk when it lies in it, else from its parts.
          const text = length > MAX_LINE_BYTES
            ? null
            : parts.length
            ? Buffer.concat(parts, held).toString("utf8").trim()
            : data.toString("utf8", start, end).trim();
          if (text !== "") {
            this.#insert(insert, text, offset, length);
            added++;
          }
          offset += length + 1;
          parts = [];
          held = 0;
          length = 0;
          start = nl + 1;
        }
      }
      // A last line without its newline may still be being written: index it next time.
      this.#indexed = offset;
      this.#db.prepare("INSERT OR REPLACE INTO meta (k, v) VALUES ('bytes', ?)").run(
        String(offset),
      );
      this.#db.exec("COMMIT");
      if (added) this.#cache.clear();
    } catch (error) {
      this.#db.exec("ROLLBACK");
      // nothing of this pass was kept
      this.#lines = before.lines;
      this.#rows = before.rows;
      this.#perExample = before.perExample;
      throw error;
    } finally {
      closeSync(fd);
    }
    return added;
  }

  /** One line of the file: its text, or null for a line over {@link MAX_LINE_BYTES}. */
  #insert(insert: Statement, text: string | null, offset: number, length: number): void {
    const line = this.#lines++;
    let rows: RowSummary[] | null = null;
    let keys: LineKeys = { key: null, replaces: null, retryable: false };
    try {
      if (text !== null) {
        const parsed = JSON.parse(text);
        rows = summarizeLine(parsed);
        keys = lineKeys(parsed);
      }
    } catch { /* corrupt */ }
    if (rows === null) {
      insert.run(
        line,
        null,
        offset,
        length,
        null,
        null,
        null,
        null,
        text === null ? "OversizeLine" : "CorruptLine",
        null,
        0,
        0,
        1,
        null,
        null,
        0,
        1,
      );
      this.#rows++;
      return;
    }
    // A retry takes the place (and the rollout index) of the row it re-ran.
    let replacedRollout: number | null = null;
    if (keys.replaces !== null) {
      const old = this.#db.prepare(
        `SELECT rollout, example FROM rows WHERE ukey = ? AND live = 1 AND trace IS NULL
         AND retryable = ? ORDER BY id LIMIT 1`,
      ).get(keys.replaces, keys.retryable ? 1 : 0);
      if (keys.retryable && old && String(old.example) === rows[0]?.example) {
        replacedRollout = Number(old.rollout);
      }
      const gone = this.#db.prepare(
        `UPDATE rows SET live = 0 WHERE ukey = ? AND live = 1 AND retryable = ?`,
      ).run(keys.replaces, keys.retryable ? 1 : 0) as { changes?: number | bigint };
      this.#rows -= Number(gone.changes ?? 0);
    }
    // A row that a line read before it already re-ran (out of order) never counts.
    const live = keys.retryable && keys.key !== null &&
        this.#db.prepare("SELECT 1 AS x FROM rows WHERE replaces = ? AND retryable = 1 LIMIT 1")
          .get(keys.key)
      ? 0
      : 1;
    for (const r of rows) {
      let rollout = r.rollout;
      if (r.trace === null && replacedRollout !== null && live) {
        rollout ??= replacedRollout;
      } else if (r.trace === null && live) {
        const seen = this.#perExample.get(r.example) ?? 0;
        this.#perExample.set(r.example, seen + 1);
        rollout ??= seen;
      }
      insert.run(
        line,
        r.trace,
        offset,
        length,
        r.example,
        rollout ?? 0,
        r.attempt,
        r.reward,
        r.error,
        r.stop,
        r.turns,
        r.tokens,
        0,
        keys.key,
        keys.replaces,
        keys.retryable ? 1 : 0,
        live,
      );
      this.#rows += live;
    }
  }

  /** Rollouts indexed so far (an episode counts its trainable traces). */
  get count(): number {
    return this.#rows;
  }

  /** Lines indexed so far. */
  get lines(): number {
    return this.#lines;
  }

  /** `compute()`, kept until rows are added. */
  #cached<T>(key: string, compute: () => T): T {
    if (this.#cache.has(key)) return this.#cache.get(key) as T;
    const value = compute();
    this.#cache.set(key, value);
    return value;
  }

  /** Tokens (input and output) summed over the rollouts indexed so far. */
  get tokens(): number {
    return this.#cached(
      "tokens",
      () =>
        Number(
          this.#db.prepare("SELECT COALESCE(SUM(tokens), 0) AS n FROM rows WHERE live = 1").get()!
            .n,
        ),
    );
  }

  /**
   * The index a page sorted by `column` reads in order, so it reads one page of rows instead
   * of sorting them all: line, reward and example ascending have theirs from the start; the
   * others are made on first use.
   */
  #sortIndex(column: string, desc: boolean): void {
    if (!desc && ["line", "reward", "example"].includes(column)) return;
    const name = `rows_by_${column}_${desc ? "desc" : "asc"}`;
    if (this.#sortIndexes.has(name)) return;
    this.#db.exec(`CREATE INDEX IF NOT EXISTS ${name} ON rows (${column}${desc ? " DESC" : ""})`);
    this.#sortIndexes.add(name);
  }

  /** One page of rows, filtered and sorted. */
  query(q: RowQuery): { rows: IndexedRow[]; total: number } {
    const where: string[] = [];
    const args: unknown[] = [];
    const filtered = () => where.length > 1;
    where.push("live = 1");
    if (q.errors === "only") where.push("error IS NOT NULL");
    if (q.errors === "none") where.push("error IS NULL");
    if (q.errorType) (where.push("error = ?"), args.push(q.errorType));
    if (q.example) (where.push("example = ?"), args.push(q.example));
    if (q.stop) (where.push("stop = ?"), args.push(q.stop));
    if (q.minReward !== undefined) (where.push("reward >= ?"), args.push(q.minReward));
    if (q.maxReward !== undefined) (where.push("reward <= ?"), args.push(q.maxReward));
    const clause = `WHERE ${where.join(" AND ")}`;
    const sort = ["line", "reward", "example", "turns", "tokens"].includes(q.sort ?? "")
      ? q.sort
      : "line";
    const size = Math.min(500, Math.max(1, q.pageSize ?? 50));
    const page = Math.max(0, q.page ?? 0);
    const total = filtered()
      ? this.#cached(
        `total ${clause} ${JSON.stringify(args)}`,
        () => Number(this.#db.prepare(`SELECT COUNT(*) AS n FROM rows ${clause}`).get(...args)!.n),
      )
      : this.#rows;
    this.#sortIndex(sort!, q.desc === true);
    const rows = this.#db.prepare(
      `SELECT line, trace, example, rollout, attempt, reward, error, stop, turns, tokens, corrupt
       FROM rows ${clause} ORDER BY ${sort} ${q.desc ? "DESC" : "ASC"}, id ASC LIMIT ? OFFSET ?`,
    ).all(...args, size, page * size).map(rowOf);
    return { rows, total };
  }

  /** Rewards in ten buckets over [0, 1] (values outside go to the ends), and the unscored. */
  histogram(): Histogram {
    const h = this.#cached("histogram", () => this.#histogram());
    return { ...h, buckets: [...h.buckets], errors: { ...h.errors } };
  }

  #histogram(): Histogram {
    const buckets = new Array(10).fill(0);
    // 0 … 1, widened to whole numbers around rewards outside it (a weighted sum reaches 2):
    // a reward of 2 is never counted in a 0.9–1.0 bar.
    const range = this.#db.prepare(
      "SELECT MIN(reward) AS lo, MAX(reward) AS hi FROM rows WHERE reward IS NOT NULL AND live = 1",
    ).get()!;
    const lo = Math.min(0, Math.floor(numberOr(range.lo, 0)!));
    const hi = Math.max(1, Math.ceil(numberOr(range.hi, 1)!));
    // Counted by SQLite, bucket by bucket, instead of a row object per rollout. CAST cuts
    // toward zero, which is floor for what is at or above lo.
    for (
      const r of this.#db.prepare(
        `SELECT MIN(9, MAX(0, CAST((reward - ?) * 10 / ? AS INTEGER))) AS b, COUNT(*) AS n
         FROM rows WHERE reward IS NOT NULL AND live = 1 GROUP BY b`,
      ).all(lo, hi - lo)
    ) buckets[Number(r.b)] += Number(r.n);
    const unscored = Number(
      this.#db.prepare("SELECT COUNT(*) AS n FROM rows WHERE reward IS NULL AND live = 1").get()!
        .n,
    );
    const errors: Record<string, number> = {};
    for (
      const r of this.#db.prepare(
        "SELECT error, COUNT(*) AS n FROM rows WHERE error IS NOT NULL AND live = 1 GROUP BY error",
      ).all()
    ) errors[String(r.error)] = Number(r.n);
    return { buckets, lo, hi, unscored, errors };
  }

  /** The rollouts indexed from one line (several for an episode), in order. */
  rowsAt(line: number): IndexedRow[] {
    return this.#db.prepare(
      `SELECT line, trace, example, rollout, attempt, reward, error, stop, turns, tokens, corrupt
       FROM rows WHERE line = ? ORDER BY id`,
    ).all(line).map(rowOf);
  }

  /**
   * The line's record, parsed; a corrupt line comes back as the start of its text, and a
   * line over {@link MAX_LINE_BYTES} too, with its size as `oversize` (it is never read whole).
   */
  read(
    line: number,
  ): { record: unknown; corrupt: boolean; text?: string; oversize?: number } | null {
    const row = this.#db.prepare(
      "SELECT offset, length, corrupt FROM rows WHERE line = ? ORDER BY id LIMIT 1",
    ).get(line);
    if (!row) return null;
    const length = Number(row.length);
    const whole = Number(row.corrupt) !== 1 && length <= MAX_LINE_BYTES;
    const fd = this.#openFile(this.file);
    if (fd === null) return null;
    try {
      const buf = Buffer.alloc(whole ? length : Math.min(length, 16_000));
      readSync(fd, buf, 0, buf.length, Number(row.offset));
      const text = buf.toString("utf8");
      if (!whole) {
        const oversize = length > MAX_LINE_BYTES ? { oversize: length } : {};
        return { record: null, corrupt: true, text: text.slice(0, 4000), ...oversize };
      }
      return { record: JSON.parse(text), corrupt: false };
    } finally {
      closeSync(fd);
    }
  }

  close(): void {
    this.#db.close();
  }
}
