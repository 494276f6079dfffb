/**
 * The model-call cache (opt-in: `--cache`, or `[client] cache = true`): responses stored in
 * SQLite (`node:sqlite`), keyed by a hash of the endpoint, model, messages, tools, sampling
 * arguments and the rollout's index within its group, so the `-r` repeats of one example stay
 * distinct answers unless `cache_repeats = true`. A database that cannot be opened, or that
 * is locked or corrupt when used, turns the cache off with a warning: a run never fails
 * because of its cache.
 * @module
 */
import { createHash } from "node:crypto";
import { mkdirSync } from "node:fs";
import { homedir } from "node:os";
import { dirname, join } from "node:path";
import process from "node:process";
import type { Messages, Response } from "../types.ts";
import {
  type ChatClient,
  type ChatRequestOptions,
  normalizeSamplingArgs,
  OpenAIChatClient,
  toWireMessages,
} from "./client.ts";

/** Where the cache lives: `$VF_CACHE_DB`, else `~/.cache/vf/model-cache.sqlite`. */
export function defaultCachePath(env: Record<string, string | undefined> = process.env): string {
  if (env.VF_CACHE_DB) return env.VF_CACHE_DB;
  return join(
    env.XDG_CACHE_HOME || join(env.HOME || homedir(), ".cache"),
    "vf",
    "model-cache.sqlite",
  );
}

interface Statement {
  get(...args: unknown[]): Record<string, unknown> | undefined;
  run(...args: unknown[]): unknown;
}
interface Database {
  exec(sql: string): void;
  prepare(sql: string): Statement;
  close(): void;
}

/** A cache database. */
export class ModelCache {
  readonly path: string;
  #db: Database | null;
  #get: Statement | null = null;
  #put: Statement | null = null;

  private constructor(path: string, db: Database) {
    this.path = path;
    this.#db = db;
  }

  /**
   * Open (creating) the database; null, after a warning, when it cannot be used.
   */
  static async open(path = defaultCachePath()): Promise<ModelCache | null> {
    try {
      const { DatabaseSync } = await import("node:sqlite") as unknown as {
        DatabaseSync: new (path: string, options?: Record<string, unknown>) => Database;
      };
      mkdirSync(dirname(path), { recursive: true });
      const db = new DatabaseSync(path);
      db.exec("PRAGMA busy_timeout = 2000");
      db.exec(
        "CREATE TABLE IF NOT EXISTS calls (key TEXT PRIMARY KEY, model TEXT, response TEXT NOT NULL, created REAL NOT NULL)",
      );
      const cache = new ModelCache(path, db);
      cache.#get = db.prepare("SELECT response FROM calls WHERE key = ?");
      cache.#put = db.prepare(
        "INSERT OR REPLACE INTO calls (key, model, response, created) VALUES (?, ?, ?, ?)",
      );
      return cache;
    } catch (error) {
      console.warn(
        `warning: the model cache at ${path} cannot be used (${
          (error as Error).message
        }); running without a cache`,
      );
      return null;
    }
  }

  /** Whether the cache still works (it turns itself off on its first failure). */
  get usable(): boolean {
    return this.#db !== null;
  }

  #fail(error: unknown): void {
    console.warn(
      `warning: the model cache at ${this.path} failed (${
        (error as Error).message
      }); going on without it`,
    );
    try {
      this.#db?.close();
    } catch { /* already broken */ }
    this.#db = null;
  }

  /** A stored response, if any. */
  get(key: string): Response | undefined {
    if (!this.#db) return undefined;
    try {
      const row = this.#get!.get(key);
      return row ? JSON.parse(String(row.response)) as Response : undefined;
    } catch (error) {
      this.#fail(error);
      return undefined;
    }
  }

  /** Store a response. */
  put(key: string, model: string, response: Response): void {
    if (!this.#db) return;
    const { retries: _r, ...kept } = response;
    try {
      this.#put!.run(key, model, JSON.stringify(kept), Date.now() / 1000);
    } catch (error) {
      this.#fail(error);
    }
  }

  /** Entries and their size. */
  stats(): { entries: number; bytes: number; models: Record<string, number> } {
    if (!this.#db) return { entries: 0, bytes: 0, models: {} };
    const total = this.#db.prepare(
      "SELECT COUNT(*) AS n, COALESCE(SUM(LENGTH(response)), 0) AS b FROM calls",
    ).get()!;
    const models: Record<string, number> = {};
    const rows =
      (this.#db.prepare("SELECT model, COUNT(*) AS n FROM calls GROUP BY model") as unknown as {
        all(): Array<{ model: string; n: number }>;
      }).all();
    for (const r of rows) models[String(r.model)] = Number(r.n);
    return { entries: Number(total.n), bytes: Number(total.b), models };
  }

  /** Remove every entry. */
  clear(): number {
    if (!this.#db) return 0;
    const n = Number(this.#db.prepare("SELECT COUNT(*) AS n FROM calls").get()!.n);
    this.#db.exec("DELETE FROM calls");
    this.#db.exec("VACUUM");
    return n;
  }

  close(): void {
    try {
      this.#db?.close();
    } catch { /* closing a broken database */ }
    this.#db = null;
  }
}

/** The key of one call. */
export function cacheKey(
  baseUrl: string,
  prompt: Messages,
  model: string,
  options: ChatRequestOptions,
  repeats: boolean,
): string {
  const material = JSON.stringify([
    baseUrl,
    model,
    toWireMessages(prompt),
    options.tools ?? [],
    normalizeSamplingArgs(options.samplingArgs ?? {}),
    repeats ? null : options.cacheSalt ?? null,
  ]);
  return createHash("sha256").update(material).digest("hex");
}

/** Hits and misses of a run. */
export interface CacheCounts {
  hits: number;
  misses: number;
}

/** A client that answers from the cache when it can, and fills it otherwise. */
export class CachedChatClient implements ChatClient {
  readonly counts: CacheCounts = { hits: 0, misses: 0 };

  constructor(
    readonly inner: ChatClient,
    readonly cache: ModelCache,
    readonly options: { repeats?: boolean } = {},
  ) {}

  get baseUrl(): string {
    return this.inner.baseUrl;
  }

  get headersFromState(): Record<string, string> {
    return this.inner.headersFromState;
  }

  async getResponse(
    prompt: Messages,
    model: string,
    options: ChatRequestOptions = {},
  ): Promise<Response> {
    const key = cacheKey(this.baseUrl, prompt, model, options, this.options.repeats === true);
    const hit = this.cache.get(key);
    if (hit) {
      this.counts.hits++;
      return hit;
    }
    const response = await this.inner.getResponse(prompt, model, options);
    this.counts.misses++;
    this.cache.put(key, model, response);
    return response;
  }
}

/**
 * `client` telling the calls it makes which rollout of a group they belong to (the cache
 * keeps repeats apart by it).
 */
export function withCacheSalt(client: ChatClient, salt: string): ChatClient {
  // vf's HTTP client never reads the salt (the cache and the sandbox's proxy client do): no
  // wrapper, and no copy of the options per call.
  if (client instanceof OpenAIChatClient) return client;
  // One wrapper per client and salt, made once: groups ask for the same few salts again
  // and again.
  let salted = SALTED.get(client);
  if (!salted) SALTED.set(client, salted = new Map());
  let wrapped = salted.get(salt);
  if (!wrapped) salted.set(salt, wrapped = saltedClient(client, salt));
  return wrapped;
}

const SALTED = new WeakMap<ChatClient, Map<string, ChatClient>>();

function saltedClient(client: ChatClient, salt: string): ChatClient {
  return {
    get baseUrl() {
      return client.baseUrl;
    },
    get headersFromState() {
      return client.headersFromState;
    },
    getResponse: (prompt, model, options = {}) =>
      client.getResponse(prompt, model, { cacheSalt: salt, ...options }),
  };
}
