/**
 * Worker entry for `http1_thread.ts`: runs the HTTP/1.1 pool (`http1.ts`) on a thread of its
 * own, so the sockets, the request heads and the response parsing cost the thread that runs the
 * rollouts nothing. Posts `{ ready: true }` once loaded. Each message from the caller is a batch
 * (see {@link Batch}); each message back is the replies that arrived together (see
 * {@link Replies}).
 * @module
 */
import { parentPort } from "node:worker_threads";
import { Http1Error, http1Request, type Http1Response, Http1TimeoutError } from "./http1.ts";

/**
 * From the caller: `requests` flat, six fields per request (id, url, headers id, body,
 * timeout ms or -1, signal id or 0); headers and signals defined before the requests that use
 * them (a negative headers id is one request's own, dropped once read); signals aborted or no
 * longer used.
 */
export interface Batch {
  requests: Array<number | string>;
  headers: Array<[number, Record<string, string>]> | null;
  signals: number[] | null;
  aborted: number[] | null;
  forgotten: number[] | null;
}

/** To the caller: `ok` flat, four fields per reply (id, status, text, retry-after or null). */
export interface Replies {
  ok: Array<number | string | null>;
  failed: Array<FailedRequest> | null;
}

/** A request that failed, as the caller rebuilds its error. */
export interface FailedRequest {
  id: number;
  /** `timeout`: an Http1TimeoutError; `http1`: an Http1Error; else an error of this name. */
  kind: "timeout" | "http1" | "TypeError" | "RangeError" | "Error";
  message: string;
  phase?: Http1Error["phase"];
  code?: string;
  timeoutMs?: number;
}

const port = parentPort!;
const urls = new Map<string, URL>();
const headerSets = new Map<number, Readonly<Record<string, string>>>();
const signals = new Map<number, AbortController>();

let ok: Replies["ok"] = [];
let failed: FailedRequest[] | null = null;
let scheduled = false;

function send(): void {
  scheduled = false;
  const replies: Replies = { ok, failed };
  ok = [];
  failed = null;
  port.postMessage(replies);
}

function schedule(): void {
  if (scheduled) return;
  scheduled = true;
  queueMicrotask(send);
}

/** One request's outcome, gathered with the others that settle in the same turn. */
class Settle {
  constructor(readonly id: number, readonly timeoutMs: number | undefined) {}

  done = (res: Http1Response): void => {
    ok.push(this.id, res.status, res.text, res.headers.get("retry-after") ?? null);
    schedule();
  };

  fail = (error: unknown): void => {
    (failed ??= []).push(describe(this.id, error, this.timeoutMs));
    schedule();
  };
}

function describe(id: number, error: unknown, timeoutMs: number | undefined): FailedRequest {
  const message = error instanceof Error ? error.message : String(error);
  if (error instanceof Http1TimeoutError) {
    return { id, kind: "timeout", message, phase: error.phase, timeoutMs };
  }
  if (error instanceof Http1Error) {
    return { id, kind: "http1", message, phase: error.phase, code: error.code };
  }
  const kind = error instanceof TypeError
    ? "TypeError"
    : error instanceof RangeError
    ? "RangeError"
    : "Error";
  return { id, kind, message };
}

port.on("message", (batch: Batch) => {
  // Frozen, as the caller's were: the pool then builds their header lines once, not per request.
  if (batch.headers) {
    for (const [id, headers] of batch.headers) headerSets.set(id, Object.freeze(headers));
  }
  if (batch.signals) { for (const id of batch.signals) signals.set(id, new AbortController()); }
  const requests = batch.requests;
  for (let i = 0; i < requests.length; i += 6) {
    const id = requests[i] as number;
    const href = requests[i + 1] as string;
    let url = urls.get(href);
    if (!url) urls.set(href, url = new URL(href));
    const timeout = requests[i + 4] as number;
    const signalId = requests[i + 5] as number;
    const settle = new Settle(id, timeout < 0 ? undefined : timeout);
    const headersId = requests[i + 2] as number;
    const headers = headerSets.get(headersId)!;
    if (headersId < 0) headerSets.delete(headersId);
    http1Request({
      method: "POST",
      url,
      headers,
      body: requests[i + 3] as string,
      signal: signalId ? signals.get(signalId)?.signal : undefined,
      timeoutMs: settle.timeoutMs,
    }).then(settle.done, settle.fail);
  }
  // The caller has already rejected the requests of an aborted signal: closing their sockets
  // is all that is left (an inference server stops generating for a closed connection).
  if (batch.aborted) {
    for (const id of batch.aborted) {
      signals.get(id)?.abort();
      signals.delete(id);
    }
  }
  if (batch.forgotten) { for (const id of batch.forgotten) signals.delete(id); }
});
port.postMessage({ ready: true });
