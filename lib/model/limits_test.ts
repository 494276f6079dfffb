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

Deno.test("Semaphore.resize(): fewer permits hold new holders back until enough are released; more let waiters in at once", async () => {
  const sem = new Semaphore(3);
  const held = await Promise.all([sem.acquire(), sem.acquire(), sem.acquire()]);
  const order: string[] = [];
  const waiter = (name: string) =>
    sem.acquire().then((release) => {
      order.push(name);
      return release;
    });
  const d = waiter("d");
  const e = waiter("e");
  sem.resize(1);
  assert.equal(sem.max, 1);
  // Two releases leave one permit held, which is the new limit: nobody passes.
  held[0]();
  held[1]();
  await new Promise((r) => setTimeout(r, 0));
  assert.deepEqual(order, []);
  assert.equal(sem.held, 1);
  // The last old holder's release lets one waiter in.
  held[2]();
  const releaseD = await d;
  assert.deepEqual(order, ["d"]);
  assert.equal(sem.held, 1);
  // Raised to two: the other waiter comes in without a release.
  sem.resize(2);
  const releaseE = await e;
  assert.deepEqual(order, ["d", "e"]);
  assert.equal(sem.held, 2);
  releaseD();
  releaseE();
  assert.equal(sem.held, 0);
  assert.throws(() => sem.resize(0), RangeError);
});
