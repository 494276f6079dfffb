/**
 * `user-sim`: an assistant talks with a user across turns. The user is a model playing a
 * persona (`{scenario}` is the task's prompt, `{done}` the marker it says when satisfied),
 * or a script: a list of messages (`--env.script`) or, in code, a function. The assistant
 * never sees the task's prompt, only what the user says; the conversation ends at the done
 * marker, when the user runs out of turns (`--env.user.max_turns`, default 8) or when either
 * side stops. The assistant's trace gets the `user_turns` metric.
 * @module
 */
import { z } from "npm:zod@^4.6.0";
import type { Interaction } from "../agent.ts";
import { Task, type TaskScores } from "../../tasks/task.ts";
import { EnvError } from "../../errors.ts";
import { type Agents, Env, type Episode } from "../env.ts";

/** What a scripted user sees before each of its turns. */
export interface UserScriptContext {
  /** User turns sent so far. */
  turn: number;
  /** The assistant's last reply ("" before the first turn). */
  lastReply: string;
  task: Task;
}

/** A scripted user: the next message, or null to end the conversation. */
export type UserScript = (ctx: UserScriptContext) => string | null | Promise<string | null>;

/** The user's opening cue: what the assistant says first. */
export const OPENING_LINE = "Hello! How can I help you today?";

const DEFAULT_PERSONA = "You are a user talking to an AI assistant. Your situation: {scenario}\n" +
  "Speak only as the user, one short message at a time. When the assistant has fully " +
  "helped you, reply with exactly {done} and nothing else.";

/** The simulated user's task: no prompt, a persona as its system prompt, nothing to score. */
export class UserTask extends Task {
  static override HARNESS = "null";

  constructor(task: Task, persona: string, done: string) {
    super({
      id: `${task.key}--user`,
      idx: task.data.idx,
      prompt: "",
      system_prompt: persona.replaceAll("{scenario}", task.promptText).replaceAll("{done}", done),
    });
  }

  // deno-lint-ignore require-await
  override async score(): Promise<TaskScores> {
    return { reward: 0, rewards: {}, metrics: {} };
  }
}

/** An assistant and a (simulated or scripted) user. */
export class UserSimEnv extends Env {
  static override roles: Record<string, Record<string, unknown>> = {
    assistant: {},
    user: { harness: { id: "null" }, max_turns: 8, runtime: { type: "subprocess" as const } },
  };
  static override options: Record<string, z.ZodType> = {
    persona: z.string().optional(),
    done_marker: z.string().min(1).default("###DONE###"),
    /** A scripted user: these messages in order (no user model is called). */
    script: z.array(z.string()).min(1).optional(),
  };

  /** A scripted user in code (set by a subclass or after construction); beats `script`. */
  userScript?: UserScript;

  override setup(agents: Agents): void {
    agents.user.trainable = false;
  }

  get doneMarker(): string {
    return (this.options.done_marker as string | undefined) ?? "###DONE###";
  }

  async run(task: Task, agents: Agents): Promise<void> {
    await using assistant = await agents.assistant.interaction(task, { promptless: true });
    const script = this.userScript ?? listScript(this.options.script as string[] | undefined);
    const turns = script
      ? await this.#scripted(task, assistant, script)
      : await this.#simulated(task, assistant, agents);
    assistant.trace.info.user_turns = turns;
  }

  async #scripted(task: Task, assistant: Interaction, script: UserScript): Promise<number> {
    let turns = 0;
    let lastReply = "";
    for (;;) {
      const message = await script({ turn: turns, lastReply, task });
      if (message === null || message.includes(this.doneMarker)) return turns;
      turns++;
      const segment = await assistant.turn(message);
      lastReply = segment.lastReply;
      if (segment.terminated) return turns;
    }
  }

  async #simulated(task: Task, assistant: Interaction, agents: Agents): Promise<number> {
    const persona = (this.options.persona as string | undefined) ?? DEFAULT_PERSONA;
    await using user = await agents.user.interaction(
      new UserTask(task, persona, this.doneMarker),
      { promptless: true },
    );
    let turns = 0;
    let said = await user.turn(OPENING_LINE);
    while (!said.terminated && !said.lastReply.includes(this.doneMarker)) {
      turns++;
      const answer = await assistant.turn(said.lastReply);
      if (answer.terminated) break;
      said = await user.turn(answer.lastReply);
    }
    // A user that failed ended the talk, not the assistant: nothing of it is scored.
    const failed = user.trace.error;
    if (failed) {
      throw new EnvError(`The simulated user failed: ${failed.error}: ${failed.message}`);
    }
    return turns;
  }

  override finalize(_task: Task, episode: Episode): void {
    for (const t of episode.traces) {
      if (t.role === "assistant") t.metrics.user_turns = Number(t.info.user_turns ?? 0);
      // The simulated user is not graded: no reward rather than a 0.
      if (t.role === "user") t.reward = null;
    }
  }
}

function listScript(list: string[] | undefined): UserScript | undefined {
  return list ? ({ turn }) => list[turn] ?? null : undefined;
}
