/**
 * `vf replay <run-dir>` and `vf rescore <run-dir>`: re-run a run from its record, offline.
 * Replay answers every model call with the reply the run got (and, for a task run, every
 * sandbox operation from `record.jsonl`), so the rewards come out the same; rescore re-applies
 * changed scoring (an eval's rubric, a task's offline rewards and judges) to what was saved.
 * Either writes a new run beside the source that names it (`replayed_from` / `rescored_from`).
 * @module
 */
import process from "node:process";
import { existsSync } from "node:fs";
import { readFile, writeFile } from "node:fs/promises";
import { dirname, join, resolve } from "node:path";
import { ConfigError } from "../errors.ts";
import { terminalText } from "../util/terminal.ts";
import { loadOutputs, writeJsonAtomic } from "../eval/results.ts";
import { evaluate } from "../eval/evaluate.ts";
import { ReplayClient } from "../eval/replay.ts";
import type { Usage } from "../types.ts";
import { renderSummary } from "../eval/progress.ts";
import { deepMerge, readToml, validateEvalConfig } from "../config.ts";
import { parseArgs } from "./args.ts";
import { resolveEval } from "./eval.ts";
import { runTasks } from "./run.ts";
import { validateRunConfig } from "./run_config.ts";
import { loadTraces } from "../agents/run.ts";
import { rescoreTrace, type TaskTrace } from "../tasks/rollout/mod.ts";
import { renderTaskSummary, summarizeTraces } from "../tasks/summary.ts";
import { loadRecords, ReplaySandboxSource } from "../tasks/record.ts";

const HELP = {
  replay: `vf replay <run-dir> [-o <dir>]

Re-run a run offline from its record: every model call is answered with the reply the run got
at the same place (prompt, rollout, turn), and for a vf run every sandbox operation from its
record.jsonl, so neither a model nor a Docker engine is needed and the rewards come out the
same. Writes a new run beside the source (or under -o) whose metadata names it
(replayed_from), says how many rewards match, and exits 1 when one differs.
`,
  rescore: `vf rescore <run-dir> [@ config.toml] [-o <dir>]

Re-apply changed scoring without calling the agent model. A vf eval run: the environment's
current rubric runs on the saved completions. A vf run: the task's offline rewards (those that
read only the trace) and the judges run on the saved traces; a TOML after @ is laid over the
run's config (new judges, say); rewards that need the sandbox are skipped and named. Writes a
new run beside the source (or under -o) whose metadata names it (rescored_from).
`,
};

export async function cmdReplay(argv: string[], mode: "replay" | "rescore"): Promise<number> {
  const flags = parseArgs(argv);
  if (flags.help || flags.h) {
    process.stdout.write(HELP[mode]);
    return 0;
  }
  const source = flags._.map(String)[0];
  if (!source) {
    throw new ConfigError(`vf ${mode} needs a run folder; usage: ${HELP[mode].split("\n")[0]}`);
  }
  const runDir = resolve(source);
  if (existsSync(join(runDir, "traces.jsonl"))) return await replayTasks(runDir, flags, mode);
  if (!existsSync(join(runDir, "results.jsonl"))) {
    throw new ConfigError(`${source}: not a run folder (no results.jsonl)`);
  }
  const configPath = join(runDir, "config.json");
  let saved: Record<string, unknown>;
  try {
    saved = JSON.parse(await readFile(configPath, "utf8"));
  } catch {
    throw new ConfigError(`${configPath}: missing or not JSON; vf ${mode} needs the run's config`);
  }
  delete saved.format_version;
  delete saved.resume;
  // The environment as it was asked for (a local module by its path), not its id.
  if (typeof saved.env_source === "string") saved.env_id = saved.env_source;
  delete saved.env_source;
  const config = validateEvalConfig(saved, configPath);
  const outputs = await loadOutputs(runDir);
  const run = await resolveEval(config, configPath);
  const client = new ReplayClient(outputs);
  const id = crypto.randomUUID().slice(0, 8);
  const outDir = flags.o ?? flags["output-dir"];
  const target = outDir ? resolve(String(outDir), id) : join(dirname(runDir), id);
  const link = mode === "replay" ? "replayed_from" : "rescored_from";
  await writeJsonAtomic(join(target, "config.json"), {
    ...saved,
    format_version: 1,
    [link]: runDir,
  });
  process.stderr.write(`Saving results to ${terminalText(target)}\n`);
  try {
    const result = await evaluate(run.env, client, run.model, {
      numExamples: run.numExamples,
      rolloutsPerExample: run.rollouts,
      maxConcurrent: run.maxConcurrent,
      samplingArgs: run.sampling,
      independentScoring: config.independent_scoring,
      stateColumns: config.state_columns,
      shuffleSeed: config.shuffle_seed ?? null,
      resultsDir: target,
      metadataExtra: { [link]: runDir },
    });
    process.stdout.write(renderSummary(result.metadata, result.outputs) + "\n");
    // Reward by example and place in its group, before and after.
    const keyed = (list: typeof outputs) => {
      const seen = new Map<number, number>();
      return new Map(list.map((o) => {
        const n = seen.get(o.example_id) ?? 0;
        seen.set(o.example_id, n + 1);
        return [`${o.example_id}#${n}`, o.error ? null : o.reward] as const;
      }));
    };
    const before = keyed(outputs);
    const after = keyed(result.outputs);
    const c = compareRewards(before, after);
    process.stdout.write(
      `${mode === "replay" ? "replayed" : "rescored"} ${result.outputs.length} rollouts from ${
        terminalText(runDir)
      }: ` +
        `${c.text}; ${client.served} replies from the record, ${client.missed} missing\n`,
    );
    if (mode === "replay" && (client.missed || c.same !== after.size)) {
      process.stderr.write(notReproduced(c, runDir, "eval"));
      return 1;
    }
    return 0;
  } finally {
    await run.env.teardown().catch(() => {});
  }
}

/** Rewards of a task run by task and rollout index. */
function taskRewards(traces: TaskTrace[]): Map<string, number | null> {
  return new Map(
    traces.map((t) => [`${t.task.key}#${t.rollout_index}`, t.error ? null : t.reward]),
  );
}

/**
 * Replay a `vf run` from its record: the model's replies from the traces, every sandbox
 * operation from `record.jsonl`; no engine and no model are touched.
 */
async function replayTasks(
  runDir: string,
  flags: ReturnType<typeof parseArgs>,
  mode: "replay" | "rescore",
): Promise<number> {
  if (mode === "rescore") return await rescoreTasks(runDir, flags);
  const recordPath = join(runDir, "record.jsonl");
  if (!existsSync(recordPath)) {
    throw new ConfigError(
      `${recordPath}: missing; the run was made before vf recorded sandbox I/O, so it cannot be replayed`,
    );
  }
  const records = await loadRecords(recordPath);
  const traces = await loadTraces(runDir);
  const client = new ReplayClient(traces.map((t) => {
    // A trace without messages (the readers let it pass) has no replies to serve.
    const messages = Array.isArray(t.messages) ? t.messages : [];
    const first = messages.findIndex((m) => m?.role === "assistant");
    const cut = first < 0 ? messages.length : first;
    const usage: Array<Usage | null> = [];
    for (const c of t.model_calls ?? []) {
      const u = (c.response as { usage?: unknown } | null | undefined)?.usage;
      if (Number.isInteger(c.turn) && c.turn >= 0 && c.turn < 10_000 && isUsage(u)) {
        usage[c.turn] = u;
      }
    }
    return {
      prompt: messages.slice(0, cut),
      completion: messages.slice(cut),
      index: t.rollout_index,
      usage,
    };
  }));
  const configPath = join(runDir, "config.json");
  let saved: Record<string, unknown>;
  try {
    saved = JSON.parse(await readFile(configPath, "utf8"));
  } catch {
    throw new ConfigError(`${configPath}: missing or not JSON; vf replay needs the run's config`);
  }
  delete saved.format_version;
  delete saved.resume;
  const config = await validateRunConfig(saved, configPath);
  const id = crypto.randomUUID().slice(0, 8);
  const outDir = flags.o ?? flags["output-dir"];
  const target = outDir ? resolve(String(outDir), id) : join(dirname(runDir), id);
  const code = await runTasks(config, saved, configPath, {
    client,
    sandboxes: new ReplaySandboxSource(records),
    runDir: target,
    link: { replayed_from: runDir },
  });
  const before = taskRewards(traces);
  const after = taskRewards(await loadTraces(target));
  const c = compareRewards(before, after);
  process.stdout.write(
    `replayed ${after.size} rollouts from ${terminalText(runDir)}: ${c.text}; ` +
      `${client.served} replies from the record, ${client.missed} missing\n`,
  );
  if (code !== 0 || c.same !== after.size || client.missed) {
    process.stderr.write(notReproduced(c, runDir, "run"));
    return 1;
  }
  return 0;
}

/** A replay's rewards against its source's; rollouts the source never finished are apart. */
function compareRewards(before: Map<string, unknown>, after: Map<string, unknown>) {
  const unfinished = [...after.keys()].filter((k) => !before.has(k)).length;
  const same = [...after].filter(([k, v]) => before.has(k) && before.get(k) === v).length;
  const total = after.size - unfinished;
  return {
    same,
    total,
    unfinished,
    text: `${same} of ${total} rewards as before` +
      (unfinished ? `; ${unfinished} rollouts the source run never finished` : ""),
  };
}

function notReproduced(c: ReturnType<typeof compareRewards>, dir: string, command: string) {
  const runDir = terminalText(dir);
  const rest = c.unfinished
    ? `; ${c.unfinished} rollouts were never finished in "${runDir}": finish it with ` +
      `vf ${command} ... --resume ${runDir}, then replay it`
    : "";
  return `error: the replay did not reproduce the run (${
    c.total - c.same
  } rewards differ${rest})\n`;
}

/**
 * Rescore a `vf run` offline: the task's rewards marked `offline` (they read only the trace)
 * and the judges, as the taskset and config say now (a TOML after `@` is laid over the run's
 * config: new judges, say); rewards that need the sandbox are skipped and named.
 */
async function rescoreTasks(runDir: string, flags: ReturnType<typeof parseArgs>): Promise<number> {
  const configPath = join(runDir, "config.json");
  let saved: Record<string, unknown>;
  try {
    saved = JSON.parse(await readFile(configPath, "utf8"));
  } catch {
    throw new ConfigError(`${configPath}: missing or not JSON; vf rescore needs the run's config`);
  }
  delete saved.format_version;
  delete saved.resume;
  const positional = flags._.map(String);
  const at = positional.indexOf("@");
  let source = configPath;
  if (at >= 0) {
    if (!positional[at + 1]) throw new ConfigError("vf rescore <run-dir> @ needs a TOML file");
    source = positional[at + 1];
    saved = deepMerge(saved, await readToml(source));
  }
  const config = await validateRunConfig(saved, source);
  const traces = await loadTraces(runDir);
  const id = crypto.randomUUID().slice(0, 8);
  const outDir = flags.o ?? flags["output-dir"];
  const target = outDir ? resolve(String(outDir), id) : join(dirname(runDir), id);
  return await runTasks(config, saved, source, {
    rescore: async (taskset, judges) => {
      const tasks = new Map((await taskset.tasks(-1)).map((t) => [t.key, t]));
      const out: TaskTrace[] = [];
      for (const t of traces) {
        const task = tasks.get(t.task.key);
        if (!task) {
          throw new ConfigError(`${runDir}: task "${t.task.key}" is not in the taskset any more`);
        }
        if (t.error) {
          out.push({ ...t, run_id: id });
          continue;
        }
        const { scores, skipped, info } = await rescoreTrace(task, t, { judges });
        // What could not run again is dropped alike, rewards and metrics: an old value beside
        // new ones would pass for a rescored one. The trace names what was skipped.
        out.push({
          ...t,
          run_id: id,
          reward: scores.reward,
          rewards: scores.rewards,
          metrics: scores.metrics,
          info: skipped.length ? { ...info, rescore_skipped: skipped } : info,
        });
      }
      await writeJsonAtomic(join(target, "config.json"), {
        ...saved,
        format_version: 1,
        rescored_from: runDir,
      });
      await writeFile(
        join(target, "traces.jsonl"),
        out.map((t) => JSON.stringify(t)).join("\n") + "\n",
      );
      const perTask = new Map<string, number>();
      for (const t of out) perTask.set(t.task.key, (perTask.get(t.task.key) ?? 0) + 1);
      const summary = summarizeTraces(out, {
        run_id: id,
        taskset: taskset.id,
        model: String(saved.model ?? ""),
        env_id: "single-agent",
        num_tasks: perTask.size,
        rollouts_per_task: Math.max(1, ...perTask.values()),
      }, { passThreshold: config.pass_threshold });
      await writeJsonAtomic(join(target, "metadata.json"), { ...summary, rescored_from: runDir });
      process.stderr.write(`Saving traces to ${terminalText(target)}\n`);
      process.stdout.write(renderTaskSummary(summary) + "\n");
      process.stdout.write(
        `rescored ${out.length} rollouts from ${terminalText(runDir)} into ${
          terminalText(target)
        }\n`,
      );
      return 0;
    },
  });
}

/** A saved usage that can be served again: token counts that are whole numbers. */
function isUsage(u: unknown): u is Usage {
  const x = u as Record<string, unknown> | null;
  return typeof x === "object" && x !== null &&
    [x.prompt_tokens, x.completion_tokens].every((n) => Number.isInteger(n) && (n as number) >= 0);
}
