/**
 * Tests of building an Env from `[env]` beside their code: which Env an id names (built-ins,
 * local modules, URLs only with trust), how roles are resolved over an Env's defaults (model,
 * endpoint, sampling, harness, runtime policy, limits), what is left as the Env's options, and
 * the `file: env.<path>: message` errors bad input gets.
 * @module
 */
import assert from "node:assert/strict";
import { join } from "node:path";
import { z } from "npm:zod@^4.6.0";
import {
  BestOfNEnv,
  buildEnv,
  type ChatClient,
  ConfigError,
  Env,
  ENVS,
  OpenAIChatClient,
  resolveEnvClass,
  SingleAgentEnv,
} from "../../mod.ts";
import type { Task } from "../tasks/task.ts";
import { cliEnvSchema, envClassOf, isEnvClass, parseEnvConfig, roleClient } from "./load.ts";

const TASKSET = { id: "sums" };

function runClient(): OpenAIChatClient {
  return new OpenAIChatClient({ base_url: "http://127.0.0.1:9/v1", api_key_var: "VF_NO_KEY" });
}

/** buildEnv() with the run's defaults; role clients are made with {@link roleClient}. */
function build(raw: Record<string, unknown>, extra: Partial<Parameters<typeof buildEnv>[0]> = {}) {
  return buildEnv({
    raw: { taskset: TASKSET, ...raw },
    source: "run.toml",
    client: runClient(),
    model: "run-model",
    samplingArgs: { temperature: 0.5, max_tokens: 100 },
    makeClient: roleClient,
    ...extra,
  });
}

async function configError(promise: Promise<unknown>): Promise<string> {
  const error = await promise.then(() => null, (e) => e);
  assert.ok(error instanceof ConfigError, `expected a ConfigError, got ${error}`);
  return error.message;
}

class Pair extends Env {
  static override roles = { left: { model: "left-default", max_turns: 3 }, right: {} };
  static override options = { rounds: z.number().int().default(2) };
  async run(_task: Task): Promise<void> {}
}

Deno.test("buildEnv(): no env.id is the single agent with the run's client, model and sampling; a built-in id picks that Env and its options get their defaults", async () => {
  const client = runClient();
  const single = await build({}, { client });
  assert.ok(single instanceof SingleAgentEnv);
  assert.equal(single.id, "single-agent");
  const agent = single.roles.agent;
  assert.equal(agent.name, "agent");
  assert.equal(agent.client, client);
  assert.equal(agent.model, "run-model");
  assert.deepEqual(agent.samplingArgs, { temperature: 0.5, max_tokens: 100 });
  assert.deepEqual(agent.policy.runtime, {});
  assert.equal(agent.policy.tokenLimits, undefined);

  const best = await build({ id: "best-of-n" });
  assert.ok(best instanceof BestOfNEnv);
  assert.deepEqual(best.options, { n: 4, threshold: 1 });
  assert.equal((await build({ id: "best-of-n", n: 2 })).options.n, 2);
});

Deno.test("buildEnv(): a role's table is deep-merged over the Env's defaults; its own endpoint gets its own client; sampling merges over the run's; limits and timeouts reach its policy", async () => {
  const dir = await Deno.makeTempDir({ prefix: "vf_agents_load_" });
  try {
    const module = join(dir, "pair.ts");
    await Deno.writeTextFile(
      module,
      `import { Env } from ${JSON.stringify(new URL("../../mod.ts", import.meta.url).href)};
import { z } from "npm:zod@^4.6.0";
export default class Pair extends Env {
  static roles = { left: { model: "left-default", max_turns: 3 }, right: {} };
  static options = { rounds: z.number().int().default(2) };
  async run() {}
}
`,
    );
    const run = runClient();
    const pair = await build({
      id: module,
      rounds: 5,
      timeout: { episode: 60 },
      max_concurrent_agents: 2,
      fork_group: true,
      left: {
        sampling: { temperature: 0 },
        max_output_tokens: 50,
        harness: { id: "null", max_turns: 7, tool_timeout: 9 },
        timeout: { agent: 30 },
        runtime: { type: "subprocess" },
      },
      right: {
        model: "judge-model",
        client: { base_url: "http://127.0.0.1:8/v1", api_key_var: "VF_RIGHT_KEY" },
      },
    }, { client: run, baseDir: dir });
    assert.equal(pair.id, module);
    assert.equal(pair.baseDir, dir);
    assert.deepEqual(pair.options, {
      rounds: 5,
      timeout: { episode: 60 },
      max_concurrent_agents: 2,
    });
    const { left, right } = pair.roles;
    assert.equal(left.model, "left-default", "the Env's default model for the role");
    assert.equal(left.client, run);
    assert.deepEqual(left.samplingArgs, { temperature: 0, max_tokens: 100 });
    assert.deepEqual(left.harness, { id: "null", max_turns: 7, tool_timeout: 9 });
    assert.equal(left.policy.maxTurns, 7, "the harness's max_turns beats the role's");
    assert.equal(left.policy.toolTimeoutSeconds, 9);
    assert.deepEqual(left.policy.tokenLimits, {
      max_input_tokens: undefined,
      max_output_tokens: 50,
      max_total_tokens: undefined,
    });
    assert.deepEqual(left.policy.timeouts, { agent: 30 });
    assert.deepEqual(left.policy.runtime, { type: "subprocess" });
    assert.equal(right.model, "judge-model");
    assert.notEqual(right.client, run);
    assert.ok(right.client instanceof OpenAIChatClient);
  } finally {
    await Deno.remove(dir, { recursive: true });
  }
});

Deno.test("buildEnv(): a taskset's own Env is used when env.id is not given, as taskset:<class>", async () => {
  const env = await build({ left: { model: "l" } }, { tasksetEnv: Pair });
  assert.ok(env instanceof Pair);
  assert.equal(env.id, "taskset:Pair");
  assert.deepEqual(env.options, { rounds: 2 });
  assert.equal(env.roles.left.policy.maxTurns, 3, "the Env's default max_turns for the role");
  assert.equal(env.roles.right.model, "run-model");
  // An explicit id beats the taskset's Env.
  assert.ok((await build({ id: "single-agent" }, { tasksetEnv: Pair })) instanceof SingleAgentEnv);
});

Deno.test("buildEnv(): bad [env] input names the file and the field", async () => {
  const cases: Array<[Record<string, unknown>, string | RegExp]> = [
    [
      { harness: { id: "null" } },
      "run.toml: env.harness: a harness belongs to a role; use --env.agent.harness.* ([env.agent.harness] in TOML, or the role's name for other Envs)",
    ],
    [{ agent: { modle: "x" } }, /^run\.toml: env\.agent: unknown key "modle"/],
    [{ id: "best-of-n", n: 0 }, /^run\.toml: env\.n: /],
    [
      { id: "best-of-n", extra: 1 },
      /^run\.toml: env: unknown key "extra"; "best-of-n" takes "id", "taskset", .*"agent", "n", "threshold"$/,
    ],
    [
      { agent: { client: { api_key_var: "K" } } },
      'run.toml: env.agent.client.base_url: role "agent" sets a client but no base_url; give the endpoint or drop env.agent.client',
    ],
    [
      { agent: { client: { base_url: "http://x/v1" } } },
      'run.toml: env.agent.model: role "agent" has its own endpoint (env.agent.client.base_url) but no model; set env.agent.model',
    ],
    [
      { agent: { harness: { id: "nope" } } },
      /^run\.toml: env\.agent\.harness\.id: unknown harness "nope"; known: "bash", /,
    ],
    [
      { id: "no-such-env" },
      /^run\.toml: env\.id: unknown Env "no-such-env"; built-ins: "single-agent", "best-of-n"/,
    ],
    [
      { id: "https://example.com/env.ts" },
      /^run\.toml: env\.id: "https:\/\/example\.com\/env\.ts" is an Env from a URL; .* so it runs only with --trust/,
    ],
    [
      { id: "./vf-missing-env.ts" },
      'run.toml: env.id: Env module "./vf-missing-env.ts" does not exist',
    ],
  ];
  for (const [raw, expected] of cases) {
    const message = await configError(build(raw));
    if (typeof expected === "string") assert.equal(message, expected);
    else assert.match(message, expected);
  }
});

Deno.test("buildEnv(): an Env whose role shadows an [env] field is a programming error (TypeError); a missing declared role at construction is too", async () => {
  class Shadow extends Env {
    static override roles = { timeout: {} };
    async run(): Promise<void> {}
  }
  await assert.rejects(
    build({}, { tasksetEnv: Shadow }),
    (e: Error) =>
      e instanceof TypeError &&
      e.message === 'Env "taskset:Shadow": role "timeout" shadows an [env] field of the same name',
  );
  assert.throws(
    () => new Pair({ id: "pair", roles: {} }),
    (e: Error) => e instanceof TypeError && e.message === 'Env "pair" needs roles "left", "right"',
  );
});

Deno.test("resolveEnvClass(): built-ins by id; a module's default Env, or its one exported Env; a module with several, none, or that fails to load is a ConfigError", async () => {
  for (const [id, cls] of Object.entries(ENVS)) assert.equal(await resolveEnvClass(id), cls);
  const dir = await Deno.makeTempDir({ prefix: "vf_agents_resolve_" });
  const mod = JSON.stringify(new URL("../../mod.ts", import.meta.url).href);
  const files: Record<string, string> = {
    "one.ts": `import { Env } from ${mod};\nexport class Only extends Env { async run() {} }\n`,
    "two.ts":
      `import { Env } from ${mod};\nexport class A extends Env { async run() {} }\nexport class B extends Env { async run() {} }\n`,
    "two_default.ts":
      `import { Env } from ${mod};\nexport class A extends Env { async run() {} }\nexport default class B extends Env { async run() {} }\n`,
    "none.ts": "export const x = 1;\n",
    "broken.ts": "export const = ;\n",
  };
  try {
    for (const [name, text] of Object.entries(files)) {
      await Deno.writeTextFile(join(dir, name), text);
    }
    assert.equal((await resolveEnvClass(join(dir, "one.ts"))).name, "Only");
    assert.equal((await resolveEnvClass(join(dir, "two_default.ts"))).name, "B");
    assert.equal(
      await configError(resolveEnvClass(join(dir, "two.ts"))),
      `Env module "${
        join(dir, "two.ts")
      }" exports several Envs (A, B); export the one to run as default`,
    );
    assert.equal(
      await configError(resolveEnvClass(join(dir, "none.ts"))),
      `env.id: Env module "${join(dir, "none.ts")}" exports no Env class`,
    );
    assert.match(
      await configError(resolveEnvClass(join(dir, "broken.ts"))),
      new RegExp(`^env\\.id: Env module ".*broken\\.ts" failed to load: `),
    );
  } finally {
    await Deno.remove(dir, { recursive: true });
  }
});

Deno.test("isEnvClass() and envClassOf(): an Env is recognised by shape too (an Env imported through another URL counts); other exports are ignored", () => {
  assert.ok(isEnvClass(Pair));
  assert.ok(isEnvClass(SingleAgentEnv));
  // The shape of an Env from another copy of vf: roles, run, complete.
  class Foreign {
    static roles = { agent: {} };
    run() {}
    complete() {
      return true;
    }
  }
  assert.ok(isEnvClass(Foreign));
  assert.ok(
    !isEnvClass(
      class NoRoles {
        run() {}
        complete() {}
      },
    ),
  );
  assert.ok(!isEnvClass({ roles: {} }));
  assert.ok(!isEnvClass(() => {}));
  assert.equal(envClassOf({ helper: () => 1, Pair }, "m"), Pair);
  assert.equal(envClassOf({ helper: 1 }, "m"), null);
});

Deno.test("roleClient(): a role's endpoint reads its key from api_key_var (default OPENAI_API_KEY); cliEnvSchema() types every built-in's roles and options", () => {
  const plain = roleClient({ base_url: "http://127.0.0.1:8/v1", timeout: 5 });
  assert.equal(plain.config?.api_key_var, "OPENAI_API_KEY");
  assert.equal(plain.config?.timeout, 5);
  const own: ChatClient = roleClient({
    base_url: "http://127.0.0.1:8/v1",
    api_key_var: "JUDGE_KEY",
    max_retries: 1,
    headers: { "x-team": "evals" },
  });
  assert.ok(own instanceof OpenAIChatClient);
  assert.equal(own.baseUrl, "http://127.0.0.1:8/v1");
  assert.equal(own.config?.api_key_var, "JUDGE_KEY");
  assert.equal(own.config?.max_retries, 1);
  assert.deepEqual(own.config?.extra_headers, { "x-team": "evals" });
  const schema = cliEnvSchema();
  const parsed = schema.safeParse({
    taskset: TASKSET,
    n: 3,
    judge: { model: "j" },
    user: { model: "u" },
    assistant: { model: "a" },
  });
  assert.ok(parsed.success, JSON.stringify(parsed.error?.issues));
  const bad = schema.safeParse({ taskset: TASKSET, n: "three" });
  assert.ok(!bad.success);
  assert.deepEqual(bad.error.issues[0].path, ["n"]);
});

Deno.test("buildEnv(): [env.agent.runtime] warm_pool reaches the role's policy typed; a bad one is named by its path", async () => {
  const env = await build({ agent: { runtime: { warm_pool: 4 } } });
  assert.equal((env.roles.agent.policy.runtime as { warm_pool?: number }).warm_pool, 4);
  const message = await configError(build({ agent: { runtime: { warm_pool: -1 } } }));
  assert.match(message, /^run\.toml: env\.agent\.runtime\.warm_pool: /);
});

Deno.test("parseEnvConfig(): [env] is checked once against the Env it names, into typed run fields, roles merged over the Env's defaults and the Env's options; buildEnv() builds from it as it would from the table", async () => {
  const raw = {
    taskset: { ...TASKSET, task: { level: 2 } },
    fork_group: true,
    services: { compose: "compose.yaml" },
    left: { model: "mine", runtime: { type: "subprocess", warm_pool: 2 } },
    rounds: 3,
  };
  const config = await parseEnvConfig(raw, { source: "run.toml", tasksetEnv: Pair });
  assert.equal(config.id, "taskset:Pair");
  assert.equal(config.cls, Pair);
  assert.deepEqual(config.base.taskset, { id: "sums", task: { level: 2 } });
  assert.equal(config.base.fork_group, true);
  assert.equal(config.base.services?.compose, "compose.yaml");
  assert.deepEqual(config.roles.left, {
    model: "mine",
    max_turns: 3,
    runtime: { type: "subprocess", warm_pool: 2 },
  });
  assert.deepEqual(config.roles.right, {});
  assert.deepEqual(config.options, { rounds: 3 });
  const env = await build({}, { config, raw: undefined });
  assert.ok(env instanceof Pair);
  assert.equal(env.roles.left.model, "mine");
  assert.deepEqual(env.options, { rounds: 3 });
  const message = await configError(
    parseEnvConfig({ taskset: TASKSET, left: { modle: "x" } }, {
      source: "run.toml",
      tasksetEnv: Pair,
    }),
  );
  assert.equal(message, `run.toml: env.left: unknown key "modle"`);
});

class BadDefaults extends Env {
  static override roles = { agent: { harness: { idd: "bash" } } };
  async run(_task: Task): Promise<void> {}
}

Deno.test("parseEnvConfig(): an Env whose role defaults are not a role table is a programming error (TypeError)", async () => {
  await assert.rejects(
    parseEnvConfig({ taskset: TASKSET }, { source: "run.toml", tasksetEnv: BadDefaults }),
    (e) => e instanceof TypeError && /role "agent"'s defaults are not a role table/.test(e.message),
  );
});
