/**
 * The HTTP/1.1 pool (`http1.ts`) on a worker thread of its own: the model client's plain-http
 * requests are posted to it in batches and their replies come back in batches, so the sockets,
 * the request heads and the response parsing run beside the thread that runs the rollouts
 * instead of on it. At hundreds of requests in flight that is about a third of what a rollout
 * costs that thread (bench/evaluate_http.ts).
 *
 * The contract is `http1Request`'s for a POST: the reply, or an `Http1Error` /
 * `Http1TimeoutError` with its phase, or the signal's reason once it aborts (and the request's
 * socket is closed, so a server stops generating). Where no worker can start (no
 * `node:worker_threads`, no permission, a bundle without the worker file) the requests run on
 * the calling thread as before, and so do the ones posted before the worker failed to load.
 *
 * The worker never keeps the process alive by itself: it is referenced only while requests are
 * in flight.
 * @module
 */
import { Worker } from "node:worker_threads";
import { Http1Error, type Http1Phase, http1Request, Http1TimeoutError } from "./http1.ts";
import type { Batch, FailedRequest, Replies } from "./_http1_worker.ts";

/** One POST to send off-thread. */
export interface ThreadRequest {
  url: URL;
  headers: Readonly<Record<string, string>>;
  body: string;
  /** Rejects with the signal's reason and closes the request's socket when it aborts. */
  signal?: AbortSignal;
  /** Whole-request deadline in milliseconds. */
  timeoutMs?: number;
}

/** A complete reply: what the model client reads of one. */
export interface ThreadReply {
  status: number;
  text: string;
  retryAfter: string | null;
}

// In a binary built by `bun build --compile` every bundled module shares the executable's
// import.meta.url; the worker is a separate entrypoint there, at its path from the project root
// (scripts/_bun_build.ts).
const WORKER_URL = /\/(\$bunfs|~BUN)\/root\//.test(import.meta.url)
  ? new URL("./lib/model/_http1_worker.ts", import.meta.url)
  : new URL("./_http1_worker.ts", import.meta.url);

/** A request in flight on the worker. */
class Call {
  constructor(
    readonly req: ThreadRequest,
    readonly link: SignalLink | null,
    readonly resolve: (reply: ThreadReply) => void,
    readonly reject: (error: unknown) => void,
  ) {}
}

/** A signal mirrored on the worker: one listener here for every request that shares it. */
interface SignalLink {
  id: number;
  signal: AbortSignal;
  /** Requests in flight under it; at 0 the worker forgets it. */
  count: number;
  onAbort: () => void;
}

/** The requests and notices gathered in one turn, posted together. */
function emptyBatch(): Batch {
  return { requests: [], headers: null, signals: null, aborted: null, forgotten: null };
}

class Http1Thread {
  readonly worker: Worker;
  ready = false;
  readonly pending = new Map<number, Call>();
  #batch = emptyBatch();
  #scheduled = false;
  #nextId = 0;
  #nextHeadersId = 0;
  #nextSignalId = 0;
  /** Ids of the frozen header objects the worker holds (a client's headers for every call). */
  readonly #headerIds = new WeakMap<object, number>();
  readonly #links = new WeakMap<AbortSignal, SignalLink>();
  readonly #hrefs = new WeakMap<URL, string>();

  constructor() {
    this.worker = new Worker(WORKER_URL);
    this.worker.unref();
    this.worker.on("message", (message: Replies | { ready: true }) => {
      if ("ready" in message) this.ready = true;
      else this.#settle(message);
    });
    this.worker.on("error", (error: Error) => this.#stopped(error));
    this.worker.on("exit", (code: number) => {
      if (thread === this) this.#stopped(new Error(`the thread exited with code ${code}`));
    });
  }

  post(req: ThreadRequest): Promise<ThreadReply> {
    const batch = this.#batch;
    const id = ++this.#nextId;
    const link = req.signal ? this.#link(req.signal, batch) : null;
    let href = this.#hrefs.get(req.url);
    if (href === undefined) this.#hrefs.set(req.url, href = req.url.href);
    batch.requests.push(
      id,
      href,
      this.#headersId(req.headers, batch),
      req.body,
      req.timeoutMs ?? -1,
      link ? link.id : 0,
    );
    this.#schedule();
    if (this.pending.size === 0) this.worker.ref();
    return new Promise<ThreadReply>((resolve, reject) => {
      this.pending.set(id, new Call(req, link, resolve, reject));
    });
  }

  #headersId(headers: Readonly<Record<string, string>>, batch: Batch): number {
    const frozen = Object.isFrozen(headers);
    if (frozen) {
      const known = this.#headerIds.get(headers);
      if (known !== undefined) return known;
    }
    const id = frozen ? ++this.#nextHeadersId : -++this.#nextHeadersId;
    if (frozen) this.#headerIds.set(headers, id);
    (batch.headers ??= []).push([id, headers]);
    return id;
  }

  #link(signal: AbortSignal, batch: Batch): SignalLink {
    let link = this.#links.get(signal);
    if (!link) {
      const made: SignalLink = {
        id: ++this.#nextSignalId,
        signal,
        count: 0,
        onAbort: () => this.#aborted(made),
      };
      link = made;
      this.#links.set(signal, link);
      signal.addEventListener("abort", link.onAbort, { once: true });
      (batch.signals ??= []).push(link.id);
    }
    link.count++;
    return link;
  }

  #release(link: SignalLink | null): void {
    if (!link || --link.count > 0) return;
    link.signal.removeEventListener("abort", link.onAbort);
    this.#links.delete(link.signal);
    (this.#batch.forgotten ??= []).push(link.id);
  }

  #aborted(link: SignalLink): void {
    this.#links.delete(link.signal);
    for (const [id, call] of this.pending) {
      if (call.link !== link) continue;
      this.pending.delete(id);
      call.reject(link.signal.reason);
    }
    (this.#batch.aborted ??= []).push(link.id);
    this.#schedule();
    this.#idle();
  }

  #schedule(): void {
    if (this.#scheduled) return;
    this.#scheduled = true;
    queueMicrotask(this.#flush);
  }

  #flush = (): void => {
    this.#scheduled = false;
    const batch = this.#batch;
    this.#batch = emptyBatch();
    this.worker.postMessage(batch);
  };

  #settle(replies: Replies): void {
    const ok = replies.ok;
    for (let i = 0; i < ok.length; i += 4) {
      const call = this.pending.get(ok[i] as number);
      if (!call) continue; // aborted here already
      this.pending.delete(ok[i] as number);
      this.#release(call.link);
      call.resolve({
        status: ok[i + 1] as number,
        text: ok[i + 2] as string,
        retryAfter: ok[i + 3] as string | null,
      });
    }
    if (replies.failed) {
      for (const failure of replies.failed) {
        const call = this.pending.get(failure.id);
        if (!call) continue;
        this.pending.delete(failure.id);
        this.#release(call.link);
        call.reject(rebuilt(failure));
      }
    }
    this.#idle();
  }

  #idle(): void {
    if (this.pending.size === 0) this.worker.unref();
  }

  /**
   * The worker failed or exited. Before it ever loaded, nothing it was sent ran: those requests
   * and all later ones run on this thread. After, what was in flight is lost with it.
   */
  #stopped(error: Error): void {
    if (thread !== this) return;
    thread = null;
    unavailable = true;
    const calls = [...this.pending.values()];
    this.pending.clear();
    for (const call of calls) call.link?.signal.removeEventListener("abort", call.link.onAbort);
    if (!this.ready) {
      // Said once: requests still work, at the cost to this thread the worker is there to save.
      console.warn(
        `vf: the HTTP/1.1 worker thread "${WORKER_URL.href}" did not start (${error.message}); ` +
          "model requests run on the main thread",
      );
      for (const call of calls) http1PostHere(call.req).then(call.resolve, call.reject);
      return;
    }
    for (const call of calls) {
      call.reject(
        new Http1Error(
          `The HTTP/1.1 worker thread stopped with the request in flight: ${error.message}`,
          "receive",
          undefined,
        ),
      );
    }
    this.worker.terminate();
  }
}

/** The error the worker reported, as `http1Request` would have thrown it. */
function rebuilt(failure: FailedRequest): Error {
  const phase = failure.phase as Http1Phase;
  switch (failure.kind) {
    case "timeout":
      return new Http1TimeoutError(phase, failure.timeoutMs ?? 0);
    case "http1":
      return new Http1Error(failure.message, phase, failure.code);
    case "TypeError":
      return new TypeError(failure.message);
    case "RangeError":
      return new RangeError(failure.message);
    default:
      return new Error(failure.message);
  }
}

let thread: Http1Thread | null = null;
/** Set once a worker could not start or stopped: every request runs on this thread then. */
let unavailable = false;

/** POSTs `req` through the HTTP/1.1 pool on the calling thread. */
export function http1PostHere(req: ThreadRequest): Promise<ThreadReply> {
  return http1Request({
    method: "POST",
    url: req.url,
    headers: req.headers,
    body: req.body,
    signal: req.signal,
    timeoutMs: req.timeoutMs,
  }).then((res) => ({
    status: res.status,
    text: res.text,
    retryAfter: res.headers.get("retry-after") ?? null,
  }));
}

/**
 * POSTs `req` through the HTTP/1.1 pool on its worker thread (started on first use), or on this
 * thread where no worker can run.
 *
 * @throws {Http1Error} when the connection fails; `phase` says whether any response arrived
 * @throws {Http1TimeoutError} when `timeoutMs` passes first
 * @throws the signal's reason when `signal` aborts
 */
export function http1Post(req: ThreadRequest): Promise<ThreadReply> {
  if (req.signal?.aborted) return Promise.reject(req.signal.reason);
  if (!unavailable && thread === null) {
    try {
      thread = new Http1Thread();
    } catch {
      unavailable = true;
    }
  }
  return thread ? thread.post(req) : http1PostHere(req);
}

/** Where requests run now: `"worker"` (started, or to start on first use) or `"this thread"`. */
export function http1PostWhere(): "worker" | "this thread" {
  return unavailable ? "this thread" : "worker";
}
