import assert from "node:assert/strict";
import { coerceFlag, flagsToConfig, parseArgs } from "./args.ts";

const NUMBER_SHAPED_IDS = ["590143e8", "00123456", "1e5", "12345678", "0x1f"];
/** What a free-form key keeps as a string: no number is spelt this way. */
const NOT_NUMBERS = new Set(["590143e8", "00123456", "1e5", "0x1f"]);

Deno.test("flags and dotted overrides keep id-shaped values as strings unless the config declares a number (or, on a free-form key, the value is a number as written)", () => {
  for (const id of NUMBER_SHAPED_IDS) {
    const flags = parseArgs([
      "eval",
      "--run",
      id,
      "--model",
      id,
      "--env.taskset.expect_sha",
      id,
      "--env.agent.runtime.image",
      id,
      "--env.agent.scoring.env.TOKEN",
      id,
      "--client.api_key_var",
      id,
    ]);
    const config = flagsToConfig(flags as Record<string, unknown>);
    assert.equal(config.run, id, `--run ${id}`);
    assert.equal(config.model, id, `--model ${id}`);
    const env = config.env as {
      taskset: Record<string, unknown>;
      agent: { runtime: Record<string, unknown>; scoring: { env: Record<string, unknown> } };
    };
    // A free-form knob: a number only where the value is how that number is written.
    assert.equal(
      env.taskset.expect_sha,
      NOT_NUMBERS.has(id) ? id : Number(id),
      `--env.taskset.expect_sha ${id}`,
    );
    assert.equal(env.agent.runtime.image, id);
    assert.equal(env.agent.scoring.env.TOKEN, id);
    assert.equal((config.client as Record<string, unknown>).api_key_var, id);
  }
});

Deno.test("flags the config declares numeric become numbers, in any numeric spelling", () => {
  const flags = parseArgs([
    "--client.timeout",
    "1e2",
    "--env.agent.runtime.cpu",
    "2",
    "--env.agent.runtime.memory",
    "4",
    "--env.n",
    "3",
    "--limits.max_model_connections",
    "064",
    "-n",
    "5",
    "--seed",
    "7",
    "--max_concurrent",
    "12",
  ]);
  const config = flagsToConfig(flags as Record<string, unknown>);
  assert.equal((config.client as Record<string, unknown>).timeout, 100);
  const env = config.env as { n: number; agent: { runtime: Record<string, unknown> } };
  assert.equal(env.agent.runtime.cpu, 2);
  assert.equal(env.agent.runtime.memory, 4);
  assert.equal(env.n, 3);
  assert.equal((config.limits as Record<string, unknown>).max_model_connections, 64);
  assert.equal(config.num_examples, 5);
  assert.equal(config.shuffle_seed, 7);
  assert.equal(config.max_concurrent, 12);
});

Deno.test("coerceFlag() keeps memory sizes as strings and parses booleans and JSON where declared", () => {
  assert.equal(coerceFlag(["env", "agent", "runtime", "memory"], "512m"), "512m");
  assert.equal(coerceFlag(["env", "agent", "runtime", "network"], "true"), true);
  assert.equal(coerceFlag(["env", "agent", "runtime", "image"], "true"), "true");
  assert.deepEqual(coerceFlag(["sampling_args"], '{"temperature":0.5}'), { temperature: 0.5 });
  assert.deepEqual(coerceFlag(["env", "taskset", "words"], '["a","b"]'), ["a", "b"]);
  assert.equal(coerceFlag(["client", "timeout"], "soon"), "soon", "left for the schema to reject");
});

Deno.test("free-form overrides (a taskset's knobs, env_args) are typed as TOML would read them: numbers, booleans, JSON; ids and quoted values stay strings", () => {
  const flags = parseArgs([
    "--env.taskset.count=3",
    "--env.taskset.ratio",
    "0.5",
    "--env.taskset.offset=-2",
    "--env.taskset.shuffle",
    "false",
    "--env.taskset.words",
    '["a",1]',
    "--env.taskset.sha",
    "590143e8",
    "--env.taskset.pin",
    '"12345678"',
    "--env.taskset.name",
    "easy",
    "--env.taskset.task.rewards.bonus.weight",
    "0.25",
    "--env_args.n=5",
    "--env_args.split",
    "test",
    "--env_args.opts",
    '{"k": 2}',
  ]);
  const config = flagsToConfig(flags as Record<string, unknown>);
  const taskset = (config.env as { taskset: Record<string, unknown> }).taskset;
  assert.deepEqual(taskset, {
    count: 3,
    ratio: 0.5,
    offset: -2,
    shuffle: false,
    words: ["a", 1],
    sha: "590143e8",
    pin: "12345678",
    name: "easy",
    task: { rewards: { bonus: { weight: 0.25 } } },
  });
  assert.deepEqual(config.env_args, { n: 5, split: "test", opts: { k: 2 } });
  // --env-args as JSON gives the same table as the dotted flags.
  const json = flagsToConfig(
    parseArgs(["--env-args", '{"n": 5, "split": "test", "opts": {"k": 2}}']) as Record<
      string,
      unknown
    >,
  );
  assert.deepEqual(json.env_args, config.env_args);
});

Deno.test("coerceFlag(): where anything goes, a number is one only in its own spelling, and a double-quoted value is a string on any key", () => {
  const knob = (v: string) => coerceFlag(["env", "taskset", "x"], v);
  assert.equal(knob("5"), 5);
  assert.equal(knob("1.25"), 1.25);
  assert.equal(knob("12345678"), 12345678);
  for (const id of ["00123456", "1e5", "0x1f", "5.0", "+3", "Infinity", "12345678901234567890"]) {
    assert.equal(knob(id), id, `${id} stays a string`);
  }
  assert.equal(knob('"5"'), "5");
  assert.equal(knob('"true"'), "true");
  assert.equal(knob('"a \\"b\\""'), 'a "b"');
  assert.equal(knob('"unclosed'), '"unclosed');
  assert.equal(coerceFlag(["env", "agent", "runtime", "cpu"], '"2"'), "2", "left for the schema");
  assert.equal(coerceFlag(["model"], '"gpt-x"'), "gpt-x");
  // A flag no config declares (a command's own, such as --run) is not guessed a number.
  assert.equal(coerceFlag(["run"], "12345678"), "12345678");
});
