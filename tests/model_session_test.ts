/**
 * `[client] session_header` and `[client] cache_salt`, as prime-rl's train client sends them:
 * `X-Session-ID: <trace id>` on every model call of a rollout, and vLLM's prefix-cache salt
 * (`cache_salt` in the body) one per task group. Real rollouts (subprocess runtime) against
 * the loopback model server, which records each request's headers and body.
 */
import assert from "node:assert/strict";
import { NullHarness, OpenAIChatClient, reward, runTaskset, Task, Taskset } from "../mod.ts";
import { startModelServer } from "./model_server.ts";
import { resolveClient } from "../lib/cli/resolve.ts";
import { ClientSection } from "../lib/config.ts";
import { evaluate } from "../lib/eval/evaluate.ts";
import { echoEnv } from "./_echo_env.ts";

class Reply extends Task {
  static override HARNESS = "null";
  correct = reward(() => 1);
}

class Two extends Taskset<Reply> {
  get id() {
    return "session-two";
  }
  load() {
    return [new Reply({ id: "a", prompt: "Say a" }), new Reply({ id: "b", prompt: "Say b" })];
  }
}

function runTwo(url: string, config: { session_header?: boolean; cache_salt?: "group" }) {
  return runTaskset({
    taskset: new Two(),
    policy: { runtime: { type: "subprocess" }, harness: new NullHarness() },
    client: new OpenAIChatClient({ base_url: url, max_retries: 0, timeout: 30, ...config }),
    model: "m",
    rolloutsPerTask: 2,
    runId: `session-${crypto.randomUUID().slice(0, 8)}`,
  });
}

Deno.test('[client] session_header and cache_salt = "group": each call carries its trace id as X-Session-ID and one cache_salt per task group', async () => {
  await using server = await startModelServer({ responder: () => ({ content: "ok" }) });
  const { traces } = await runTwo(server.url, { session_header: true, cache_salt: "group" });
  assert.equal(traces.length, 4);
  assert.ok(traces.every((t) => !t.error), JSON.stringify(traces.map((t) => t.error)));
  assert.equal(server.requests.length, 4);
  const sessions = server.requests.map((r) => r.headers["x-session-id"]);
  assert.deepEqual(new Set(sessions), new Set(traces.map((t) => t.trace_id)));
  const saltOf = new Map<string, string>();
  for (const r of server.requests) {
    const trace = traces.find((t) => t.trace_id === r.headers["x-session-id"])!;
    const salt = (r.body as { cache_salt?: unknown }).cache_salt;
    assert.equal(typeof salt, "string");
    const key = trace.task.key;
    if (saltOf.has(key)) assert.equal(salt, saltOf.get(key), "one salt per group");
    saltOf.set(key, salt as string);
  }
  assert.equal(saltOf.size, 2);
  assert.notEqual([...saltOf.values()][0], [...saltOf.values()][1], "groups are salted apart");
});

Deno.test("without session_header or cache_salt, model calls carry neither", async () => {
  await using server = await startModelServer({ responder: () => ({ content: "ok" }) });
  await runTwo(server.url, {});
  assert.equal(server.requests.length, 4);
  for (const r of server.requests) {
    assert.equal(r.headers["x-session-id"], undefined);
    assert.equal("cache_salt" in (r.body as object), false);
  }
});

Deno.test("[client] session_header and cache_salt are config keys resolveClient() hands to the client; another salt mode is an error", async () => {
  const client = ClientSection.parse({ session_header: true, cache_salt: "group" });
  const { client: resolved } = await resolveClient({
    model: "m",
    base_url: "http://127.0.0.1:9/v1",
    client,
  });
  // The endpoint's own client, under the cost meter.
  const config = (resolved as unknown as { inner: OpenAIChatClient }).inner.config;
  assert.equal(config?.session_header, true);
  assert.equal(config?.cache_salt, "group");
  assert.equal(ClientSection.safeParse({ cache_salt: "task" }).success, false);
});

Deno.test("a legacy environment's rollouts send X-Session-ID (its trajectory id) and a per-example cache_salt", async () => {
  await using server = await startModelServer({ responder: () => ({ content: "ok" }) });
  const client = new OpenAIChatClient({
    base_url: server.url,
    max_retries: 0,
    session_header: true,
    cache_salt: "group",
  });
  const results = await evaluate(echoEnv(1), client, "m", { rolloutsPerExample: 2 });
  assert.equal(server.requests.length, 2);
  const ids = server.requests.map((r) => r.headers["x-session-id"]);
  assert.equal(new Set(ids).size, 2, "one session per rollout");
  assert.ok(ids.every((id) => typeof id === "string" && id.length > 0));
  const salts = server.requests.map((r) => (r.body as { cache_salt?: string }).cache_salt);
  assert.equal(salts[0], salts[1], "the example's group shares a salt");
  assert.ok(results);
});
