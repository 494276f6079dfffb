/**
 * A served run's `client` takes `max_output_tokens` and `reasoning` as `[client]` and a role's
 * own endpoint do: `vf serve <taskset>` over HTTP runs a program agent (a shell script in the
 * subprocess runtime) that calls the gateway's Anthropic route with thinking and a large
 * `max_tokens`; the loopback model server sees the cap clamped and `reasoning_effort` sent only
 * when the run's client says so. A bad value is a 400 naming the field.
 * @module
 */
import assert from "node:assert/strict";
import { join } from "node:path";
import { fileURLToPath } from "node:url";
import { ServerEnvironment } from "../mod.ts";
import { startModelServer } from "./model_server.ts";
import { cliCommand, collect, tempDir } from "./_cli.ts";

function freePort(): number {
  const listener = Deno.listen({ hostname: "127.0.0.1", port: 0 });
  const port = (listener.addr as Deno.NetAddr).port;
  listener.close();
  return port;
}

const AGENT = `#!/bin/sh
curl -sS -X POST "$ANTHROPIC_BASE_URL/v1/messages" -H "x-api-key: $ANTHROPIC_API_KEY" \\
  -H "content-type: application/json" -H "anthropic-version: 2023-06-01" \\
  -d '{"model":"m","max_tokens":5000,"thinking":{"type":"enabled","budget_tokens":2048},"messages":[{"role":"user","content":"think"}]}' \\
  > /dev/null
`;

Deno.test("vf serve <taskset> over HTTP: a run's client.max_output_tokens clamps the model call's cap and client.reasoning lets a program's thinking through", async () => {
  await using tmp = await tempDir("vf_serve_client_limits_");
  await using model = await startModelServer({ responder: () => ({ content: "hi" }) });
  const agent = join(tmp.path, "agent.sh");
  await Deno.writeTextFile(agent, AGENT);
  const port = freePort();
  const url = `http://127.0.0.1:${port}`;
  const taskset = fileURLToPath(new URL("./_zmq_taskset.ts", import.meta.url));
  const server = cliCommand([
    "serve",
    taskset,
    "--port",
    String(port),
    "--env.agent.runtime.type",
    "subprocess",
    "--env.agent.harness.id",
    "program",
    "--env.agent.harness.command",
    `sh ${agent}`,
  ], { cwd: tmp.path, env: {}, registry: false }).spawn();
  try {
    const end = Date.now() + 60_000;
    for (;;) {
      const up = await fetch(`${url}/health`).then((r) => (r.body?.cancel(), r.ok), () => false);
      if (up) break;
      if (Date.now() > end) throw new Error("vf serve was not healthy after 60 s");
      await new Promise((r) => setTimeout(r, 100));
    }
    const env = await ServerEnvironment.connect(url);
    const run = async (client: Record<string, unknown>) => {
      const before = model.requests.length;
      await env.run({
        taskData: { prompt: "Say hi", expected: "hi" },
        client: { base_url: model.url, ...client },
        model: "m",
      });
      const bodies = model.requests.slice(before).map((r) => r.body as Record<string, unknown>);
      assert.equal(bodies.length, 1, JSON.stringify(bodies));
      return bodies[0];
    };

    const limited = await run({ max_output_tokens: 64, reasoning: true });
    assert.equal(limited.max_completion_tokens, 64);
    assert.equal(limited.reasoning_effort, "low");

    // Without them the program's cap goes as it asked, and its thinking is not sent.
    const plain = await run({});
    assert.equal(plain.max_completion_tokens, 5000);
    assert.equal("reasoning_effort" in plain, false);
    const off = await run({ reasoning: false, max_output_tokens: null });
    assert.equal(off.max_completion_tokens, 5000);
    assert.equal("reasoning_effort" in off, false);

    for (
      const [client, field] of [
        [{ max_output_tokens: 0 }, "client.max_output_tokens"],
        [{ max_output_tokens: 1.5 }, "client.max_output_tokens"],
        [{ reasoning: "yes" }, "client.reasoning"],
      ] as const
    ) {
      const bad = await fetch(`${url}/run`, {
        method: "POST",
        body: JSON.stringify({
          task_data: { prompt: "Say hi", expected: "hi" },
          client: { base_url: model.url, ...client },
          model: "m",
        }),
      });
      assert.equal(bad.status, 400);
      assert.match((await bad.json()).error, new RegExp(`^${field.replace(".", "\\.")}: `));
    }
  } finally {
    server.kill("SIGTERM");
    const out = await collect(server);
    assert.equal(out.code, 0, out.stderr);
  }
});
