/**
 * Requests per second of a tight `fetch` loop against the local model server, beside a
 * baseline measured in the same run: a bare `Deno.serve`/`Bun.serve` handler sending the
 * same bytes, so the ratio shows what routing and reply building cost.
 *
 * `deno run -A bench/raw_http.ts [--concurrency 64] [--seconds 3] [--max-requests 1000000]
 * [--url http://127.0.0.1:8000/v1]`
 *
 * With `--url`, only that (loopback) server is measured, e.g. one started in another process
 * with `deno run -A lib/model/local_server.ts --port 8000`.
 * @module
 */

import process from "node:process";
import { serveHttp } from "../lib/model/http_server.ts";
import { startModelServer } from "../lib/model/local_server.ts";

function flag(name: string, fallback: string): string {
  const args = process.argv.slice(2);
  const i = args.indexOf(`--${name}`);
  return i >= 0 && i + 1 < args.length ? args[i + 1] : fallback;
}

const concurrency = Number(flag("concurrency", "64"));
const seconds = Number(flag("seconds", "3"));
const maxRequests = Number(flag("max-requests", "1000000"));
const external = flag("url", "");

const requestBody = JSON.stringify({
  model: "vf-demo",
  messages: [{ role: "user", content: "What is 2 + 2?" }],
});

interface Result {
  requests: number;
  failures: number;
  seconds: number;
  perSecond: number;
}

async function hammer(baseUrl: string): Promise<Result> {
  const { hostname } = new URL(baseUrl);
  if (!["127.0.0.1", "localhost", "[::1]"].includes(hostname)) {
    throw new Error(`Refusing to benchmark "${baseUrl}": only loopback hosts are allowed`);
  }
  const url = `${baseUrl}/chat/completions`;
  const init = { method: "POST", headers: { "content-type": "application/json" } };
  // Warm up the connection pool so the timed part measures steady state.
  await Promise.all(
    Array.from({ length: concurrency }, async () => {
      await (await fetch(url, { ...init, body: requestBody })).arrayBuffer();
    }),
  );
  let issued = 0;
  let done = 0;
  let failures = 0;
  const started = performance.now();
  const deadline = started + seconds * 1000;
  await Promise.all(Array.from({ length: concurrency }, async () => {
    while (issued < maxRequests && performance.now() < deadline) {
      issued++;
      const res = await fetch(url, { ...init, body: requestBody });
      await res.arrayBuffer();
      if (res.status === 200) done++;
      else failures++;
    }
  }));
  const elapsed = (performance.now() - started) / 1000;
  return { requests: done, failures, seconds: elapsed, perSecond: done / elapsed };
}

function report(label: string, r: Result): void {
  console.log(
    `${label.padEnd(28)} ${r.perSecond.toFixed(0).padStart(7)} req/s ` +
      `(${r.requests} ok, ${r.failures} failed, ${
        r.seconds.toFixed(2)
      } s, concurrency ${concurrency})`,
  );
}

const runtime = (globalThis as { Deno?: { version: { deno: string } } }).Deno
  ? `deno ${(globalThis as unknown as { Deno: { version: { deno: string } } }).Deno.version.deno}`
  : `bun ${(globalThis as unknown as { Bun: { version: string } }).Bun.version}`;
console.log(`runtime: ${runtime}; client and server ${external ? "apart" : "in one process"}`);

if (external) {
  report(`server at ${external}`, await hammer(external));
} else {
  const server = await startModelServer({ responder: () => ({ content: "4" }) });
  // The baseline sends the bytes the model server sends, without routing or reply building.
  const probe = await fetch(`${server.url}/chat/completions`, {
    method: "POST",
    headers: { "content-type": "application/json" },
    body: requestBody,
  });
  const fixed = await probe.text();
  const bare = await serveHttp(() =>
    new Response(fixed, { headers: { "content-type": "application/json" } })
  );
  const baseline = await hammer(`http://127.0.0.1:${bare.port}/v1`);
  await bare.close();
  const measured = await hammer(server.url);
  await server.close();
  report("baseline (bare serve)", baseline);
  report("local model server", measured);
  console.log(
    `ratio model server / baseline: ${(measured.perSecond / baseline.perSecond).toFixed(2)}`,
  );
}
