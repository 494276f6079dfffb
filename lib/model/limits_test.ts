import assert from "node:assert/strict";
import type { ChatClient } from "./client.ts";
import { limitModelConnections, Semaphore } from "./limits.ts";
import type { Response } from "../types.ts";

Deno.test("Semaphore hands permits out in order and never exceeds max", async () => {
  const sem = new Semaphore(2);
  let inside = 0;
  let most = 0;
  await Promise.all(Array.from({ length: 8 }, async () => {
    const release = await sem.acquire();
    inside++;
    most = Math.max(most, inside);
    await new Promise((r) => setTimeout(r, 5));
    inside--;
    release();
  }));
  assert.equal(most, 2);
  assert.equal(sem.peak, 2);
  assert.equal(sem.held, 0);
});

Deno.test("limitModelConnections() bounds requests in flight and keeps the client's fields", async () => {
  let inflight = 0;
  let most = 0;
  const inner: ChatClient = {
    baseUrl: "http://127.0.0.1:1/v1",
    headersFromState: { "x-a": "a" },
    async getResponse() {
      inflight++;
      most = Math.max(most, inflight);
      await new Promise((r) => setTimeout(r, 10));
      inflight--;
      return {} as Response;
    },
  };
  const client = limitModelConnections(inner, 3);
  assert.equal(client.baseUrl, inner.baseUrl);
  assert.deepEqual(client.headersFromState, { "x-a": "a" });
  await Promise.all(Array.from({ length: 10 }, () => client.getResponse([], "m")));
  assert.equal(most, 3);
  assert.equal(client.connections.peak, 3);
});
