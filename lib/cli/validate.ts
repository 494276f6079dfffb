/**
 * `vf validate`: per task, the gold answer must score 1.0 and an untouched workspace 0.0.
 * @module
 */

import process from "node:process";
import { PROBES } from "../tasks/probe.ts";
import { validateTaskset } from "../tasks/validate.ts";
import { z } from "npm:zod@^4.6.0";
import { EvalConfig, formatIssue, RuntimeTable } from "../config.ts";
import { sandboxLimitsFromConfig } from "../../runtimes/limits.ts";
import { ConfigError } from "../errors.ts";
import { terminalJson, terminalText } from "../util/terminal.ts";
import { flagsToConfig, parseArgs } from "./args.ts";
import { loadTasksetFor } from "./resolve.ts";

const VALIDATE_HELP =
  `vf validate <taskset> [-n N] [-c N] [--runtime.type docker|subprocess] [--probe]
            [--limits.max_sandboxes N] [--limits.sandbox_create_rate R]
            [--env.taskset.include GLOB] [--env.taskset.exclude GLOB]

Per task, in fresh sandboxes: the gold answer (Task.validate) must score 1.0 and an
untouched workspace 0.0. Prints a table and a JSON summary; exits 1 when any task fails.
  -c N      tasks validated at once (default 4); each runs its two checks together
  --limits.*  as [limits] in a run: every sandbox started (agents, services, graders,
            probes) counts against max_sandboxes, and starts at most sandbox_create_rate
            a second
  --probe   also try known exploits against each task's grader, scored as in a run
            (isolated grading included): ${PROBES.map((p) => p.name).join(", ")}.
            A task that scores above 0 under any of them fails, naming the probe.
`;

/**
 * What `vf validate` reads of its flags, checked once: the runtime table (first, so its
 * issues are named first), the eval config's sandbox, trust and `[limits]` keys, and
 * `--env.taskset.*`; other flags are not its and are left alone, and sizes that are not
 * numbers fall back to the defaults.
 */
const ValidateConfig = z.object({
  runtime: RuntimeTable.optional(),
  ...EvalConfig.pick({ sandbox: true, trust: true, reload: true, lock_file: true, limits: true })
    .shape,
  env: z.object({ taskset: z.record(z.string(), z.unknown()).optional() }).optional(),
  num_examples: z.number().catch(-1),
  max_concurrent: z.number().catch(4),
  probe: z.boolean().catch(false),
});

export async function cmdValidate(argv: string[]): Promise<number> {
  const flags = parseArgs(argv);
  if (flags.help || flags.h) {
    process.stdout.write(VALIDATE_HELP);
    return 0;
  }
  const positional = flags._.map(String);
  if (!positional[0]) throw new ConfigError("vf validate needs a taskset: vf validate file-sum");
  const parsed = ValidateConfig.safeParse(flagsToConfig(flags as Record<string, unknown>));
  if (!parsed.success) {
    throw new ConfigError(`command line: ${formatIssue(parsed.error.issues[0])}`);
  }
  const config = parsed.data;
  const runtime = config.runtime ?? {};
  const taskset = await loadTasksetFor(
    positional[0],
    // `--env.taskset.*`: a Harbor folder's selectors (include, exclude, n_tasks) and multipliers.
    { ...config.env?.taskset, id: positional[0] },
    config,
    "command line",
  );
  const runId = `validate-${crypto.randomUUID().slice(0, 8)}`;
  const results = await validateTaskset(taskset, {
    numTasks: config.num_examples,
    runtime,
    runId,
    maxConcurrent: config.max_concurrent,
    probe: config.probe,
    limits: sandboxLimitsFromConfig(config.limits),
  });
  const rows = [
    ["task", "gold", "untouched", "result"],
    ...results.map((r) => [
      r.task,
      r.gold_reward === null ? "-" : r.gold_reward.toFixed(2),
      r.empty_reward === null ? "-" : r.empty_reward.toFixed(2),
      r.ok ? "ok" : `FAIL ${r.error ?? ""}`,
    ]),
  ];
  printTable(rows);
  if (config.probe) {
    process.stdout.write("\nintegrity probes (reward earned without doing the task; must be 0):\n");
    printTable([
      ["task", ...PROBES.map((p) => p.name)],
      ...results.map((r) => [
        r.task,
        ...PROBES.map((p) => {
          const got = r.probes?.find((x) => x.probe === p.name);
          if (!got) return "-";
          if (got.reward === null) return "error";
          return got.flagged ? `GAMED ${got.reward.toFixed(2)}` : got.reward.toFixed(2);
        }),
      ]),
    ]);
  }
  const failed = results.filter((r) => !r.ok).length;
  process.stdout.write(
    terminalJson({
      taskset: taskset.id,
      run_id: runId,
      runtime: runtime.type ?? "docker",
      tasks: results.length,
      passed: results.length - failed,
      failed,
      results,
    }) + "\n",
  );
  return failed ? 1 : 0;
}

/** Task keys and errors come from the taskset and its sandboxes: each cell is shown as text. */
function printTable(cells: string[][]): void {
  const rows = cells.map((r) => r.map(terminalText));
  const widths = rows[0].map((_, c) => Math.max(...rows.map((r) => r[c].length)));
  process.stdout.write(
    rows.map((r) => r.map((c, i) => c.padEnd(widths[i])).join("  ").trimEnd()).join("\n") + "\n",
  );
}
