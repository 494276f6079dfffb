/**
 * `single-agent`: one agent runs the task. A task that scripts its user
 * ({@link Task.userMessage}) turns the run into an interaction: after each reply the task
 * says what the user answers, until it returns nothing.
 * @module
 */
import type { Task } from "../../tasks/task.ts";
import { type Agents, Env } from "../env.ts";

/** One agent per episode; the episode is written as its one trace. */
export class SingleAgentEnv extends Env {
  static override roles = { agent: {} };

  override get flat(): boolean {
    return true;
  }

  async run(task: Task, agents: Agents): Promise<void> {
    if (!task.scriptsUser) {
      await agents.agent.run(task);
      return;
    }
    await using chat = await agents.agent.interaction(task);
    let segment = await chat.turn();
    for (let turn = 0; !segment.terminated; turn++) {
      const next = await task.userMessage({
        turn,
        lastReply: segment.lastReply,
        messages: chat.trace.messages,
        data: task.data,
        state: chat.state,
        info: chat.trace.info,
      });
      if (next === null || next === undefined) break;
      segment = await chat.turn(next);
    }
  }
}
