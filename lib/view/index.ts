/**
 * The viewer's index of a run: one SQLite row per line of its results file (`results.jsonl`
 * of `vf eval`, `traces.jsonl` of `vf run`) with the line's place in the file and what the
 * tables filter and sort by, so a 100k-rollout run pages without loading whole. The index
 * follows the file as it grows (a live run), reading only the new tail; a line that does not
 * parse is indexed as corrupt, never a crash. Indexes live under `~/.cache/vf/view`.
 * @module
 */
import { Buffer } from "node:buffer";
import { createHash } from "node:crypto";
import { closeSync, existsSync, mkdirSync, openSync, readSync, statSync } from "node:fs";
import { homedir } from "node:os";
import { join } from "node:path";
import process from "node:process";

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

/** One indexed rollout (a line of the results file). */
export interface IndexedRow {
  line: number;
  example: string;
  rollout: number;
  reward: number | null;
  error: string | null;
  stop: string | null;
  turns: number;
  tokens: number;
  corrupt: boolean;
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

/**
 * The fields the index keeps, from one parsed line of either layout. The line may hold
 * anything (it was written by environment code): every field is typed here, so a hostile
 * line is indexed with what makes sense of it, never a crash.
 */
export function summarizeLine(line: unknown): Omit<IndexedRow, "line" | "corrupt"> {
  const rec = objectOr(line);
  // vf run: a trace, or an episode holding traces (its first trainable one speaks for it).
  const traces = Array.isArray(rec.traces) ? rec.traces.map(objectOr) : null;
  const t = traces ? (traces.find((x) => x.trainable !== false) ?? traces[0] ?? {}) : rec;
  const task = objectOr(t.task);
  const errors = Array.isArray(rec.errors) ? rec.errors : [];
  const err = t.error ?? (traces ? errors[0] : null);
  const usage = objectOr(t.usage);
  const messages = t.messages ?? t.completion;
  const rollout = numberOr(t.rollout_index ?? rec.episode_index, 0)!;
  return {
    example: label(task.key ?? t.example_id ?? rec.example_id) ?? "",
    rollout: Number.isInteger(rollout) ? rollout : 0,
    reward: numberOr(t.reward, null),
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

/** The index of one run's results file. */
export class RunIndex {
  readonly file: string;
  readonly #db: Database;
  #indexed = 0;
  #lines = 0;

  private constructor(file: string, db: Database) {
    this.file = file;
    this.#db = db;
    const meta = db.prepare("SELECT v FROM meta WHERE k = 'bytes'").get();
    this.#indexed = Number(meta?.v ?? 0);
    this.#lines = Number(db.prepare("SELECT COUNT(*) AS n FROM rows").get()!.n);
  }

  /** Open (or create) the index of `file`, kept in `dir` (default ~/.cache/vf/view). */
  static async open(file: string, dir = cacheDir()): Promise<RunIndex> {
    const { DatabaseSync } = await import("node:sqlite") as unknown as {
      DatabaseSync: new (path: string) => Database;
    };
    mkdirSync(dir, { recursive: true });
    const name = createHash("sha256").update(file).digest("hex").slice(0, 24);
    const db = new DatabaseSync(join(dir, `${name}.sqlite`));
    db.exec("PRAGMA busy_timeout = 2000");
    db.exec(
      `CREATE TABLE IF NOT EXISTS rows (line INTEGER PRIMARY KEY, offset INTEGER NOT NULL,
        length INTEGER NOT NULL, example TEXT, rollout INTEGER, reward REAL, error TEXT,
        stop TEXT, turns INTEGER, tokens INTEGER, corrupt INTEGER NOT NULL)`,
    );
    db.exec("CREATE TABLE IF NOT EXISTS meta (k TEXT PRIMARY KEY, v TEXT)");
    db.exec("CREATE INDEX IF NOT EXISTS rows_reward ON rows (reward)");
    db.exec("CREATE INDEX IF NOT EXISTS rows_example ON rows (example)");
    const index = new RunIndex(file, db);
    // A file that shrank was rewritten (a repaired tail): index it again from the start.
    if (existsSync(file) && statSync(file).size < index.#indexed) index.#reset();
    return index;
  }

  #reset(): void {
    this.#db.exec("DELETE FROM rows");
    this.#db.exec("DELETE FROM meta");
    this.#indexed = 0;
    this.#lines = 0;
  }

  /** Index what was appended since the last call; returns the number of new lines. */
  refresh(): number {
    if (!existsSync(this.file)) return 0;
    const size = statSync(this.file).size;
    if (size < this.#indexed) this.#reset();
    if (size === this.#indexed) return 0;
    const fd = openSync(this.file, "r");
    const insert = this.#db.prepare(
      `INSERT OR REPLACE INTO rows (line, offset, length, example, rollout, reward, error, stop,
        turns, tokens, corrupt) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)`,
    );
    let added = 0;
    const linesBefore = this.#lines;
    try {
      this.#db.exec("BEGIN");
      let offset = this.#indexed;
      let carry = Buffer.alloc(0);
      const chunk = Buffer.alloc(1 << 20);
      let position = offset;
      while (position < size) {
        const n = readSync(fd, chunk, 0, Math.min(chunk.length, size - position), position);
        if (n <= 0) break;
        position += n;
        let data = Buffer.concat([carry, chunk.subarray(0, n)]);
        let start = 0;
        for (;;) {
          const nl = data.indexOf(10, start);
          if (nl < 0) break;
          const bytes = data.subarray(start, nl);
          const text = bytes.toString("utf8").trim();
          if (text) {
            let row: Omit<IndexedRow, "line" | "corrupt"> | null = null;
            try {
              row = summarizeLine(JSON.parse(text));
            } catch { /* corrupt */ }
            insert.run(
              this.#lines++,
              offset,
              bytes.length,
              row?.example ?? null,
              row?.rollout ?? null,
              row?.reward ?? null,
              row ? row.error : "CorruptLine",
              row?.stop ?? null,
              row?.turns ?? 0,
              row?.tokens ?? 0,
              row ? 0 : 1,
            );
            added++;
          }
          offset += nl + 1 - start;
          start = nl + 1;
        }
        carry = Buffer.from(data.subarray(start));
        data = carry;
      }
      // A last line without its newline may still be being written: index it next time.
      this.#indexed = offset;
      this.#db.prepare("INSERT OR REPLACE INTO meta (k, v) VALUES ('bytes', ?)").run(
        String(offset),
      );
      this.#db.exec("COMMIT");
    } catch (error) {
      this.#db.exec("ROLLBACK");
      this.#lines = linesBefore; // nothing of this pass was kept
      throw error;
    } finally {
      closeSync(fd);
    }
    return added;
  }

  /** Rollouts indexed so far. */
  get count(): number {
    return this.#lines;
  }

  /** One page of rows, filtered and sorted. */
  query(q: RowQuery): { rows: IndexedRow[]; total: number } {
    const where: string[] = [];
    const args: unknown[] = [];
    if (q.errors === "only") where.push("error IS NOT NULL");
    if (q.errors === "none") where.push("error IS NULL");
    if (q.errorType) (where.push("error = ?"), args.push(q.errorType));
    if (q.example) (where.push("example = ?"), args.push(q.example));
    if (q.stop) (where.push("stop = ?"), args.push(q.stop));
    if (q.minReward !== undefined) (where.push("reward >= ?"), args.push(q.minReward));
    if (q.maxReward !== undefined) (where.push("reward <= ?"), args.push(q.maxReward));
    const clause = where.length ? `WHERE ${where.join(" AND ")}` : "";
    const sort = ["line", "reward", "example", "turns", "tokens"].includes(q.sort ?? "")
      ? q.sort
      : "line";
    const size = Math.min(500, Math.max(1, q.pageSize ?? 50));
    const page = Math.max(0, q.page ?? 0);
    const total = Number(
      this.#db.prepare(`SELECT COUNT(*) AS n FROM rows ${clause}`).get(...args)!.n,
    );
    const rows = this.#db.prepare(
      `SELECT line, example, rollout, reward, error, stop, turns, tokens, corrupt FROM rows
       ${clause} ORDER BY ${sort} ${q.desc ? "DESC" : "ASC"}, line ASC LIMIT ? OFFSET ?`,
    ).all(...args, size, page * size).map((r) => ({
      line: Number(r.line),
      example: String(r.example ?? ""),
      rollout: Number(r.rollout ?? 0),
      reward: r.reward === null ? null : Number(r.reward),
      error: r.error === null ? null : String(r.error),
      stop: r.stop === null ? null : String(r.stop),
      turns: Number(r.turns),
      tokens: Number(r.tokens),
      corrupt: Number(r.corrupt) === 1,
    }));
    return { rows, total };
  }

  /** Rewards in ten buckets over [0, 1] (values outside go to the ends), and the unscored. */
  histogram(): { buckets: number[]; unscored: number; errors: Record<string, number> } {
    const buckets = new Array(10).fill(0);
    for (const r of this.#db.prepare("SELECT reward FROM rows WHERE reward IS NOT NULL").all()) {
      const v = Number(r.reward);
      buckets[Math.min(9, Math.max(0, Math.floor(v * 10)))]++;
    }
    const unscored = Number(
      this.#db.prepare("SELECT COUNT(*) AS n FROM rows WHERE reward IS NULL").get()!.n,
    );
    const errors: Record<string, number> = {};
    for (
      const r of this.#db.prepare(
        "SELECT error, COUNT(*) AS n FROM rows WHERE error IS NOT NULL GROUP BY error",
      ).all()
    ) errors[String(r.error)] = Number(r.n);
    return { buckets, unscored, errors };
  }

  /** The line's record, parsed; a corrupt line comes back as its text. */
  read(line: number): { record: unknown; corrupt: boolean; text?: string } | null {
    const row = this.#db.prepare("SELECT offset, length, corrupt FROM rows WHERE line = ?").get(
      line,
    );
    if (!row) return null;
    const fd = openSync(this.file, "r");
    try {
      const buf = Buffer.alloc(Number(row.length));
      readSync(fd, buf, 0, buf.length, Number(row.offset));
      const text = buf.toString("utf8");
      if (Number(row.corrupt) === 1) {
        return { record: null, corrupt: true, text: text.slice(0, 4000) };
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
