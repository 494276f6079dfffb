/**
 * The `program` harness: the agent is a program inside the sandbox (vf's shipped agent, or
 * any command) that calls the model through the rollout's gateway. It gets
 * `OPENAI_BASE_URL`/`OPENAI_API_KEY` (and `ANTHROPIC_BASE_URL`/`ANTHROPIC_API_KEY`) naming
 * the gateway and a per-rollout secret, never the real key; the gateway answers each call
 * through the run's client, model and sampling, within the rollout's turn limit and stop
 * conditions, and records it on the trace.
 * @module
 */
import { CommandTimeoutError, ConfigError, InfraError, TaskError } from "../errors.ts";
import process from "node:process";
import { type ChatCall, GatewayRefusal } from "../gateway/chat.ts";
import {
  AGENT_CANNOT_RUN,
  CANNOT_RUN_PREFIX,
  PYTHON_AGENT,
  SH_AGENT,
} from "../gateway/agent_programs.ts";
import type { Messages, Response, Tool } from "../types.ts";
import { currentActivity, withActivity } from "../util/activity.ts";
import {
  assistantMessage,
  callModel,
  type Harness,
  type HarnessContext,
  initialMessages,
  StopFired,
} from "./harness.ts";

/** `[env.<role>.harness]` keys of the program harness. */
export interface ProgramHarnessOptions {
  /** The command (a string runs with `sh -c`); default vf's agent program. */
  command?: string | string[];
  /**
   * Which shipped agent runs when no command is given: `python` or `sh`; default python where
   * the image has `python3`, else sh.
   */
  agent?: "python" | "sh";
  /** Extra environment of the program. */
  env?: Record<string, string>;
  /** Names of evaluator environment variables passed through to the program. */
  forward_env?: string[];
  /** Seconds the program may run; default the rollout's agent timeout. */
  timeout?: number;
}

const AGENT_DIR = "/tmp/vf-agent";
const OUTPUT_LIMIT = 16_000;

const SH_TOOL: Tool = {
  name: "bash",
  description: "Run a shell command in the sandbox; returns its exit code and output.",
  parameters: {
    type: "object",
    properties: { command: { type: "string" } },
    required: ["command"],
  },
};

function clip(text: string): string {
  return text.length > OUTPUT_LIMIT
    ? `${text.slice(0, OUTPUT_LIMIT / 2)}\n…[cut]…\n${text.slice(-OUTPUT_LIMIT / 2)}`
    : text;
}

function userText(messages: Messages): string {
  const last = [...messages].reverse().find((m) => m.role === "user");
  const content = last?.content;
  if (typeof content === "string") return content;
  if (Array.isArray(content)) {
    return content.map((p) => (p as { text?: string }).text ?? "").join("");
  }
  return "";
}

/** Runs an agent program in the sandbox, its model calls answered by the gateway. */
export class ProgramHarness implements Harness {
  readonly id = "program";
  readonly executesCode = true;
  readonly needsGateway = true;
  readonly options: ProgramHarnessOptions;

  constructor(options: ProgramHarnessOptions = {}) {
    if (options.agent !== undefined && options.agent !== "python" && options.agent !== "sh") {
      throw new ConfigError(`harness.agent must be "python" or "sh", not "${options.agent}"`);
    }
    this.options = options;
  }

  async run(ctx: HarnessContext): Promise<void> {
    const route = ctx.gateway;
    if (!route) {
      throw new ConfigError(
        `The program harness needs a route from the sandbox to the model gateway, which the ` +
          `${ctx.runtime.type} runtime does not provide; use docker or subprocess`,
      );
    }
    const initial = initialMessages(ctx.data);
    ctx.recorder.messages.push(...initial);
    const instruction = userText(initial);
    let modelError: unknown = null;
    // The gateway's server calls answer(): its model calls are this rollout's progress.
    const activity = currentActivity();

    const answer = async (
      messages: Messages,
      tools: Tool[],
      sampling: Record<string, unknown>,
      options: Parameters<typeof callModel>[3] = {},
    ) => {
      const turn = ctx.recorder.model_calls.length;
      if (turn >= ctx.maxTurns) {
        ctx.recorder.stop_condition ??= "max_turns_reached";
        throw new GatewayRefusal(400, "rollout stopped: max_turns_reached");
      }
      if (ctx.recorder.stop_condition) {
        throw new GatewayRefusal(400, `rollout stopped: ${ctx.recorder.stop_condition}`);
      }
      // The program owns the conversation: what it sent is the transcript so far.
      ctx.recorder.messages.splice(0, ctx.recorder.messages.length, ...structuredClone(messages));
      let response: Response;
      try {
        response = await withActivity(activity, () =>
          callModel(
            { ...ctx, samplingArgs: { ...sampling, ...ctx.samplingArgs } },
            turn,
            tools,
            options,
          ));
      } catch (error) {
        if (error instanceof StopFired) {
          throw new GatewayRefusal(400, `rollout stopped: ${error.condition}`);
        }
        modelError ??= error;
        throw error;
      }
      ctx.recorder.messages.push(assistantMessage(response));
      return response;
    };

    // vf's sh agent: the conversation lives here, one command per step.
    const shell: Messages = [];
    route.session.handler = {
      chat: (call: ChatCall, onDelta) =>
        answer(call.messages, call.tools, call.sampling, {
          onDelta,
          notHonoured: call.notHonoured,
        }),
      shellStep: async (output) => {
        if (output === null) {
          shell.splice(0, shell.length, ...structuredClone(initial));
        } else {
          const last = shell.at(-1);
          const id = last?.role === "assistant" ? last.tool_calls?.[0]?.id : undefined;
          if (id) shell.push({ role: "tool", tool_call_id: id, content: clip(output) });
        }
        const response = await answer(shell, [SH_TOOL], {});
        const message = assistantMessage(response);
        const call = message.role === "assistant" ? message.tool_calls?.[0] : undefined;
        if (message.role === "assistant" && message.tool_calls) {
          message.tool_calls = call ? [call] : [];
        }
        shell.push(message);
        if (!call) return null;
        try {
          const args = JSON.parse(call.arguments || "{}");
          return typeof args.command === "string" ? args.command : "echo 'bash needs a command'";
        } catch {
          return "echo 'the bash tool arguments were not JSON'";
        }
      },
    };

    const agent = await this.#pickAgent(ctx);
    const argv = await this.#argv(ctx, agent?.agent ?? null);
    const env: Record<string, string> = {
      OPENAI_BASE_URL: `${route.url}/v1`,
      OPENAI_API_KEY: route.session.modelSecret,
      OPENAI_MODEL: ctx.model,
      ANTHROPIC_BASE_URL: route.url,
      ANTHROPIC_API_KEY: route.session.modelSecret,
      VF_GATEWAY_URL: route.url,
      VF_INSTRUCTION: instruction,
      VF_MAX_TURNS: String(ctx.maxTurns),
      VF_COMMAND_TIMEOUT: String(Math.round(ctx.toolTimeoutMs / 1000)),
      // The gateway and the rollout's services are reached directly, never via the proxy.
      NO_PROXY: route.noProxy ?? new URL(route.url).hostname,
      no_proxy: route.noProxy ?? new URL(route.url).hostname,
    };
    for (const name of this.options.forward_env ?? []) {
      const value = process.env[name];
      if (value === undefined) {
        throw new ConfigError(`harness.forward_env names "${name}", which is not set`);
      }
      env[name] = value;
    }
    Object.assign(env, this.options.env ?? {});

    const started = Date.now();
    const record = {
      id: "program",
      name: "program",
      arguments: JSON.stringify(argv),
      output: "",
      duration_ms: 0,
    } as HarnessContext["recorder"]["tool_calls"][number];
    ctx.recorder.tool_calls.push(record);
    try {
      const r = await ctx.runtime.run(argv, {
        env,
        user: ctx.user,
        cwd: ctx.data.workdir,
        timeoutMs: this.options.timeout ? this.options.timeout * 1000 : undefined,
        signal: ctx.signal,
      });
      record.exit_code = r.exit_code;
      record.output = clip(
        [
          agent?.why,
          `exit code: ${r.exit_code}`,
          r.stdout && `stdout:\n${r.stdout}`,
          r.stderr && `stderr:\n${r.stderr}`,
        ]
          .filter(Boolean).join("\n"),
      );
      ctx.recorder.metrics.program_exit_code = r.exit_code;
      if (modelError) throw modelError;
      if (ctx.recorder.stop_condition) return; // a limit or stop: the exit code does not matter
      const shipped = agent?.agent;
      // Only before the model's first step: once the model has run commands, a missing tool or a
      // gateway it cannot reach may be its own doing (rm wget, a rewritten /etc/hosts), and
      // calling that infrastructure would let an agent turn a failing rollout into a re-run.
      if (shipped && ctx.recorder.model_calls.length === 0) {
        // vf's own agent that cannot work in this sandbox is a broken image or route, not an
        // agent that did nothing: infrastructure, never scored.
        const why = r.stderr.split("\n").find((l) => l.startsWith(CANNOT_RUN_PREFIX));
        if (r.exit_code === AGENT_CANNOT_RUN && why) {
          throw new InfraError(
            `The ${shipped} agent program cannot run in the sandbox: ${
              why.slice(CANNOT_RUN_PREFIX.length).trim()
            }`,
          );
        }
        if (r.exit_code === 126 || r.exit_code === 127) {
          throw new InfraError(
            `The ${shipped} agent program could not start (exit ${r.exit_code}): ${
              (r.stderr || r.stdout).trim().slice(0, 500)
            }; it needs ${
              shipped === "sh"
                ? '"sh" in the image'
                : '"python3" in the image; for an image without Python use --env.agent.harness.agent sh'
            }`,
          );
        }
      }
      if (r.exit_code === 126 || r.exit_code === 127) {
        throw new TaskError(
          `The agent program could not start (exit ${r.exit_code}): ${
            (r.stderr || r.stdout).trim().slice(0, 500)
          }`,
        );
      }
      ctx.recorder.stop_condition = r.exit_code === 0 ? "agent_completed" : "program_failed";
    } catch (error) {
      if (error instanceof CommandTimeoutError) {
        record.error = error.message;
        if (modelError) throw modelError;
        ctx.recorder.stop_condition ??= "program_timeout";
        return;
      }
      throw error;
    } finally {
      record.duration_ms = Date.now() - started;
    }
  }

  /**
   * Which of vf's agent programs runs (null for a given command): the one `harness.agent`
   * names, else python where the image has `python3` and sh where it does not, with a line
   * saying why for the trace.
   */
  async #pickAgent(
    ctx: HarnessContext,
  ): Promise<{ agent: "python" | "sh"; why: string | null } | null> {
    const command = this.options.command;
    if (typeof command === "string" || (Array.isArray(command) && command.length)) return null;
    if (this.options.agent) return { agent: this.options.agent, why: null };
    const probe = await ctx.runtime.run(
      ["sh", "-c", "command -v python3 >/dev/null 2>&1 && echo python3"],
      { signal: ctx.signal },
    );
    return probe.stdout.trim() === "python3"
      ? { agent: "python", why: "vf picked the python agent: the image has python3" }
      : { agent: "sh", why: "vf picked the sh agent: the image has no python3" };
  }

  async #argv(ctx: HarnessContext, agent: "python" | "sh" | null): Promise<string[]> {
    const command = this.options.command;
    if (typeof command === "string") return ["sh", "-c", command];
    if (Array.isArray(command) && command.length) return command;
    const sh = agent === "sh";
    const path = `${AGENT_DIR}/${sh ? "agent.sh" : "agent.py"}`;
    await ctx.runtime.write(path, sh ? SH_AGENT : PYTHON_AGENT, { mode: 0o755 });
    if (ctx.user) {
      await ctx.runtime.run(["chmod", "-R", "a+rX", AGENT_DIR]);
    }
    return sh ? ["sh", path] : ["python3", path];
  }
}
