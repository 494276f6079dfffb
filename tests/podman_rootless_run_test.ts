/**
 * A taskset run on ROOTLESS podman end to end (tests/setup.sh starts its service as
 * VF_PODMAN_USER, on /run/user/<uid>/podman/podman.sock, and loads busybox into its own image
 * store): `vf run file-sum` with isolated grading and warm pools for both the agent's and the
 * grader's sandboxes, its DOCKER_HOST (in the child only) on that socket. file-sum asks for no
 * cpu/memory limits and no network, which rootless podman on a cgroup v1 host without a usable
 * /dev/net/tun cannot give; what it cannot give is refused on the rollout's trace, once, and
 * nothing is left on the engine.
 * @module
 */
import assert from "node:assert/strict";
import { join } from "node:path";
import { DockerEngine } from "../runtimes/docker/engine_api.ts";
import { DockerRuntime } from "../runtimes/docker/mod.ts";
import { SandboxUnsupportedError } from "../runtimes/errors.ts";
import { bashModel, startModelServer } from "./model_server.ts";
import { cliCommand, collect, tempDir, transcript } from "./_cli.ts";

const ROOTLESS_UID = new TextDecoder().decode(
  new Deno.Command("id", { args: ["-u", Deno.env.get("VF_PODMAN_USER") ?? "vf-rootless"] })
    .outputSync().stdout,
).trim();
const ROOTLESS_HOST = `unix:///run/user/${ROOTLESS_UID}/podman/podman.sock`;
/** Whether rootless podman's network helper is installed (tests/setup.sh installs it). */
const SLIRP4NETNS = new Deno.Command("sh", { args: ["-c", "command -v slirp4netns"] })
  .outputSync().success;

/** The ledger's lines, parsed. */
async function ledgerOf(path: string) {
  return (await Deno.readTextFile(path)).trim().split("\n").map((l) => JSON.parse(l));
}

/** The run's traces, from the folder its stderr names. */
async function tracesOf(stderr: string) {
  const dir = /^Saving traces to (.+)$/m.exec(stderr)![1];
  return (await Deno.readTextFile(join(dir, "traces.jsonl"))).trim().split("\n")
    .map((l) => JSON.parse(l));
}

/** Asserts the engines keep none of the run's containers and networks. */
async function assertNoneLeft(engines: DockerEngine[], runId: string): Promise<void> {
  for (const engine of engines) {
    const left = await engine.listContainers({ all: true, labels: [`vf.run_id=${runId}`] });
    assert.deepEqual(left, [], `${engine.endpoint.display} keeps none of run ${runId}'s sandboxes`);
    const networks = await engine.listNetworks({ labels: [`vf.run_id=${runId}`] });
    assert.deepEqual(
      networks,
      [],
      `${engine.endpoint.display} keeps none of run ${runId}'s networks`,
    );
  }
}

/** `vf run file-sum` on busybox (the image the rootless store holds), on rootless podman. */
function runFileSum(cwd: string, modelUrl: string, ledger: string, extra: string[]) {
  return collect(cliCommand(
    [
      "run",
      "file-sum",
      "-m",
      "m",
      "-b",
      modelUrl,
      "-o",
      "out",
      "--env.taskset.image",
      "busybox:latest",
      ...extra,
    ],
    { cwd, env: { DOCKER_HOST: ROOTLESS_HOST, VF_LEDGER: ledger }, registry: false },
  ));
}

Deno.test("vf run on rootless podman: isolated grading and warm pools work, every sandbox there and none left", async () => {
  await using tmp = await tempDir("vf_podman_rootless_run_");
  await using model = await startModelServer({
    responder: bashModel(
      "cat /app/input.txt",
      "awk '{ s += $1 } END { print s }' /app/input.txt > /app/output/answer.txt",
    ),
  });
  const ledger = join(tmp.path, "ledger.jsonl");
  const res = await runFileSum(tmp.path, model.url, ledger, [
    "-n",
    "2",
    "-c",
    "2",
    "--env.agent.scoring.mode",
    "isolated",
    "--env.agent.runtime.warm_pool",
    "1",
    "--env.agent.scoring.runtime.warm_pool",
    "1",
  ]);
  assert.equal(res.code, 0, transcript(res));
  const traces = await tracesOf(res.stderr);
  assert.equal(traces.length, 2);
  for (const t of traces) {
    assert.equal(t.reward, 1, JSON.stringify(t.error));
    assert.equal(t.scoring.mode, "isolated");
  }
  const entries = await ledgerOf(ledger);
  const requested = entries.filter((e) => e.event === "requested");
  for (const e of requested) assert.equal(e.host.docker_host, ROOTLESS_HOST);
  const graders = requested.filter((e) => e.labels["vf.role"] === "grader");
  // A grading sandbox per rollout, each a fresh one (pooled ones are never used twice), and
  // each pool made at least one sandbox of its role.
  assert.ok(graders.length >= 2, `a grading sandbox per rollout: ${JSON.stringify(graders)}`);
  assert.ok(graders.some((e) => e.labels["vf.pool"]), "the grader's warm pool made a sandbox");
  assert.ok(
    requested.some((e) => e.labels["vf.role"] !== "grader" && e.labels["vf.pool"]),
    "the agent's warm pool made a sandbox",
  );
  const runId = requested[0].run_id;
  assert.equal(entries.filter((e) => e.event === "stopped").length, requested.length);
  const rootless = new DockerEngine(ROOTLESS_HOST);
  const docker = new DockerEngine("unix:///var/run/docker.sock");
  try {
    await assertNoneLeft([rootless, docker], runId);
  } finally {
    await rootless.close();
    await docker.close();
  }
});

Deno.test("vf run on rootless podman: cpu/memory limits and network are refused on the trace, not retried, and none is left", async () => {
  await using tmp = await tempDir("vf_podman_rootless_refuse_");
  await using model = await startModelServer({ responder: () => ({ content: "Done." }) });
  const runs = [
    {
      name: "limits",
      flags: ["--env.agent.runtime.cpu", "0.5", "--env.agent.runtime.memory", "256m"],
    },
    { name: "network", flags: ["--env.agent.runtime.network", "true"] },
  ];
  // Both runs at once: each has a folder and a ledger of its own.
  const results = await Promise.all(runs.map(async ({ name, flags }) => {
    const cwd = join(tmp.path, name);
    await Deno.mkdir(cwd);
    const ledger = join(cwd, "ledger.jsonl");
    const res = await runFileSum(cwd, model.url, ledger, ["-n", "1", ...flags]);
    return { name, res, ledger };
  }));
  const rootless = new DockerEngine(ROOTLESS_HOST);
  try {
    for (const { name, res, ledger } of results) {
      assert.notEqual(res.code, 0, `${name}: every rollout errored\n${transcript(res)}`);
      const [trace, ...more] = await tracesOf(res.stderr);
      assert.equal(more.length, 0, name);
      assert.equal(trace.reward, null, `${name}: not scored`);
      assert.equal(trace.error.phase, "setup", name);
      assert.equal(trace.error.infra, true, name);
      if (name === "limits") {
        assert.equal(trace.error.error, "SandboxUnsupportedError", JSON.stringify(trace.error));
        assert.match(trace.error.message, /dropped the cpu\/memory limits .*cgroup v2/);
      } else {
        // The rollout's network comes first, with the gateway relay on it, and is refused.
        assert.match(trace.error.error_chain_repr, /SandboxUnsupportedError\(/);
        assert.match(
          trace.error.message,
          /\(rootless podman\) cannot give container "vf-[0-9a-f]+" the network it asked for \(network = true\): .*\/dev\/net\/tun/,
        );
      }
      const entries = await ledgerOf(ledger);
      const requested = entries.filter((e) => e.event === "requested");
      // Refused once: a retry would ask for another sandbox, which could not do better.
      assert.equal(requested.length, 1, `${name}: ${JSON.stringify(requested)}`);
      assert.equal(requested[0].host.docker_host, ROOTLESS_HOST);
      assert.equal(entries.filter((e) => e.event === "stopped").length, 1, name);
      await assertNoneLeft([rootless], requested[0].run_id);
    }
  } finally {
    await rootless.close();
  }
});

Deno.test("rootless podman: a sandbox asking for network is refused with why, and nothing is left", async () => {
  const runId = `vf-rootless-net-${crypto.randomUUID().slice(0, 8)}`;
  const engine = new DockerEngine(ROOTLESS_HOST);
  try {
    const rt = new DockerRuntime(
      { type: "docker", image: "busybox", network: true },
      { runId, engine },
    );
    await assert.rejects(rt.start(), (error: Error) => {
      assert.ok(error instanceof SandboxUnsupportedError, String(error));
      assert.match(error.message, /\(rootless podman\) cannot give container .*network = true/);
      if (SLIRP4NETNS) {
        assert.match(
          error.message,
          /slirp4netns, which needs \/dev\/net\/tun open to the podman user/,
        );
        assert.match(error.message, /\(podman: [^)]*(\/dev\/net\/tun|rootless netns)/);
      } else {
        // tests/setup.sh installs it; a machine set up without it is refused for that.
        // (once podman tried, it may fail earlier, setting up the namespace it would run in)
        assert.match(
          error.message,
          /slirp4netns, which (is not installed|needs \/dev\/net\/tun .* could not be set up) \(podman: /,
        );
      }
      return true;
    });
    await rt.stop();
    await assertNoneLeft([engine], runId);
  } finally {
    await engine.close();
  }
});
