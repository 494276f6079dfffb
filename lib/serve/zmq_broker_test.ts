/**
 * The ZeroMQ broker's start-up against a worker that is serving but wedged: a real ZeroMQ
 * socket at the worker's address that takes the broker's `health` and never answers (a stand-in
 * for a worker process stuck in its event loop, which cannot be made to wedge on demand).
 */
import assert from "node:assert/strict";
import { startZmqBroker } from "./zmq_broker.ts";
import { loadZmq, messages, RECEIVE_OPTIONS } from "./_zmq.ts";
import type { WorkerPool } from "./workers.ts";

Deno.test("startZmqBroker() fails with the worker's index and pid when its health gets no reply in time", async () => {
  const zmq = await loadZmq();
  const dir = await Deno.makeTempDir({ prefix: "vf-broker-test-" });
  const silent = new zmq.Router({ linger: 0, ...RECEIVE_OPTIONS });
  const address = `ipc://${dir}/0`;
  await silent.bind(address);
  let heard = 0;
  const drain = (async () => {
    for await (const _ of messages(silent)) heard++;
  })();
  const pool = {
    closing: false,
    workers: [{ index: 0, pid: 4242, zmq: address, alive: true, exited: new Promise(() => {}) }],
  } as unknown as WorkerPool;
  try {
    const started = performance.now();
    await assert.rejects(
      startZmqBroker(pool, { address: "tcp://127.0.0.1:0", healthTimeoutMs: 500 }),
      /^Error: Worker 0 does not answer health: no reply within 0\.5 s \(pid 4242\)$/,
    );
    assert.ok(performance.now() - started >= 500);
    assert.equal(heard, 1, "the worker got the health request");
  } finally {
    silent.close();
    await drain;
    await Deno.remove(dir, { recursive: true });
  }
});
