/**
 * A small client for the parts of Prime Intellect's sandbox API that vf uses (create, get,
 * list, delete, SSH sessions and the gateway's key authorization), plus listing and
 * deleting vf's leftover sandboxes. {@linkcode PrimeRuntime} drives a sandbox through it.
 * @module
 */

import process from "node:process";
import { ConfigError } from "../../lib/errors.ts";
import { sleep } from "../_util.ts";
import { SandboxApiError, SandboxError, SandboxUnavailableError } from "../errors.ts";

/** Prime's public API. */
export const PRIME_API_BASE = "https://api.primeintellect.ai";

/** A sandbox as Prime's API reports it (the fields vf uses). */
export interface PrimeSandbox {
  id: string;
  name: string;
  status: string;
  labels: string[];
  createdAt?: string;
  errorType?: string | null;
  errorMessage?: string | null;
  pendingImageBuildId?: string | null;
}

/** What `POST /sandbox/{id}/ssh-session` answers. */
export interface SshSession {
  session_id: string;
  sandbox_id: string;
  host: string;
  port: number;
  gateway_url: string;
  user_ns: string;
  job_id: string;
  token: string;
  ttl_seconds: number;
}

/** How to reach Prime's API. */
export interface PrimeApiOptions {
  /** Default `https://api.primeintellect.ai`. */
  apiBase?: string;
  /** Environment variable holding the key; default `PRIME_API_KEY`. */
  apiKeyVar?: string;
  /** Team; default `PRIME_TEAM_ID` when set. */
  teamId?: string;
}

export const FAILED = new Set(["ERROR", "TERMINATED", "TIMEOUT"]);
export const MAX_SESSION_TTL_S = 3600;

/** A small client for the parts of Prime's sandbox API vf uses. */
export class PrimeApi {
  readonly base: string;
  readonly keyVar: string;
  readonly teamId: string | undefined;

  constructor(options: PrimeApiOptions = {}) {
    this.base = (options.apiBase ?? PRIME_API_BASE).replace(/\/+$/, "").replace(/\/api\/v1$/, "");
    this.keyVar = options.apiKeyVar ?? "PRIME_API_KEY";
    this.teamId = options.teamId ?? (process.env.PRIME_TEAM_ID || undefined);
  }

  #key(): string {
    const key = process.env[this.keyVar];
    if (!key) {
      throw new ConfigError(
        `The Prime API key is not set: set ${this.keyVar} to a key from ` +
          `https://app.primeintellect.ai/dashboard/tokens`,
      );
    }
    return key;
  }

  /**
   * One API call with retries of transient failures (network errors, 408, 429, 5xx).
   * @returns the JSON body, or undefined for 404 when `allow404`
   */
  async request<T>(
    method: string,
    path: string,
    options: { body?: unknown; query?: URLSearchParams; allow404?: boolean; attempts?: number } =
      {},
  ): Promise<T | undefined> {
    const key = this.#key();
    const url = `${this.base}/api/v1${path}${options.query ? `?${options.query}` : ""}`;
    const attempts = options.attempts ?? 5;
    let lastError: unknown;
    for (let attempt = 1; attempt <= attempts; attempt++) {
      let response: Response;
      try {
        response = await fetch(url, {
          method,
          headers: {
            Authorization: `Bearer ${key}`,
            "Content-Type": "application/json",
            "User-Agent": "vf",
          },
          body: options.body === undefined ? undefined : JSON.stringify(options.body),
          signal: AbortSignal.timeout(30_000),
        });
      } catch (error) {
        lastError = new SandboxUnavailableError(
          `Cannot reach the Prime API at "${this.base}": ${(error as Error).message}; check ` +
            `the network or apiBase`,
          { cause: error },
        );
        if (attempt < attempts) await sleep(backoff(attempt));
        continue;
      }
      const text = await response.text();
      if (response.ok) return (text ? JSON.parse(text) : {}) as T;
      if (response.status === 404 && options.allow404) return undefined;
      const detail = errorDetail(text);
      const what = `${method} ${path}`;
      if (response.status === 401 || response.status === 403) {
        throw new SandboxApiError(
          response.status,
          `The Prime API rejected the key in ${this.keyVar} (HTTP ${response.status} on ${what}` +
            `${detail ? `: ${detail}` : ""}); check the key and its permissions at ` +
            `https://app.primeintellect.ai/dashboard/tokens`,
        );
      }
      if (response.status === 402) {
        throw new SandboxApiError(
          402,
          `The Prime API asks for payment (HTTP 402 on ${what}); check billing at ` +
            `https://app.primeintellect.ai/dashboard/billing`,
        );
      }
      lastError = new SandboxApiError(
        response.status,
        `The Prime API answered HTTP ${response.status} to ${what}${detail ? `: ${detail}` : ""}`,
      );
      const transient = response.status === 408 || response.status === 429 ||
        response.status >= 500;
      if (!transient || attempt === attempts) throw lastError;
      const retryAfter = Number(response.headers.get("retry-after"));
      await sleep(
        Number.isFinite(retryAfter) && retryAfter > 0
          ? Math.min(retryAfter * 1000, 30_000)
          : backoff(attempt),
      );
    }
    throw lastError;
  }

  /** `POST /sandbox`. */
  async create(body: Record<string, unknown>): Promise<PrimeSandbox> {
    if (this.teamId && body.team_id === undefined) body = { ...body, team_id: this.teamId };
    return (await this.request<PrimeSandbox>("POST", "/sandbox", { body }))!;
  }

  /** `GET /sandbox/{id}`; undefined when it does not exist. */
  async get(id: string): Promise<PrimeSandbox | undefined> {
    return await this.request<PrimeSandbox>("GET", `/sandbox/${encodeURIComponent(id)}`, {
      allow404: true,
    });
  }

  /** `DELETE /sandbox/{id}`; false when it was already gone. */
  async delete(id: string): Promise<boolean> {
    const result = await this.request("DELETE", `/sandbox/${encodeURIComponent(id)}`, {
      allow404: true,
      attempts: 6,
    });
    return result !== undefined;
  }

  /** `GET /sandbox`, every page, with all of `labels`. */
  async list(options: { labels?: string[]; activeOnly?: boolean } = {}): Promise<PrimeSandbox[]> {
    const out: PrimeSandbox[] = [];
    for (let page = 1; page <= 1000; page++) {
      const query = new URLSearchParams({ page: String(page), per_page: "100" });
      for (const label of options.labels ?? []) query.append("labels", label);
      if (options.activeOnly !== false) query.set("is_active", "true");
      if (this.teamId) query.set("team_id", this.teamId);
      const body = (await this.request<{ sandboxes: PrimeSandbox[]; hasNext?: boolean }>(
        "GET",
        "/sandbox",
        { query },
      ))!;
      out.push(...(body.sandboxes ?? []));
      if (!body.hasNext) break;
    }
    return out;
  }

  /** `POST /sandbox/{id}/ssh-session`. */
  async sshSession(id: string, ttlSeconds: number): Promise<SshSession> {
    return (await this.request<SshSession>(
      "POST",
      `/sandbox/${encodeURIComponent(id)}/ssh-session`,
      { body: { ttl_seconds: ttlSeconds } },
    ))!;
  }

  /** Authorizes `publicKey` for an SSH session at the session's gateway. */
  async authorizeKey(session: SshSession, publicKey: string): Promise<void> {
    const url = `${session.gateway_url.replace(/\/+$/, "")}/${session.user_ns}/${session.job_id}` +
      `/authorize`;
    let lastError: unknown;
    for (let attempt = 1; attempt <= 5; attempt++) {
      try {
        const response = await fetch(url, {
          method: "POST",
          headers: { Authorization: `Bearer ${session.token}`, "Content-Type": "application/json" },
          body: JSON.stringify({
            session_id: session.session_id,
            public_key: publicKey,
            ttl_seconds: session.ttl_seconds,
          }),
          signal: AbortSignal.timeout(30_000),
        });
        const text = await response.text();
        if (response.ok) return;
        lastError = new SandboxApiError(
          response.status,
          `Prime's SSH gateway refused the session key (HTTP ${response.status}` +
            `${errorDetail(text) ? `: ${errorDetail(text)}` : ""})`,
        );
        if (response.status < 500 && response.status !== 429) throw lastError;
      } catch (error) {
        if (error instanceof SandboxApiError && error.status < 500 && error.status !== 429) {
          throw error;
        }
        lastError = error instanceof SandboxError ? error : new SandboxUnavailableError(
          `Cannot reach Prime's SSH gateway: ${(error as Error).message}`,
          { cause: error },
        );
      }
      await sleep(backoff(attempt));
    }
    throw lastError;
  }
}

function backoff(attempt: number): number {
  const base = Math.min(500 * 2 ** (attempt - 1), 8_000);
  return base * (0.75 + Math.random() * 0.5);
}

function errorDetail(text: string): string {
  try {
    const body = JSON.parse(text);
    const detail = body?.detail ?? body?.message ?? body?.error;
    if (typeof detail === "string") return detail;
    if (detail !== undefined) return JSON.stringify(detail).slice(0, 300);
  } catch {
    // not JSON
  }
  return text.trim().slice(0, 300);
}

/** Which Prime sandboxes {@linkcode listPrimeSandboxes} and {@linkcode cleanupPrime} select. */
export interface PrimeCleanupFilter {
  /** Only sandboxes of this run (label `vf.run_id`). */
  runId?: string;
  /** Only sandboxes created at least this long ago. */
  olderThanMs?: number;
  /** More labels every selected sandbox must have. */
  labels?: string[];
}

/**
 * Active Prime sandboxes labelled `vf.managed=1` (and the filter's labels).
 * @param filter which sandboxes
 * @param options how to reach the API
 */
export async function listPrimeSandboxes(
  filter: PrimeCleanupFilter = {},
  options: PrimeApiOptions = {},
): Promise<PrimeSandbox[]> {
  const labels = ["vf.managed=1", ...(filter.labels ?? [])];
  if (filter.runId) labels.push(`vf.run_id=${filter.runId}`);
  const sandboxes = await new PrimeApi(options).list({ labels });
  const cutoff = filter.olderThanMs === undefined ? Infinity : Date.now() - filter.olderThanMs;
  return sandboxes.filter((s) =>
    labels.every((l) => (s.labels ?? []).includes(l)) && s.status !== "TERMINATED" &&
    (cutoff === Infinity || (s.createdAt !== undefined && Date.parse(s.createdAt) <= cutoff))
  );
}

/**
 * Deletes the Prime sandboxes {@linkcode listPrimeSandboxes} selects. Returns their ids.
 * @param filter which sandboxes
 * @param options how to reach the API
 * @returns the ids of the deleted sandboxes
 * @throws {SandboxApiError} when the API refuses the key or keeps failing
 * @example
 * ```ts
 * const removed = await cleanupPrime({ runId: "run-1", olderThanMs: 30 * 60_000 });
 * ```
 */
export async function cleanupPrime(
  filter: PrimeCleanupFilter = {},
  options: PrimeApiOptions = {},
): Promise<string[]> {
  const api = new PrimeApi(options);
  const doomed = await listPrimeSandboxes(filter, options);
  const removed: string[] = [];
  await Promise.all(doomed.map(async (s) => {
    if (await api.delete(s.id)) removed.push(s.id);
  }));
  return removed;
}
