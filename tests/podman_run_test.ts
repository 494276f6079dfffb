/**
 * A taskset run on podman end to end: `vf run file-sum` with isolated grading and a warm pool,
 * its DOCKER_HOST (in the child only) on root podman's Engine API socket. Both rollouts are
 * solved and graded in sandboxes of their own, every sandbox was asked of podman, and none is
 * left there or on Docker.
 * @module
 */
import assert from "node:assert/strict";
import { join } from "node:path";
import { DockerEngine } from "../runtimes/docker/engine_api.ts";
import { bashModel, startModelServer } from "./model_server.ts";
import { cliCommand, collect, tempDir, transcript } from "./_cli.ts";

const PODMAN_SOCK = Deno.env.get("VF_PODMAN_SOCK") ?? "/run/podman/podman.sock";

Deno.test("vf run on podman: isolated grading and a warm pool work, every sandbox on podman and none left", async () => {
  await using tmp = await tempDir("vf_podman_run_");
  await using model = await startModelServer({
    responder: bashModel(
      "cat /app/input.txt",
      "awk '{ s += $1 } END { print s }' /app/input.txt > /app/output/answer.txt",
    ),
  });
  const ledger = join(tmp.path, "ledger.jsonl");
  const res = await collect(cliCommand(
    [
      "run",
      "file-sum",
      "-m",
      "m",
      "-b",
      model.url,
      "-n",
      "2",
      "-c",
      "2",
      "-o",
      "out",
      "--env.agent.scoring.mode",
      "isolated",
      "--env.agent.runtime.warm_pool",
      "1",
    ],
    {
      cwd: tmp.path,
      env: { DOCKER_HOST: `unix://${PODMAN_SOCK}`, VF_LEDGER: ledger },
      registry: false,
    },
  ));
  assert.equal(res.code, 0, transcript(res));
  const dir = /^Saving traces to (.+)$/m.exec(res.stderr)![1];
  const traces = (await Deno.readTextFile(join(dir, "traces.jsonl"))).trim().split("\n")
    .map((l) => JSON.parse(l));
  assert.equal(traces.length, 2);
  for (const t of traces) {
    assert.equal(t.reward, 1, JSON.stringify(t.error));
    assert.equal(t.scoring.mode, "isolated");
  }
  const entries = (await Deno.readTextFile(ledger)).trim().split("\n").map((l) => JSON.parse(l));
  const requested = entries.filter((e) => e.event === "requested");
  for (const e of requested) assert.equal(e.host.docker_host, `unix://${PODMAN_SOCK}`);
  const roles = requested.map((e) => e.labels["vf.role"]);
  assert.equal(roles.filter((r) => r === "grader").length, 2, "a grading sandbox per rollout");
  assert.ok(requested.some((e) => e.labels["vf.pool"]), "the warm pool made a sandbox");
  const runId = requested[0].run_id;
  assert.equal(entries.filter((e) => e.event === "stopped").length, requested.length);
  const podman = new DockerEngine(`unix://${PODMAN_SOCK}`);
  const docker = new DockerEngine("unix:///var/run/docker.sock");
  try {
    for (const engine of [podman, docker]) {
      const left = await engine.listContainers({ all: true, labels: [`vf.run_id=${runId}`] });
      assert.deepEqual(left, [], `${engine.endpoint.display} keeps none of the run's sandboxes`);
    }
  } finally {
    await podman.close();
    await docker.close();
  }
});
