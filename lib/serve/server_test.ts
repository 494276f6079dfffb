import assert from "node:assert/strict";
import { OpenAIChatClient } from "../model/client.ts";
import { EnvServerError, ServerEnvironment } from "./client.ts";
import { startEnvServer } from "./server.ts";
import type { SingleTurnEnv } from "../legacy/multi_turn.ts";
import { AuthenticationError } from "../errors.ts";
import { evaluate } from "../eval/evaluate.ts";
import type { Row } from "../types.ts";
import {
  lastUserText,
  type ModelServer,
  type Responder,
  startModelServer,
} from "../../tests/model_server.ts";
import { echoEnv } from "../../tests/_echo_env.ts";
import type { RolloutOutput } from "../state.ts";

/** The echo environment, with env args and sampling args the server must pass on. */
function makeEnv(): SingleTurnEnv {
  return echoEnv(6, { envArgs: { flavour: "plain" }, samplingArgs: { temperature: 0.5 } });
}

/** Right for even examples, wrong for odd ones. */
const halfRight: Responder = (request) => {
  const q = lastUserText(request);
  return { content: Number(q.slice(1)) % 2 === 0 ? q.replace("q", "a") : "nope" };
};

function clientFor(server: ModelServer): OpenAIChatClient {
  return new OpenAIChatClient({
    base_url: server.url,
    api_key: "test-key",
    max_retries: 0,
    timeout: 10,
  });
}

function post(url: string, body: unknown, headers: Record<string, string> = {}): Promise<Response> {
  return fetch(url, {
    method: "POST",
    headers: { "content-type": "application/json", ...headers },
    body: typeof body === "string" ? body : JSON.stringify(body),
  });
}

async function readLines(res: Response): Promise<Array<Record<string, unknown>>> {
  const text = await res.text();
  return text.split("\n").filter((l) => l.trim()).map((l) => JSON.parse(l));
}

async function eventually(
  check: () => boolean | Promise<boolean>,
  what: string,
  ms = 5000,
): Promise<void> {
  const end = Date.now() + ms;
  while (!(await check())) {
    if (Date.now() > end) throw new Error(`Timed out waiting for ${what}`);
    await new Promise((r) => setTimeout(r, 10));
  }
}

async function inputsFor(env: SingleTurnEnv, n: number, r: number): Promise<Row[]> {
  return (await env.getEvalDataset(n)).repeat(r).toList();
}

/** Comparable parts of an output (no timings or ids). */
function essence(o: RolloutOutput) {
  return {
    example_id: o.example_id,
    prompt: o.prompt,
    completion: o.completion,
    answer: o.answer,
    reward: o.reward,
    metrics: o.metrics,
    error: o.error,
    stop_condition: o.stop_condition,
    token_usage: o.token_usage,
  };
}

function freePort(): number {
  const listener = Deno.listen({ hostname: "127.0.0.1", port: 0 });
  const port = (listener.addr as Deno.NetAddr).port;
  listener.close();
  return port;
}

Deno.test("GET /health, GET /info and POST /dataset describe the served environment", async () => {
  await using server = await startEnvServer(makeEnv(), {
    maxConcurrent: 7,
    evalDefaults: { num_examples: 3, rollouts_per_example: 2 },
  });
  const health = await (await fetch(`${server.url}/health`)).json();
  assert.deepEqual(
    { ...health, version: typeof health.version },
    {
      ok: true,
      env_id: "echo-test",
      in_flight: 0,
      queued: 0,
      max_concurrent: 7,
      requests: 0,
      version: "string",
    },
  );
  const info = await (await fetch(`${server.url}/info`)).json();
  assert.equal(info.env_id, "echo-test");
  assert.deepEqual(info.env_args, { flavour: "plain" });
  assert.deepEqual(info.sampling_args, { temperature: 0.5 });
  assert.equal(info.pass_threshold, 0.5);
  assert.equal(info.eval_dataset_size, 6);
  assert.deepEqual(info.eval_defaults, { num_examples: 3, rollouts_per_example: 2 });
  assert.equal(info.protocol_version, 1);

  const local = makeEnv();
  const { rows } = await (await post(`${server.url}/dataset`, { n: 3, seed: 7 })).json();
  assert.deepEqual(rows, (await local.getEvalDataset(3, 7)).toList());
  const all = await (await post(`${server.url}/dataset`, {})).json();
  assert.equal(all.rows.length, 6);

  const served = await ServerEnvironment.connect(server.url);
  assert.equal(served.envId, "echo-test");
  assert.deepEqual(served.samplingArgs, { temperature: 0.5 });
  assert.deepEqual(
    (await served.getEvalDataset(2)).toList(),
    (await local.getEvalDataset(2)).toList(),
  );
});

Deno.test("POST /rollouts streams one line per group, then done", async () => {
  await using model = await startModelServer({ responder: halfRight });
  const env = makeEnv();
  await using server = await startEnvServer(env);
  const res = await post(`${server.url}/rollouts`, {
    request_id: "r1",
    inputs: await inputsFor(env, 3, 2),
    model: "m",
    client: { base_url: model.url, api_key: "k", max_retries: 0 },
    sampling_args: { max_tokens: 5 },
  });
  assert.equal(res.status, 200);
  assert.equal(res.headers.get("content-type"), "application/x-ndjson");
  assert.equal(res.headers.get("vf-request-id"), "r1");
  const lines = await readLines(res);
  assert.equal(lines.length, 4);
  assert.deepEqual(lines.at(-1), { type: "done", count: 3 });
  const groups = lines.slice(0, 3);
  assert.deepEqual(groups.map((g) => g.type), ["group", "group", "group"]);
  assert.deepEqual(groups.map((g) => g.example_id).sort(), [0, 1, 2]);
  for (const g of groups) {
    const outputs = g.outputs as RolloutOutput[];
    assert.equal(outputs.length, 2);
    assert.equal(g.retryable, false);
    assert.ok(outputs.every((o) => o.example_id === g.example_id));
    assert.ok(outputs.every((o) => o.reward === (g.example_id === 1 ? 0 : 1)));
  }
  // The trainer's endpoint, key and sampling args reached the model; env defaults merged in.
  assert.equal(model.requests.length, 6);
  assert.equal(model.requests[0].headers.authorization, "Bearer k");
  assert.equal(model.requests[0].body.max_completion_tokens, 5);
  assert.equal(model.requests[0].body.temperature, 0.5);
});

Deno.test("evaluate() through ServerEnvironment matches a local run", async () => {
  await using model = await startModelServer({ responder: halfRight });
  await using server = await startEnvServer(makeEnv());
  const served = await ServerEnvironment.connect(server.url);
  const options = { numExamples: 4, rolloutsPerExample: 3, stateColumns: ["answer"] };
  const remote = await evaluate(served, clientFor(model), "m", options);
  const local = await evaluate(makeEnv(), clientFor(model), "m", options);
  assert.equal(remote.outputs.length, 12);
  assert.deepEqual(remote.outputs.map(essence), local.outputs.map(essence));
  assert.deepEqual(remote.outputs.map((o) => o.answer), local.outputs.map((o) => o.answer));
  assert.equal(remote.metadata.avg_reward, 0.5);
  assert.deepEqual(remote.metadata.pass_at_k, local.metadata.pass_at_k);
  assert.equal(remote.metadata.env_id, "echo-test");
  assert.deepEqual(remote.metadata.sampling_args, local.metadata.sampling_args);
  assert.equal(server.inFlight, 0);
});

Deno.test("concurrent requests never run more than maxConcurrent groups; the rest queue", async () => {
  await using model = await startModelServer({
    responder: () => ({ content: "x", delay_ms: 150 }),
  });
  const env = makeEnv();
  await using server = await startEnvServer(env, { maxConcurrent: 2 });
  let maxInFlight = 0;
  let maxQueued = 0;
  let maxModel = 0;
  let sampling = true;
  const sampler = (async () => {
    while (sampling) {
      const h = await (await fetch(`${server.url}/health`)).json();
      maxInFlight = Math.max(maxInFlight, h.in_flight, server.inFlight);
      maxQueued = Math.max(maxQueued, h.queued);
      maxModel = Math.max(maxModel, model.inFlight);
      await new Promise((r) => setTimeout(r, 5));
    }
  })();
  const rows = await inputsFor(env, 4, 2);
  const started = Date.now();
  const results = await Promise.all([0, 1, 2, 3].map(async (i) => {
    const res = await post(`${server.url}/rollouts`, {
      inputs: rows.filter((r) => r.example_id === i),
      model: "m",
      client: { base_url: model.url },
    });
    return await readLines(res);
  }));
  const elapsed = Date.now() - started;
  sampling = false;
  await sampler;
  for (const lines of results) {
    assert.deepEqual(lines.map((l) => l.type), ["group", "done"]);
    assert.equal((lines[0].outputs as unknown[]).length, 2);
  }
  assert.ok(maxInFlight <= 2, `in flight reached ${maxInFlight}`);
  assert.equal(maxInFlight, 2);
  assert.ok(maxQueued >= 1, "some groups waited");
  assert.ok(maxModel <= 4, `model saw ${maxModel} requests at once`);
  assert.ok(elapsed >= 290, `4 groups through 2 slots take two rounds, took ${elapsed} ms`);
  assert.equal(model.requests.length, 8);
  const h = await (await fetch(`${server.url}/health`)).json();
  assert.deepEqual([h.in_flight, h.queued, h.requests], [0, 0, 0]);
});

Deno.test("POST /cancel ends the stream with a cancelled line and aborts the model requests", async () => {
  await using model = await startModelServer({ responder: () => ({ hang: true }) });
  const env = makeEnv();
  await using server = await startEnvServer(env, { maxConcurrent: 1 });
  const res = await post(`${server.url}/rollouts`, {
    request_id: "to-cancel",
    inputs: await inputsFor(env, 2, 3),
    model: "m",
    client: { base_url: model.url },
  });
  await eventually(() => model.inFlight === 3, "the first group's model requests");
  assert.equal(server.queued, 1);
  const started = Date.now();
  const cancel = await (await post(`${server.url}/cancel`, { request_id: "to-cancel" })).json();
  assert.deepEqual(cancel, { cancelled: true });
  const lines = await readLines(res);
  assert.ok(Date.now() - started < 2000, "the stream ended quickly");
  assert.deepEqual(lines, [{
    type: "error",
    error: "Cancelled",
    message: 'Request "to-cancel" was cancelled',
    cancelled: true,
  }]);
  await eventually(() => model.inFlight === 0, "the model requests to be aborted", 2000);
  assert.equal(model.requests.length, 3, "the queued group never started");
  assert.deepEqual([server.inFlight, server.queued], [0, 0]);
  const again = await (await post(`${server.url}/cancel`, { request_id: "to-cancel" })).json();
  assert.deepEqual(again, { cancelled: false });
});

Deno.test("aborting evaluate() through ServerEnvironment cancels the server's rollouts", async () => {
  await using model = await startModelServer({ responder: () => ({ hang: true }) });
  await using server = await startEnvServer(makeEnv());
  const served = await ServerEnvironment.connect(server.url);
  const controller = new AbortController();
  const run = evaluate(served, clientFor(model), "m", {
    numExamples: 2,
    rolloutsPerExample: 2,
    signal: controller.signal,
  });
  await eventually(() => model.inFlight === 4, "4 hanging model requests");
  const reason = new Error("stop now");
  const started = Date.now();
  controller.abort(reason);
  await assert.rejects(run, (e) => e === reason);
  assert.ok(Date.now() - started < 2000);
  await eventually(
    () => model.inFlight === 0 && server.inFlight === 0,
    "the rollouts to stop",
    2000,
  );
});

Deno.test("a client disconnecting from the stream cancels its rollouts", async () => {
  await using model = await startModelServer({ responder: () => ({ hang: true }) });
  const env = makeEnv();
  await using server = await startEnvServer(env);
  const controller = new AbortController();
  const res = await fetch(`${server.url}/rollouts`, {
    method: "POST",
    body: JSON.stringify({
      inputs: await inputsFor(env, 1, 2),
      model: "m",
      client: { base_url: model.url },
    }),
    signal: controller.signal,
  });
  assert.equal(res.status, 200);
  await eventually(() => model.inFlight === 2, "2 hanging model requests");
  controller.abort();
  await res.body?.cancel().catch(() => {});
  await eventually(() => model.inFlight === 0, "the model requests to be aborted");
  await eventually(
    async () => (await (await fetch(`${server.url}/health`)).json()).requests === 0,
    "the request to end",
  );
  assert.equal(server.inFlight, 0);
});

Deno.test("evaluate() fails clearly while the server is down and works again after a restart", async () => {
  await using model = await startModelServer({ responder: halfRight });
  const port = freePort();
  const first = await startEnvServer(makeEnv(), { port });
  const served = await ServerEnvironment.connect(first.url);
  const ok = await evaluate(served, clientFor(model), "m", {
    numExamples: 2,
    rolloutsPerExample: 2,
  });
  assert.equal(ok.outputs.length, 4);
  await first.close();

  await assert.rejects(
    evaluate(served, clientFor(model), "m", { numExamples: 2, rolloutsPerExample: 2 }),
    (e) =>
      e instanceof EnvServerError &&
      e.message.startsWith(`Cannot reach the env server at "http://127.0.0.1:${port}"`) &&
      e.message.includes("vf serve"),
  );
  await assert.rejects(
    ServerEnvironment.connect(`http://127.0.0.1:${port}`),
    /Cannot reach the env server at "http:\/\/127\.0\.0\.1:\d+": .+; check the URL \(--server\)/,
  );

  await using second = await startEnvServer(makeEnv(), { port });
  assert.equal(second.port, port);
  const again = await evaluate(served, clientFor(model), "m", {
    numExamples: 2,
    rolloutsPerExample: 2,
  });
  assert.equal(again.outputs.length, 4);
  assert.deepEqual(again.outputs.map(essence), ok.outputs.map(essence));
});

Deno.test("a server closing mid-run fails the run with a clear error", async () => {
  await using model = await startModelServer({ responder: () => ({ hang: true }) });
  const server = await startEnvServer(makeEnv());
  const served = await ServerEnvironment.connect(server.url);
  const run = evaluate(served, clientFor(model), "m", { numExamples: 2, rolloutsPerExample: 1 });
  await eventually(() => model.inFlight === 2, "2 hanging model requests");
  await server.close();
  await assert.rejects(run, (e) => e instanceof EnvServerError && /shutting down/.test(e.message));
  await eventually(() => model.inFlight === 0, "the model requests to be aborted");
});

Deno.test("a fatal model error on the server reaches the evaluator as the same error", async () => {
  await using model = await startModelServer({ responder: halfRight, apiKey: "right-key" });
  await using server = await startEnvServer(makeEnv());
  const served = await ServerEnvironment.connect(server.url);
  await assert.rejects(
    evaluate(served, clientFor(model), "m", { numExamples: 2 }),
    (e) => e instanceof AuthenticationError && /rejected the API key/.test(e.message),
  );
});

Deno.test("bad request bodies get a 400 naming the field", async () => {
  await using server = await startEnvServer(makeEnv());
  const valid = {
    inputs: [{ example_id: 0, prompt: [{ role: "user", content: "q0" }] }],
    model: "m",
    client: { base_url: "http://127.0.0.1:1/v1" },
  };
  const cases: Array<[string, unknown, RegExp]> = [
    ["/rollouts", "{not json", /^Request body is not valid JSON/],
    ["/rollouts", { ...valid, model: undefined }, /^model: /],
    ["/rollouts", { ...valid, inputs: [] }, /^inputs: /],
    ["/rollouts", { ...valid, inputs: [{ prompt: "hi" }] }, /^inputs\.0\.example_id: /],
    ["/rollouts", { ...valid, inputs: [{ example_id: 0, prompt: 5 }] }, /^inputs\.0\.prompt: /],
    [
      "/rollouts",
      { ...valid, client: { base_url: "ftp://x" } },
      /^client\.base_url: must be an http\(s\) URL/,
    ],
    [
      "/rollouts",
      { ...valid, client: { base_url: "http://x", api_kye: "k" } },
      /^client: .*api_kye/,
    ],
    ["/rollouts", { ...valid, sampling: {} }, /sampling/],
    [
      "/rollouts",
      { ...valid, client: { base_url: "http://x", api_key_var: "HOME" } },
      /^client\.api_key_var: "HOME" is not allowed/,
    ],
    ["/dataset", { n: "3" }, /^n: /],
    ["/cancel", {}, /^request_id: /],
  ];
  for (const [path, body, pattern] of cases) {
    const res = await post(`${server.url}${path}`, body);
    const json = await res.json();
    assert.equal(res.status, 400, `${path} ${JSON.stringify(body)}`);
    assert.match(json.error, pattern);
  }
  const missing = await fetch(`${server.url}/nope`);
  assert.equal(missing.status, 404);
  await missing.body?.cancel();
});

Deno.test("a token guards every route but /health", async () => {
  await using model = await startModelServer({ responder: halfRight });
  await using server = await startEnvServer(makeEnv(), { token: "s3cret" });
  const health = await fetch(`${server.url}/health`);
  assert.equal(health.status, 200);
  await health.body?.cancel();
  const info = await fetch(`${server.url}/info`);
  assert.equal(info.status, 401);
  await info.body?.cancel();
  await assert.rejects(ServerEnvironment.connect(server.url), /HTTP 401/);
  const served = await ServerEnvironment.connect(server.url, { token: "s3cret" });
  const { outputs } = await evaluate(served, clientFor(model), "m", { numExamples: 1 });
  assert.equal(outputs.length, 1);
});

Deno.test("an idle stream gets heartbeat lines, which ServerEnvironment skips", async () => {
  await using model = await startModelServer({
    responder: () => ({ content: "a0", delay_ms: 250 }),
  });
  const env = makeEnv();
  await using server = await startEnvServer(env, { heartbeatMs: 40 });
  const res = await post(`${server.url}/rollouts`, {
    inputs: await inputsFor(env, 1, 1),
    model: "m",
    client: { base_url: model.url },
  });
  const types = (await readLines(res)).map((l) => l.type);
  assert.ok(types.filter((t) => t === "heartbeat").length >= 2, types.join(","));
  assert.deepEqual(types.filter((t) => t !== "heartbeat"), ["group", "done"]);
  const served = await ServerEnvironment.connect(server.url);
  const { outputs } = await evaluate(served, clientFor(model), "m", { numExamples: 1 });
  assert.equal(outputs[0].reward, 1);
});

Deno.test("streamRollouts() yields groups as they finish; leaving early cancels the rest", async () => {
  await using model = await startModelServer({
    responder: (req) => (lastUserText(req) === "q0" ? { content: "a0" } : { hang: true }),
  });
  const env = makeEnv();
  await using server = await startEnvServer(env);
  const served = await ServerEnvironment.connect(server.url);
  const config = { base_url: model.url, api_key: "k" };
  const seen: number[] = [];
  for await (const group of served.streamRollouts(await inputsFor(env, 3, 2), config, "m")) {
    seen.push(group.example_id);
    assert.equal(group.outputs.length, 2);
    await eventually(() => model.inFlight === 4, "the other groups' model requests");
    break;
  }
  assert.deepEqual(seen, [0]);
  await eventually(() => model.inFlight === 0 && server.inFlight === 0, "the rest to be cancelled");
});
