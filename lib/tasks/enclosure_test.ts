import assert from "node:assert/strict";
import { SandboxLimitError, SandboxLimits } from "../../runtimes/limits.ts";
import { WarmPool } from "../../runtimes/pool.ts";
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
  const pool = new WarmPool({ limits: new SandboxLimits({}, { docker: { maxLive: 2 } }) });
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
  assert.equal(pool.stats.fresh + pool.stats.misses, 0);
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
