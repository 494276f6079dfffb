import assert from "node:assert/strict";
import { coerceFlag, flagsToConfig, parseArgs } from "./args.ts";

const NUMBER_SHAPED_IDS = ["590143e8", "00123456", "1e5", "12345678", "0x1f"];

Deno.test("flags and dotted overrides keep id-shaped values as strings unless the config declares a number", () => {
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
    assert.equal(env.taskset.expect_sha, id, `--env.taskset.expect_sha ${id}`);
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
  assert.equal(coerceFlag(["env", "taskset", "count"], "5"), "5");
  assert.equal(coerceFlag(["client", "timeout"], "soon"), "soon", "left for the schema to reject");
});
