/**
 * Fork-per-group against a real Docker engine: a task's setup runs once, its sandbox is
 * snapshotted, and the task's other rollouts start from the snapshot with nothing of each
 * other's work.
 */
import assert from "node:assert/strict";
import { runTaskset, Task, type TaskHookContext, Taskset, type TaskTrace } from "../mod.ts";
import { GroupForks } from "../lib/tasks/fork.ts";
import { runTaskRollout } from "../lib/tasks/rollout/mod.ts";
import type { ChatClient } from "../lib/model/client.ts";
import { cleanupContainers, DockerEngine, DockerRuntime } from "../runtimes/docker/mod.ts";
import type { HarnessContext } from "../lib/tasks/harness.ts";

const DOCKER_SOCKET = "/var/run/docker.sock";

async function dockerJson(path: string): Promise<Array<Record<string, unknown>>> {
  const client = Deno.createHttpClient({ proxy: { transport: "unix", path: DOCKER_SOCKET } });
  try {
    const res = await fetch(`http://docker${path}`, { client });
    assert.equal(res.status, 200, await res.clone().text());
    return await res.json();
  } finally {
    client.close();
  }
}

const byRun = (runId: string) =>
  encodeURIComponent(JSON.stringify({ label: [`vf.run_id=${runId}`] }));

/** The harness never asks a model: nothing here calls it. */
const noModel: ChatClient = {
  baseUrl: "http://127.0.0.1:9/v1",
  headersFromState: {},
  getResponse: () => Promise.reject(new Error("fork_test's harness never calls the model")),
};

/**
 * Each rollout reads what setup left, counts what earlier rollouts left behind, and leaves
 * a file of its own: a member that saw another's file would mean shared state.
 */
const harness = {
  id: "fork-probe",
  executesCode: true,
  async run(ctx: HarnessContext) {
    const r = await ctx.runtime.run([
      "sh",
      "-c",
      'cat seed; echo " $(ls members | wc -l)"; echo "$$" > "members/$$"',
    ]);
    assert.equal(r.exit_code, 0, r.stderr);
    ctx.recorder.messages.push({ role: "assistant", content: r.stdout.trim() });
  },
};

class ProbeTask extends Task {
  constructor(key: string, readonly setups: Map<string, number>) {
    super({ id: key, prompt: "probe", workdir: "/work" });
  }
  override async setup({ runtime, trace, state }: TaskHookContext): Promise<void> {
    this.setups.set(this.key, (this.setups.get(this.key) ?? 0) + 1);
    const seed = `${this.key}-${crypto.randomUUID()}`;
    await runtime.run(["sh", "-c", `mkdir -p members && printf %s "${seed}" > seed`]);
    trace.info.seed = seed;
    state.seed = seed;
  }
  override score({ trace, state }: TaskHookContext) {
    const [seen, others] = String(trace.messages.at(-1)?.content ?? "").split(" ");
    const ok = seen === state.seed && trace.info.seed === state.seed && others === "0";
    return Promise.resolve({ reward: ok ? 1 : 0, rewards: {}, metrics: {} });
  }
}

class Probes extends Taskset<ProbeTask> {
  readonly setups = new Map<string, number>();
  override readonly forkGroup = true;
  get id() {
    return "fork-probes";
  }
  *load() {
    for (const key of ["a", "b"]) yield new ProbeTask(key, this.setups);
  }
}

function groups(traces: TaskTrace[]): Map<string, TaskTrace[]> {
  const out = new Map<string, TaskTrace[]>();
  for (const t of traces) out.set(t.task.key, [...(out.get(t.task.key) ?? []), t]);
  return out;
}

for (const maxConcurrent of [1, 6]) {
  Deno.test(`fork_group (${maxConcurrent} at once): setup runs once per task, members start from its snapshot with its info and state, and none sees another's files`, async () => {
    const taskset = new Probes();
    const runId = `fork${maxConcurrent}-${crypto.randomUUID().slice(0, 6)}`;
    const { traces } = await runTaskset({
      taskset,
      policy: {
        runtime: { type: "docker", image: "busybox:latest" },
        harness,
        scoring: { mode: "shared" },
      },
      client: noModel,
      model: "none",
      rolloutsPerTask: 3,
      maxConcurrent,
      runId,
    });
    assert.equal(traces.length, 6);
    for (const t of traces) {
      assert.equal(t.reward, 1, JSON.stringify([t.error, t.messages, t.info]));
    }
    assert.deepEqual(Object.fromEntries(taskset.setups), { a: 1, b: 1 });
    for (const [key, group] of groups(traces)) {
      const leaders = group.filter((t) => !t.runtime.forked_from);
      assert.equal(leaders.length, 1, `${key}: ${JSON.stringify(group.map((t) => t.runtime))}`);
      const members = group.filter((t) => t !== leaders[0]);
      for (const m of members) {
        assert.equal(m.runtime.forked_from, leaders[0].trace_id);
        assert.equal(m.info.seed, leaders[0].info.seed);
      }
    }
    assert.deepEqual(await dockerJson(`/containers/json?all=1&filters=${byRun(runId)}`), []);
    assert.deepEqual(await dockerJson(`/images/json?filters=${byRun(runId)}`), []);
  });
}

Deno.test("fork_group on a runtime that cannot snapshot: every rollout sets up on its own and scores", async () => {
  const taskset = new Probes();
  class HostProbe extends ProbeTask {
    override get needsContainer() {
      return false;
    }
  }
  taskset.load = function* () {
    for (const key of ["a"]) yield new HostProbe(key, taskset.setups);
  };
  const { traces } = await runTaskset({
    taskset,
    policy: { runtime: { type: "subprocess" }, harness, scoring: { mode: "shared" } },
    client: noModel,
    model: "none",
    rolloutsPerTask: 2,
    maxConcurrent: 2,
    runId: `fork-sub-${crypto.randomUUID().slice(0, 6)}`,
  });
  assert.deepEqual(traces.map((t) => [t.reward, t.runtime.forked_from]), [
    [1, undefined],
    [1, undefined],
  ]);
  assert.deepEqual(Object.fromEntries(taskset.setups), { a: 2 });
});

Deno.test("fork_group: a member's wait for a slow leader does not count against its own setup timeout", async () => {
  class HostProbe extends ProbeTask {
    override get needsContainer() {
      return false;
    }
  }
  const setups = new Map<string, number>();
  const task = new HostProbe("slow-leader", setups);
  // The test leads the group, and settles it (no snapshot: set up on your own) only after
  // longer than the member's setup timeout (5 s against 4 s; the 4 s leave a loaded machine
  // room for the member's own setup).
  const forks = new GroupForks();
  const lead = forks.join(`agent\0${task.key}`);
  assert.ok(lead.lead);
  const settle = setTimeout(() => lead.settle(null), 5_000);
  const started = performance.now();
  try {
    const trace = await runTaskRollout({
      task,
      tasksetId: "fork-probes",
      policy: {
        runtime: { type: "subprocess" },
        harness,
        scoring: { mode: "shared" },
        timeouts: { setup: 4 },
      },
      client: noModel,
      model: "none",
      runId: `fork-slow-${crypto.randomUUID().slice(0, 6)}`,
      forks,
    });
    assert.equal(trace.error, null, JSON.stringify(trace.error));
    assert.equal(trace.reward, 1);
    // Before, the wait hit the setup timeout: a second attempt then set up without waiting.
    assert.ok(performance.now() - started >= 5_000, "the member waited for its leader");
    assert.equal(trace.runtime.attempts ?? 1, 1, "one attempt");
    assert.deepEqual(Object.fromEntries(setups), { "slow-leader": 1 }, "it set up on its own");
  } finally {
    clearTimeout(settle);
    await forks.close();
  }
});

Deno.test("vf cleanup's sweep removes the snapshots a killed run left (labelled vf.fork=1 with the run's labels)", async () => {
  const runId = `fork-left-${crypto.randomUUID().slice(0, 6)}`;
  const rt = new DockerRuntime({ type: "docker", image: "busybox:latest" }, {
    runId,
    ledger: null,
  });
  await rt.start();
  try {
    await rt.run(["sh", "-c", "echo kept > /kept.txt"]);
    const snapshot = await rt.snapshot();
    const images = await dockerJson(`/images/json?filters=${byRun(runId)}`);
    assert.deepEqual(images.flatMap((i) => i.RepoTags as string[]), [snapshot.image]);
  } finally {
    await rt.stop();
  }
  // The run was killed before it could remove its snapshot: the sweep by run finds it.
  await cleanupContainers({ runId });
  assert.deepEqual(await dockerJson(`/images/json?filters=${byRun(runId)}`), []);
  await DockerEngine.closeShared();
});
