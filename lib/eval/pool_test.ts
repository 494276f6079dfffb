import assert from "node:assert/strict";
import { WorkerPool } from "./pool.ts";
import type { StartGate } from "./evaluate.ts";

/** A promise and the function that resolves it. */
function latch(): { promise: Promise<void>; open: () => void } {
  let open!: () => void;
  const promise = new Promise<void>((r) => (open = r));
  return { promise, open };
}

Deno.test("WorkerPool runs the queue on at most `workers` at once, and a requeue after the others ended starts workers again", async () => {
  const held = latch();
  const ran: string[] = [];
  let live = 0;
  let peak = 0;
  const pool = new WorkerPool(["a", "b", "c", "d", "last"], {
    workers: 2,
    signal: new AbortController().signal,
    run: async (job) => {
      peak = Math.max(peak, ++live);
      try {
        if (job === "last") await held.promise;
        else await new Promise((r) => setTimeout(r, 5));
        ran.push(job);
        return "ok";
      } finally {
        live--;
      }
    },
  });
  const done = pool.run();
  // Everything but the held job has run: one worker waits in it, the other has ended.
  while (ran.length < 4) await new Promise((r) => setTimeout(r, 5));
  await new Promise((r) => setTimeout(r, 20));
  assert.equal(pool.open, true);
  assert.equal(pool.requeue(["again1", "again2"]), true);
  // Only a new worker can run them: the other one waits in the held job.
  const deadline = Date.now() + 30_000;
  while (ran.length < 6 && Date.now() < deadline) await new Promise((r) => setTimeout(r, 5));
  assert.deepEqual(ran.slice(4).sort(), ["again1", "again2"], "the requeued jobs ran meanwhile");
  held.open();
  await done;
  assert.equal(ran.at(-1), "last");
  assert.ok(peak <= 2, `peak ${peak}`);
  assert.equal(pool.open, false);
  assert.equal(pool.requeue(["late"]), false, "an ended pool takes nothing");
});

Deno.test("WorkerPool: an interrupted job goes back to the front of the queue and runs again; the gate hears it as never run", async () => {
  const heard: Array<[string, unknown, number | undefined]> = [];
  const gate: StartGate = {
    allows: (size) => {
      heard.push(["allows", null, size]);
      return true;
    },
    finished: (outcome, size) => void heard.push(["finished", outcome, size]),
  };
  const ran: string[] = [];
  const interrupted: string[] = [];
  let first = true;
  const pool = new WorkerPool(["a", "b"], {
    workers: 1,
    signal: new AbortController().signal,
    gate,
    run: (job) => {
      ran.push(job);
      if (job === "a" && first) {
        first = false;
        return Promise.resolve("interrupted");
      }
      return Promise.resolve(job === "b" ? "infra" : { ok: true, latencyMs: 7 });
    },
    onInterrupted: (job) => interrupted.push(job),
  });
  await pool.run();
  assert.deepEqual(ran, ["a", "a", "b"]);
  assert.deepEqual(interrupted, ["a"]);
  const finished = heard.filter((h) => h[0] === "finished").map((h) => h[1]) as Array<
    { ok: boolean; latencyMs?: number } | null
  >;
  assert.deepEqual(finished.map((o) => o && o.ok), [null, true, false]);
  assert.equal(finished[1]!.latencyMs, 7, "a job's own latency is kept");
  assert.equal(typeof finished[2]!.latencyMs, "number", "an infra job's latency is its run time");
  assert.equal(heard.filter((h) => h[0] === "allows").length, 3);
});

Deno.test("WorkerPool: the gate is asked with the size of the job the worker then takes, and a refusal ends the worker", async () => {
  let inFlight = 0;
  const sizes: number[] = [];
  const gate: StartGate = {
    allows: async (size = 1) => {
      sizes.push(size);
      // Two workers ask at once; the second is let through after the first took its job.
      await new Promise((r) => setTimeout(r, sizes.length === 2 ? 20 : 0));
      inFlight += size;
      return true;
    },
    finished: (_outcome, size = 1) => void (inFlight -= size),
  };
  const taken: number[][] = [];
  const pool = new WorkerPool([[1, 1, 1], [2], [3, 3]], {
    workers: 2,
    signal: new AbortController().signal,
    gate,
    sizeOf: (job) => job.length,
    run: async (job) => {
      taken.push(job);
      await new Promise((r) => setTimeout(r, 30));
      return "ok";
    },
  });
  await pool.run();
  assert.equal(taken.length, 3);
  // The second worker asked for the first job (3), which the first took: it asked again (1).
  assert.deepEqual(sizes.slice(0, 3), [3, 3, 1]);
  assert.deepEqual(taken.map((j) => j.length), [3, 1, 2]);
  assert.equal(inFlight, 0, "every size let through was given back");

  const refused = new WorkerPool(["x"], {
    workers: 1,
    signal: new AbortController().signal,
    gate: { allows: () => false, finished: () => {} },
    run: () => Promise.reject(new Error("never runs")),
  });
  await refused.run();
});

Deno.test("WorkerPool: a throw goes to onError and ends its worker; without onError run() throws it", async () => {
  const errors: unknown[] = [];
  const ran: number[] = [];
  const boom = new Error("boom");
  const pool = new WorkerPool([1, 2, 3], {
    workers: 1,
    signal: new AbortController().signal,
    run: (job) => {
      ran.push(job);
      return job === 2 ? Promise.reject(boom) : Promise.resolve("ok");
    },
    onError: (error) => errors.push(error),
  });
  await pool.run();
  assert.deepEqual(ran, [1, 2]);
  assert.deepEqual(errors, [boom]);

  const bare = new WorkerPool([1], {
    workers: 1,
    signal: new AbortController().signal,
    run: () => Promise.reject(boom),
  });
  await assert.rejects(bare.run(), /boom/);

  // An aborted signal starts nothing.
  const aborted = new AbortController();
  aborted.abort();
  const none: number[] = [];
  await new WorkerPool([1], {
    workers: 1,
    signal: aborted.signal,
    run: (job) => {
      none.push(job);
      return Promise.resolve("ok");
    },
  }).run();
  assert.deepEqual(none, []);
});
