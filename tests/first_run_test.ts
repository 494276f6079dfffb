/**
 * What a new user sees the first time they run the README's demo command in a fresh clone:
 * the demo's own output, with no package-manager chatter (one "Download"/"Initialize" line per
 * npm package, an "Ignored build scripts" box), and the same command working offline after.
 * The copy reuses this machine's Deno cache, so no package is fetched from the registry;
 * filling the copy's `node_modules` is what printed the lines.
 * @module
 */
import assert from "node:assert/strict";
import { type CliResult, collect, transcript } from "./_cli.ts";
import { childEnv } from "./_child_env.ts";
import { freshCopy } from "./_checkout.ts";

/** Lines a package manager prints while it installs, as opposed to what vf prints. */
const CHATTER = /^(Download|Initialize|Warning)\b|Ignored build scripts|approve-scripts/m;

/** `deno task demo -n 2 -r 1` in `cwd`, with no network when `offline` (a new network namespace). */
function demo(cwd: string, offline: boolean): Promise<CliResult> {
  const task = [Deno.execPath(), "task", "demo", "-n", "2", "-r", "1"];
  const [command, ...args] = offline
    ? ["unshare", "-n", "sh", "-c", 'ip link set lo up && exec "$@"', "sh", ...task]
    : task;
  return collect(
    new Deno.Command(command, {
      args,
      cwd,
      env: childEnv({}, { registry: !offline }),
      clearEnv: true,
      stdin: "null",
      stdout: "piped",
      stderr: "piped",
    }),
  );
}

Deno.test("the README's demo command on a fresh clone prints no install chatter, then runs offline", async () => {
  await using clone = await freshCopy("vf_first_run_");
  const first = await demo(clone.path, false);
  assert.equal(first.code, 0, transcript(first));
  assert.match(first.stdout, /errors: 0 of 2 /, transcript(first));
  assert.doesNotMatch(first.stderr, CHATTER, transcript(first));
  assert.doesNotMatch(first.stdout, CHATTER, transcript(first));

  const offline = await demo(clone.path, true);
  assert.equal(offline.code, 0, transcript(offline));
  assert.match(offline.stdout, /errors: 0 of 2 /, transcript(offline));
  assert.doesNotMatch(offline.stderr, CHATTER, transcript(offline));
});
