/**
 * `vf compare <runA> <runB>`: paired per-example statistics of two runs, and an exit code for
 * CI (`--fail-if-worse D`).
 * @module
 */
import process from "node:process";
import { existsSync } from "node:fs";
import { join } from "node:path";
import { ConfigError } from "../errors.ts";
import { isUnscoredOutput } from "../eval/results.ts";
import { eachSavedOutput } from "../eval/saved.ts";
import { pairedComparison, type RewardsByExample } from "../eval/compare.ts";
import { loadEpisodes, scoredTraces } from "../agents/run.ts";
import { isUnscored } from "../tasks/summary.ts";
import { parseArgs } from "./args.ts";
import { terminalLines, terminalText } from "../util/terminal.ts";

const COMPARE_HELP = `vf compare <runA> <runB> [--fail-if-worse D] [--top N]

Compare run B against run A, paired by example (results.jsonl of vf eval, or traces.jsonl of
vf run): each example's mean reward in both, the mean difference B - A with a 95% bootstrap
interval over examples, how many examples got better or worse, and the largest drops. Rollouts
that were never scored are left out, never counted as 0.
  --fail-if-worse D   exit 1 when B is worse than A by more than D with 95% confidence (the
                      whole interval below -D)
  --top N             list the N largest per-example drops (default 5)
`;

/** A run folder's scored rewards per example, from either results layout. */
export async function rewardsOf(dir: string): Promise<RewardsByExample> {
  const out: RewardsByExample = new Map();
  const add = (key: string, reward: number) => {
    const rewards = out.get(key);
    if (rewards) rewards.push(reward);
    else out.set(key, [reward]);
  };
  if (existsSync(join(dir, "traces.jsonl"))) {
    for (const t of scoredTraces(await loadEpisodes(dir))) {
      if (isUnscored(t) || typeof t.reward !== "number") continue;
      add(t.task.key, t.reward);
    }
    return out;
  }
  if (existsSync(join(dir, "results.jsonl"))) {
    // One output at a time: only the rewards are kept, not a million records.
    await eachSavedOutput(dir, (o) => {
      if (isUnscoredOutput(o) || typeof o.reward !== "number") return;
      add(String(o.example_id), o.reward);
    });
    return out;
  }
  throw new ConfigError(`${dir}: not a run folder (no results.jsonl or traces.jsonl)`);
}

const fmt = (x: number) => (x >= 0 ? "+" : "") + x.toFixed(4);

export async function cmdCompare(argv: string[]): Promise<number> {
  const flags = parseArgs(argv);
  if (flags.help || flags.h) {
    process.stdout.write(COMPARE_HELP);
    return 0;
  }
  const [a, b] = flags._.map(String);
  if (!a || !b) {
    throw new ConfigError(
      `vf compare needs two run folders; usage: ${COMPARE_HELP.split("\n")[0]}`,
    );
  }
  const threshold = flags["fail-if-worse"] === undefined
    ? undefined
    : Number(flags["fail-if-worse"]);
  if (threshold !== undefined && !(threshold >= 0)) {
    throw new ConfigError(
      `--fail-if-worse: "${flags["fail-if-worse"]}" is not a non-negative number`,
    );
  }
  const top = flags.top === undefined ? 5 : Number(flags.top);
  let result;
  try {
    result = pairedComparison(await rewardsOf(a), await rewardsOf(b));
  } catch (error) {
    if (error instanceof RangeError) throw new ConfigError(`${a} and ${b}: ${error.message}`);
    throw error;
  }
  const lines = [
    `A ${a}`,
    `B ${b}`,
    `paired examples ${result.paired}` +
    (result.onlyA || result.onlyB
      ? ` (left out: ${result.onlyA} only in A, ${result.onlyB} only in B)`
      : ""),
    `mean reward  A ${result.meanA.toFixed(4)}  B ${result.meanB.toFixed(4)}`,
    `B - A ${fmt(result.delta)}  95% CI [${fmt(result.ci[0])}, ${fmt(result.ci[1])}]`,
    `examples better ${result.better}  worse ${result.worse}  same ${result.ties}`,
  ];
  const drops = result.perExample.filter((p) => p.delta < 0).slice(0, top);
  if (drops.length) {
    lines.push("largest drops:");
    for (const p of drops) {
      lines.push(
        `  ${terminalText(p.example)}  ${p.a.toFixed(3)} -> ${p.b.toFixed(3)}  (${fmt(p.delta)})`,
      );
    }
  }
  // Example ids and task keys come from the runs' files: no terminal escapes.
  process.stdout.write(terminalLines(lines.join("\n")) + "\n");
  if (threshold !== undefined && result.ci[1] < -threshold) {
    process.stderr.write(
      `error: B is worse than A by more than ${threshold} (95% CI upper bound ${
        fmt(result.ci[1])
      })\n`,
    );
    return 1;
  }
  return 0;
}
