/**
 * The sandbox ledger: a local append-only JSONL file recording every sandbox vf asks for,
 * written *before* the create request, so a sandbox whose creator died between request and
 * response (SIGKILL, OOM, power loss) can still be found and removed by `vf cleanup`.
 *
 * Each line is one event of one sandbox, keyed by a name the client picks before asking
 * (the container name for Docker): `requested` (before the create call), `created` (the
 * provider answered with an id) and `stopped` (removed). {@linkcode Ledger.live} replays the
 * file: a sandbox is live from its first event until its `stopped` event.
 *
 * The file is `VF_LEDGER` when set (`off` disables the ledger), else
 * `$XDG_CACHE_HOME/vf/ledger.jsonl`, else `~/.cache/vf/ledger.jsonl`. Lines are appended with
 * single `O_APPEND` writes, so several vf processes can share one ledger.
 *
 * Runtime types register how to remove their leftovers with {@linkcode registerCleaner};
 * {@linkcode cleanupLedger} (what `vf cleanup` runs) hands each type its live entries.
 * @module
 */

import { appendFile, mkdir, readFile, rename, rm } from "node:fs/promises";
import { homedir } from "node:os";
import { dirname, join } from "node:path";
import process from "node:process";
import { SandboxError } from "../lib/errors.ts";
import { currentOwner, keepReason, type OwnerPolicy, type SandboxOwner } from "./owner.ts";

/** Version of ledger lines. */
export const LEDGER_FORMAT_VERSION = 1;

/** What happened to a sandbox. */
export type LedgerEvent = "requested" | "created" | "stopped";

/** One line of the ledger. */
export interface LedgerEntry {
  format_version: number;
  event: LedgerEvent;
  /** Runtime type: `docker`, `ssh`, `prime`, ... */
  type: string;
  /** The name chosen before the request (unique per type); ties a sandbox's events together. */
  key: string;
  /** The provider's id, once known. */
  id?: string;
  run_id?: string;
  labels?: Record<string, string>;
  /**
   * What a cleaner needs to reach the sandbox again (for Docker: `docker_host`,
   * `tls_verify`, `cert_path`). Never secrets.
   */
  host?: Record<string, unknown>;
  /** ISO time of the event. */
  at: string;
  /** Process that wrote the line. */
  pid: number;
  /** The writing process as an owner another process can check (host, pid, start, boot). */
  owner?: SandboxOwner;
}

/** What callers pass to {@linkcode Ledger.record}; the rest is filled in. */
export type LedgerRecord = Omit<LedgerEntry, "format_version" | "at" | "pid" | "owner"> & {
  at?: string;
};

/** A sandbox the ledger believes live: its events merged, oldest time first. */
export interface LiveSandbox {
  type: string;
  key: string;
  id?: string;
  run_id?: string;
  labels?: Record<string, string>;
  host?: Record<string, unknown>;
  /** When it was requested (ISO). */
  requested_at: string;
  /** True when the provider never confirmed it (`requested` without `created`). */
  unconfirmed: boolean;
  /** The process that requested it. */
  owner?: SandboxOwner;
}

/** Which live sandboxes to select. */
export interface LedgerFilter {
  /** Only this run's. */
  runId?: string;
  /** Only those requested at least this long ago. */
  olderThanMs?: number;
  /** Only this runtime type. */
  type?: string;
  /**
   * Check owners (`vf cleanup`): sandboxes of a run that is still going, and those whose owner
   * cannot be checked (unless `olderThanMs` is given), are kept. Default: no check.
   */
  owners?: OwnerPolicy;
}

/** The ledger path from the environment; `null` when `VF_LEDGER=off`. */
export function defaultLedgerPath(
  env: Record<string, string | undefined> = process.env,
): string | null {
  const explicit = env.VF_LEDGER;
  if (explicit !== undefined && explicit !== "") return explicit === "off" ? null : explicit;
  const cache = env.XDG_CACHE_HOME || join(env.HOME || homedir(), ".cache");
  return join(cache, "vf", "ledger.jsonl");
}

/** An append-only sandbox ledger file. */
export class Ledger {
  /** The JSONL file. */
  readonly path: string;
  #dirReady: Promise<unknown> | undefined;

  constructor(path: string) {
    this.path = path;
  }

  /**
   * Appends one event. Callers await it before the action it describes (`requested` before
   * the create request).
   * @throws {SandboxError} when the file cannot be written
   */
  async record(record: LedgerRecord): Promise<void> {
    const entry: LedgerEntry = {
      format_version: LEDGER_FORMAT_VERSION,
      ...record,
      at: record.at ?? new Date().toISOString(),
      pid: process.pid,
      owner: currentOwner(),
    };
    try {
      this.#dirReady ??= mkdir(dirname(this.path), { recursive: true });
      await this.#dirReady;
      await appendFile(this.path, JSON.stringify(entry) + "\n");
    } catch (error) {
      this.#dirReady = undefined;
      throw new SandboxError(
        `Cannot write the sandbox ledger "${this.path}": ${(error as Error).message}; set ` +
          `VF_LEDGER to a writable file (or VF_LEDGER=off to run without one)`,
        { cause: error },
      );
    }
  }

  /** Every entry in file order (a torn or malformed line is skipped). */
  async entries(): Promise<LedgerEntry[]> {
    let text: string;
    try {
      text = await readFile(this.path, "utf8");
    } catch (error) {
      if ((error as { code?: string }).code === "ENOENT") return [];
      throw error;
    }
    return parseLines(text);
  }

  /** The sandboxes without a `stopped` event, selected by `filter`. */
  async live(filter: LedgerFilter = {}): Promise<LiveSandbox[]> {
    return selectLive(replay(await this.entries()), filter);
  }

  /**
   * Rewrites the ledger keeping only live sandboxes' lines. The file is first renamed aside,
   * so processes appending meanwhile start a new file; lines of the old one that are still
   * live are appended to it.
   */
  async compact(): Promise<{ before: number; after: number }> {
    const aside = `${this.path}.${process.pid}.compacting`;
    try {
      await rename(this.path, aside);
    } catch (error) {
      if ((error as { code?: string }).code === "ENOENT") return { before: 0, after: 0 };
      throw error;
    }
    // A writer that opened the old file just before the rename finishes its line first.
    await new Promise((resolve) => setTimeout(resolve, 50));
    const entries = parseLines(await readFile(aside, "utf8"));
    const live = new Set(replay(entries).map((s) => `${s.type}\0${s.key}`));
    const kept = entries.filter((e) => live.has(`${e.type}\0${e.key}`));
    if (kept.length) {
      await appendFile(this.path, kept.map((e) => JSON.stringify(e) + "\n").join(""));
    }
    await rm(aside, { force: true });
    return { before: entries.length, after: kept.length };
  }
}

function parseLines(text: string): LedgerEntry[] {
  const out: LedgerEntry[] = [];
  for (const line of text.split("\n")) {
    if (!line.trim()) continue;
    try {
      const entry = JSON.parse(line) as LedgerEntry;
      if (entry && typeof entry.type === "string" && typeof entry.key === "string") out.push(entry);
    } catch {
      // a torn line from a writer that died mid-write
    }
  }
  return out;
}

/** Merges entries per sandbox and returns those not stopped. */
export function replay(entries: LedgerEntry[]): LiveSandbox[] {
  const byKey = new Map<string, LiveSandbox | null>();
  for (const e of entries) {
    const k = `${e.type}\0${e.key}`;
    if (e.event === "stopped") {
      byKey.set(k, null);
      continue;
    }
    const current = byKey.get(k);
    if (current === null) continue; // stopped already; a late line changes nothing
    const merged: LiveSandbox = current ?? {
      type: e.type,
      key: e.key,
      requested_at: e.at,
      unconfirmed: true,
    };
    merged.owner ??= e.owner;
    merged.id = e.id ?? merged.id;
    merged.run_id = e.run_id ?? merged.run_id;
    merged.labels = e.labels ?? merged.labels;
    merged.host = e.host ?? merged.host;
    if (e.event === "created") merged.unconfirmed = false;
    byKey.set(k, merged);
  }
  return [...byKey.values()].filter((s): s is LiveSandbox => s !== null);
}

function selectLive(all: LiveSandbox[], filter: LedgerFilter): LiveSandbox[] {
  const cutoff = filter.olderThanMs === undefined ? Infinity : Date.now() - filter.olderThanMs;
  return all.filter((s) =>
    (filter.runId === undefined || s.run_id === filter.runId) &&
    (filter.type === undefined || s.type === filter.type) &&
    Date.parse(s.requested_at) <= cutoff
  );
}

let processLedger: Ledger | null | undefined;

/** The process's ledger (from `VF_LEDGER`, read once); `null` when disabled. */
export function defaultLedger(): Ledger | null {
  if (processLedger === undefined) {
    const path = defaultLedgerPath();
    processLedger = path === null ? null : new Ledger(path);
  }
  return processLedger;
}

/** Replaces the process's ledger (a path, a ledger, or `null` to disable); for tests and embedders. */
export function setDefaultLedger(ledger: Ledger | string | null): void {
  processLedger = typeof ledger === "string" ? new Ledger(ledger) : ledger;
}

/**
 * Records a sandbox event in the process's ledger: the hook every runtime calls (`requested`
 * before its create request, `created` once it has an id, `stopped` once it is gone).
 * A no-op when the ledger is off.
 * @throws {SandboxError} when the ledger cannot be written
 */
export async function recordSandbox(record: LedgerRecord): Promise<void> {
  await defaultLedger()?.record(record);
}

/** The live sandboxes of the process's ledger. */
export async function liveEntries(filter: LedgerFilter = {}): Promise<LiveSandbox[]> {
  return (await defaultLedger()?.live(filter)) ?? [];
}

/** What a cleaner reports for each sandbox it was given. */
export interface CleanerResult {
  /** Keys of sandboxes it removed. */
  removed: string[];
  /** Keys of sandboxes that were already gone. */
  gone?: string[];
  /** Keys it could not remove, with why. */
  failed?: Array<{ key: string; error: string }>;
}

/**
 * Removes a runtime type's leftover sandboxes. It receives the ledger's live entries of its
 * type (already filtered by run and age) and reports which it removed and which were already
 * gone ("not found"); both get a `stopped` line. Anything else stays live for the next run.
 */
export type Cleaner = (sandboxes: LiveSandbox[]) => Promise<CleanerResult>;

const cleaners = new Map<string, Cleaner>();

/**
 * Registers how leftovers of a runtime type are removed (a runtime module calls this at
 * import: `registerCleaner("ssh", async (sandboxes) => ...)`). A later registration replaces
 * an earlier one.
 */
export function registerCleaner(type: string, cleaner: Cleaner): void {
  cleaners.set(type, cleaner);
}

/** The runtime types with a registered cleaner. */
export function cleanerTypes(): string[] {
  return [...cleaners.keys()];
}

/** What {@linkcode cleanupLedger} did. */
export interface LedgerCleanupReport {
  /** Sandboxes removed, as `type:key`. */
  removed: string[];
  /** Sandboxes the ledger listed that were already gone, as `type:key`. */
  gone: string[];
  /** Sandboxes still live after cleanup, with the reason. */
  failed: Array<{ type: string; key: string; error: string }>;
  /** Sandboxes the owner check kept (their run is still going, or their owner is unknown). */
  kept: Array<{ type: string; key: string; reason: string }>;
}

/**
 * Removes the ledger's live sandboxes (selected by `filter`) through each type's registered
 * cleaner and records `stopped` for those gone. Types without a cleaner are reported as
 * failed, naming the type.
 * @param filter which sandboxes
 * @param options.ledger default the process's ledger
 */
export async function cleanupLedger(
  filter: LedgerFilter = {},
  options: { ledger?: Ledger | null } = {},
): Promise<LedgerCleanupReport> {
  const ledger = options.ledger === undefined ? defaultLedger() : options.ledger;
  const report: LedgerCleanupReport = { removed: [], gone: [], failed: [], kept: [] };
  if (!ledger) return report;
  const live = (await ledger.live(filter)).filter((s) => {
    if (!filter.owners) return true;
    const reason = keepReason(s.owner, Date.parse(s.requested_at), filter.owners);
    if (reason !== undefined) report.kept.push({ type: s.type, key: s.key, reason });
    return reason === undefined;
  });
  const byType = new Map<string, LiveSandbox[]>();
  for (const s of live) byType.set(s.type, [...(byType.get(s.type) ?? []), s]);
  await Promise.all([...byType].map(async ([type, sandboxes]) => {
    const cleaner = cleaners.get(type);
    if (!cleaner) {
      for (const s of sandboxes) {
        report.failed.push({
          type,
          key: s.key,
          error: `no cleaner is registered for runtime type "${type}"`,
        });
      }
      return;
    }
    let result: CleanerResult;
    try {
      result = await cleaner(sandboxes);
    } catch (error) {
      for (const s of sandboxes) report.failed.push({ type, key: s.key, error: String(error) });
      return;
    }
    const removed = new Set(result.removed);
    const gone = new Set(result.gone ?? []);
    for (const s of sandboxes) {
      if (!removed.has(s.key) && !gone.has(s.key)) continue;
      await ledger.record({
        event: "stopped",
        type,
        key: s.key,
        id: s.id,
        run_id: s.run_id,
      });
      (removed.has(s.key) ? report.removed : report.gone).push(`${type}:${s.key}`);
    }
    for (const f of result.failed ?? []) report.failed.push({ type, ...f });
  }));
  return report;
}
