import assert from "node:assert/strict";
import { join } from "node:path";
import { RpcPeer } from "./protocol.ts";
import { RemoteEnvironment, startSandboxHost } from "./remote.ts";
import { OpenAIChatClient } from "../model/client.ts";
import { startModelServer } from "../../tests/model_server.ts";

/** Two peers joined back to back in memory; `handler` serves what `a` calls on `b`. */
function pair(handler: (method: string, params: unknown, signal: AbortSignal) => Promise<unknown>) {
  const peers: { a?: RpcPeer; b?: RpcPeer } = {};
  const a = new RpcPeer((line) => Promise.resolve(peers.b!.receive(line)), () => {
    return Promise.reject(new Error("unused"));
  });
  const b = new RpcPeer((line) => Promise.resolve(a.receive(line)), handler);
  Object.assign(peers, { a, b });
  return { a, b };
}

async function waitFor(check: () => boolean, ms: number, what: string): Promise<void> {
  const end = Date.now() + ms;
  while (!check()) {
    if (Date.now() > end) throw new Error(`timed out waiting for ${what}`);
    await new Promise((r) => setTimeout(r, 10));
  }
}

Deno.test("RpcPeer.call() with an aborted signal rejects at once and aborts the handler's signal on the other side", async () => {
  let handlerSignal: AbortSignal | undefined;
  let release!: () => void;
  const released = new Promise<void>((r) => (release = r));
  const { a } = pair((_method, _params, signal) => {
    handlerSignal = signal;
    signal.addEventListener("abort", () => release(), { once: true });
    return released.then(() => "late");
  });
  const controller = new AbortController();
  const call = a.call("slow", {}, { signal: controller.signal });
  await waitFor(() => handlerSignal !== undefined, 1000, "the handler");
  assert.equal(handlerSignal!.aborted, false);
  controller.abort(new Error("no longer needed"));
  await assert.rejects(call, /no longer needed/);
  await waitFor(() => handlerSignal!.aborted, 1000, "the cancel to arrive");
  // A call that completes first is not cancelled by a later abort.
  const done = new AbortController();
  const { a: a2 } = pair(() => Promise.resolve(42));
  assert.equal(await a2.call("fast", {}, { signal: done.signal }), 42);
  done.abort();
});

Deno.test("RpcPeer.close() aborts the requests it is still handling", async () => {
  let handlerSignal: AbortSignal | undefined;
  const { a, b } = pair((_m, _p, signal) => {
    handlerSignal = signal;
    return new Promise(() => {});
  });
  const call = a.call("forever").catch((e) => e);
  await waitFor(() => handlerSignal !== undefined, 1000, "the handler");
  b.close(new Error("channel closed"));
  assert.equal(handlerSignal!.aborted, true);
  a.close(new Error("channel closed"));
  assert.match(String(await call), /channel closed/);
});

Deno.test("aborting a sandboxed environment's rollout cancels the model request the evaluator made for it", async () => {
  const dir = await Deno.makeTempDir({ prefix: "vf_sandbox_cancel_" });
  try {
    const vf = new URL("../../mod.ts", import.meta.url).href;
    await Deno.writeTextFile(
      join(dir, "mod.ts"),
      `import { SingleTurnEnv } from "${vf}";
export function loadEnvironment() {
  return new SingleTurnEnv({ evalDataset: [{ question: "q", answer: "a" }] });
}
`,
    );
    await using model = await startModelServer({ responder: () => ({ hang: true }) });
    const { host, info } = await startSandboxHost({
      spec: join(dir, "mod.ts"),
      kind: "environment",
      args: {},
      lockFile: join(dir, "vf.lock"),
      cacheRoot: join(dir, "cache"),
    });
    const env = new RemoteEnvironment(host, info);
    try {
      const inputs = (await env.getEvalDataset()).toList();
      const client = new OpenAIChatClient({ base_url: model.url, max_retries: 0 });
      const controller = new AbortController();
      const run = env.runGroupOutputs(inputs, client, "m", { signal: controller.signal });
      await waitFor(() => model.inFlight === 1, 10_000, "the model request");
      controller.abort(new Error("stopped by the user"));
      let timer: ReturnType<typeof setTimeout> | undefined;
      const outcome = await Promise.race([
        run.then(() => "resolved", (e) => String(e)),
        new Promise<string>((r) => (timer = setTimeout(() => r("still running after 5 s"), 5_000))),
      ]);
      clearTimeout(timer);
      assert.match(outcome, /stopped by the user/);
      // The cancel went evaluator → sandbox (rollout) → evaluator (model call) → HTTP request.
      await waitFor(() => model.inFlight === 0, 5_000, "the model request to be cancelled");
      assert.equal(model.requests.length, 1);
    } finally {
      await env.teardown();
    }
  } finally {
    await Deno.remove(dir, { recursive: true });
  }
});
