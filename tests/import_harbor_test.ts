/**
 * `vf import --format harbor <job-dir>` reads a folder someone else wrote: it must not be led
 * out of it by a link, read a file without bound, crash on a field of the wrong type, write a
 * half run, print a field's escape sequences, or put the run anywhere but under the outputs.
 * @module
 */
import assert from "node:assert/strict";
import { existsSync } from "node:fs";
import { join } from "node:path";
import { cmdImport } from "../lib/cli/exchange.ts";
import { ConfigError } from "../lib/errors.ts";
import { MAX_RESULT_BYTES, MAX_TRAJECTORY_BYTES } from "../lib/harbor/import.ts";
import { runCli, tempDir, transcript } from "./_cli.ts";

// deno-lint-ignore no-explicit-any
type Json = any;

const RESULT = {
  id: "trial-1",
  task_name: "hello",
  agent_info: { name: "terminus", model_info: { name: "m" } },
  agent_result: { n_input_tokens: 10, n_output_tokens: 5 },
  verifier_result: { rewards: { reward: 1 } },
};

const TRAJECTORY = {
  schema_version: "ATIF-v1.7",
  session_id: "s",
  agent: { name: "terminus", version: "1", model_name: "m" },
  steps: [
    { step_id: 1, source: "user", message: "hi" },
    { step_id: 2, source: "agent", message: "done" },
  ],
};

async function write(root: string, files: Record<string, unknown>): Promise<void> {
  for (const [path, value] of Object.entries(files)) {
    const full = join(root, path);
    await Deno.mkdir(join(full, ".."), { recursive: true });
    await Deno.writeTextFile(full, typeof value === "string" ? value : JSON.stringify(value));
  }
}

/** Imports `job` into `out` in this process: the message of the ConfigError, or null. */
async function importError(job: string, out: string): Promise<string | null> {
  try {
    assert.equal(await cmdImport(["--format", "harbor", job, "-o", out]), 0);
    return null;
  } catch (error) {
    assert.ok(error instanceof ConfigError, `not a ConfigError: ${(error as Error).stack}`);
    return error.message;
  }
}

/** The import of `job` fails with a message matching `want`, and nothing is written. */
async function refused(job: string, out: string, want: RegExp): Promise<void> {
  const message = await importError(job, out);
  assert.ok(message !== null, `${job} was imported`);
  assert.match(message, want);
  assert.doesNotMatch(message, /secret/);
  assert.equal(existsSync(join(out, "evals")), false, `${message}: something was written`);
}

Deno.test("vf import reads nothing a link leads to outside the job folder: a result.json, an agent folder or a trajectory linked out is an error naming it, a linked trial folder is passed over", async () => {
  await using tmp = await tempDir("vf_import_links_");
  const outside = join(tmp.path, "elsewhere");
  await write(outside, {
    "result.json": { ...RESULT, task_name: "secret-task" },
    "agent/trajectory.json": { ...TRAJECTORY, agent: { name: "a", model_name: "secret-model" } },
    "trial/result.json": { ...RESULT, task_name: "secret-trial" },
  });
  const job = (name: string) => join(tmp.path, name);
  const out = join(tmp.path, "outputs");

  await write(job("a"), { "ok__1/result.json": RESULT });
  await Deno.symlink(join(outside, "result.json"), join(job("a"), "ok__1", "x"));
  await Deno.mkdir(join(job("a"), "linked__2"));
  await Deno.symlink(join(outside, "result.json"), join(job("a"), "linked__2", "result.json"));
  await refused(
    job("a"),
    out,
    new RegExp(`linked__2/result\\.json: leads outside the job folder`),
  );

  await write(job("b"), { "t__1/result.json": RESULT });
  await Deno.symlink(join(outside, "agent"), join(job("b"), "t__1", "agent"));
  await refused(job("b"), out, /t__1\/agent\/trajectory\.json: leads outside the job folder/);

  await write(job("c"), { "t__1/result.json": RESULT });
  await Deno.mkdir(join(job("c"), "t__1", "agent"));
  await Deno.symlink(
    join(outside, "agent", "trajectory.json"),
    join(job("c"), "t__1", "agent", "trajectory.json"),
  );
  await refused(job("c"), out, /t__1\/agent\/trajectory\.json: leads outside the job folder/);

  // A trial folder that is a link (out, or back in) is no trial of this job.
  await write(job("d"), { "t__1/result.json": RESULT, "t__1/agent/trajectory.json": TRAJECTORY });
  await Deno.symlink(join(outside, "trial"), join(job("d"), "away__2"));
  await Deno.symlink(join(job("d"), "t__1"), join(job("d"), "again__3"));
  assert.equal(await importError(job("d"), out), null);
  const [runDir] = [...Deno.readDirSync(join(out, "evals", "harbor-import--m"))];
  const lines = (await Deno.readTextFile(
    join(out, "evals", "harbor-import--m", runDir.name, "traces.jsonl"),
  )).trim().split("\n");
  assert.equal(lines.length, 1);
  assert.doesNotMatch(lines[0], /secret/);
  assert.equal(JSON.parse(lines[0]).info.harbor_trial, "t__1");
});

Deno.test("vf import refuses a result.json or trajectory over its limit, a FIFO, and JSON that is not Harbor's shape, naming the file and field, and writes nothing", async () => {
  await using tmp = await tempDir("vf_import_bad_");
  const out = join(tmp.path, "outputs");
  let n = 0;
  const job = async (files: Record<string, unknown>) => {
    const dir = join(tmp.path, `job${n++}`);
    await write(dir, files);
    return dir;
  };

  // Sparse files: as large as they say, none of it on disk.
  const big = await job({ "t__1/result.json": "{}" });
  await Deno.truncate(join(big, "t__1", "result.json"), MAX_RESULT_BYTES + 1);
  await refused(big, out, /t__1\/result\.json: is over vf import's limit of 16 MiB$/);
  const long = await job({ "t__1/result.json": RESULT, "t__1/agent/trajectory.json": "{}" });
  await Deno.truncate(join(long, "t__1", "agent", "trajectory.json"), MAX_TRAJECTORY_BYTES + 1);
  await refused(long, out, /trajectory\.json: is over vf import's limit of 256 MiB$/);

  // A FIFO would block a plain read until something wrote to it.
  const fifo = await job({ "t__1/.keep": "" });
  const made = await new Deno.Command("mkfifo", { args: [join(fifo, "t__1", "result.json")] })
    .output();
  assert.equal(made.code, 0, new TextDecoder().decode(made.stderr));
  await refused(fifo, out, /t__1\/result\.json: is not a regular file$/);

  const cases: Array<[Record<string, unknown>, RegExp]> = [
    [{ "t__1/result.json": "null" }, /t__1\/result\.json: \(the document\): must be an object/],
    [{ "t__1/result.json": "[1]" }, /result\.json: \(the document\): must be an object, not \[1\]/],
    [{ "t__1/result.json": "{broken" }, /t__1\/result\.json: not JSON: /],
    [
      { "t__1/result.json": { ...RESULT, task_name: 7 } },
      /result\.json: task_name: must be a string, not 7$/,
    ],
    [
      { "t__1/result.json": { ...RESULT, agent_info: "x" } },
      /result\.json: agent_info: must be an object, not "x"$/,
    ],
    [
      { "t__1/result.json": { ...RESULT, agent_result: { n_input_tokens: "lots" } } },
      /result\.json: agent_result\.n_input_tokens: must be a whole number from 0, not "lots"$/,
    ],
    [
      { "t__1/result.json": { ...RESULT, verifier_result: { rewards: [1] } } },
      /result\.json: verifier_result\.rewards: must be an object, not \[1\]$/,
    ],
    [
      { "t__1/result.json": { ...RESULT, exception_info: { exception_type: {} } } },
      /result\.json: exception_info\.exception_type: must be a string, not \{\}$/,
    ],
    [
      { "t__1/result.json": RESULT, "t__1/agent/trajectory.json": "{nope" },
      /t__1\/agent\/trajectory\.json: not JSON: /,
    ],
    [
      {
        "t__1/result.json": RESULT,
        "t__1/agent/trajectory.json": {
          ...TRAJECTORY,
          steps: [{ step_id: 1, source: "agent", message: "x", tool_calls: "ls" }],
        },
      },
      /trajectory\.json: steps\[0\]\.tool_calls: must be a list, not "ls"$/,
    ],
    [
      {
        "t__1/result.json": RESULT,
        "t__1/agent/trajectory.json": {
          ...TRAJECTORY,
          steps: [{ step_id: 1, source: "agent", message: "", tool_calls: [{ arguments: {} }] }],
        },
      },
      /trajectory\.json: steps\[0\]\.tool_calls\[0\]\.function_name: must be a string, not undefined$/,
    ],
    [
      {
        "t__1/result.json": RESULT,
        "t__1/agent/trajectory.json": {
          ...TRAJECTORY,
          steps: [{ step_id: 1, source: "agent", message: "x", observation: { results: {} } }],
        },
      },
      /trajectory\.json: steps\[0\]\.observation\.results: must be a list, not \{\}$/,
    ],
    [
      {
        "t__1/result.json": RESULT,
        "t__1/agent/trajectory.json": { ...TRAJECTORY, agent: { model_name: 3 } },
      },
      /trajectory\.json: agent\.model_name: must be a string, not 3$/,
    ],
  ];
  for (const [files, want] of cases) {
    // A good trial first: the bad one after it must still leave nothing written.
    await refused(await job({ "a__0/result.json": RESULT, ...files }), out, want);
  }
});

Deno.test("vf import keeps names from the job inside the outputs folder and prints none of their escape sequences; a bad field is a one-line error and exit 1", async () => {
  await using tmp = await tempDir("vf_import_names_");
  const job = join(tmp.path, "job");
  const out = join(tmp.path, "outputs");
  const hostile = "../../../escaped\x1b]0;pwned\x07\x1b[2J\n" + "x".repeat(400);
  await write(job, {
    "t__1/result.json": {
      ...RESULT,
      id: "../../../escaped-id",
      task_name: "../../escaped-task",
      agent_info: { name: "a", model_info: { name: hostile } },
    },
  });
  const res = await runCli(["import", "--format", "harbor", job, "-o", out], {
    cwd: tmp.path,
    registry: false,
  });
  assert.equal(res.code, 0, transcript(res));
  for (const c of ["\x1b", "\x07"]) assert.ok(!(res.stdout + res.stderr).includes(c));
  assert.equal([...Deno.readDirSync(tmp.path)].map((e) => e.name).sort().join(), "job,outputs");
  const [model] = [...Deno.readDirSync(join(out, "evals"))];
  assert.match(model.name, /^harbor-import--[A-Za-z0-9_.-]+$/);
  assert.ok(model.name.length <= 120, model.name);
  const [run] = [...Deno.readDirSync(join(out, "evals", model.name))];
  const dir = join(out, "evals", model.name, run.name);
  assert.deepEqual([...Deno.readDirSync(dir)].map((e) => e.name).sort(), [
    "metadata.json",
    "traces.jsonl",
  ]);
  // The names stay what the job said, as data.
  const trace: Json = JSON.parse(await Deno.readTextFile(join(dir, "traces.jsonl")));
  assert.equal(trace.task.key, "../../escaped-task");
  assert.equal(trace.trace_id, "../../../escaped-id");
  assert.equal(trace.model, hostile);

  await write(job, {
    "t__2/result.json": { ...RESULT, agent_result: { n_output_tokens: "\x1b]0;pwned\x07" } },
  });
  const bad = await runCli(["import", "--format", "harbor", job, "-o", join(tmp.path, "o2")], {
    cwd: tmp.path,
    registry: false,
  });
  assert.equal(bad.code, 1, transcript(bad));
  assert.match(bad.stderr, /t__2\/result\.json: agent_result\.n_output_tokens: must be a whole/);
  for (const c of ["\x1b", "\x07"]) assert.ok(!bad.stderr.includes(c), bad.stderr);
  assert.equal(bad.stderr.trim().split("\n").length, 1, bad.stderr);
  assert.equal(existsSync(join(tmp.path, "o2")), false);
});
