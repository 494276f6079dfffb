/**
 * Tests of the Env layer's episode beside its code: {@link runEpisode} runs an Env's setup,
 * run and finalize with fresh agents, records the Env's own failures and timeouts on the
 * episode, closes interactions an Env left open, and {@link flatTrace}/{@link episodeOfLine}
 * convert between episode lines and single-agent trace lines. Agents run for real: tasks on the
 * subprocess runtime, the model a loopback OpenAI-compatible server
 * (`lib/model/local_server.ts`).
 * @module
 */
import assert from "node:assert/strict";
import {
  type AgentRole,
  type Agents,
  Env,
  type Episode,
  NullHarness,
  OpenAIChatClient,
  reward,
  runEpisode,
  Task,
  type TaskTrace,
} from "../../mod.ts";
import { type ModelServer, type Responder, startModelServer } from "../model/local_server.ts";
import { EPISODE_FORMAT_VERSION, episodeOfLine, flatTrace } from "./env.ts";

/** Scores 1 when the agent's last reply says the task's answer. */
class SayTask extends Task {
  said = reward(({ trace }) =>
    String(trace.messages.at(-1)?.content ?? "").includes(String(this.data.answer)) ? 1 : 0
  );
}

const TASK = new SayTask({ id: "say", idx: 3, prompt: "Say blue.", answer: "blue" });

function role(server: ModelServer, name = "agent", extra: Partial<AgentRole> = {}): AgentRole {
  return {
    name,
    client: new OpenAIChatClient({
      base_url: server.url,
      api_key_var: "VF_NO_KEY",
      max_retries: 0,
    }),
    model: "m",
    harness: new NullHarness(),
    policy: { runtime: { type: "subprocess" } },
    ...extra,
  };
}

async function server(responder: Responder = () => ({ content: "blue" })): Promise<ModelServer> {
  return await startModelServer({ responder });
}

const OPTIONS = { tasksetId: "colours", runId: "env-test" };

/** An Env whose run and finalize are the given functions. */
function envOf(
  roles: Record<string, AgentRole>,
  run: (task: Task, agents: Agents) => Promise<void>,
  options: {
    finalize?: (task: Task, episode: Episode) => void | Promise<void>;
    env?: Record<string, unknown>;
  } = {},
): Env {
  class Scripted extends Env {
    static override roles = Object.fromEntries(Object.keys(roles).map((r) => [r, {}]));
    run(task: Task, agents: Agents) {
      return run(task, agents);
    }
    override finalize(task: Task, episode: Episode) {
      return options.finalize?.(task, episode);
    }
  }
  return new Scripted({ id: "scripted", roles, options: options.env });
}

Deno.test("runEpisode(): one agent's run joins the episode, which names the run, Env, taskset and task and is ok when every trace is", async () => {
  await using model = await server();
  const env = envOf({ agent: role(model) }, async (task, agents) => {
    await agents.agent.run(task);
  });
  const episode = await runEpisode(env, TASK, { ...OPTIONS, episodeIndex: 2 });
  assert.equal(episode.format_version, EPISODE_FORMAT_VERSION);
  assert.equal(episode.kind, "episode");
  assert.equal(episode.run_id, "env-test");
  assert.equal(episode.env_id, "scripted");
  assert.equal(episode.taskset, "colours");
  assert.deepEqual(episode.task, { key: "say", idx: 3, hash: TASK.hash });
  assert.equal(episode.example_id, 3);
  assert.equal(episode.episode_index, 2);
  assert.deepEqual(episode.errors, []);
  assert.equal(episode.ok, true);
  assert.equal(episode.traces.length, 1);
  const [trace] = episode.traces;
  assert.equal(trace.episode_id, episode.episode_id);
  assert.equal(trace.role, "agent");
  assert.equal(trace.reward, 1, JSON.stringify(trace.error));
  assert.equal(trace.rollout_index, 2);
  assert.equal(typeof episode.timing.total_ms, "number");
  assert.equal(model.requests.length, 1);
});

Deno.test("runEpisode(): finalize sees every trace after the run and may score them; a throw in run, or an Env that runs no agent, is an env error and finalize is skipped", async () => {
  await using model = await server();
  let finalized = 0;
  const scoring = envOf({ a: role(model, "a"), b: role(model, "b") }, async (task, agents) => {
    await agents.a.run(task);
    await agents.b.run(task);
  }, {
    finalize: (_task, episode) => {
      finalized++;
      for (const t of episode.traces) t.metrics.both = episode.traces.length;
    },
  });
  const ok = await runEpisode(scoring, TASK, OPTIONS);
  assert.deepEqual(ok.traces.map((t) => [t.role, t.metrics.both]), [["a", 2], ["b", 2]]);
  assert.equal(finalized, 1);

  const throwing = envOf({ agent: role(model) }, async (task, agents) => {
    await agents.agent.run(task);
    throw new Error("the game's rules broke");
  }, { finalize: () => void finalized++ });
  const failed = await runEpisode(throwing, TASK, OPTIONS);
  assert.equal(failed.ok, false);
  assert.equal(failed.traces.length, 1, "the finished run still joined");
  assert.equal(failed.errors.length, 1);
  assert.equal(failed.errors[0].phase, "env");
  assert.equal(failed.errors[0].message, "the game's rules broke");
  assert.equal(finalized, 1, "finalize does not run after a failed run");

  const idle = await runEpisode(envOf({ agent: role(model) }, async () => {}), TASK, OPTIONS);
  assert.equal(idle.ok, false);
  assert.equal(idle.errors[0].error, "EnvError");
  assert.equal(idle.errors[0].message, 'Env "scripted" ran no agent on task "say"');

  const badFinal = envOf({ agent: role(model) }, async (task, agents) => {
    await agents.agent.run(task);
  }, {
    finalize: () => {
      throw new TypeError("cannot judge");
    },
  });
  const judged = await runEpisode(badFinal, TASK, OPTIONS);
  assert.equal(judged.ok, false);
  assert.deepEqual(judged.errors.map((e) => [e.phase, e.error, e.message]), [[
    "env",
    "TypeError",
    "cannot judge",
  ]]);
});

Deno.test("runEpisode(): timeout.episode cuts the run short with an EnvError; the run it cut short keeps its trace with the timeout as its error", async () => {
  await using model = await server(() => ({ content: "blue", delay_ms: 5_000 }));
  const env = envOf({ agent: role(model) }, async (task, agents) => {
    await agents.agent.run(task);
  }, { env: { timeout: { episode: 0.3 } } });
  const started = performance.now();
  const episode = await runEpisode(env, TASK, OPTIONS);
  assert.ok(performance.now() - started < 4_000, "the episode waited for the slow model");
  assert.equal(episode.ok, false);
  assert.equal(episode.errors[0].error, "EnvError");
  assert.equal(episode.errors[0].message, "The episode's run timed out after 0.3s");
  assert.equal(episode.traces.length, 1);
  assert.equal(episode.traces[0].ok, false);
  assert.equal(episode.traces[0].error?.message, "The episode's run timed out after 0.3s");
});

Deno.test("runEpisode(): timeout.finalize bounds finalize; an interrupt of the whole run (the signal) throws instead of being recorded", async () => {
  await using model = await server();
  const slowFinal = envOf({ agent: role(model) }, async (task, agents) => {
    await agents.agent.run(task);
  }, {
    env: { timeout: { finalize: 0.2 } },
    finalize: () => new Promise((r) => setTimeout(r, 1_000)),
  });
  const episode = await runEpisode(slowFinal, TASK, OPTIONS);
  assert.deepEqual(episode.errors.map((e) => e.message), [
    "The episode's finalize timed out after 0.2s",
  ]);
  assert.equal(episode.traces[0].ok, true, "the run itself was fine");

  const controller = new AbortController();
  const reason = new Error("interrupted");
  const waiting = envOf({ agent: role(model) }, (_task, _agents) =>
    new Promise((_, reject) => {
      setTimeout(() => controller.abort(reason), 50);
      controller.signal.addEventListener("abort", () => reject(controller.signal.reason));
    }));
  await assert.rejects(
    runEpisode(waiting, TASK, { ...OPTIONS, signal: controller.signal }),
    (e) => e === reason,
  );
});

Deno.test("runEpisode(): max_concurrent_agents bounds the agent runs active at once (default 1)", async () => {
  let active = 0;
  let peak = 0;
  await using model = await server(async () => {
    peak = Math.max(peak, ++active);
    await new Promise((r) => setTimeout(r, 150));
    active--;
    return { content: "blue" };
  });
  const three = (agents: Agents, task: Task) =>
    Promise.all([0, 1, 2].map(() => agents.agent.run(task))).then(() => {});
  const serial = await runEpisode(
    envOf({ agent: role(model) }, (t, a) => three(a, t)),
    TASK,
    OPTIONS,
  );
  assert.equal(serial.traces.length, 3);
  assert.equal(peak, 1);
  assert.deepEqual(
    serial.traces.map((t) => t.attempt).sort(),
    [0, 1, 2],
    "each run counts its attempt",
  );
  peak = 0;
  const wide = envOf({ agent: role(model) }, (t, a) => three(a, t), {
    env: { max_concurrent_agents: 3 },
  });
  await runEpisode(wide, TASK, OPTIONS);
  assert.equal(peak, 3);
});

Deno.test("runEpisode(): an interaction the Env left open is closed by the episode, and its trace joins as closed by the user", async () => {
  await using model = await server();
  const env = envOf({ agent: role(model) }, async (task, agents) => {
    const chat = await agents.agent.interaction(task);
    const segment = await chat.turn();
    assert.equal(segment.lastReply, "blue");
    // No close: the Env forgot.
  });
  const episode = await runEpisode(env, TASK, OPTIONS);
  assert.equal(episode.traces.length, 1);
  assert.equal(episode.traces[0].stop_condition, "user_closed");
  assert.equal(episode.traces[0].reward, 1);
  assert.equal(episode.ok, true);
});

// ---------------------------------------------------------------------------------------
// Lines of traces.jsonl

function trace(extra: Partial<TaskTrace> = {}): TaskTrace {
  return {
    format_version: 3,
    trace_id: "t1",
    run_id: "r",
    taskset: "ts",
    task: { key: "k", idx: 4, hash: "h" },
    example_id: 4,
    rollout_index: 1,
    ok: true,
    error: null,
    timing: { started_at: 12 },
    ...extra,
  } as TaskTrace;
}

Deno.test("flatTrace(): a one-trace episode is its trace, carrying the episode's error when the trace has none; more traces are not flat", () => {
  const base = { errors: [], traces: [trace()] } as unknown as Episode;
  assert.equal(flatTrace(base), base.traces[0]);
  const failed = {
    errors: [{ error: "EnvError", message: "finalize broke", phase: "env" }],
    traces: [trace()],
  } as unknown as Episode;
  const flat = flatTrace(failed)!;
  assert.equal(flat.ok, false);
  assert.deepEqual(flat.error, { error: "EnvError", message: "finalize broke", phase: "env" });
  const own = trace({
    ok: false,
    error: { error: "TaskError", message: "own" } as TaskTrace["error"],
  });
  assert.equal(
    flatTrace({ errors: failed.errors, traces: [own] } as unknown as Episode)!.error?.message,
    "own",
  );
  assert.equal(flatTrace({ errors: [], traces: [trace(), trace()] } as unknown as Episode), null);
});

Deno.test("episodeOfLine(): an episode line is taken as is, a single-agent trace line becomes a one-trace episode, anything else is null", () => {
  const episode = { kind: "episode", task: { key: "k" }, traces: [] };
  assert.equal(episodeOfLine(episode), episode);
  const wrapped = episodeOfLine(trace({ episode_id: undefined }))!;
  assert.equal(wrapped.kind, "episode");
  assert.equal(wrapped.env_id, "single-agent");
  assert.equal(wrapped.episode_id, "t1", "the trace's id when it has no episode id");
  assert.equal(wrapped.episode_index, 1);
  assert.equal(wrapped.example_id, 4);
  assert.equal(wrapped.ok, true);
  assert.deepEqual(wrapped.timing, { started_at: 12 });
  assert.equal(wrapped.traces.length, 1);
  assert.equal(
    episodeOfLine(trace({ ok: true, error: { error: "E" } as TaskTrace["error"] }))!.ok,
    false,
  );
  for (
    const junk of [null, 3, "x", {}, { task: { key: 1 } }, { task: { key: "k" } }, {
      kind: "episode",
      task: { key: "k" },
    }]
  ) {
    assert.equal(episodeOfLine(junk), null, JSON.stringify(junk));
  }
});
