import assert from "node:assert/strict";
import { OpenAIChatClient } from "../../model/client.ts";
import { startModelServer } from "../../model/local_server.ts";
import { TaskError } from "../../errors.ts";
import { NullHarness } from "../harness.ts";
import { reward, Task, type TaskHookContext } from "../task.ts";
import { type AgentPolicy, runTaskRollout, TaskRollout, type TaskRolloutOptions } from "./mod.ts";

/** Writes a file in setup; its reward reads the file back and counts the agent's replies. */
class NoteTask extends Task {
  static override HARNESS = "null";
  override async setup({ runtime, state }: TaskHookContext) {
    const r = await runtime.run(["sh", "-c", "echo seeded > note.txt"]);
    if (r.exit_code !== 0) throw new TaskError(r.stderr);
    state.seeded = true;
  }
  seeded = reward(async ({ runtime, state }) => {
    const r = await runtime.run(["cat", "note.txt"]);
    return state.seeded && r.stdout.trim() === "seeded" ? 1 : 0;
  });
  replies = reward(({ trace }) => trace.messages.filter((m) => m.role === "assistant").length, {
    weight: 0.5,
  });
}

function options(
  url: string,
  task: Task,
  extra: Partial<TaskRolloutOptions> = {},
  policy: Partial<AgentPolicy> = {},
): TaskRolloutOptions {
  return {
    task,
    tasksetId: "notes",
    policy: { runtime: { type: "subprocess" }, harness: new NullHarness(), ...policy },
    client: new OpenAIChatClient({ base_url: url }),
    model: "m",
    runId: "rollout-mod-test",
    ...extra,
  };
}

Deno.test("TaskRollout: open sets up a subprocess sandbox, steps run and resume the harness, close scores it, removes the sandbox and keeps its record", async () => {
  let n = 0;
  await using server = await startModelServer({ responder: () => ({ content: `reply ${++n}` }) });
  const rollout = new TaskRollout(options(server.url, new NoteTask({ id: "a", prompt: "hi" })));
  assert.equal(await rollout.open(), true);
  assert.ok(rollout.runtime, "the agent's sandbox is up once open");
  const first = await rollout.step();
  // The first segment brings the task's prompt; a later one what followed the user's turn.
  assert.deepEqual(first.messages.map((m) => m.content), ["hi", "reply 1"]);
  assert.equal(first.lastReply, "reply 1");
  const second = await rollout.step([{ role: "user", content: "again" }]);
  assert.deepEqual(second.messages.map((m) => m.content), ["reply 2"]);
  const trace = await rollout.close();
  assert.equal(trace.ok, true, JSON.stringify(trace.error));
  assert.deepEqual(trace.rewards, { seeded: 1, replies: 2 });
  assert.equal(trace.reward, 2);
  assert.deepEqual(trace.reward_weights, { replies: 0.5 });
  assert.deepEqual(trace.scoring, { mode: "shared", attempts: 1 });
  for (const key of ["setup_ms", "sandbox_ms", "agent_ms", "finalize_ms", "scoring_ms"]) {
    assert.equal(typeof trace.timing[key], "number", key);
  }
  assert.equal(rollout.runtime, null, "close removes the sandbox");
  assert.equal(await rollout.close(), trace, "close is idempotent");
  // What the sandbox did is the rollout's own result, for vf replay.
  const record = rollout.record!;
  assert.equal(record.sandboxes.length, 1);
  assert.equal(record.sandboxes[0].role, "agent");
  assert.equal(record.sandboxes[0].type, "subprocess");
  assert.deepEqual(
    record.sandboxes[0].ops.map((op) => (op.args as { argv?: string[] }).argv),
    [["sh", "-c", "echo seeded > note.txt"], ["cat", "note.txt"]],
  );
  assert.equal(record.tools, null);
});

Deno.test("TaskRollout: a failed setup is recorded in phase setup; step does nothing and close still tears down", async () => {
  class Broken extends NoteTask {
    override setup(): Promise<void> {
      return Promise.reject(new TaskError("no fixture"));
    }
  }
  await using server = await startModelServer({ responder: () => ({ content: "x" }) });
  const rollout = new TaskRollout(options(server.url, new Broken({ id: "b", prompt: "hi" })));
  assert.equal(await rollout.open(), false);
  assert.equal(rollout.failed, true);
  assert.deepEqual(await rollout.step(), { messages: [], terminated: true, lastReply: "" });
  const trace = await rollout.close();
  assert.equal(trace.ok, false);
  assert.equal(trace.error?.phase, "setup");
  assert.equal(trace.error?.message, "no fixture");
  assert.equal(trace.reward, null);
  assert.equal(server.requests.length, 0, "the model is never called");
});

Deno.test("TaskRollout: a finalize that outlasts its phase timeout fails the trace in phase finalize, naming the limit", async () => {
  class SlowFinalize extends NoteTask {
    override finalize({ signal }: TaskHookContext): Promise<void> {
      return new Promise((_, reject) =>
        signal?.addEventListener("abort", () => reject(signal.reason))
      );
    }
  }
  await using server = await startModelServer({ responder: () => ({ content: "x" }) });
  const trace = await runTaskRollout(
    options(server.url, new SlowFinalize({ id: "c", prompt: "hi" }), {}, {
      timeouts: { finalize: 0.2 },
    }),
  );
  assert.equal(trace.ok, false);
  assert.equal(trace.error?.phase, "finalize");
  assert.equal(trace.error?.message, 'Phase "finalize" timed out after 0.2s');
  assert.equal(typeof trace.timing.finalize_ms, "number");
});

Deno.test("TaskRollout.run(): an interrupt is thrown, not recorded, and the sandbox is removed first", async () => {
  const run = new AbortController();
  const reason = new Error("interrupted");
  await using server = await startModelServer({
    responder: () => {
      run.abort(reason);
      return { content: "late" };
    },
  });
  const rollout = new TaskRollout(
    options(server.url, new NoteTask({ id: "d", prompt: "hi" }), { signal: run.signal }),
  );
  await assert.rejects(rollout.run(), (e) => e === reason);
  assert.equal(rollout.runtime, null);
  assert.equal(rollout.trace.error, null, "an interrupt is not a result");
});
