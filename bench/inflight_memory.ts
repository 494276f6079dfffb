/**
 * Heap held per rollout in flight: every young-generation collection copies what the rollouts
 * in flight hold, so at hundreds of them it decides much of `evaluate`'s GC cost. A server in a
 * child process accepts connections and never answers; `n` single-turn rollouts (and, as the
 * baseline, `n` bare HTTP/1.1-pool requests) wait on it, and the heap after a full GC is
 * compared with the heap before they started. Each request opens its own connection here, so
 * both figures include one socket's objects.
 *
 *   deno run -A --v8-flags=--expose-gc bench/inflight_memory.ts [n=256]
 * @module
 */
import { evaluate, OpenAIChatClient, Rubric, SingleTurnEnv } from "../mod.ts";
import { http1Request } from "../lib/model/http1.ts";

const n = Number(Deno.args[0] ?? 256);
const gc = (globalThis as { gc?: () => void }).gc;
if (!gc) throw new Error("Run with --v8-flags=--expose-gc");

/** Accepts, reads and never answers; prints its port, then each connection it accepts. */
const SERVER = `const l = Deno.listen({ hostname: "127.0.0.1", port: 0 });
console.log(l.addr.port);
for await (const c of l) {
  console.log("conn");
  (async () => { const b = new Uint8Array(4096); while ((await c.read(b)) !== null); })().catch(() => {});
}`;

async function measure(kind: "evaluate" | "bare"): Promise<number> {
  const child = new Deno.Command(Deno.execPath(), {
    args: ["eval", SERVER],
    stdout: "piped",
    stderr: "inherit",
  }).spawn();
  const lines = child.stdout.pipeThrough(new TextDecoderStream()).getReader();
  let text = "";
  let accepted = -1; // the first line is the port
  let port = 0;
  const pump = (async () => {
    for (;;) {
      const { value, done } = await lines.read();
      if (done) return;
      text += value;
      let nl;
      while ((nl = text.indexOf("\n")) >= 0) {
        if (accepted++ < 0) port = Number(text.slice(0, nl));
        text = text.slice(nl + 1);
      }
    }
  })();
  while (port === 0) await new Promise((r) => setTimeout(r, 10));
  const url = `http://127.0.0.1:${port}/v1`;
  const env = new SingleTurnEnv({
    evalDataset: Array.from({ length: n }, (_, i) => ({ question: `What is 2+2? (#${i})` })),
    systemPrompt: "Answer briefly.",
    rubric: new Rubric({ funcs: [() => 1] }),
  });
  await env.getEvalDataset(n);
  const client = new OpenAIChatClient({ base_url: url, max_retries: 0 });
  const dir = await Deno.makeTempDir({ prefix: "vf-bench-inflight-" });
  const stop = new AbortController();
  const heap = () => {
    gc!();
    gc!();
    return Deno.memoryUsage().heapUsed;
  };
  const before = heap();
  const endpoint = new URL(`${url}/chat/completions`);
  const running = kind === "evaluate"
    ? evaluate(env, client, "bench", {
      maxConcurrent: n,
      resultsDir: dir,
      keepOutputs: false,
      signal: stop.signal,
    }).catch(() => {})
    : Promise.all(Array.from({ length: n }, (_, i) =>
      http1Request({
        method: "POST",
        url: endpoint,
        headers: { "content-type": "application/json" },
        body: JSON.stringify({
          model: "bench",
          messages: [{ role: "user", content: `What is 2+2? (#${i})` }],
        }),
        signal: stop.signal,
      }).catch(() => {})));
  const deadline = Date.now() + 60_000;
  while (accepted < n && Date.now() < deadline) await new Promise((r) => setTimeout(r, 20));
  if (accepted < n) throw new Error(`only ${accepted} of ${n} requests reached the server`);
  await new Promise((r) => setTimeout(r, 200)); // their bodies written
  const held = (heap() - before) / n;
  stop.abort();
  await running;
  child.kill();
  await pump.catch(() => {});
  await child.status;
  await Deno.remove(dir, { recursive: true });
  return held;
}

const bare = await measure("bare");
const held = await measure("evaluate");
console.log(`${n} requests in flight, heap after a full GC, bytes per request:`);
console.log(`| bare HTTP/1.1-pool request | ${bare.toFixed(0)} |`);
console.log(`| evaluate rollout (keepOutputs: false) | ${held.toFixed(0)} |`);
