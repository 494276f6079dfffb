/**
 * Integrity probes (`vf validate --probe`): known ways to earn a reward without doing a
 * task, tried against each task's grader. Each probe starts from the untouched workspace
 * (after `setup`), tampers with it the way a reward-hacking agent would, then the task is
 * scored exactly as in a run: in the agent's sandbox for shared scoring, or, for isolated
 * scoring, in a fresh grading sandbox that receives the artifacts and then the private tests.
 * A task that scores above 0 under any probe is flagged with the probe's name.
 *
 * The probes know nothing of a task beyond its declared artifacts and workdir: they rewrite
 * the artifacts' files, and plant files and replacements where graders are known to look.
 * @module
 */

import { posix } from "node:path";
import type { SandboxSource } from "../../runtimes/pool.ts";
import type { Runtime, RuntimeSpec } from "../../runtimes/runtime.ts";
import { parseNetworkPolicy } from "../gateway/policy.ts";
import { type CheckedOptions, servicesOf, startChecked } from "./checked.ts";
import type { ComposeCache } from "../services/cache.ts";
import {
  type AgentPolicy,
  collectArtifacts,
  resolveNetworkPolicy,
  resolveRuntimeSpec,
  restoreArtifacts,
} from "./rollout/mod.ts";
import type { Task, TaskHookContext, TraceView } from "./task.ts";

/** One way to game a grader. */
export interface Probe {
  name: string;
  /** What it imitates. */
  description: string;
  /** Tampers with the agent's sandbox (after setup); `files` are the artifacts' files. */
  apply(runtime: Runtime, files: string[], workdir: string): Promise<void>;
}

const sh = async (runtime: Runtime, script: string, ...args: string[]) => {
  await runtime.run(["sh", "-c", script, "probe", ...args], { timeoutMs: 30_000 });
};

/** Writes `python` into Python files and `shell` into every other file. */
async function writeEach(
  runtime: Runtime,
  files: string[],
  python: string,
  shell = "#!/bin/sh\nexit 0\n",
): Promise<void> {
  for (const f of files) {
    await runtime.write(f, /\.pyw?$/.test(f) ? python : shell, { mode: 0o755 });
  }
}

/** The probes `vf validate --probe` runs, in order. */
export const PROBES: Probe[] = [
  {
    name: "exit-0-os-exit",
    description: "every artifact file is replaced by code that exits 0 when imported or run " +
      "(os._exit(0) in Python, exit 0 in a shell)",
    apply: (rt, files) => writeEach(rt, files, "import os\nos._exit(0)\n"),
  },
  {
    name: "exit-0-sys-exit",
    description: "every artifact file raises SystemExit(0) at import (sys.exit(0))",
    apply: (rt, files) => writeEach(rt, files, "import sys\nsys.exit(0)\n"),
  },
  {
    name: "replaced-interpreter",
    description: "python, python3 and pytest in the agent's sandbox are replaced by scripts " +
      "that exit 0",
    apply: (rt) =>
      sh(
        rt,
        `for n in python python3 pytest; do
  p=$(command -v "$n") || continue
  printf '#!/bin/sh\\nexit 0\\n' > "$p" 2>/dev/null && chmod 755 "$p" 2>/dev/null
done; exit 0`,
      ),
  },
  {
    name: "prewritten-verdict",
    description: "reward and verdict files a grader might read are written in advance",
    apply: async (rt, files, workdir) => {
      const dirs = new Set(["/logs/verifier", "/tmp", workdir, ...files.map(posix.dirname)]);
      for (const d of dirs) {
        for (const name of ["reward.txt", "reward", "verdict.txt", "result.txt"]) {
          await rt.write(posix.join(d, name), "1\n").catch(() => {});
        }
        await rt.write(posix.join(d, "reward.json"), '{"reward": 1, "passed": true}\n')
          .catch(() => {});
      }
    },
  },
  {
    name: "tests-tampered",
    description: "test inputs the agent can reach are deleted or emptied",
    apply: (rt, _files, workdir) =>
      sh(
        rt,
        `for d in /tests "$1/tests" "$1/test"; do
  [ -d "$d" ] || continue
  find "$d" -type f -exec sh -c ': > "$1"' _ {} \\; 2>/dev/null; rm -rf "$d" 2>/dev/null
done; exit 0`,
        workdir,
      ),
  },
  {
    name: "symlinked-outputs",
    description: "every artifact file is replaced by a symlink (to /dev/null)",
    apply: (rt, files) =>
      sh(rt, `for f in "$@"; do rm -f -- "$f"; ln -s /dev/null "$f"; done; exit 0`, ...files),
  },
];

/** What a probe earned on one task. */
export interface ProbeResult {
  probe: string;
  /** The reward under the probe; null when scoring failed. */
  reward: number | null;
  /** True when the probe earned more than 0. */
  flagged: boolean;
  error: string | null;
}

/** The regular files under the task's artifacts in a sandbox. */
async function artifactFiles(runtime: Runtime, task: Task): Promise<string[]> {
  const workdir = task.data.workdir ?? "/";
  const sources = (task.data.artifacts ?? []).map((a) =>
    posix.isAbsolute(a.source) ? a.source : posix.join(workdir, a.source)
  );
  if (!sources.length) return [];
  const r = await runtime.run(
    [
      "sh",
      "-c",
      'for p in "$@"; do [ -e "$p" ] && find "$p" -type f; done; exit 0',
      "ls",
      ...sources,
    ],
    { timeoutMs: 30_000 },
  );
  return r.stdout.split("\n").filter(Boolean);
}

/**
 * Runs one probe on one task: setup in a fresh agent sandbox (with the task's services and
 * network policy), the probe, then scoring as the task's scoring mode says.
 */
export async function runProbe(
  task: Task,
  probe: Probe,
  options: {
    runtime: AgentPolicy["runtime"];
    runId: string;
    signal?: AbortSignal;
    /** Where its sandboxes come from (the run's limits); default: started here. */
    sandboxes?: SandboxSource;
    /** Takes the probe's share of the limit before it starts anything (`vf validate`). */
    take?: (task: Task, gold: boolean) => Promise<() => void>;
    /** The run's parsed Compose specs (`vf validate`'s); default: parsed for this task. */
    composeCache?: ComposeCache;
  },
): Promise<ProbeResult> {
  const mode = task.data.scoring?.mode ?? "shared";
  const view: TraceView = { info: {}, messages: [], artifacts: new Map() };
  const state = task.initialState();
  const ctxOf = (runtime: Runtime): TaskHookContext => ({
    runtime,
    task,
    data: task.data,
    trace: view,
    state,
    signal: options.signal,
  });
  const release = await options.take?.(task, false);
  try {
    const scoring = task.data.scoring ?? {};
    const services = await servicesOf(task, options.composeCache);
    const checked = (
      spec: RuntimeSpec,
      role: "agent" | "grader",
      around: Pick<CheckedOptions, "services" | "egress">,
    ) =>
      startChecked(task, spec, {
        runId: options.runId,
        role,
        sandboxes: options.sandboxes,
        signal: options.signal,
        ...around,
      });
    let reward: number;
    {
      // The task's services and network policy around it, as in a run.
      await using agent = await checked(
        resolveRuntimeSpec(options.runtime, task, "agent"),
        "agent",
        {
          services,
          egress: resolveNetworkPolicy(options.runtime, task),
        },
      );
      await task.setup(ctxOf(agent.runtime));
      agent.phase("agent");
      await probe.apply(
        agent.runtime,
        await artifactFiles(agent.runtime, task),
        task.data.workdir ?? "/",
      );
      if (mode === "isolated") {
        const artifacts = await collectArtifacts(agent.runtime, task);
        await agent[Symbol.asyncDispose](); // one sandbox at a time
        // The grader as a run has it: its own policy, and services only with scoring.services.
        const graderConfig = { ...options.runtime, ...(scoring.runtime ?? {}) };
        await using grader = await checked(
          resolveRuntimeSpec(graderConfig, task, "grader"),
          "grader",
          {
            services: scoring.services ? services : null,
            egress: scoring.network
              ? parseNetworkPolicy(scoring.network, "scoring.network")
              : resolveNetworkPolicy(graderConfig, task, "env.agent.scoring.runtime"),
          },
        );
        const ctx = ctxOf(grader.runtime);
        await task.setup(ctx);
        await restoreArtifacts(grader.runtime, artifacts);
        await task.stageVerifier(ctx);
        grader.phase("grade");
        reward = (await task.score(ctx)).reward;
      } else {
        const ctx = ctxOf(agent.runtime);
        await task.stageVerifier(ctx);
        agent.phase("grade");
        reward = (await task.score(ctx)).reward;
      }
    }
    return { probe: probe.name, reward, flagged: reward > 0, error: null };
  } catch (error) {
    return {
      probe: probe.name,
      reward: null,
      flagged: false,
      error: error instanceof Error ? `${error.name}: ${error.message}` : String(error),
    };
  } finally {
    release?.();
  }
}
