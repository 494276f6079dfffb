/**
 * `vf export` and `vf import`: trajectories between vf's run layout and Harbor's (ATIF).
 * @module
 */
import process from "node:process";
import { existsSync } from "node:fs";
import { mkdir, writeFile } from "node:fs/promises";
import { join, resolve } from "node:path";
import { ConfigError } from "../errors.ts";
import { importHarborJob, traceToAtif } from "../harbor/atif.ts";
import { loadTraces } from "../agents/run.ts";
import { summarizeTraces } from "../tasks/summary.ts";
import { writeJsonAtomic } from "../eval/results.ts";
import { parseArgs } from "./args.ts";

const EXPORT_HELP = `vf export --format atif <run-dir> [-o <dir>]

Write each rollout of a vf run (its traces.jsonl) as an ATIF trajectory, Harbor's agent
trajectory format: one <task>-<rollout>-<trace id>.json per rollout in <dir> (default
<run-dir>/atif). vf's reward, rewards and stop condition are in each file's extra.
`;

const IMPORT_HELP = `vf import --format harbor <job-dir> [-o <outputs>]

Read a Harbor job folder (a result.json per trial, and agent/trajectory.json when the agent
wrote ATIF) into vf's run layout: <outputs>/evals/harbor-import--<model>/<run id>/ with
traces.jsonl and metadata.json (default outputs: ./outputs). A trial that raised is an error
on its trace, and one without a verifier result is unscored: neither counts as a 0.
`;

function format(flags: Record<string, unknown>, want: string, help: string): void {
  const f = flags.format;
  if (f !== want) {
    throw new ConfigError(
      `${f === undefined ? "--format is required" : `unknown --format "${f}"`}; usage: ${
        help.split("\n")[0]
      }`,
    );
  }
}

/** `vf export --format atif <run-dir> [-o dir]`. */
export async function cmdExport(argv: string[]): Promise<number> {
  const flags = parseArgs(argv);
  if (flags.help || flags.h) {
    process.stdout.write(EXPORT_HELP);
    return 0;
  }
  format(flags, "atif", EXPORT_HELP);
  const runDir = flags._.map(String)[0];
  if (!runDir) {
    throw new ConfigError(`vf export needs a run folder; usage: ${EXPORT_HELP.split("\n")[0]}`);
  }
  if (!existsSync(join(runDir, "traces.jsonl"))) {
    throw new ConfigError(`${join(runDir, "traces.jsonl")}: missing; give a vf run folder`);
  }
  const out = resolve(String(flags.o ?? flags["output-dir"] ?? join(runDir, "atif")));
  await mkdir(out, { recursive: true });
  const traces = await loadTraces(runDir);
  for (const t of traces) {
    const name = `${
      t.task.key.replace(/[^A-Za-z0-9_.-]/g, "_")
    }-${t.rollout_index}-${t.trace_id}.json`;
    await writeFile(join(out, name), JSON.stringify(traceToAtif(t), null, 2) + "\n");
  }
  process.stdout.write(
    `wrote ${traces.length} ATIF trajector${traces.length === 1 ? "y" : "ies"} to ${out}\n`,
  );
  return 0;
}

/** `vf import --format harbor <job-dir> [-o outputs]`. */
export async function cmdImport(argv: string[]): Promise<number> {
  const flags = parseArgs(argv);
  if (flags.help || flags.h) {
    process.stdout.write(IMPORT_HELP);
    return 0;
  }
  format(flags, "harbor", IMPORT_HELP);
  const jobDir = flags._.map(String)[0];
  if (!jobDir) {
    throw new ConfigError(
      `vf import needs a Harbor job folder; usage: ${IMPORT_HELP.split("\n")[0]}`,
    );
  }
  const runId = crypto.randomUUID().slice(0, 8);
  const traces = await importHarborJob(jobDir, runId);
  const model = traces.find((t) => t.model)?.model || "unknown";
  const outputs = String(flags.o ?? flags["output-dir"] ?? "outputs");
  const runDir = resolve(outputs, "evals", `harbor-import--${model.replace(/[/:]/g, "-")}`, runId);
  await mkdir(runDir, { recursive: true });
  await writeFile(
    join(runDir, "traces.jsonl"),
    traces.map((t) => JSON.stringify(t)).join("\n") + "\n",
  );
  const perTask = new Map<string, number>();
  for (const t of traces) perTask.set(t.task.key, (perTask.get(t.task.key) ?? 0) + 1);
  const summary = summarizeTraces(traces, {
    run_id: runId,
    taskset: "harbor-import",
    model,
    env_id: "harbor",
    num_tasks: perTask.size,
    rollouts_per_task: Math.max(...perTask.values()),
  });
  await writeJsonAtomic(join(runDir, "metadata.json"), {
    ...summary,
    imported_from: resolve(jobDir),
  });
  process.stdout.write(
    `imported ${traces.length} trial${traces.length === 1 ? "" : "s"} into ${runDir}\n` +
      `reward ${
        summary.avg_reward === null ? "n/a" : summary.avg_reward.toFixed(4)
      }  errors ${summary.num_errors} of ${traces.length}\n`,
  );
  return 0;
}
