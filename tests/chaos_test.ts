/**
 * The chaos suite, reduced for CI: one round of every scenario in chaos/scenarios.ts with a
 * fixed seed (the full suite is `deno run -A chaos/run.ts --rounds N`). Each breaks a real
 * part mid-run — SIGKILL to `vf run` on Docker and on ssh, SIGKILL to a private dockerd and to
 * a test host's sshd, a model endpoint that fails, hangs and crawls, a results disk (tmpfs)
 * that fills — and then requires: `vf cleanup` leaves no sandbox, no rollout is scored below 1
 * for an infrastructure cause, `--resume` completes the run, and every results file parses.
 * Needs root (private dockerd, network namespace, tmpfs), as the rest of the suite does.
 * @module
 */
import assert from "node:assert/strict";
import { ChaosLab, SCENARIOS, type Tally } from "../chaos/scenarios.ts";

const root = await Deno.makeTempDir({ prefix: "vf_chaos_test_" });

/** Whether the machine's engine has its bridge interface (the chaos engine must not touch it). */
async function hasDocker0(): Promise<boolean> {
  const out = await new Deno.Command("ip", { args: ["link", "show", "docker0"], stderr: "null" })
    .output();
  return out.code === 0;
}
const docker0Before = await hasDocker0();
const lab = new ChaosLab(root);

function check(tally: Tally): void {
  const report = `${tally.scenario} (seed ${tally.seed}): ${tally.notes.join("; ")}\n` +
    tally.problems.map((p) => `  problem: ${p}`).join("\n");
  console.log(report);
  assert.equal(tally.leaked, 0, `leaked sandboxes\n${report}`);
  assert.equal(tally.fakeZeros, 0, `fake zeros\n${report}`);
  assert.deepEqual(tally.problems, [], report);
}

// Fixed seeds: the breaking points vary between scenarios but not between CI runs.
const SEEDS: Record<string, number> = {
  "sigkill-docker": 11,
  "sigkill-ssh": 12,
  "kill-dockerd": 13,
  "kill-sshd": 14,
  "model-fail-hang-slow": 15,
  "results-disk-full": 16,
};

for (const [name, scenario] of Object.entries(SCENARIOS)) {
  Deno.test(`chaos: ${name}: cleanup leaves nothing, no fake zeros, --resume completes, results parse`, async () => {
    check(await scenario(lab, SEEDS[name]));
  });
}

Deno.test("chaos: the private engine and the test host are removed, and the machine's engine keeps its bridge", async () => {
  await lab.close();
  await Deno.remove(root, { recursive: true });
  assert.equal(await hasDocker0(), docker0Before, "docker0 of the machine's engine");
});
