import assert from "node:assert/strict";
import { ConfigError } from "../lib/errors.ts";
import {
  dedicatedHostOf,
  RUNTIME_TYPES,
  RuntimeConfigByType,
  RuntimeTable,
  specOf,
  traitsOf,
  traitsOfConfig,
} from "./config.ts";
import type { TaskNeeds } from "./runtime.ts";

const needs: TaskNeeds = {
  task: "t1",
  role: "agent",
  container: true,
  image: "busybox",
  workdir: "/app",
  resources: { cpu: 1, memory: 0.5 },
  env: { TASK: "1", SHARED: "task" },
};

Deno.test("specOf() gives a docker container by default, the config's fields over the task's", () => {
  assert.deepEqual(specOf({ cpu: 2, env: { SHARED: "config" } }, needs), {
    type: "docker",
    image: "busybox",
    cpu: 2,
    memory: "512m",
    workdir: "/app",
    env: { TASK: "1", SHARED: "config" },
    network: false,
    labels: { "vf.role": "agent" },
  });
  // A policy is the egress proxy's to enforce: the container's network stays closed.
  const policy = specOf({ network: { allow: ["pypi.org:443"] } }, needs);
  assert.equal(policy.type === "docker" && policy.network, false);
  const extra = specOf({ env: { SHARED: "config" } }, { ...needs, extraEnv: { SHARED: "extra" } });
  assert.deepEqual(extra.type === "docker" && extra.env, { TASK: "1", SHARED: "extra" });
});

Deno.test("specOf() maps each type's snake_case keys to its spec", () => {
  assert.deepEqual(
    specOf({ type: "subprocess", image: "ignored" }, { ...needs, container: false }),
    {
      type: "subprocess",
      workdir: "/app",
      env: needs.env,
    },
  );
  assert.deepEqual(
    specOf({
      type: "ssh",
      host: "h",
      port: 2222,
      user: "u",
      private_key_path: "/k",
      known_hosts_path: "/kh",
      ssh_config_path: "",
      trust_on_first_use: true,
      dedicated: true,
      max_sessions: 4,
      image: "ignored",
    }, needs),
    {
      type: "ssh",
      host: "h",
      port: 2222,
      user: "u",
      privateKeyPath: "/k",
      knownHostsPath: "/kh",
      sshConfigPath: null,
      trustOnFirstUse: true,
      dedicated: true,
      maxSessions: 4,
      workdir: "/app",
      env: needs.env,
    },
  );
  const prime = specOf({ type: "prime", gpu: "H100_80GB", memory: "2g", ttl_minutes: 5 }, needs);
  assert.equal(prime.type === "prime" && prime.memory, undefined, "prime takes GB as a number");
  assert.equal(prime.type === "prime" && prime.ttlMinutes, 5);
  assert.deepEqual(prime.type === "prime" && prime.labels, { "vf.role": "agent" });
  const pod = specOf({ type: "kubernetes", start_timeout: 30, memory: 2, network: true }, needs);
  assert.equal(pod.type === "kubernetes" && pod.startTimeoutMs, 30_000);
  assert.equal(pod.type === "kubernetes" && pod.memory, "2048m");
  assert.equal(pod.type === "kubernetes" && pod.network, true);
});

Deno.test("specOf() refuses what a runtime cannot serve, naming the task and the flag", () => {
  const refused = (f: () => unknown, re: RegExp) =>
    assert.throws(f, (e) => e instanceof ConfigError && re.test(e.message));
  refused(
    () => specOf({ type: "subprocess" }, needs),
    /^Task "t1" needs a container runtime \(image "busybox"\); the subprocess runtime cannot run it; use --env\.agent\.runtime\.type docker$/,
  );
  refused(() => specOf({ type: "ssh" }, needs), /^The ssh runtime needs a host/);
  refused(() => specOf({ type: "ssh", host: "h" }, needs), /a shared SSH host is not one/);
  refused(
    () => specOf({}, { ...needs, image: undefined, role: "grader" }),
    /^Task "t1" has no image for its grader sandbox; set TaskData\.image/,
  );
  refused(
    () => specOf({ type: "lxc" as never }, needs),
    /^Unknown runtime type "lxc"; known: "docker", "subprocess", "ssh", "prime", "kubernetes"$/,
  );
});

Deno.test("RuntimeTable accepts every key of every type's table, and refuses others by name", () => {
  const keys = new Set(Object.keys(RuntimeTable.shape));
  for (const table of RuntimeConfigByType.options) {
    for (const key of Object.keys(table.shape)) assert.ok(keys.has(key), key);
  }
  assert.deepEqual(RuntimeConfigByType.options.map((t) => t.shape.type.value), [...RUNTIME_TYPES]);
  // A config switched to another type keeps the other type's keys.
  assert.ok(RuntimeTable.safeParse({ type: "subprocess", image: "x", host: "h" }).success);
  const typo = RuntimeTable.safeParse({ imgae: "x" });
  assert.equal(typo.error?.issues[0].code, "unrecognized_keys");
});

Deno.test("traitsOf() answers from the spec alone: isolation, egress, gateway, snapshots", () => {
  const docker = traitsOf({ type: "docker", image: "busybox" });
  assert.deepEqual(
    [docker.isolation, docker.egress, docker.gateway, docker.snapshots, docker.enclosed],
    [true, true, "network", true, false],
  );
  assert.equal(traitsOf({ type: "docker", image: "b", networkName: "n" }).enclosed, true);
  assert.equal(traitsOf({ type: "docker", image: "b", command: null }).killProcesses, false);
  const host = traitsOf({ type: "subprocess" });
  assert.deepEqual([host.isolation, host.gateway, host.onHost, host.artifacts], [
    false,
    "loopback",
    true,
    false,
  ]);
  const shared = traitsOf({ type: "ssh", host: "h" });
  const dedicated = traitsOf({ type: "ssh", host: "h", dedicated: true });
  assert.deepEqual([shared.isolation, shared.dedicated, shared.gateway], [false, false, null]);
  assert.deepEqual([dedicated.isolation, dedicated.dedicated], [true, true]);
  assert.equal(shared.label, "ssh runtime on a shared host");
  for (const type of ["prime", "kubernetes"] as const) {
    const t = traitsOf({ type, image: "x" });
    assert.deepEqual([t.isolation, t.egress, t.gateway, t.services], [true, false, null, false]);
  }
  assert.equal(dedicatedHostOf({ type: "ssh", host: "h", dedicated: true }), "h");
  assert.equal(dedicatedHostOf({ type: "ssh", host: "h" }), undefined);
  assert.equal(dedicatedHostOf({ type: "docker", image: "b" }), undefined);
});

Deno.test("traitsOfConfig() agrees with traitsOf() of the spec the config becomes", () => {
  const configs = [
    {},
    { type: "subprocess" as const },
    { type: "ssh" as const, host: "h" },
    { type: "ssh" as const, host: "h", dedicated: true },
    { type: "prime" as const },
    { type: "kubernetes" as const },
  ];
  for (const config of configs) {
    const spec = specOf(config, { ...needs, container: false });
    assert.deepEqual(traitsOfConfig(config), traitsOf(spec), JSON.stringify(config));
  }
});
