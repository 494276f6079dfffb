/**
 * tests/run.sh, the README's test command: tests start without waiting for the type check,
 * and a type error still fails the run, counted in the final "N passed, N failed" line with
 * the checker's message.
 * @module
 */
import assert from "node:assert/strict";
import { join } from "node:path";
import { collect, tempDir, transcript } from "./_cli.ts";
import { childEnv } from "./_child_env.ts";
import { freshCopy, ROOT } from "./_checkout.ts";

Deno.test("tests/run.sh runs the tests of a file with a type error and counts the type error as a failure", async () => {
  await using tmp = await tempDir("vf_run_sh_");
  const good = join(tmp.path, "good_test.ts");
  const bad = join(tmp.path, "bad_test.ts");
  await Deno.writeTextFile(good, 'Deno.test("good", () => {});\n');
  // Wrong only to the type checker: it runs fine.
  await Deno.writeTextFile(
    bad,
    'const n: number = "forty-two";\nDeno.test("runs despite a type error", () => void n);\n',
  );
  const res = await collect(
    new Deno.Command("bash", {
      args: [join(ROOT, "tests/run.sh"), good, bad],
      cwd: tmp.path,
      env: childEnv({}, { registry: false, docker: true }),
      clearEnv: true,
      stdin: "null",
      stdout: "piped",
      stderr: "piped",
    }),
  );
  const out = transcript(res);
  assert.notEqual(res.code, 0, out);
  // Both tests ran; the type error is one more failure.
  assert.equal(res.stdout.trim().split("\n").at(-1), "2 passed, 1 failed", out);
  assert.match(res.stderr, /TS2322/, out);
  assert.match(res.stderr, /bad_test\.ts/, out);
  assert.match(res.stderr, /type check failed/, out);
});

Deno.test("tests/run.sh passes a clean run with its summary line", async () => {
  await using tmp = await tempDir("vf_run_sh_");
  const good = join(tmp.path, "good_test.ts");
  await Deno.writeTextFile(good, 'Deno.test("good", () => {});\n');
  const res = await collect(
    new Deno.Command("bash", {
      args: [join(ROOT, "tests/run.sh"), good],
      cwd: tmp.path,
      env: childEnv({}, { registry: false, docker: true }),
      clearEnv: true,
      stdin: "null",
      stdout: "piped",
      stderr: "piped",
    }),
  );
  assert.equal(res.code, 0, transcript(res));
  assert.equal(res.stdout.trim().split("\n").at(-1), "1 passed, 0 failed", transcript(res));
});

Deno.test("tests/run.sh counts a type error in cli.ts, which no test imports, as a failure", async () => {
  // A scratch checkout whose CLI entry point has a type error the tests never load.
  await using copy = await freshCopy("vf_run_sh_cli_");
  const cli = join(copy.path, "cli.ts");
  await Deno.writeTextFile(
    cli,
    (await Deno.readTextFile(cli)) + '\nconst broken: number = "forty-two";\nvoid broken;\n',
  );
  const good = join(copy.path, "good_test.ts");
  await Deno.writeTextFile(good, 'Deno.test("good", () => {});\n');
  const res = await collect(
    new Deno.Command("bash", {
      args: [join(copy.path, "tests/run.sh"), good],
      cwd: copy.path,
      env: childEnv({}, { registry: false, docker: true }),
      clearEnv: true,
      stdin: "null",
      stdout: "piped",
      stderr: "piped",
    }),
  );
  const out = transcript(res);
  assert.notEqual(res.code, 0, out);
  assert.equal(res.stdout.trim().split("\n").at(-1), "1 passed, 1 failed", out);
  assert.match(res.stderr, /TS2322/, out);
  assert.match(res.stderr, /cli\.ts/, out);
});
