/**
 * The prime runtime. Prime's API is unreachable from CI, so its HTTP half runs against the
 * Prime API stand-in (tests/_prime_api_standin.ts), which serves the documented endpoints on
 * loopback; its SSH half is real: the stand-in's SSH sessions point at a real sshd test host
 * in a network namespace (tests/_sshd_hosts.ts).
 */

import assert from "node:assert/strict";
import { ConfigError } from "../../lib/errors.ts";
import {
  cleanupPrime,
  createRuntime,
  listPrimeSandboxes,
  liveRuntimes,
  PrimeApi,
  PrimeRuntime,
  type PrimeRuntimeSpec,
  SandboxApiError,
  SandboxStateError,
  SandboxUnavailableError,
  sshConnectionsClosed,
} from "../mod.ts";
import {
  type PrimeApiStandIn,
  type StandInOptions,
  startPrimeApiStandIn,
} from "../../tests/_prime_api_standin.ts";
import { startSshdHost } from "../../tests/_sshd_hosts.ts";

const STANDIN = "Prime API stand-in (Prime's API is unreachable from CI)";
const KEY_VAR = "VF_TEST_PRIME_API_KEY";
const KEY = `pit_${crypto.randomUUID()}`;
const RUN_ID = `prime-${crypto.randomUUID().slice(0, 8)}`;

const sshHost = await startSshdHost();
globalThis.addEventListener("unload", () => sshHost.closeSync());

/** Runs `fn` with a fresh stand-in and the API key set; closes both afterwards. */
function withStandIn(
  options: Partial<StandInOptions>,
  fn: (standIn: PrimeApiStandIn) => Promise<void>,
) {
  return async () => {
    const standIn = await startPrimeApiStandIn({ apiKey: KEY, sshHost, ...options });
    Deno.env.set(KEY_VAR, KEY);
    try {
      await fn(standIn);
    } finally {
      Deno.env.delete(KEY_VAR);
      await sshConnectionsClosed();
      await standIn.close();
    }
  };
}

function specFor(
  standIn: PrimeApiStandIn,
  extra: Partial<PrimeRuntimeSpec> = {},
): PrimeRuntimeSpec {
  return {
    type: "prime",
    apiBase: standIn.url,
    apiKeyVar: KEY_VAR,
    ssh: { knownHostsPath: sshHost.knownHostsPath },
    ...extra,
  };
}

const calls = (standIn: PrimeApiStandIn, method: string, pattern: RegExp) =>
  standIn.requests.filter((r) => r.method === method && pattern.test(r.path));

Deno.test(
  `${STANDIN}: create, wait until running, run over SSH, and stop deletes the sandbox`,
  withStandIn({ pendingPolls: 3 }, async (standIn) => {
    const rt = createRuntime(
      specFor(standIn, {
        image: "python:3.11-slim",
        cpu: 2,
        memory: 4,
        disk: 20,
        ttlMinutes: 30,
        labels: { team: "vf" },
        env: { VF_PRIME: "yes" },
      }),
      { runId: RUN_ID, task: "task-1" },
    );
    assert.ok(rt instanceof PrimeRuntime);
    assert.equal(rt.id, "");
    await rt.start();

    const [create] = calls(standIn, "POST", /^\/api\/v1\/sandbox$/);
    const body = create.body as Record<string, unknown>;
    assert.equal(create.authorization, `Bearer ${KEY}`);
    assert.equal(body.docker_image, "python:3.11-slim");
    assert.deepEqual(
      [body.cpu_cores, body.memory_gb, body.disk_size_gb, body.gpu_count, body.vm],
      [2, 4, 20, 0, false],
    );
    assert.equal(body.timeout_minutes, 30, "the provider-side time to live");
    assert.deepEqual(body.labels, [
      "vf.managed=1",
      `vf.run_id=${RUN_ID}`,
      "vf.task=task-1",
      "team=vf",
    ]);
    assert.match(String(body.name), /^vf-[0-9a-f]{12}$/);
    assert.match(String(body.idempotency_key), /^[0-9a-f]{32}$/);
    assert.equal(rt.id, standIn.live()[0].id);
    assert.ok(
      calls(standIn, "GET", /^\/api\/v1\/sandbox\/sbx/).length >= 5,
      "polled through PENDING and PROVISIONING",
    );
    assert.equal(calls(standIn, "POST", /ssh-session$/).length, 1);
    assert.equal(
      calls(standIn, "POST", /^\/gateway\/ns-standin\/sbx[0-9a-f]+\/authorize$/).length,
      1,
    );

    assert.deepEqual(rt.capabilities, { isolation: true, users: true, network_control: false });
    const result = await rt.run(["sh", "-c", 'echo "$VF_PRIME $(id -u)"; pwd']);
    assert.equal(result.exit_code, 0);
    assert.equal(result.stdout, `yes 0\n${(rt as PrimeRuntime).workdir}\n`);
    await rt.write("notes/a.txt", "über");
    assert.equal(new TextDecoder().decode(await rt.read("notes/a.txt")), "über");
    assert.ok(liveRuntimes().includes(rt));

    await rt.stop();
    await rt.stop();
    assert.equal(calls(standIn, "DELETE", /^\/api\/v1\/sandbox\/sbx/).length, 1);
    assert.deepEqual(standIn.live(), []);
    assert.ok(!liveRuntimes().includes(rt));
    await assert.rejects(rt.run(["true"]), SandboxStateError);
  }),
);

Deno.test(
  `${STANDIN}: a sandbox that never becomes ready is deleted and start fails clearly`,
  withStandIn({ neverReady: true }, async (standIn) => {
    const rt = createRuntime(specFor(standIn, { readyTimeoutMs: 1_500 }), { runId: RUN_ID });
    const started = performance.now();
    const error = await rt.start().then(() => undefined, (e) => e);
    assert.ok(error instanceof SandboxUnavailableError, `got ${error}`);
    assert.match(
      error.message,
      /^Prime sandbox "sbx[0-9a-f]+" was not running after \d+ s \(last status PENDING\); it was deleted\. Raise readyTimeoutMs/,
    );
    assert.ok(performance.now() - started < 10_000);
    assert.equal(calls(standIn, "DELETE", /^\/api\/v1\/sandbox\/sbx/).length, 1);
    assert.deepEqual(standIn.live(), []);
    assert.ok(!liveRuntimes().includes(rt));
  }),
);

Deno.test(
  `${STANDIN}: a sandbox that fails to start is reported with its error and deleted`,
  withStandIn({ pendingPolls: 1, failWith: "IMAGE_PULL_FAILED" }, async (standIn) => {
    const rt = createRuntime(specFor(standIn, { image: "no/such:image", gpu: "A100_80GB:2" }));
    const error = await rt.start().then(() => undefined, (e) => e);
    assert.ok(error instanceof SandboxUnavailableError, `got ${error}`);
    assert.match(error.message, /failed to start: status ERROR \(IMAGE_PULL_FAILED\)/);
    assert.deepEqual(standIn.live(), []);
    const body = calls(standIn, "POST", /^\/api\/v1\/sandbox$/)[0].body as Record<string, unknown>;
    assert.deepEqual([body.gpu_type, body.gpu_count, body.vm], ["A100_80GB", 2, true]);
  }),
);

Deno.test(
  `${STANDIN}: a rejected API key is SandboxApiError 401, and a missing one is ConfigError`,
  withStandIn({}, async (standIn) => {
    Deno.env.set(KEY_VAR, "pit_wrong");
    const rt = createRuntime(specFor(standIn));
    const error = await rt.start().then(() => undefined, (e) => e);
    assert.ok(error instanceof SandboxApiError, `got ${error}`);
    assert.equal(error.status, 401);
    assert.match(
      error.message,
      new RegExp(
        `^The Prime API rejected the key in ${KEY_VAR} \\(HTTP 401 on POST /sandbox: ` +
          `Invalid or expired API key\\); check the key`,
      ),
    );
    assert.deepEqual(standIn.live(), []);
    assert.equal(calls(standIn, "POST", /^\/api\/v1\/sandbox$/).length, 1, "not retried");

    Deno.env.delete(KEY_VAR);
    const missing = await createRuntime(specFor(standIn)).start().then(() => undefined, (e) => e);
    assert.ok(missing instanceof ConfigError, `got ${missing}`);
    assert.match(missing.message, new RegExp(`set ${KEY_VAR} to a key`));
  }),
);

Deno.test(
  `${STANDIN}: stop() retries transient delete errors and stop() during start() deletes`,
  withStandIn({ pendingPolls: 2, failDeletes: 2 }, async (standIn) => {
    await using rt = createRuntime(specFor(standIn), { runId: RUN_ID });
    await rt.start();
    await rt.stop();
    assert.equal(calls(standIn, "DELETE", /^\/api\/v1\/sandbox\/sbx/).length, 3);
    assert.deepEqual(standIn.live(), []);

    const racing = createRuntime(specFor(standIn), { runId: RUN_ID });
    const starting = racing.start();
    while (!standIn.sandboxes.size || standIn.live().length === 0) {
      await new Promise((resolve) => setTimeout(resolve, 10));
    }
    await racing.stop();
    await assert.rejects(starting, SandboxStateError);
    assert.deepEqual(standIn.live(), [], "the sandbox created for the racing start is deleted");
  }),
);

Deno.test(
  `${STANDIN}: cleanupPrime() deletes the managed sandboxes of one run`,
  withStandIn({}, async (standIn) => {
    const api = new PrimeApi({ apiBase: standIn.url, apiKeyVar: KEY_VAR });
    const make = (labels: string[]) =>
      api.create({
        name: `vf-${crypto.randomUUID().slice(0, 8)}`,
        docker_image: "busybox",
        labels,
      });
    const a1 = await make(["vf.managed=1", "vf.run_id=run-a"]);
    const a2 = await make(["vf.managed=1", "vf.run_id=run-a", "vf.task=t"]);
    const b = await make(["vf.managed=1", "vf.run_id=run-b"]);
    const foreign = await make(["vf.run_id=run-a"]); // not made by vf
    const options = { apiBase: standIn.url, apiKeyVar: KEY_VAR };

    const listed = await listPrimeSandboxes({ runId: "run-a" }, options);
    assert.deepEqual(listed.map((s) => s.id).sort(), [a1.id, a2.id].sort());
    assert.deepEqual(await cleanupPrime({ runId: "run-a", olderThanMs: 3_600_000 }, options), []);
    assert.deepEqual(
      (await cleanupPrime({ runId: "run-a" }, options)).sort(),
      [a1.id, a2.id].sort(),
    );
    assert.deepEqual(standIn.live().map((s) => s.id).sort(), [b.id, foreign.id].sort());
    const list = calls(standIn, "GET", /^\/api\/v1\/sandbox$/)[0];
    assert.deepEqual(list.query.getAll("labels"), ["vf.managed=1", "vf.run_id=run-a"]);
    assert.deepEqual(await cleanupPrime({}, options), [b.id]);
    assert.deepEqual(standIn.live().map((s) => s.id), [foreign.id]);
  }),
);

Deno.test("prime: the spec is checked before anything is created", () => {
  assert.throws(
    () => createRuntime({ type: "prime", ttlMinutes: 2000 }),
    (e: unknown) =>
      e instanceof ConfigError && /ttlMinutes 2000; Prime allows 1 to 1440/.test(e.message),
  );
  assert.throws(
    () => createRuntime({ type: "prime", gpu: "H100_80GB", vm: false }),
    (e: unknown) => e instanceof ConfigError && /GPUs only in VM sandboxes/.test(e.message),
  );
  assert.throws(
    () => createRuntime({ type: "prime", gpu: "H100_80GB:0" }),
    (e: unknown) => e instanceof ConfigError && /Invalid gpu "H100_80GB:0"/.test(e.message),
  );
});

Deno.test(
  `${STANDIN}: sandboxes reached through one gateway as one login user run at once`,
  withStandIn({}, async (standIn) => {
    // Each VM is made for its runtime alone: that they share the gateway's user@host:port
    // does not make them one dedicated host that only one of them may hold.
    const spec = specFor(standIn, {
      ssh: {
        user: "root",
        privateKeyPath: sshHost.privateKeyPath,
        knownHostsPath: sshHost.knownHostsPath,
      },
    });
    const [a, b] = [createRuntime(spec), createRuntime(spec)];
    try {
      await Promise.all([a.start(), b.start()]);
      const [ra, rb] = await Promise.all([a.run(["pwd"]), b.run(["pwd"])]);
      assert.equal(ra.exit_code, 0, ra.stderr);
      assert.equal(rb.exit_code, 0, rb.stderr);
      assert.notEqual(ra.stdout, rb.stdout, "each has a workdir of its own");
      assert.equal(standIn.live().length, 2);
    } finally {
      await Promise.all([a.stop(), b.stop()]);
    }
    assert.deepEqual(standIn.live(), []);
  }),
);

Deno.test("prime: the sshd test host is removed", async () => {
  await sshConnectionsClosed();
  await sshHost.close();
});
