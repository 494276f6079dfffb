/**
 * `vf serve --workers N`: one port in front of up to N worker processes, each a `vf serve`
 * of the same environment on a loopback port, so rollouts use every core. The front starts
 * with one worker and adds one (up to N) whenever every worker has groups waiting; each
 * `/rollouts` stream and `/run` goes to the least-loaded worker and `/cancel` to the one that
 * holds the request. `GET /health` reports every worker's load. The token (`VF_SERVER_TOKEN`) and TLS
 * apply at the front; workers listen on loopback only. The processes are a
 * {@link WorkerPool}, which the ZeroMQ broker (`zmq_broker.ts`) shares with the front under
 * `--zmq`; each worker then also serves the wire on a private `ipc://` endpoint.
 * @module
 */
import { type ChildProcess, spawn } from "node:child_process";
import { mkdtemp, rm } from "node:fs/promises";
import { tmpdir } from "node:os";
import { join } from "node:path";
import process from "node:process";
import { type Context, Hono } from "npm:hono@^4.13.0";
import { type HttpListener, serveHttp } from "../model/http_server.ts";

/** A worker process and what the front and the ZeroMQ broker know of it. */
export interface Worker {
  /** Its place in the pool, from 0. */
  index: number;
  child: ChildProcess;
  pid: number;
  /** Its HTTP server (loopback), when the pool serves HTTP. */
  url: string;
  /** Its private ZeroMQ endpoint (`ipc://<tmpdir>/<index>`), when the pool serves ZeroMQ. */
  zmq: string;
  /** False once the process has exited. */
  alive: boolean;
  /** Resolves when the process exits. */
  exited: Promise<{ code: number | null; signal: string | null }>;
  /** `/rollouts` streams the front has open on it. */
  active: number;
  queued: number;
  inFlight: number;
  maxConcurrent: number;
}

/** Options of {@link WorkerPool.start}. */
export interface WorkerPoolOptions {
  /** The `vf serve` arguments a worker runs with (the environment and its settings). */
  workerArgs: string[];
  /** Workers at most. */
  maxWorkers: number;
  /** Workers started at once; default 1 (the HTTP front adds the others under load). */
  initial?: number;
  /** Each worker serves HTTP on a loopback port; default true. */
  http?: boolean;
  /** Each worker serves the ZeroMQ wire on a private ipc endpoint; default false. */
  zmq?: boolean;
}

/** The command that runs this program again: `deno run -A <main>` or the vf binary itself. */
function selfCommand(): string[] {
  const deno = (globalThis as { Deno?: typeof Deno }).Deno;
  if (deno?.mainModule) {
    return [deno.execPath(), "run", "-A", new URL(deno.mainModule).pathname];
  }
  return [process.execPath];
}

async function startWorker(
  index: number,
  args: string[],
  serve: { http: boolean; zmq?: string },
): Promise<Worker> {
  const [cmd, ...pre] = selfCommand();
  const extra = [
    ...(serve.http ? ["--port", "0", "--host", "127.0.0.1"] : []),
    ...(serve.zmq ? ["--zmq", serve.zmq] : []),
  ];
  const child = spawn(cmd, [...pre, "serve", ...args, ...extra], {
    stdio: ["ignore", "pipe", "inherit"],
  });
  const exited = new Promise<{ code: number | null; signal: string | null }>((resolve) =>
    child.once("exit", (code, signal) => resolve({ code, signal }))
  );
  const [url, zmq] = await new Promise<[string, string]>((resolve, reject) => {
    let out = "";
    const onData = (chunk: Buffer) => {
      out += chunk.toString();
      const url = /at (http:\/\/127\.0\.0\.1:\d+)/.exec(out)?.[1] ?? "";
      const zmq = /ZeroMQ at (\S+)/.exec(out)?.[1] ?? "";
      if ((url || !serve.http) && (zmq || !serve.zmq)) {
        child.stdout!.off("data", onData);
        resolve([url, zmq]);
      }
    };
    child.stdout!.on("data", onData);
    void exited.then(({ code }) =>
      reject(new Error(`a worker exited (${code}) before serving: ${out}`))
    );
  });
  child.stdout!.resume();
  const worker: Worker = {
    index,
    child,
    pid: child.pid!,
    url,
    zmq,
    alive: true,
    exited,
    active: 0,
    queued: 0,
    inFlight: 0,
    maxConcurrent: Infinity,
  };
  void exited.then(() => (worker.alive = false));
  return worker;
}

/**
 * The worker processes of `vf serve --workers N`, shared by the HTTP front and the ZeroMQ
 * broker: both dispatch to the same processes.
 */
export class WorkerPool {
  /** Every worker started, dead ones included (their `alive` is false). */
  readonly workers: Worker[] = [];
  readonly maxWorkers: number;
  #options: WorkerPoolOptions;
  #dir: string | undefined;
  #adding: Promise<Worker> | null = null;
  #closing = false;

  private constructor(options: WorkerPoolOptions, dir: string | undefined) {
    this.#options = options;
    this.maxWorkers = options.maxWorkers;
    this.#dir = dir;
  }

  /**
   * Start `initial` workers (default 1) and resolve once each serves.
   * @throws {Error} when a worker exits before serving (the others are stopped)
   */
  static async start(options: WorkerPoolOptions): Promise<WorkerPool> {
    // ipc endpoints in a private directory: only this user reaches the workers.
    const dir = options.zmq ? await mkdtemp(join(tmpdir(), "vf-workers-")) : undefined;
    const pool = new WorkerPool(options, dir);
    const initial = Math.min(options.initial ?? 1, options.maxWorkers);
    const started = await Promise.allSettled(
      Array.from({ length: initial }, (_, i) => pool.#spawn(i)),
    );
    for (const s of started) if (s.status === "fulfilled") pool.workers.push(s.value);
    const failed = started.find((s) => s.status === "rejected");
    if (failed) {
      await pool.close();
      throw (failed as PromiseRejectedResult).reason;
    }
    pool.workers.sort((a, b) => a.index - b.index);
    return pool;
  }

  #spawn(index: number): Promise<Worker> {
    return startWorker(index, this.#options.workerArgs, {
      http: this.#options.http ?? true,
      zmq: this.#dir ? `ipc://${join(this.#dir, String(index))}` : undefined,
    });
  }

  /** Workers whose process is running. */
  get live(): Worker[] {
    return this.workers.filter((w) => w.alive);
  }

  /** Whether {@link WorkerPool.close} has been called. */
  get closing(): boolean {
    return this.#closing;
  }

  /** Whether a worker is being added now. */
  get adding(): boolean {
    return this.#adding !== null;
  }

  /** Add one worker (one at a time; none past `maxWorkers`). */
  add(): Promise<Worker> {
    if (this.#adding) return this.#adding;
    if (this.workers.length >= this.maxWorkers || this.#closing) {
      return Promise.reject(new RangeError(`the pool has its ${this.maxWorkers} workers`));
    }
    this.#adding = this.#spawn(this.workers.length)
      .then((w) => {
        this.workers.push(w);
        if (this.#closing) w.child.kill("SIGTERM");
        return w;
      })
      .finally(() => (this.#adding = null));
    return this.#adding;
  }

  /** Stop every worker (SIGTERM: each winds its runs down and replies) and wait for them. */
  async close(): Promise<void> {
    this.#closing = true;
    await this.#adding?.catch(() => {});
    await Promise.all(this.workers.map((w) => {
      if (w.alive) w.child.kill("SIGTERM");
      return w.exited;
    }));
    if (this.#dir) await rm(this.#dir, { recursive: true, force: true });
  }
}

/** Options of {@link startWorkerFront}. */
export interface WorkerFrontOptions {
  /** The `vf serve` arguments a worker runs with (the environment and its settings). */
  workerArgs: string[];
  /** Workers at most. */
  maxWorkers: number;
  /** Workers to dispatch to, shared with the ZeroMQ broker; the front then does not close
   * them. Default: its own pool of `workerArgs`, one worker to start with. */
  pool?: WorkerPool;
  port: number;
  hostname: string;
  token?: string;
  tls?: { cert: string; key: string };
  /** How the front polls the workers' load, in ms; default 500. */
  pollMs?: number;
}

/** The running front. */
export interface WorkerFront {
  url: string;
  port: number;
  readonly workers: number;
  close(): Promise<void>;
}

/** Start the front and its first worker. */
export async function startWorkerFront(options: WorkerFrontOptions): Promise<WorkerFront> {
  const ownPool = options.pool === undefined;
  const pool = options.pool ??
    await WorkerPool.start({ workerArgs: options.workerArgs, maxWorkers: options.maxWorkers });
  const workers = pool.workers;
  const owner = new Map<string, Worker>();
  const headersOf = (req: Request) => {
    const h = new Headers();
    for (const name of ["content-type", "authorization", "accept"]) {
      const v = req.headers.get(name);
      if (v) h.set(name, v);
    }
    return h;
  };
  const forward = async (worker: Worker, req: Request, path: string, body?: string) => {
    const res = await fetch(worker.url + path, {
      method: req.method,
      headers: headersOf(req),
      body,
    });
    return new Response(res.body, { status: res.status, headers: res.headers });
  };
  const least = () => {
    const live = pool.live;
    return (live.length ? live : workers).reduce((a, b) =>
      b.active + b.queued < a.active + a.queued ? b : a
    );
  };

  // Poll the workers' load; add one when every worker has groups waiting.
  const poll = setInterval(async () => {
    await Promise.all(pool.live.map(async (w) => {
      try {
        const h = await (await fetch(`${w.url}/health`)).json();
        w.queued = Number(h.queued ?? 0);
        w.inFlight = Number(h.in_flight ?? 0);
        w.maxConcurrent = Number(h.max_concurrent ?? Infinity);
      } catch { /* a worker that does not answer keeps its last numbers */ }
    }));
    // Busy: groups waiting, or every slot taken.
    const busy = (w: Worker) => w.queued > 0 || w.inFlight >= w.maxConcurrent;
    if (!pool.adding && workers.length < pool.maxWorkers && pool.live.every(busy)) {
      pool.add().catch((error) =>
        console.warn(`warning: could not add a worker: ${error.message}`)
      );
    }
  }, options.pollMs ?? 500);

  const app = new Hono();
  if (options.token !== undefined) {
    const expected = `Bearer ${options.token}`;
    app.use("*", async (c, next) => {
      if (c.req.path === "/health" || c.req.header("authorization") === expected) {
        return await next();
      }
      return c.json(
        { error: "Missing or wrong token; send Authorization: Bearer <token> (VF_SERVER_TOKEN)" },
        401,
      );
    });
  }
  app.get("/health", (c) =>
    c.json({
      ok: true,
      workers: workers.map((w) => ({
        worker: w.index,
        pid: w.pid,
        alive: w.alive,
        url: w.url,
        active_requests: w.active,
        in_flight: w.inFlight,
        queued: w.queued,
      })),
      max_workers: pool.maxWorkers,
      in_flight: workers.reduce((a, w) => a + w.inFlight, 0),
      queued: workers.reduce((a, w) => a + w.queued, 0),
    }));
  app.get("/info", async (c) => {
    // Clients size their load by max_concurrent: offer what all the workers can take.
    const res = await fetch(`${least().url}/info`, { headers: headersOf(c.req.raw) });
    if (!res.ok) return new Response(res.body, { status: res.status, headers: res.headers });
    const info = await res.json();
    return c.json({ ...info, max_concurrent: Number(info.max_concurrent) * pool.maxWorkers });
  });
  app.post("/dataset", async (c) => forward(least(), c.req.raw, "/dataset", await c.req.text()));
  // A `/rollouts` stream or a `/run` goes to the least-loaded worker, which owns it for `/cancel`.
  const dispatch = (path: string) => async (c: Context) => {
    const body = await c.req.text();
    let id: string | undefined;
    try {
      id = JSON.parse(body).request_id;
    } catch { /* the worker answers the bad body */ }
    const worker = least();
    worker.active++;
    if (id) owner.set(id, worker);
    try {
      const res = await fetch(`${worker.url}${path}`, {
        method: "POST",
        headers: headersOf(c.req.raw),
        body,
      });
      // Count the stream as the worker's until it has been read to the end.
      const done = () => {
        worker.active--;
        if (id) owner.delete(id);
      };
      if (!res.body) {
        done();
        return new Response(null, { status: res.status, headers: res.headers });
      }
      const counted = res.body.pipeThrough(new TransformStream({ flush: done }));
      return new Response(counted, { status: res.status, headers: res.headers });
    } catch (error) {
      worker.active--;
      if (id) owner.delete(id);
      return c.json({ error: `worker unreachable: ${(error as Error).message}` }, 502);
    }
  };
  app.post("/rollouts", dispatch("/rollouts"));
  app.post("/run", dispatch("/run"));
  app.post("/cancel", async (c) => {
    const body = await c.req.text();
    let id = "";
    try {
      id = String(JSON.parse(body).request_id ?? "");
    } catch { /* answered below */ }
    const worker = owner.get(id);
    if (!worker) return c.json({ cancelled: false });
    return await forward(worker, c.req.raw, "/cancel", body);
  });

  let listener: HttpListener;
  try {
    listener = await serveHttp((r) => app.fetch(r), {
      port: options.port,
      hostname: options.hostname,
      tls: options.tls,
    });
  } catch (error) {
    clearInterval(poll);
    if (ownPool) await pool.close();
    throw error;
  }
  const scheme = options.tls ? "https" : "http";
  const host = options.hostname.includes(":") ? `[${options.hostname}]` : options.hostname;
  let closed: Promise<void> | undefined;
  return {
    url: `${scheme}://${host}:${listener.port}`,
    port: listener.port,
    get workers() {
      return workers.length;
    },
    close: () =>
      closed ??= (async () => {
        clearInterval(poll);
        await listener.close();
        if (ownPool) await pool.close();
      })(),
  };
}
