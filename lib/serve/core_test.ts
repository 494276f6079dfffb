/**
 * One env-server core under both transports at once, in one process: a legacy environment
 * served over HTTP (`ServerEnvironment`) and ZeroMQ (`ZmqEnvClient`), sharing one limit and
 * one set of requests, against a real model server on loopback.
 */
import assert from "node:assert/strict";
import { ServerEnvironment } from "./client.ts";
import { EnvServerCore } from "./core.ts";
import { startEnvServer } from "./server.ts";
import { startZmqEnvServer } from "./zmq.ts";
import { type EnvServerReplyError, ZmqEnvClient } from "./zmq_client.ts";
import { lastUserText, startModelServer } from "../../tests/model_server.ts";
import { echoEnv } from "../../tests/_echo_env.ts";

async function until(check: () => boolean | Promise<boolean>): Promise<void> {
  const end = Date.now() + 10_000;
  while (!(await check())) {
    if (Date.now() > end) throw new Error("timed out");
    await new Promise((r) => setTimeout(r, 10));
  }
}

Deno.test("a core under HTTP and ZeroMQ bounds both with one limit, and either transport cancels the other's request", async () => {
  await using model = await startModelServer({
    responder: (request) => {
      const q = lastUserText(request);
      return q.includes("HANG") ? { hang: true } : { content: q.replace("q", "a") };
    },
  });
  await using core = new EnvServerCore(echoEnv(), { maxConcurrent: 1 });
  await using http = await startEnvServer(core);
  await using zmq = await startZmqEnvServer(core, { address: "tcp://127.0.0.1:0" });
  await using zmqEnv = await ZmqEnvClient.connect(zmq.address);
  await zmqEnv.waitForServer({ timeoutMs: 10_000, intervalMs: 50 });
  const httpEnv = await ServerEnvironment.connect(http.url);
  const client = { base_url: model.url };

  // A ZeroMQ run takes the one slot; an HTTP run waits for it.
  const hung = zmqEnv.run({ taskData: { prompt: "HANG", answer: "x" }, client, model: "m" }, {
    requestId: "a".repeat(32),
  });
  const hungDone = assert.rejects(hung, (error: EnvServerReplyError) => {
    assert.equal(error.message, "Cancelled: rollout aborted");
    return true;
  });
  await until(() => model.inFlight === 1);
  const queued = httpEnv.run<{ ok: boolean; traces: Array<{ reward: number }> }>({
    taskData: { prompt: "q3", answer: "a3", idx: 3 },
    client,
    model: "m",
  });
  await until(() => core.queued === 1);
  const health = await httpEnv.health();
  assert.deepEqual([health.in_flight, health.queued, health.requests], [1, 1, 2]);
  const zmqHealth = await zmqEnv.status();
  assert.deepEqual([zmqHealth.in_flight, zmqHealth.queued], [1, 1]);

  // HTTP's /cancel reaches the run ZeroMQ started; the HTTP run then gets the slot.
  const res = await fetch(`${http.url}/cancel`, {
    method: "POST",
    body: JSON.stringify({ request_id: "a".repeat(32) }),
  });
  assert.deepEqual(await res.json(), { cancelled: true });
  await hungDone;
  const episode = await queued;
  assert.equal(episode.ok, true);
  assert.equal(episode.traces[0].reward, 1);
  assert.deepEqual([core.inFlight, core.queued, core.requests], [0, 0, 0]);
});

Deno.test("startZmqEnvServer() takes a legacy environment itself: each run is one rollout of its row", async () => {
  await using model = await startModelServer({ responder: () => ({ content: "a1" }) });
  await using server = await startZmqEnvServer(echoEnv(), { address: "tcp://127.0.0.1:0" });
  await using env = await ZmqEnvClient.connect(server.address);
  await env.waitForServer({ timeoutMs: 10_000, intervalMs: 50 });
  assert.equal((await env.status()).env_id, "echo-test");
  // The current wire: the rollout's row arrives as upstream's Trace, assembled from deltas.
  const episode = await env.run<{
    vf: { example_id: number };
    traces: Array<{ rewards: Record<string, { score: number }>; nodes: unknown[] }>;
  }>({
    taskData: { prompt: "q1", answer: "a1", idx: 1 },
    client: { base_url: model.url },
    model: "m",
  });
  assert.deepEqual([episode.traces[0].rewards.reward.score, episode.vf.example_id], [1, 1]);
  assert.ok(episode.traces[0].nodes.length >= 2);
});

Deno.test("POST /run on a legacy environment: one rollout per request; a reused id is a 409 while it runs", async () => {
  await using model = await startModelServer({
    responder: (request) => lastUserText(request) === "HANG" ? { hang: true } : { content: "a2" },
  });
  await using server = await startEnvServer(echoEnv());
  const env = await ServerEnvironment.connect(server.url);
  const client = { base_url: model.url };
  const episode = await env.run<{ ok: boolean; traces: Array<{ reward: number }> }>({
    taskData: { prompt: "q2", answer: "a2" },
    client,
    model: "m",
  });
  assert.equal(episode.traces[0].reward, 1);

  const controller = new AbortController();
  const hung = env.run({ taskData: { prompt: "HANG", answer: "x" }, client, model: "m" }, {
    requestId: "same",
    signal: controller.signal,
  });
  const cancelled = assert.rejects(hung, /^EnvServerReplyError: Cancelled: rollout aborted$/);
  await until(() => model.inFlight === 1);
  const again = await fetch(`${server.url}/run`, {
    method: "POST",
    body: JSON.stringify({ request_id: "same", task_data: { prompt: "q0" }, client, model: "m" }),
  });
  assert.equal(again.status, 409);
  assert.match((await again.json()).error, /request_id: "same" is already running/);
  controller.abort();
  await cancelled;
  await until(() => model.inFlight === 0);
});
