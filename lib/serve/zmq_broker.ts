/**
 * `vf serve --zmq <address> --workers N`: the broker of verifiers' env-server Pool. It owns the
 * public ROUTER and talks to each worker process (a {@link WorkerPool} member serving the
 * same wire on its private `ipc://` endpoint) through a DEALER of its own.
 *
 * - `run` goes to the live worker with the fewest runs in flight (its own queue included);
 *   payloads and replies pass through as bytes, never decoded.
 * - `health` is answered by the broker: the totals and each worker's `pid`, `alive`,
 *   `in_flight`, `queued` and `served` (runs it has replied to).
 * - `cancel` goes to the worker that owns the run (`cancelled: false` when none does).
 * - A worker that exits: each request it held is replied
 *   `{ success: false, error: "WorkerError: …" }` and the broker serves on with the others.
 * @module
 */
import { VERSION } from "../version.ts";
import {
  frameText,
  messages,
  openDealer,
  openRouter,
  pack,
  unpack,
  type ZmqDealer,
  type ZmqImpl,
} from "./_zmq.ts";
import { DEFAULT_ZMQ_WIRE, wireError, type ZmqWire } from "./wire.ts";
import type { Worker, WorkerPool } from "./workers.ts";
import { DEFAULT_ZMQ_ADDRESS } from "./zmq.ts";

/** Options of {@link startZmqBroker}. */
export interface ZmqBrokerOptions {
  /** Where to bind; default `tcp://127.0.0.1:5000`. Port 0 picks a free one. */
  address?: string;
  /** Told about replies that could not be delivered. Default: warn. */
  onWarning?: (message: string) => void;
  /**
   * How long each worker has to answer the broker's first `health` (it is serving already,
   * so a worker that stays silent is wedged); default 60 s, `Infinity` for no limit.
   */
  healthTimeoutMs?: number;
  /** The form of the wire the workers speak and the broker answers in; default `2026-09`. */
  wire?: ZmqWire;
  /** The transport of its sockets (see `ZMQ_IMPLS`); default `zmtp`. */
  impl?: ZmqImpl;
}

/** A running broker. */
export interface ZmqBroker {
  /** The bound public endpoint. */
  readonly address: string;
  /** The served environment's id, as the workers report it. */
  readonly envId: string;
  /** Replies to what is still pending, then closes the sockets. Stop the pool first, so the
   * workers' own replies (cancelled runs) get through. */
  close(): Promise<void>;
}

type Socket = ZmqDealer;

/** A request forwarded to a worker and not yet replied to. */
interface Pending {
  worker: Member;
  method: string;
  /** The client's identity and request id frame; absent for the broker's own requests. */
  identity?: Uint8Array;
  requestId: Uint8Array;
  /** The broker's own requests resolve here. */
  resolve?: (reply: Record<string, unknown>) => void;
}

/** A worker as the broker sees it. */
interface Member {
  worker: Worker;
  dealer: Socket;
  send: (frames: Uint8Array[]) => Promise<void>;
  /** Runs sent to it and not yet replied to (running or waiting for a slot there). */
  runs: number;
  served: number;
  maxConcurrent: number;
  loop: Promise<void>;
}

/** Frames sent one at a time (a zeromq socket takes one send in progress). */
function serialSender(socket: { send(frames: Uint8Array[]): Promise<void> }) {
  let last = Promise.resolve();
  return (frames: Uint8Array[]) => {
    const sent = last.then(() => socket.send(frames));
    last = sent.catch(() => {});
    return sent;
  };
}

const encoder = new TextEncoder();

/**
 * Serve the ZeroMQ wire in front of `pool`'s workers (each started with `zmq: true`).
 *
 * @param pool the running workers; the broker never starts or stops them
 * @param options the public address
 * @returns the broker; close it after the pool
 * @throws {Error} when the address cannot be bound or a worker does not answer `health`
 */
export async function startZmqBroker(
  pool: WorkerPool,
  options: ZmqBrokerOptions = {},
): Promise<ZmqBroker> {
  const warn = options.onWarning ?? ((m: string) => console.warn(`warning: ${m}`));
  const healthTimeoutMs = options.healthTimeoutMs ?? 60_000;
  const current = (options.wire ?? DEFAULT_ZMQ_WIRE) === "2026-09";
  const pending = new Map<string, Pending>();
  const members: Member[] = [];
  const router = await openRouter(options.impl);
  const dealers = await Promise.all(pool.workers.map(() => openDealer(options.impl)));
  let replying = Promise.resolve();

  /** Send `[requestId, response]` to a client (or resolve the broker's own request). */
  const reply = (p: Pick<Pending, "identity" | "requestId" | "resolve">, response: unknown) => {
    if (p.resolve) {
      p.resolve(
        response instanceof Uint8Array
          ? unpack(response) as Record<string, unknown>
          : response as Record<string, unknown>,
      );
      return;
    }
    if (!p.identity) return;
    const frame = response instanceof Uint8Array ? response : pack(response);
    relay(p.identity, p.requestId, current ? [encoder.encode("reply"), frame] : [frame]);
  };

  /** Send `[requestId, ...frames]` to a client, in order with every other send. */
  const relay = (identity: Uint8Array, requestId: Uint8Array, frames: Uint8Array[]) => {
    replying = replying.then(() => router.send([identity, requestId, ...frames])).catch(
      (error) => {
        if (!router.closed) {
          warn(`could not reply to request "${frameText(requestId)}": ${error.message}`);
        }
      },
    );
  };

  /** Reply to request `id`: with the worker's reply, or (`byWorker` false) the broker's. */
  const settle = (id: string, response: unknown, byWorker = false) => {
    const p = pending.get(id);
    if (!p) return; // a late reply of a worker that was given up on
    pending.delete(id);
    if (p.method === "run") {
      p.worker.runs--;
      if (byWorker) p.worker.served++;
    }
    reply(p, response);
  };

  function join(worker: Worker, dealer: Socket): Member {
    dealer.connect(worker.zmq);
    const member: Member = {
      worker,
      dealer,
      send: serialSender(dealer),
      runs: 0,
      served: 0,
      maxConcurrent: 0,
      loop: Promise.resolve(),
    };
    member.loop = (async () => {
      try {
        for await (const frames of messages(dealer)) {
          const [requestId] = frames;
          if (!current) {
            settle(frameText(requestId), frames[1], true);
            continue;
          }
          // A run's deltas pass through; its reply frame ends the request.
          if (frameText(frames[1]) === "delta") {
            const p = pending.get(frameText(requestId));
            if (p?.identity) relay(p.identity, p.requestId, frames.slice(1));
            continue;
          }
          settle(frameText(requestId), frames[2], true);
        }
      } catch (error) {
        if (!dealer.closed) warn(`lost worker ${worker.index}'s replies: ${wireError(error)}`);
      }
    })();
    void worker.exited.then(({ code, signal }) => {
      const error = pool.closing
        ? "Cancelled: rollout aborted: the env server is shutting down"
        : `WorkerError: Worker ${worker.index} (pid ${worker.pid}) exited (${
          signal ?? `code ${code}`
        }) before replying; the other workers keep serving, send the request again`;
      for (const [id, p] of pending) {
        if (p.worker === member) settle(id, { success: false, error });
      }
      dealer.close();
    });
    return member;
  }

  /** Forward a client's request (or the broker's own) to `member`. */
  const forward = (
    member: Member,
    id: string,
    frames: Uint8Array[],
    p: Omit<Pending, "worker">,
  ) => {
    pending.set(id, { ...p, worker: member });
    if (p.method === "run") member.runs++;
    member.send(frames).catch((error) =>
      settle(id, { success: false, error: `WorkerError: ${(error as Error).message}` })
    );
  };

  const leastBusy = (): Member | undefined =>
    members.filter((m) => m.worker.alive).reduce<Member | undefined>(
      (a, b) => (a === undefined || b.runs < a.runs ? b : a),
      undefined,
    );

  let stopping = false;
  const noWorker = () => ({
    success: false,
    error: pool.closing || stopping
      ? "Cancelled: rollout aborted: the env server is shutting down"
      : "WorkerError: No worker process is running; restart vf serve",
  });

  // Ask every worker for its health: it is up, and its env id and run limit.
  let envId = "";
  const healthTimers = new Set<ReturnType<typeof setTimeout>>();
  pool.workers.forEach((worker, i) => members.push(join(worker, dealers[i])));
  await Promise.all(members.map(async (m) => {
    const id = `broker-health-${m.worker.index}`;
    const health = await new Promise<Record<string, unknown>>((resolve) => {
      const timer = Number.isFinite(healthTimeoutMs)
        ? setTimeout(() =>
          settle(id, {
            success: false,
            error: `no reply within ${healthTimeoutMs / 1000} s (pid ${m.worker.pid})`,
          }), healthTimeoutMs)
        : undefined;
      if (timer !== undefined) healthTimers.add(timer);
      forward(m, id, [encoder.encode(id), encoder.encode("health"), pack({})], {
        method: "health",
        requestId: encoder.encode(id),
        resolve: (reply) => {
          clearTimeout(timer);
          healthTimers.delete(timer!);
          resolve(reply);
        },
      });
    });
    if (health.success !== true) {
      throw new Error(`Worker ${m.worker.index} does not answer health: ${health.error}`);
    }
    m.maxConcurrent = Number(health.max_concurrent ?? 0);
    envId ||= String(health.env_id ?? "");
  })).catch(async (error) => {
    // The other workers' health requests are given up with the start.
    for (const timer of healthTimers) clearTimeout(timer);
    router.close();
    for (const m of members) m.dealer.close();
    await Promise.all(members.map((m) => m.loop));
    throw error;
  });

  const health = () => {
    const live = members.filter((m) => m.worker.alive);
    const counts = members.map((m) => ({
      worker: m.worker.index,
      pid: m.worker.pid,
      alive: m.worker.alive,
      in_flight: Math.min(m.runs, m.maxConcurrent),
      queued: Math.max(0, m.runs - m.maxConcurrent),
      served: m.served,
    }));
    return {
      success: true,
      error: null,
      env_id: envId,
      in_flight: counts.reduce((a, c) => a + c.in_flight, 0),
      queued: counts.reduce((a, c) => a + c.queued, 0),
      max_concurrent: live.reduce((a, m) => a + m.maxConcurrent, 0),
      version: VERSION,
      workers: counts,
    };
  };

  function handle(frames: Uint8Array[]): void {
    const [identity, requestIdFrame, methodFrame, payloadFrame] = frames;
    if (frames.length !== 4) {
      // The workers answer a malformed request the way a single server does.
      if (frames.length < 2) return;
      const member = leastBusy();
      const id = frameText(requestIdFrame);
      if (!member || pending.has(id)) {
        return reply({ identity, requestId: requestIdFrame }, noWorker());
      }
      return forward(member, id, frames.slice(1), {
        method: "",
        identity,
        requestId: requestIdFrame,
      });
    }
    const id = frameText(requestIdFrame);
    const method = frameText(methodFrame);
    const client = { identity, requestId: requestIdFrame };
    if (method === "health") return reply(client, health());
    if (pending.has(id)) {
      return reply(client, {
        success: false,
        error: `RequestError: request_id "${id}" is already running; send a fresh id`,
      });
    }
    let member = leastBusy();
    if (method === "cancel") {
      let target: unknown;
      try {
        target = (unpack(payloadFrame) as { request_id?: unknown })?.request_id;
      } catch { /* the worker replies to the bad payload */ }
      if (typeof target === "string" && target !== "") {
        const run = pending.get(target);
        if (!run || run.method !== "run") {
          return reply(client, { success: true, error: null, cancelled: false });
        }
        member = run.worker;
      }
    }
    if (!member) return reply(client, noWorker());
    forward(member, id, frames.slice(1), { method, ...client });
  }

  const requested = options.address ?? DEFAULT_ZMQ_ADDRESS;
  try {
    await router.bind(requested);
  } catch (error) {
    router.close();
    for (const m of members) m.dealer.close();
    throw new Error(
      `Cannot bind the ZeroMQ env server to "${requested}": ${(error as Error).message}; ` +
        `choose another address with --zmq (port 0 picks a free one)`,
      { cause: error },
    );
  }
  const loop = (async () => {
    try {
      for await (const frames of messages(router)) handle(frames);
    } catch (error) {
      if (!router.closed) warn(`the ZeroMQ broker stopped receiving: ${wireError(error)}`);
    }
  })();

  let closed: Promise<void> | undefined;
  return {
    address: router.lastEndpoint ?? requested,
    envId,
    close: () =>
      closed ??= (async () => {
        stopping = true;
        for (const id of [...pending.keys()]) settle(id, noWorker());
        await replying;
        router.close();
        for (const m of members) if (!m.dealer.closed) m.dealer.close();
        await Promise.all([loop, ...members.map((m) => m.loop)]);
      })(),
  };
}
