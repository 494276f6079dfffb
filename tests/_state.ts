/**
 * Rollout states for unit tests that score or record them (lib/scoring/rubric_test.ts,
 * lib/eval/results_test.ts): built by the real `Environment.initState`, so they have every field a
 * rollout has.
 * @module
 */
import type { ChatClient } from "../lib/model/client.ts";
import { SingleTurnEnv } from "../lib/legacy/multi_turn.ts";
import type { State } from "../lib/state.ts";
import type { Messages, TrajectoryStep, Usage } from "../lib/types.ts";

/** A client for states that never reach a model: every call throws. */
export const noModel: ChatClient = {
  baseUrl: "http://unused.invalid/v1",
  headersFromState: {},
  getResponse() {
    throw new Error("a test state's client was asked for a model response");
  },
};

const prompt: Messages = [{ role: "user", content: "What is 2+2?" }];
const row = { prompt, answer: "4", task: "default", example_id: 0 };
const env = new SingleTurnEnv({ evalDataset: [row] });

/**
 * The state of a finished, unscored rollout: "What is 2+2?" answered "4" by "test-model",
 * trajectory id "t0". `overrides` win.
 */
export function testState(overrides: Partial<State> = {}): State {
  return {
    ...env.initState(row, noModel, "test-model"),
    is_completed: true,
    completion: [{ role: "assistant", content: "4" }],
    trajectory_id: "t0",
    ...overrides,
  };
}

/** One empty model turn of trajectory "t0"; `usage` is what the response reported. */
export function testStep(
  options: { reward?: number | null; advantage?: number | null; usage?: Usage | null } = {},
): TrajectoryStep {
  const { reward = null, advantage = null, usage = null } = options;
  return {
    prompt: [],
    completion: [],
    response: {
      id: "r",
      created: 0,
      model: "m",
      usage,
      message: { role: "assistant", content: "", finish_reason: "stop", is_truncated: false },
    },
    reward,
    advantage,
    is_truncated: false,
    trajectory_id: "t0",
    extras: {},
  };
}
