/**
 * End-to-end tests of `vf init`: the real CLI scaffolds a package in a temp dir, the
 * package's own test passes under its own deno.json, and the package runs at once —
 * `vf validate` in real Docker containers (busybox) for a taskset, `vf eval` against a real
 * model server on loopback for an environment.
 * @module
 */
import assert from "node:assert/strict";
import { join } from "node:path";
import { type CliResult, runCli, runDeno, tempDir, transcript } from "./_cli.ts";
import { lastUserText, startModelServer, textReply } from "./model_server.ts";

/** `deno <args>` in `cwd`, with what reaching the npm registry needs. */
function deno(args: string[], cwd: string): Promise<CliResult> {
  return runDeno(args, { cwd });
}

function vf(args: string[], cwd: string): Promise<CliResult> {
  return runCli(args, { cwd });
}

/** The package's own gate: its test (with its deno.json's "vf" alias), format and lint. */
async function assertPackageChecks(pkg: string, tests: number): Promise<void> {
  const test = await deno(["test", "-A"], pkg);
  assert.equal(test.code, 0, transcript(test));
  assert.match(test.stdout, new RegExp(`ok \\| ${tests} passed \\| 0 failed`), transcript(test));
  const fmt = await deno(["fmt", "--check"], pkg);
  assert.equal(fmt.code, 0, transcript(fmt));
  const lint = await deno(["lint"], pkg);
  assert.equal(lint.code, 0, transcript(lint));
}

Deno.test("vf init scaffolds a taskset that passes its own test and vf validate in Docker", async () => {
  await using tmp = await tempDir("vf_cli_init_");
  const init = await vf(["init", "hello_task"], tmp.path);
  assert.equal(init.code, 0, transcript(init));
  assert.match(init.stdout, /Created taskset package "hello_task"/);
  assert.match(init.stdout, /vf validate \.\/hello_task/);

  await assertPackageChecks(join(tmp.path, "hello_task"), 2);

  const validate = await vf(["validate", "./hello_task"], tmp.path);
  assert.equal(validate.code, 0, transcript(validate));
  const summary = JSON.parse(validate.stdout.trim().split("\n").at(-1)!);
  assert.equal(summary.taskset, "hello-task");
  assert.equal(summary.runtime, "docker");
  assert.deepEqual([summary.tasks, summary.passed, summary.failed], [2, 2, 0]);
  for (const r of summary.results) {
    assert.deepEqual([r.gold_reward, r.empty_reward, r.ok], [1, 0, true], JSON.stringify(r));
  }
});

Deno.test("vf init --kind environment scaffolds an environment that passes its test and vf eval", async () => {
  await using tmp = await tempDir("vf_cli_init_");
  const init = await vf(["init", "tiny_qa", "--kind", "environment"], tmp.path);
  assert.equal(init.code, 0, transcript(init));
  assert.match(init.stdout, /Created environment package "tiny_qa"/);

  await assertPackageChecks(join(tmp.path, "tiny_qa"), 2);

  // Right about France and gold, wrong about the spider: 2 of 3 examples.
  const answers: Record<string, string> = { France: "Paris.", spider: "6", gold: "au" };
  await using model = await startModelServer({
    responder: (request) => {
      const question = lastUserText(request);
      const key = Object.keys(answers).find((k) => question.includes(k));
      return textReply(key ? answers[key] : "?");
    },
  });
  const run = await vf(["eval", "./tiny_qa", "-m", "m", "-b", model.url, "-q"], tmp.path);
  assert.equal(run.code, 0, transcript(run));
  assert.equal(model.requests.length, 6, "evalDefaults: 3 examples × 2 rollouts");
  const base = join(tmp.path, "outputs", "evals", "tiny-qa--m");
  const [runId] = [...Deno.readDirSync(base)].map((e) => e.name);
  const metadata = JSON.parse(await Deno.readTextFile(join(base, runId, "metadata.json")));
  assert.equal(metadata.num_rollouts, 6);
  assert.ok(Math.abs(metadata.avg_reward - 2 / 3) < 1e-9, String(metadata.avg_reward));
});

Deno.test("vf init refuses a folder that is not empty and changes nothing", async () => {
  await using tmp = await tempDir("vf_cli_init_");
  await Deno.mkdir(join(tmp.path, "taken"));
  await Deno.writeTextFile(join(tmp.path, "taken", "notes.txt"), "keep me");
  const res = await vf(["init", "taken"], tmp.path);
  assert.equal(res.code, 1, transcript(res));
  assert.match(res.stderr, /^error: Folder "taken" already exists and is not empty/m);
  assert.deepEqual([...Deno.readDirSync(join(tmp.path, "taken"))].map((e) => e.name), [
    "notes.txt",
  ]);
  assert.equal(await Deno.readTextFile(join(tmp.path, "taken", "notes.txt")), "keep me");

  const usage = await vf(["init"], tmp.path);
  assert.equal(usage.code, 1, transcript(usage));
  assert.match(usage.stderr, /vf init needs one package name/);
  const kind = await vf(["init", "x", "--kind", "agent"], tmp.path);
  assert.equal(kind.code, 1, transcript(kind));
  assert.match(kind.stderr, /--kind "agent" is not one of: taskset, environment/);
  assert.equal((await vf(["init", "--help"], tmp.path)).code, 0);
});
