/**
 * `vf serve --workers N`: one port in front of up to N worker processes, each a `vf serve`
 * of the same environment on a loopback port, so rollouts use every core. The front starts
 * with one worker and adds one (up to N) whenever every worker has groups waiting; each
 * `/rollouts` stream goes to the least-loaded worker and `/cancel` to the one that holds the
 * request. `GET /health` reports every worker's load. The token (`VF_SERVER_TOKEN`) and TLS
 * apply at the front; workers listen on loopback only.
 * @module
 */
import { type ChildProcess, spawn } from "node:child_process";
import process from "node:process";
import { Hono } from "npm:hono@^4.13.0";
import { type HttpListener, serveHttp } from "../model/http_server.ts";

/** A worker process and what the front knows of its load. */
interface Worker {
  child: ChildProcess;
  url: string;
  /** `/rollouts` streams the front has open on it. */
  active: number;
  queued: number;
  inFlight: number;
  maxConcurrent: number;
}

/** Options of {@link startWorkerFront}. */
export interface WorkerFrontOptions {
  /** The `vf serve` arguments a worker runs with (the environment and its settings). */
  workerArgs: string[];
  /** Workers at most. */
  maxWorkers: number;
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

/** The command that runs this program again: `deno run -A <main>` or the vf binary itself. */
function selfCommand(): string[] {
  const deno = (globalThis as { Deno?: typeof Deno }).Deno;
  if (deno?.mainModule) {
    return [deno.execPath(), "run", "-A", new URL(deno.mainModule).pathname];
  }
  return [process.execPath];
}

async function startWorker(args: string[]): Promise<Worker> {
  const [cmd, ...pre] = selfCommand();
  const child = spawn(cmd, [...pre, "serve", ...args, "--port", "0", "--host", "127.0.0.1"], {
    stdio: ["ignore", "pipe", "inherit"],
  });
  const url = await new Promise<string>((resolve, reject) => {
    let out = "";
    const onData = (chunk: Buffer) => {
      out += chunk.toString();
      const m = /at (http:\/\/127\.0\.0\.1:\d+)/.exec(out);
      if (m) {
        child.stdout!.off("data", onData);
        resolve(m[1]);
      }
    };
    child.stdout!.on("data", onData);
    child.once(
      "exit",
      (code) => reject(new Error(`a worker exited (${code}) before serving: ${out}`)),
    );
  });
  child.stdout!.resume();
  return { child, url, active: 0, queued: 0, inFlight: 0, maxConcurrent: Infinity };
}

/** Start the front and its first worker. */
export async function startWorkerFront(options: WorkerFrontOptions): Promise<WorkerFront> {
  const workers: Worker[] = [await startWorker(options.workerArgs)];
  let adding: Promise<void> | null = null;
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
  const least = () => workers.reduce((a, b) => (b.active + b.queued < a.active + a.queued ? b : a));

  // Poll the workers' load; add one when every worker has groups waiting.
  const poll = setInterval(async () => {
    await Promise.all(workers.map(async (w) => {
      try {
        const h = await (await fetch(`${w.url}/health`)).json();
        w.queued = Number(h.queued ?? 0);
        w.inFlight = Number(h.in_flight ?? 0);
        w.maxConcurrent = Number(h.max_concurrent ?? Infinity);
      } catch { /* a worker that does not answer keeps its last numbers */ }
    }));
    // Busy: groups waiting, or every slot taken.
    const busy = (w: Worker) => w.queued > 0 || w.inFlight >= w.maxConcurrent;
    if (!adding && workers.length < options.maxWorkers && workers.every(busy)) {
      adding = startWorker(options.workerArgs)
        .then((w) => void workers.push(w))
        .catch((error) => console.warn(`warning: could not add a worker: ${error.message}`))
        .finally(() => (adding = null));
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
      workers: workers.map((w, i) => ({
        worker: i,
        url: w.url,
        active_requests: w.active,
        in_flight: w.inFlight,
        queued: w.queued,
      })),
      max_workers: options.maxWorkers,
      in_flight: workers.reduce((a, w) => a + w.inFlight, 0),
      queued: workers.reduce((a, w) => a + w.queued, 0),
    }));
  app.get("/info", async (c) => {
    // Clients size their load by max_concurrent: offer what all the workers can take.
    const res = await fetch(`${workers[0].url}/info`, { headers: headersOf(c.req.raw) });
    if (!res.ok) return new Response(res.body, { status: res.status, headers: res.headers });
    const info = await res.json();
    return c.json({ ...info, max_concurrent: Number(info.max_concurrent) * options.maxWorkers });
  });
  app.post("/dataset", async (c) => forward(workers[0], c.req.raw, "/dataset", await c.req.text()));
  app.post("/rollouts", async (c) => {
    const body = await c.req.text();
    let id: string | undefined;
    try {
      id = JSON.parse(body).request_id;
    } catch { /* the worker answers the bad body */ }
    const worker = least();
    worker.active++;
    if (id) owner.set(id, worker);
    try {
      const res = await fetch(`${worker.url}/rollouts`, {
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
  });
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
    for (const w of workers) w.child.kill("SIGTERM");
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
        await adding;
        await listener.close();
        await Promise.all(workers.map((w) =>
          new Promise<void>((resolve) => {
            if (w.child.exitCode !== null) return resolve();
            w.child.once("exit", () => resolve());
            w.child.kill("SIGTERM");
          })
        ));
      })(),
  };
}
