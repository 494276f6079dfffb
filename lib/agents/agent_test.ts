/**
 * Tests of the agents inside an episode beside their code: which harness a role uses, a run
 * to completion (a failed run is data), an {@link Interaction} driven turn by turn, roles that
 * are not training data, and a sandbox provisioned once and shared by several runs. Everything
 * runs for real: the subprocess runtime, and a loopback OpenAI-compatible model server
 * (`lib/model/local_server.ts`) that answers by what it is sent.
 * @module
 */
import assert from "node:assert/strict";
import {
  type AgentRole,
  type AgentRun,
  type Agents,
  BashHarness,
  ConfigError,
  Env,
  EnvError,
  type Episode,
  type Harness,
  type HarnessContext,
  NullHarness,
  OpenAIChatClient,
  readText,
  reward,
  runEpisode,
  Task,
  type TaskHookContext,
} from "../../mod.ts";
import {
  type ChatRequest,
  lastUserText,
  type ModelServer,
  type Responder,
  startModelServer,
} from "../model/local_server.ts";
import { harnessFor } from "./agent.ts";

class EchoTask extends Task {
  // Scores 1 when the last reply repeats the last thing the user said.
  echoed = reward(({ trace }) => {
    const users = trace.messages.filter((m) => m.role === "user");
    const last = trace.messages.at(-1);
    return last?.role === "assistant" && String(last.content) === `echo: ${users.at(-1)?.content}`
      ? 1
      : 0;
  });
}

const TASK = new EchoTask({ id: "echo", prompt: "hello" });

/** Replies "echo: <last user text>". */
const ECHO: Responder = (req: ChatRequest) => ({ content: `echo: ${lastUserText(req)}` });

function role(server: ModelServer, extra: Partial<AgentRole> = {}): AgentRole {
  return {
    name: "agent",
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

/** Runs `body` as the run of a one-role Env in a real episode; returns the episode. */
async function episodeOf(
  agent: AgentRole,
  body: (task: Task, agents: Agents) => Promise<void>,
  task: Task = TASK,
  setup?: (agents: Agents) => void,
): Promise<Episode> {
  class Scripted extends Env {
    static override roles = { [agent.name]: {} };
    override setup(agents: Agents) {
      setup?.(agents);
    }
    run(t: Task, agents: Agents) {
      return body(t, agents);
    }
  }
  return await runEpisode(new Scripted({ id: "scripted", roles: { [agent.name]: agent } }), task, {
    tasksetId: "ts",
    runId: "agent-test",
  });
}

function errorsOf(episode: Episode): string {
  return JSON.stringify([episode.errors, episode.traces.map((t) => t.error)]);
}

Deno.test("harnessFor(): the role's harness object as is; a config names a built-in; else the task's HARNESS, else bash; one instance per role and id", async () => {
  await using model = await startModelServer({ responder: ECHO });
  const own: Harness = new NullHarness();
  assert.equal(harnessFor(role(model, { harness: own }), TASK), own);
  const configured = role(model, { harness: { id: "null" } });
  const chosen = harnessFor(configured, TASK);
  assert.equal(chosen.id, "null");
  assert.equal(harnessFor(configured, TASK), chosen, "built once per role");
  assert.notEqual(harnessFor(role(model, { harness: { id: "null" } }), TASK), chosen);

  class NullTask extends Task {
    static override HARNESS = "null";
  }
  const bare = role(model, { harness: undefined });
  assert.equal(harnessFor(bare, new NullTask({ prompt: "p" })).id, "null");
  assert.ok(harnessFor(bare, TASK) instanceof BashHarness, "bash when nobody chooses");
  assert.throws(() => harnessFor(role(model, { harness: { id: "nope" } }), TASK), /nope/);
});

Deno.test("EpisodeAgent.run(): a run to completion scores its trace; a model failure is data on the trace, not a throw", async () => {
  await using model = await startModelServer({
    responder: (req) =>
      req.body.model === "broken" ? { status: 400, body: "bad request" } : ECHO(req, { index: 0 }),
  });
  let run!: AgentRun;
  const ok = await episodeOf(role(model), async (task, agents) => {
    run = await agents.agent.run(task);
  });
  assert.equal(run.trace, ok.traces[0]);
  assert.equal(run.trace.reward, 1, errorsOf(ok));
  assert.deepEqual(run.state, {}, "the run's state object");
  assert.equal(run.trace.harness, "null");
  assert.equal(run.trace.model, "m");

  const failed = await episodeOf(role(model, { model: "broken" }), async (task, agents) => {
    run = await agents.agent.run(task);
    assert.equal(agents.agent.model, "broken");
  });
  assert.deepEqual(failed.errors, [], "the Env went on");
  assert.equal(run.trace.ok, false);
  assert.equal(run.trace.reward, null, "an error is never a 0");
  assert.match(run.trace.error?.message ?? "", /bad request/);
});

Deno.test("Interaction: a prompted task opens with a bare turn(), each later turn brings the user's message; close() scores once and is idempotent; a turn after close is a TypeError", async () => {
  await using model = await startModelServer({ responder: ECHO });
  let closed!: AgentRun;
  const episode = await episodeOf(role(model), async (task, agents) => {
    const chat = await agents.agent.interaction(task);
    const first = await chat.turn();
    assert.equal(first.lastReply, "echo: hello");
    assert.equal(first.terminated, false);
    const second = await chat.turn("again");
    assert.equal(second.lastReply, "echo: again");
    assert.deepEqual(second.messages.map((m) => m.role), ["assistant"]);
    assert.equal(chat.trace.reward, null, "not scored before close");
    closed = await chat.close();
    assert.equal(await chat.close(), closed);
    await assert.rejects(chat.turn("late"), /^TypeError: This interaction is closed$/);
  });
  assert.equal(episode.traces.length, 1);
  assert.equal(closed.trace.reward, 1, errorsOf(episode));
  assert.equal(closed.trace.stop_condition, "user_closed");
  assert.deepEqual(
    closed.trace.messages.map((m) => `${m.role}:${m.content}`),
    ["user:hello", "assistant:echo: hello", "user:again", "assistant:echo: again"],
  );
  assert.equal(model.requests.length, 2);
});

Deno.test("Interaction: promptless, the task's prompt is never sent and the first turn brings the user's message", async () => {
  await using model = await startModelServer({ responder: ECHO });
  const episode = await episodeOf(role(model), async (task, agents) => {
    await using chat = await agents.agent.interaction(task, { promptless: true });
    assert.equal((await chat.turn("only this")).lastReply, "echo: only this");
  });
  assert.equal(episode.ok, true, errorsOf(episode));
  assert.ok(
    !model.requests.some((r) => JSON.stringify(r.body.messages).includes("hello")),
    "the prompt was not sent",
  );
  assert.equal(episode.traces[0].reward, 1);
});

Deno.test("EpisodeAgent.interaction(): a harness that cannot resume is a ConfigError before any sandbox; a run that cannot open is an EnvError and its trace still joins", async () => {
  await using model = await startModelServer({ responder: ECHO });
  const oneShot: Harness = {
    id: "one-shot",
    executesCode: false,
    run: (_ctx: HarnessContext) => Promise.resolve(),
  };
  const refused = await episodeOf(role(model, { harness: oneShot }), async (task, agents) => {
    await assert.rejects(
      agents.agent.interaction(task),
      (e: Error) =>
        e instanceof ConfigError &&
        e.message ===
          'Harness "one-shot" cannot resume a conversation, so role "agent" cannot hold an interaction; use a harness that can (bash, null)',
    );
    await agents.agent.run(task); // so the episode ran an agent
  });
  assert.equal(refused.traces.length, 1);

  class BrokenSetup extends EchoTask {
    override setup(): Promise<void> {
      return Promise.reject(new Error("fixture missing"));
    }
  }
  const broken = await episodeOf(role(model), async (task, agents) => {
    const error = await agents.agent.interaction(task).catch((e) => e);
    assert.ok(error instanceof EnvError, `${error}`);
    assert.match(
      error.message,
      /^Role "agent" could not open its run of task "broken": \w+: .*fixture missing/,
    );
  }, new BrokenSetup({ id: "broken", prompt: "p" }));
  assert.equal(broken.traces.length, 1, "the failed run's trace joined the episode");
  assert.equal(broken.traces[0].error?.phase, "setup");
  assert.equal(model.requests.length, 0, "the broken run failed before any model call");
});

Deno.test("EpisodeAgent: a role that is not trainable (by its config or the Env's setup) writes traces marked so", async () => {
  await using model = await startModelServer({ responder: ECHO });
  const byConfig = await episodeOf(role(model, { trainable: false }), async (task, agents) => {
    assert.equal(agents.agent.trainable, false);
    await agents.agent.run(task);
  });
  assert.equal(byConfig.traces[0].trainable, false);
  const bySetup = await episodeOf(
    role(model),
    async (task, agents) => {
      await agents.agent.run(task);
    },
    TASK,
    (agents) => (agents.agent.trainable = false),
  );
  assert.equal(bySetup.traces[0].trainable, false);
  const trained = await episodeOf(role(model), async (task, agents) => {
    await agents.agent.run(task);
  });
  assert.equal(trained.traces[0].trainable, true);
});

Deno.test("EpisodeAgent.provision(): one started sandbox shared by several runs, which never stop it; it stops when disposed", async () => {
  await using model = await startModelServer({ responder: ECHO });
  class Tally extends Task {
    static override HARNESS = "null";
    override async setup({ runtime }: TaskHookContext) {
      const before = await readText(runtime, "runs.txt").catch(() => "");
      await runtime.write("runs.txt", `${before}run\n`);
    }
    runs = reward(async ({ runtime }) =>
      (await readText(runtime, "runs.txt")).trim().split("\n").length
    );
  }
  let box!: Awaited<ReturnType<Agents[string]["provision"]>>;
  const episode = await episodeOf(role(model, { harness: undefined }), async (task, agents) => {
    box = await agents.agent.provision(task);
    try {
      assert.equal(box.spec.type, "subprocess", "built from the role's runtime policy");
      await agents.agent.run(task, { box });
      await agents.agent.run(task, { box });
      assert.equal((await box.runtime.run(["cat", "runs.txt"])).stdout, "run\nrun\n");
    } finally {
      await box[Symbol.asyncDispose]();
    }
  }, new Tally({ id: "tally", prompt: "p" }));
  assert.deepEqual(episode.traces.map((t) => t.reward), [1, 2], errorsOf(episode));
  await assert.rejects(box.runtime.run(["true"]), /stopped/);
});
