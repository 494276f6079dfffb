/**
 * `vf export` and `vf import`: trajectories between vf's run layout and Harbor's (ATIF).
 * @module
 */
import process from "node:process";
import { existsSync } from "node:fs";
import { mkdir, rename, writeFile } from "node:fs/promises";
import { dirname, join, resolve } from "node:path";
import { ConfigError } from "../errors.ts";
import { atifProblems, traceToAtifDocs } from "../harbor/atif.ts";
import { importHarborJob } from "../harbor/import.ts";
import { loadEpisodes } from "../agents/run.ts";
import type { TaskTrace } from "../tasks/trace.ts";
import { type FinetuneFormat, finetuneRows } from "./_finetune.ts";
import { summarizeTraces } from "../tasks/summary.ts";
import { writeJsonAtomic } from "../eval/results.ts";
import { parseArgs } from "./args.ts";
import { terminalText } from "../util/terminal.ts";

const EXPORT_HELP = `vf export --format atif <run-dir> [-o <dir>]
vf export --format messages|sharegpt <run-dir> [-o <file>] [--min-reward R] [--success]
    [--pass-threshold T]

atif: each rollout of a vf run (its traces.jsonl) as an ATIF v1.7 trajectory, Harbor's agent
trajectory format: one <task>-<rollout>-<trace id>.json per episode in <dir> (default
<run-dir>/atif). The other agents of a multi-agent episode (judges, simulated users) are
embedded in it as subagent trajectories. vf's reward, rewards and stop condition are in each
file's extra; token ids are in each step's metrics when the run saved them (save_tokens). A
multi-step Harbor task's rollout is one file per step (<trace id>-step-<n>), each step being a
fresh session of the agent, with the step's name and reward in extra.

messages, sharegpt: the rollouts as fine-tuning JSONL (default <run-dir>/<format>.jsonl),
from results.jsonl of vf eval or traces.jsonl of vf run. messages: {"messages": [...]} in
OpenAI's chat shape; sharegpt: {"conversations": [{"from", "value"}]} with human, gpt,
function_call and observation turns. Each row's metadata names the task, reward and source
line. --min-reward keeps rollouts scored at least R; --success those that passed (reward at
least --pass-threshold, default 0.5). A rollout that errored or was never scored passes
neither. Malformed rows are skipped with a warning naming file and line; judges' and
simulated users' traces are not training data and are left out. A multi-step Harbor task's
rollout is a row per step (its own session), each with the step's name, index and reward in
its metadata; the filters take the rollout's reward, as Harbor's take the trial's.
`;

const IMPORT_HELP = `vf import --format harbor <job-dir> [-o <outputs>]

Read a Harbor job folder (a result.json per trial, and agent/trajectory.json when the agent
wrote ATIF) into vf's run layout: <outputs>/evals/harbor-import--<model>/<run id>/ with
traces.jsonl and metadata.json (default outputs: ./outputs). A trial that raised is an error
on its trace, and one without a verifier result is unscored: neither counts as a 0. Only
files inside <job-dir> are read: a link out of it, a file over its limit or a field of the
wrong type is an error naming the file and field, and nothing is written.
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

function number(flags: Record<string, unknown>, key: string): number | undefined {
  const v = flags[key];
  if (v === undefined) return undefined;
  const n = typeof v === "number" ? v : typeof v === "string" && v.trim() ? Number(v) : NaN;
  if (!Number.isFinite(n)) throw new ConfigError(`--${key}: ${JSON.stringify(v)} is not a number`);
  return n;
}

/** `vf export --format atif|messages|sharegpt <run-dir> [-o out]`. */
export async function cmdExport(argv: string[]): Promise<number> {
  // A bare --success takes no value: the run folder after it stays positional.
  const flags = parseArgs(argv.map((a) => a === "--success" ? "--success=true" : a));
  if (flags.help || flags.h) {
    process.stdout.write(EXPORT_HELP);
    return 0;
  }
  const f = flags.format;
  if (f !== "atif" && f !== "messages" && f !== "sharegpt") {
    throw new ConfigError(
      `${
        f === undefined ? "--format is required" : `unknown --format "${f}"`
      } (atif, messages or sharegpt); usage: ${EXPORT_HELP.split("\n")[0]}`,
    );
  }
  const runDir = flags._.map(String)[0];
  if (!runDir) {
    throw new ConfigError(`vf export needs a run folder; usage: ${EXPORT_HELP.split("\n")[0]}`);
  }
  if (f !== "atif") return await exportFinetune(runDir, f, flags);
  if (!existsSync(join(runDir, "traces.jsonl"))) {
    throw new ConfigError(`${join(runDir, "traces.jsonl")}: missing; give a vf run folder`);
  }
  const out = resolve(String(flags.o ?? flags["output-dir"] ?? join(runDir, "atif")));
  await mkdir(out, { recursive: true });
  let written = 0;
  for (const episode of await loadEpisodes(runDir)) {
    const traces = (episode.traces ?? []) as TaskTrace[];
    if (!traces.length) continue;
    // The episode's first trainable trace is the document; the other agents are embedded.
    const root = traces.find((t) => t.trainable !== false) ?? traces[0];
    let docs;
    try {
      // A multi-step Harbor trace is a document per step, each step being its own session.
      docs = traceToAtifDocs(root, { subagents: traces.filter((t) => t !== root) });
    } catch (error) {
      console.warn(
        `${terminalText(join(runDir, "traces.jsonl"))}: skipping trace "${
          terminalText(root?.trace_id)
        }" of ` +
          `task "${terminalText(root?.task?.key)}": not a trace vf can write as ATIF (${
            terminalText((error as Error).message)
          })`,
      );
      continue;
    }
    const problems = docs.flatMap((doc) => atifProblems(doc));
    if (problems.length) {
      console.warn(
        `${terminalText(join(runDir, "traces.jsonl"))}: skipping trace "${
          terminalText(root.trace_id)
        }": its ` +
          `ATIF breaks the format: ${terminalText(problems.slice(0, 3).join("; "))}`,
      );
      continue;
    }
    for (const doc of docs) {
      // Every part of the name comes from the run's file: none may carry a path.
      const part = (v: unknown) => String(v).replace(/[^A-Za-z0-9_.-]/g, "_");
      const name = `${part(root.task?.key)}-${part(root.rollout_index)}-${
        part(doc.trajectory_id ?? root.trace_id)
      }.json`;
      await writeFile(join(out, name), JSON.stringify(doc, null, 2) + "\n");
      written++;
    }
  }
  process.stdout.write(
    `wrote ${written} ATIF trajector${written === 1 ? "y" : "ies"} to ${terminalText(out)}\n`,
  );
  return 0;
}

/** `vf export --format messages|sharegpt`: fine-tuning JSONL from either run layout. */
async function exportFinetune(
  runDir: string,
  format: FinetuneFormat,
  flags: Record<string, unknown>,
): Promise<number> {
  const traces = join(runDir, "traces.jsonl");
  const results = join(runDir, "results.jsonl");
  const layout = existsSync(traces) ? "traces" : existsSync(results) ? "results" : null;
  if (!layout) {
    throw new ConfigError(
      `${runDir}: neither traces.jsonl (vf run) nor results.jsonl (vf eval) is here; give a run folder`,
    );
  }
  const minReward = number(flags, "min-reward");
  const passThreshold = number(flags, "pass-threshold");
  const success = flags.success === true || flags.success === "true";
  const out = resolve(String(flags.o ?? flags.output ?? join(runDir, `${format}.jsonl`)));
  const report = await finetuneRows(
    layout === "traces" ? traces : results,
    layout,
    format,
    { minReward, success, passThreshold },
    (m) => console.warn(m),
  );
  await mkdir(dirname(out), { recursive: true });
  await writeFile(out, report.rows.map((r) => r + "\n").join(""));
  process.stdout.write(
    `wrote ${report.kept} of ${report.read} rollouts to ${terminalText(out)} (${
      terminalText(format)
    })` +
      (report.filtered ? `; ${report.filtered} left out by the filter` : "") +
      (report.skipped ? `; ${report.skipped} malformed skipped` : "") + "\n",
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
  // The model's name comes from the job's files: in the folder's name it carries no path,
  // no control character and no more than a name's length.
  const named = model.replace(/[^A-Za-z0-9_.-]+/g, "-").slice(0, 100);
  const runDir = resolve(outputs, "evals", `harbor-import--${named}`, runId);
  const perTask = new Map<string, number>();
  for (const t of traces) perTask.set(t.task.key, (perTask.get(t.task.key) ?? 0) + 1);
  const summary = summarizeTraces(traces, {
    run_id: runId,
    taskset: "harbor-import",
    model,
    env_id: "harbor",
    num_tasks: perTask.size,
    // (not Math.max(...): a job of many tasks would overflow the argument list)
    rollouts_per_task: [...perTask.values()].reduce((a, b) => Math.max(a, b), 0),
  });
  // Everything is read and summed before anything is written, and each file appears whole.
  await mkdir(runDir, { recursive: true });
  const tracesFile = join(runDir, "traces.jsonl");
  const tmp = `${tracesFile}.${runId}.tmp`;
  await writeFile(tmp, traces.map((t) => JSON.stringify(t)).join("\n") + "\n");
  await rename(tmp, tracesFile);
  await writeJsonAtomic(join(runDir, "metadata.json"), {
    ...summary,
    imported_from: resolve(jobDir),
  });
  process.stdout.write(
    `imported ${traces.length} trial${traces.length === 1 ? "" : "s"} into ${
      terminalText(runDir)
    }\n` +
      `reward ${
        summary.avg_reward === null ? "n/a" : summary.avg_reward.toFixed(4)
      }  errors ${summary.num_errors} of ${traces.length}\n`,
  );
  return 0;
}
