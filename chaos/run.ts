/**
 * The chaos suite, outside the normal test run (CI runs one round of each scenario, in
 * tests/chaos_test.ts):
 *
 *   deno run -A chaos/run.ts [--rounds 5] [--seed 1] [--only sigkill-docker,kill-sshd]
 *
 * Needs root (a private dockerd, an sshd host in a network namespace, tmpfs mounts), dockerd,
 * sshd and busybox:latest in the machine's engine (tests/setup.sh provides them). Prints one
 * line per scenario run and the totals: "leaked sandboxes per 10,000 rollouts" and "fake
 * zeros per 10,000 rollouts" (the goal is 0 and 0). Exits 1 when anything was found.
 * @module
 */
import { parseArgs } from "node:util";
import { ChaosLab, SCENARIOS, type Tally, totals } from "./scenarios.ts";

const { values } = parseArgs({
  options: {
    rounds: { type: "string", default: "3" },
    seed: { type: "string", default: String(Date.now() % 100_000) },
    only: { type: "string" },
    keep: { type: "boolean", default: false },
  },
});
const rounds = Number(values.rounds);
const seed0 = Number(values.seed);
const names = values.only ? values.only.split(",") : Object.keys(SCENARIOS);
for (const name of names) {
  if (!SCENARIOS[name]) {
    console.error(`unknown scenario "${name}"; known: ${Object.keys(SCENARIOS).join(", ")}`);
    Deno.exit(2);
  }
}

const root = await Deno.makeTempDir({ prefix: "vf_chaos_" });
const lab = new ChaosLab(root);
const tallies: Tally[] = [];
const started = Date.now();
try {
  for (let round = 0; round < rounds; round++) {
    for (const [i, name] of names.entries()) {
      const seed = seed0 + round * 100 + i;
      const t0 = Date.now();
      const tally = await SCENARIOS[name](lab, seed);
      tallies.push(tally);
      const secs = ((Date.now() - t0) / 1000).toFixed(0);
      console.log(
        `${name.padEnd(22)} seed ${
          String(seed).padEnd(7)
        } rollouts ${tally.rollouts}  leaked ${tally.leaked}  ` +
          `fake zeros ${tally.fakeZeros}  problems ${tally.problems.length}  (${secs} s) ${
            tally.notes.join("; ")
          }`,
      );
      for (const p of tally.problems) console.log(`    problem: ${p}`);
    }
  }
} finally {
  if (values.keep) console.log(`kept ${root} (the engine and the test host are removed)`);
  await lab.close();
  if (!values.keep) await Deno.remove(root, { recursive: true }).catch(() => {});
}
const t = totals(tallies);
console.log(
  `\n${tallies.length} scenario runs, ${t.rollouts} rollouts, ${
    ((Date.now() - started) / 60_000).toFixed(1)
  } min`,
);
console.log(`leaked sandboxes per 10,000 rollouts: ${t.leakedPer10k.toFixed(1)} (${t.leaked})`);
console.log(`fake zeros per 10,000 rollouts: ${t.fakeZerosPer10k.toFixed(1)} (${t.fakeZeros})`);
console.log(`other problems: ${t.problems}`);
Deno.exit(t.leaked || t.fakeZeros || t.problems ? 1 : 0);
