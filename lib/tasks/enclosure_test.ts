import assert from "node:assert/strict";
import { SandboxLimitError, SandboxLimits } from "../../runtimes/limits.ts";
import { WarmPool } from "../../runtimes/pool.ts";
import { DockerEngine } from "../../runtimes/docker/engine_api.ts";
import { ConfigError } from "../errors.ts";
import { Enclosure, type EnclosureNeeds } from "./enclosure.ts";

const needs = (over: Partial<EnclosureNeeds>): EnclosureNeeds => ({
  runId: "enclosure-test",
  task: "t",
  model: "m",
  services: null,
  gateway: false,
  egress: false,
  alias: "agent",
  signal: new AbortController().signal,
  ...over,
});

const twoServices = {
  services: [{ name: "db" }, { name: "cache" }],
} as unknown as EnclosureNeeds["services"];

Deno.test("Enclosure.open() takes the sandbox's slot with its services' and relay's at once, and a limit that can never fit them is a ConfigError before anything starts", async () => {
  // Limits on docker that can never fit: the reservation fails before any network,
  // relay or service is created (nothing here reaches an engine).
  const limits = new SandboxLimits({}, { docker: { maxLive: 2 } });
  const pool = new WarmPool({ limits });
  const cases: Array<[Partial<EnclosureNeeds>, RegExp]> = [
    [
      { egress: true, services: twoServices },
      /needs 4 docker containers at once \(its sandbox, 2 services, the gateway relay\), more than \[limits\] max_sandboxes = 2/,
    ],
    [{ services: twoServices }, /needs 3 docker containers at once \(its sandbox, 2 services\)/],
  ];
  for (const [over, message] of cases) {
    const error = await Enclosure.open(
      { type: "docker", image: "busybox:latest" },
      needs(over),
      pool,
    )
      .then(() => null, (e) => e);
    assert.ok(error instanceof ConfigError, String(error));
    assert.match(error.message, message);
    assert.ok(error.cause instanceof SandboxLimitError);
  }
  // A refused reservation holds nothing.
  assert.equal(limits.for("docker").live, 0);
  await pool.close();
});

Deno.test("Enclosure.open() asks a source for exactly the containers it will start beside the sandbox", async () => {
  const asked: Array<[string, number]> = [];
  const source = {
    acquire: () => Promise.reject(new Error("not used")),
    close: () => Promise.resolve(),
    reserve: (type: string, count: number) => {
      asked.push([type, count]);
      // Refused, so the test ends before a network would be made.
      return Promise.reject(new SandboxLimitError(count, 1));
    },
  };
  for (
    const over of [{ gateway: true }, { egress: true }, { services: twoServices, gateway: true }]
  ) {
    await assert.rejects(
      Enclosure.open({ type: "docker", image: "busybox:latest" }, needs(over), source),
      ConfigError,
    );
  }
  assert.deepEqual(asked, [["docker", 2], ["docker", 2], ["docker", 4]]);
  // A subprocess sandbox's gateway is on loopback: no containers, nothing to reserve.
  const opened = await Enclosure.open({ type: "subprocess" }, needs({ gateway: true }), source);
  assert.equal(opened.slot, undefined);
  await opened.enclosure.close();
  assert.equal(asked.length, 3);
});

Deno.test("Enclosure: the sandbox's own slot is the caller's, the relay's goes back when the enclosure closes (Docker)", async () => {
  const limits = new SandboxLimits({}, { docker: { maxLive: 2 } });
  const pool = new WarmPool({ limits });
  const limiter = limits.for("docker");
  const opened = await Enclosure.open(
    { type: "docker", image: "busybox:latest" },
    needs({ runId: `enclosure-${crypto.randomUUID().slice(0, 8)}`, gateway: true }),
    pool,
  );
  try {
    assert.ok(opened.slot, "no slot for the sandbox");
    assert.equal(limiter.live, 2, "the sandbox's slot and the relay's");
    assert.ok((opened.spec as { networkName?: string }).networkName);
  } finally {
    await opened.enclosure.close();
  }
  // The relay is gone; the sandbox's slot stays taken until its sandbox (never started here)
  // would have been removed: a start still under way keeps counting.
  assert.equal(limiter.live, 1);
  opened.slot!.release();
  assert.equal(limiter.live, 0);
  await pool.close();
  await DockerEngine.closeShared();
});
