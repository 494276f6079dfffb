/**
 * What an agentic judge works on: criteria (from a rubric file, or a default `solved`
 * yes/no), the {@link JudgeTask} that puts the judge in a sandbox holding the solver's
 * workspace, and the scoring of the verdicts it gives in its final reply. The reply is the
 * one place the solver cannot write: any file in the sandbox can be rewritten by what the
 * solver left running, or by its code when the judge runs it.
 * @module
 */
import { JudgeVerdictError, TaskError } from "../../errors.ts";
import type { Criterion } from "../../scoring/judges/criteria.ts";
import {
  criterionMetrics,
  quotedNames,
  scoreVerdicts,
  type Verdicts,
  weightedScore,
} from "../../scoring/judges/verdicts.ts";
import { Task, type TaskHookContext, type TaskScores } from "../../tasks/task.ts";
import { restoreArtifacts, type TaskTrace } from "../../tasks/rollout/mod.ts";
import type { AgentRun } from "../agent.ts";

/** A verdict as the judge gives it: the criteria judges' shape. */
export type Verdict = Verdicts;

/**
 * The agentic judge's name: its reward key on the solver's trace, and the prefix of its
 * `judge/<criterion>` metrics, as a judge's name is for the judges of `[[env.judges]]`.
 */
export const JUDGE_KEY = "judge";

/**
 * Score verdicts: each criterion's choice counts `index / (choices - 1)`; the total is their
 * weighted mean.
 * @throws {JudgeVerdictError} naming the criterion when a verdict is missing, doubled or not
 *   allowed
 */
export function scoreVerdict(
  verdict: unknown,
  criteria: Criterion[],
): { score: number; scores: Record<string, number> } {
  const scores = scoreVerdicts(verdict, criteria, (fault) => {
    switch (fault.kind) {
      case "no_list":
        return `The judge's verdict has no "verdicts" list`;
      case "unknown":
        return `The judge gave a verdict for unknown criterion "${fault.name}"; criteria: ${
          quotedNames(criteria)
        }`;
      case "repeated":
        return `The judge gave criterion "${fault.name}" two verdicts`;
      case "not_allowed":
        return `Judge verdict for criterion "${fault.criterion.name}": "${fault.verdict}" is not one of ${
          quotedNames(fault.criterion.choices)
        }`;
      case "missing":
        return `The judge gave no verdict for criterion ${quotedNames(fault.criteria)}`;
    }
  });
  return { score: weightedScore(criteria, scores), scores };
}

/** Where the solver's trace is put for the judge. */
export const TRACE_PATH = "/tmp/trace.json";

/**
 * The verdict in a judge's final reply: the reply itself as JSON, else its last fenced code
 * block, else the text from its first `{` to its last `}`.
 * @throws {JudgeVerdictError} when none of them is JSON
 */
export function verdictFromReply(reply: string): unknown {
  const text = reply.trim();
  const fences = [...text.matchAll(/```[a-z]*\s*\n([\s\S]*?)```/gi)].map((m) => m[1]);
  const braces = text.indexOf("{") >= 0
    ? text.slice(text.indexOf("{"), text.lastIndexOf("}") + 1)
    : "";
  for (const candidate of [text, fences.at(-1), braces]) {
    if (!candidate) continue;
    try {
      return JSON.parse(candidate);
    } catch {
      // the next form
    }
  }
  throw new JudgeVerdictError(
    `The judge's final reply holds no JSON verdict (${
      text ? `it begins "${text.slice(0, 80)}"` : "it is empty"
    }); the judge must end with a reply of {"verdicts": [...]}`,
  );
}

const DEFAULT_POLICY = "You are a strict grader. The work of an AI agent on the task below is " +
  "in your sandbox. Inspect it with your tools (run the code, read the files), then judge it.";

/** Options of a {@link JudgeTask}. */
export interface JudgeTaskOptions {
  criteria: Criterion[];
  /** The judge works in the solver's own sandbox (true) or a fresh one with its artifacts. */
  shared: boolean;
  /** The grading policy; `{prompt}` is replaced by the solver's prompt. */
  policy?: string;
  hint?: string;
}

/** The judge's task: inspect the solver's workspace and write verdicts. */
export class JudgeTask extends Task {
  static override NEEDS_CONTAINER = true;
  static override HARNESS = "bash";
  readonly solver: AgentRun;
  readonly options: JudgeTaskOptions;

  constructor(task: Task, solver: AgentRun, options: JudgeTaskOptions) {
    const d = task.data;
    super({
      id: `${task.key}--judge-${solver.trace.attempt}`,
      idx: d.idx,
      prompt: judgePrompt(task, solver.trace, options),
      image: d.image,
      workdir: d.workdir,
      resources: d.resources,
      network: d.network,
      timeout: d.timeout,
      scoring: { mode: "shared" },
    });
    this.solver = solver;
    this.options = options;
  }

  override async setup({ runtime, trace, signal }: TaskHookContext): Promise<void> {
    if (!this.options.shared) await restoreArtifacts(runtime, this.solver.artifacts);
    else if (runtime.capabilities.kill_processes && runtime.killProcesses) {
      // The solver is done; what it left running must not change the workspace (or the trace
      // file) while the judge looks at it.
      await runtime.killProcesses({ signal });
      trace.info.solver_processes_killed = true;
    } else {
      trace.info.solver_processes_killed = false;
    }
    // Anything already at this path (a file the solver planted, a symlink) goes first.
    const rm = await runtime.run(["rm", "-rf", TRACE_PATH]);
    if (rm.exit_code !== 0) {
      throw new TaskError(`Cannot clear the judge's files: ${rm.stderr.trim()}`);
    }
    await runtime.write(TRACE_PATH, JSON.stringify(this.solver.trace, null, 2));
  }

  // deno-lint-ignore require-await
  override async finalize({ trace }: TaskHookContext): Promise<void> {
    const last = [...trace.messages].reverse().find((m) => m.role === "assistant");
    trace.info.verdict = verdictFromReply(textOf(last?.content));
    trace.info.solver_trace_id = this.solver.trace.trace_id;
  }

  // deno-lint-ignore require-await
  override async score({ trace }: TaskHookContext): Promise<TaskScores> {
    const { score, scores } = scoreVerdict(trace.info.verdict, this.options.criteria);
    return {
      reward: score,
      rewards: { [JUDGE_KEY]: score },
      metrics: criterionMetrics(JUDGE_KEY, scores),
    };
  }
}

function judgePrompt(task: Task, solver: TaskTrace, options: JudgeTaskOptions): string {
  const policy = options.policy ?? DEFAULT_POLICY;
  const parts = [
    policy.includes("{prompt}")
      ? policy.replaceAll("{prompt}", task.promptText)
      : `${policy}\n\n## Task\n${task.promptText}`,
  ];
  if (options.hint) parts.push(`## Hint\n${options.hint}`);
  parts.push(
    [
      "## Verdicts",
      "Judge each criterion; answer with one of its choices (listed worst to best):",
      ...options.criteria.map((c) =>
        `- ${c.name}: ${c.text} (answer one of: ${c.choices.join(", ")})`
      ),
      "When you are done, give your verdicts as your final reply (no tool call), as JSON, one " +
      "per criterion; only that reply counts, files in the sandbox are not read:",
      `{"verdicts": [{"name": "<criterion>", "reason": "<why>", "verdict": "<choice>"}]}`,
    ].join("\n"),
  );
  const artifacts = (task.data.artifacts ?? []).map((a) => a.source);
  parts.push(
    options.shared
      ? "## Workspace\nYou are in the agent's own sandbox, as the agent left it (the " +
        "processes it left running were stopped where the sandbox allows it)."
      : `## Workspace\nYou are in a fresh sandbox holding only the agent's declared outputs${
        artifacts.length ? ` (${artifacts.join(", ")})` : ""
      }; nothing else the agent did is here.`,
  );
  parts.push(
    `The agent's full trace (messages, tool calls) is in ${TRACE_PATH}. ` +
      `Its final reply was:\n${finalReply(solver)}`,
  );
  return parts.join("\n\n");
}

/** A message's text: a string, or the text parts of a list. */
function textOf(content: unknown): string {
  if (typeof content === "string") return content;
  if (!Array.isArray(content)) return "";
  return content.map((p) => (p?.type === "text" && typeof p.text === "string" ? p.text : ""))
    .join("");
}

function finalReply(trace: TaskTrace): string {
  const last = [...trace.messages].reverse().find((m) => m.role === "assistant");
  return typeof last?.content === "string" && last.content ? last.content : "(none)";
}

/**
 * Put a judge's verdict on the solver's trace: `judge/<name>` metrics, a `judge` reward, and
 * the reward re-weighted (`task_weight` × the task's own + `judge_weight` × the judge's).
 */
export function applyVerdict(
  solver: TaskTrace,
  judge: TaskTrace,
  weights: { task_weight?: number; judge_weight?: number },
): void {
  const score = judge.rewards[JUDGE_KEY];
  if (typeof score !== "number") {
    throw new JudgeVerdictError(`The judge of "${solver.task.key}" recorded no score`);
  }
  for (const [k, v] of Object.entries(judge.metrics)) {
    if (k.startsWith(`${JUDGE_KEY}/`)) solver.metrics[k] = v;
  }
  const taskWeight = weights.task_weight ?? 0;
  const own = solver.reward ?? 0;
  solver.rewards[JUDGE_KEY] = score;
  solver.reward = (taskWeight === 1 ? own : own * taskWeight) +
    (weights.judge_weight ?? 1) * score;
  solver.info.judge_trace_id = judge.trace_id;
}
