/**
 * A `vf run` trace line as the readers of `traces.jsonl` take it, for tests that write run
 * files by hand (hostile ones included).
 * @module
 */

// deno-lint-ignore no-explicit-any
type Json = any;

/**
 * A scored trace of task `key` with `reward`; `extra` replaces or adds fields. Its id is made
 * from the key's URI encoding, so a key holding escapes gives an id that holds none.
 */
export function traceLine(key: string, reward: number, extra: Json = {}): Json {
  return {
    format_version: 3,
    trace_id: `t-${encodeURIComponent(key)}-${reward}`,
    run_id: "r",
    taskset: "ts",
    task: { key, idx: 0, hash: "h" },
    example_id: 0,
    rollout_index: 0,
    model: "m",
    harness: "bash",
    trainable: true,
    messages: [{ role: "user", content: "q" }, { role: "assistant", content: "a" }],
    model_calls: [],
    tool_calls: [],
    reward,
    rewards: { reward },
    metrics: {},
    error: null,
    ok: true,
    usage: { input_tokens: 1, output_tokens: 1 },
    timing: { started_at: 1, ended_at: 2 },
    ...extra,
  };
}
