import assert from "node:assert/strict";
import { mkdtemp, rm, writeFile } from "node:fs/promises";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { deepMerge, readToml, resolveTemplate, setDotted, validateEvalConfig } from "./config.ts";
import { ConfigError } from "./errors.ts";

async function withTomlFile(text: string, fn: (path: string) => Promise<void>): Promise<void> {
  const dir = await mkdtemp(join(tmpdir(), "vf-config-test-"));
  try {
    const path = join(dir, "eval.toml");
    await writeFile(path, text);
    await fn(path);
  } finally {
    await rm(dir, { recursive: true, force: true });
  }
}

/** Assert that `fn` throws a ConfigError with exactly `message`. */
function throwsConfig(fn: () => unknown, message: string): void {
  assert.throws(fn, (e: unknown) => {
    assert.ok(e instanceof ConfigError, `expected a ConfigError, got ${e}`);
    assert.equal(e.message, message);
    return true;
  });
}

// ---- readToml ---------------------------------------------------------------------------

Deno.test("readToml() parses tables, arrays of tables and typed values", async () => {
  const text = [
    'env_id = "gsm8k"',
    "num_examples = 5",
    "temperature = 0.7",
    "save_results = true",
    'state_columns = ["a", "b"]',
    "[sampling_args]",
    "max_tokens = 256",
    "[[eval]]",
    'model = "m1"',
    "[[eval]]",
    'model = "m2"',
  ].join("\n");
  await withTomlFile(text, async (path) => {
    // smol-toml builds null-prototype tables; compare their content.
    assert.deepEqual(JSON.parse(JSON.stringify(await readToml(path))), {
      env_id: "gsm8k",
      num_examples: 5,
      temperature: 0.7,
      save_results: true,
      state_columns: ["a", "b"],
      sampling_args: { max_tokens: 256 },
      eval: [{ model: "m1" }, { model: "m2" }],
    });
  });
});

Deno.test("readToml() throws a ConfigError with the path and line for malformed TOML", async () => {
  await withTomlFile(
    'env_id = "gsm8k"\nmodel = "unterminated\nnum_examples = 3\n',
    async (path) => {
      await assert.rejects(
        () => readToml(path),
        (e: unknown) =>
          e instanceof ConfigError && e.message.startsWith(`${path}:2: invalid TOML: `) &&
          !e.message.includes("\n"),
      );
    },
  );
});

Deno.test("readToml() names the line of a redefined key", async () => {
  await withTomlFile("a = 1\nb = 2\na = 3\n", async (path) => {
    await assert.rejects(() => readToml(path), (e: unknown) => {
      assert.ok(e instanceof ConfigError);
      assert.match(e.message, new RegExp(`^${path.replace(/[.*+?^${}()|[\]\\]/g, "\\$&")}:3: `));
      return true;
    });
  });
});

Deno.test("readToml() throws a ConfigError naming a file that cannot be read", async () => {
  const path = join(tmpdir(), "vf-config-test-does-not-exist", "eval.toml");
  await assert.rejects(
    () => readToml(path),
    (e: unknown) =>
      e instanceof ConfigError && e.message.startsWith(`Cannot read config "${path}"`),
  );
});

// ---- validateEvalConfig -----------------------------------------------------------------

Deno.test("validateEvalConfig() accepts a full valid config and returns it", () => {
  const raw = {
    env_id: "gsm8k",
    env_args: { split: "test" },
    model: "gpt-4.1-mini",
    client: { base_url: "http://127.0.0.1:8000/v1", api_key_var: "KEY", headers: { "X-A": "1" } },
    num_examples: -1,
    rollouts_per_example: 3,
    max_concurrent: 32,
    sampling_args: { temperature: 0.2 },
    max_tokens: 512,
    temperature: 0,
    save_results: true,
    resume: "outputs/run",
    state_columns: ["judge_response"],
    extra_env_kwargs: { max_turns: 5 },
    headers: { "X-Session": "s" },
  };
  assert.deepEqual(validateEvalConfig(raw, "eval.toml"), raw);
  assert.deepEqual(validateEvalConfig({}, "eval.toml"), {});
});

Deno.test("validateEvalConfig() rejects an unknown top-level key, naming the source and key", () => {
  throwsConfig(
    () => validateEvalConfig({ modle: "x" }, "eval.toml"),
    'eval.toml: unknown key "modle"',
  );
});

Deno.test("validateEvalConfig() lists every unknown key of one table", () => {
  throwsConfig(
    () => validateEvalConfig({ env_id: "e", foo: 1, bar: 2 }, "eval.toml"),
    'eval.toml: unknown keys "foo", "bar"',
  );
});

Deno.test("validateEvalConfig() names the table path of an unknown nested key", () => {
  throwsConfig(
    () => validateEvalConfig({ client: { bse_url: "http://x" } }, "--client.bse_url"),
    '--client.bse_url: client: unknown key "bse_url"',
  );
});

Deno.test("validateEvalConfig() names the field path of a value with the wrong type", () => {
  const cases: Array<[Record<string, unknown>, RegExp]> = [
    [{ num_examples: "5" }, /^eval\.toml: num_examples: .*expected number/],
    [{ rollouts_per_example: 0 }, /^eval\.toml: rollouts_per_example: /],
    [{ rollouts_per_example: 1.5 }, /^eval\.toml: rollouts_per_example: .*expected int/],
    [{ save_results: "yes" }, /^eval\.toml: save_results: .*expected boolean/],
    [{ env_args: 3 }, /^eval\.toml: env_args: .*expected record/],
    [{ state_columns: ["a", 1] }, /^eval\.toml: state_columns\.1: .*expected string/],
    [{ client: { timeout: -1 } }, /^eval\.toml: client\.timeout: /],
    [{ headers: { "X-A": 1 } }, /^eval\.toml: headers\.X-A: .*expected string/],
    [{ temperature: -0.1 }, /^eval\.toml: temperature: /],
    [{ resume: 3 }, /^eval\.toml: resume: /],
  ];
  for (const [raw, pattern] of cases) {
    assert.throws(
      () => validateEvalConfig(raw, "eval.toml"),
      (e: unknown) => e instanceof ConfigError && pattern.test(e.message),
      JSON.stringify(raw),
    );
  }
});

Deno.test("validateEvalConfig() accepts resume as a boolean or a path", () => {
  assert.equal(validateEvalConfig({ resume: true }, "s").resume, true);
  assert.equal(validateEvalConfig({ resume: "dir" }, "s").resume, "dir");
});

Deno.test("validateEvalConfig() validates what readToml() returns, naming the file", async () => {
  await withTomlFile('env_id = "x"\n[client]\nbase_url = "u"\n', async (path) => {
    assert.deepEqual(
      JSON.parse(JSON.stringify(validateEvalConfig(await readToml(path), path))),
      { env_id: "x", client: { base_url: "u" } },
    );
  });
  await withTomlFile('env_id = "x"\n[client]\nbase_url = "u"\nnope = 2\n', async (path) => {
    const raw = await readToml(path);
    throwsConfig(() => validateEvalConfig(raw, path), `${path}: client: unknown key "nope"`);
  });
});

// ---- deepMerge --------------------------------------------------------------------------

Deno.test("deepMerge() merges nested tables and lets the override win on conflicts", () => {
  const base = { model: "a", client: { base_url: "u1", timeout: 10 }, env_args: { x: 1 } };
  const over = { model: "b", client: { timeout: 20 }, env_args: { y: 2 } };
  assert.deepEqual(deepMerge(base, over), {
    model: "b",
    client: { base_url: "u1", timeout: 20 },
    env_args: { x: 1, y: 2 },
  });
});

Deno.test("deepMerge() replaces arrays and scalars instead of merging them", () => {
  assert.deepEqual(deepMerge({ cols: ["a", "b"], n: 1 }, { cols: ["c"], n: null }), {
    cols: ["c"],
    n: null,
  });
  assert.deepEqual(deepMerge({ t: { a: 1 } }, { t: 5 }), { t: 5 });
  assert.deepEqual(deepMerge({ t: 5 }, { t: { a: 1 } }), { t: { a: 1 } });
});

Deno.test("deepMerge() leaves both inputs unchanged", () => {
  const base = { client: { timeout: 10 } };
  const over = { client: { base_url: "u" } };
  const merged = deepMerge(base, over);
  (merged.client as Record<string, unknown>).extra = true;
  assert.deepEqual(base, { client: { timeout: 10 } });
  assert.deepEqual(over, { client: { base_url: "u" } });
});

// ---- setDotted --------------------------------------------------------------------------

Deno.test("setDotted() sets a top-level key", () => {
  const target: Record<string, unknown> = { a: 1 };
  setDotted(target, "model", "m");
  assert.deepEqual(target, { a: 1, model: "m" });
});

Deno.test("setDotted() creates the tables along a dotted path", () => {
  const target: Record<string, unknown> = {};
  setDotted(target, "env.agent.scoring.mode", "isolated");
  assert.deepEqual(target, { env: { agent: { scoring: { mode: "isolated" } } } });
});

Deno.test("setDotted() keeps sibling keys of existing tables", () => {
  const target: Record<string, unknown> = { client: { base_url: "u", timeout: 5 } };
  setDotted(target, "client.timeout", 30);
  assert.deepEqual(target, { client: { base_url: "u", timeout: 30 } });
});

Deno.test("setDotted() replaces a non-table value that stands in the path", () => {
  const target: Record<string, unknown> = { client: "x", list: [1] };
  setDotted(target, "client.timeout", 30);
  setDotted(target, "list.first", 1);
  assert.deepEqual(target, { client: { timeout: 30 }, list: { first: 1 } });
});

// ---- resolveTemplate --------------------------------------------------------------------

const env = (vars: Record<string, string>) => (name: string) => vars[name];

Deno.test("resolveTemplate() replaces ${VAR} with the variable's value", () => {
  assert.equal(
    resolveTemplate("Bearer ${TOKEN} for ${USER_1}", env({ TOKEN: "abc", USER_1: "me" })),
    "Bearer abc for me",
  );
});

Deno.test("resolveTemplate() uses the default of ${VAR:-default} when the variable is unset or empty", () => {
  assert.equal(resolveTemplate("${HOST:-localhost}:8000", env({})), "localhost:8000");
  assert.equal(resolveTemplate("${HOST:-localhost}", env({ HOST: "" })), "localhost");
  assert.equal(resolveTemplate("${HOST:-}", env({})), "");
  assert.equal(resolveTemplate("${HOST:-localhost}", env({ HOST: "gpu1" })), "gpu1");
});

Deno.test("resolveTemplate() throws a ConfigError naming a missing variable without a default", () => {
  throwsConfig(
    () => resolveTemplate("key=${API_KEY}", env({})),
    'Environment variable "API_KEY" is not set and has no default',
  );
});

Deno.test("resolveTemplate() leaves text without templates (and bare $VAR) alone", () => {
  assert.equal(resolveTemplate("plain $HOME text {x}", env({})), "plain $HOME text {x}");
});

Deno.test("resolveTemplate() does not resolve templates inside substituted values", () => {
  assert.equal(resolveTemplate("${A}", env({ A: "${B}", B: "no" })), "${B}");
});

Deno.test("validateEvalConfig() checks the [limits] table and warm_pool in [env.agent.runtime]", () => {
  const limits = {
    max_sandboxes: 32,
    sandbox_create_rate: 8,
    max_model_connections: 64,
    runtime: { ssh: { max_sandboxes: 4 } },
  };
  assert.deepEqual(validateEvalConfig({ limits }, "eval.toml").limits, limits);
  const cases: Array<[Record<string, unknown>, RegExp]> = [
    [{ limits: { max_sandbox: 2 } }, /^eval\.toml: limits: unknown key "max_sandbox"/],
    [{ limits: { max_sandboxes: 0 } }, /^eval\.toml: limits\.max_sandboxes: /],
    [{ limits: { sandbox_create_rate: -1 } }, /^eval\.toml: limits\.sandbox_create_rate: /],
    [{ limits: { runtime: { ssh: { rate: 1 } } } }, /^eval\.toml: limits\.runtime\.ssh: unknown/],
  ];
  for (const [raw, pattern] of cases) {
    assert.throws(
      () => validateEvalConfig(raw, "eval.toml"),
      (e: unknown) => e instanceof ConfigError && pattern.test(e.message),
      JSON.stringify(raw),
    );
  }
});
