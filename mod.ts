/**
 * vf: build, share and run environments that evaluate and train LLMs and agents.
 *
 * Datasets become chat prompts, environments run them against any OpenAI-compatible
 * endpoint, parsers and rubrics score the completions, and `evaluate` runs many rollouts
 * concurrently, grouped per example for pass@k, streaming results to disk.
 *
 * ```ts
 * import { evaluate, OpenAIChatClient, Rubric, SingleTurnEnv } from "./mod.ts";
 *
 * const env = new SingleTurnEnv({
 *   evalDataset: [{ question: "What is 2+2?", answer: "4" }],
 *   systemPrompt: "Answer with a number only.",
 *   rubric: new Rubric({
 *     funcs: [({ completion, answer, parser }) => parser.parseAnswer(completion)?.trim() === answer],
 *   }),
 * });
 * const client = new OpenAIChatClient({ base_url: "http://127.0.0.1:8000/v1" });
 * const { metadata } = await evaluate(env, client, "my-model", { rolloutsPerExample: 4 });
 * console.log(metadata.avg_reward, metadata.pass_at_k);
 * ```
 * @module
 */

export type * from "./lib/types.ts";
export * from "./lib/errors.ts";
export { Dataset } from "./lib/data/dataset.ts";
export type { MapAsyncOptions, MapOptions, MapResult } from "./lib/data/dataset.ts";
export { datasetFromBytes, loadDataset, saveDataset } from "./lib/data/io.ts";
export { loadHubDataset } from "./lib/data/hub.ts";
export type { LoadHubDatasetOptions } from "./lib/data/hub.ts";
export { EXAMPLE_DATASET_NAMES, loadExampleDataset } from "./lib/data/examples.ts";
export { formatRows, parseInfo } from "./lib/data/formatting.ts";
export type { FormatOptions } from "./lib/data/formatting.ts";
export { contentText, normalizeMessages, normalizeToolDefs } from "./lib/messages.ts";
export {
  BOXED_SYSTEM_PROMPT,
  extractBoxedAnswer,
  extractHashAnswer,
  THINK_BOXED_SYSTEM_PROMPT,
} from "./lib/scoring/extract.ts";
export {
  MaybeThinkParser,
  messageText,
  Parser,
  ThinkParser,
  XMLParser,
} from "./lib/scoring/parser.ts";
export type { ParsedFields, ParserOptions, XMLParserOptions } from "./lib/scoring/parser.ts";
export { groupReward, Rubric, RubricGroup } from "./lib/scoring/rubric.ts";
export type {
  GroupRewardContext,
  GroupRewardFunc,
  RewardContext,
  RewardFunc,
  RubricOptions,
} from "./lib/scoring/rubric.ts";
export { MathRubric } from "./lib/scoring/math_rubric.ts";
export type { MathRubricOptions } from "./lib/scoring/math_rubric.ts";
export { verifyMath } from "./lib/scoring/math_verify.ts";
export { DEFAULT_JUDGE_PROMPT, JudgeRubric } from "./lib/scoring/judge_rubric.ts";
export type { JudgeArgs, JudgeRubricOptions } from "./lib/scoring/judge_rubric.ts";
export { fillTemplate, Judge, judgeUsage, viewOf } from "./lib/scoring/judges/judge.ts";
export type {
  JudgedTrace,
  JudgeEndpoint,
  JudgeRecord,
  JudgeSettings,
} from "./lib/scoring/judges/judge.ts";
export { promptText, REFERENCE_TEMPLATE, ReferenceJudge } from "./lib/scoring/judges/reference.ts";
export type { ReferenceJudgeSettings } from "./lib/scoring/judges/reference.ts";
export { RUBRIC_TEMPLATE, RubricJudge } from "./lib/scoring/judges/rubric.ts";
export type { RubricJudgeSettings } from "./lib/scoring/judges/rubric.ts";
export { findJsonObject, parseJudgeChoice } from "./lib/scoring/judges/parse.ts";
export { buildJudges, JUDGE_IDS } from "./lib/scoring/judges/config.ts";
export type {
  BuildJudgesOptions,
  JudgeEndpointEntry,
  JudgeEntry,
} from "./lib/scoring/judges/config.ts";
export { choiceScore } from "./lib/scoring/judges/criteria.ts";
export { renderTranscript } from "./lib/messages.ts";
export {
  EndpointUnreachableError,
  MissingTokenDataError,
  OpenAIChatClient,
  parseResponseTokens,
} from "./lib/model/client.ts";
export type { ChatClient, ChatRequestOptions, ClientConfig } from "./lib/model/client.ts";
export { loadEndpoints, RoundRobinClient } from "./lib/model/endpoints.ts";
export type { Endpoint } from "./lib/model/endpoints.ts";
export { Environment } from "./lib/legacy/environment.ts";
export type {
  DatasetBuilder,
  DatasetSource,
  EnvironmentOptions,
  RolloutOptions,
} from "./lib/legacy/environment.ts";
export { MultiTurnEnv, SingleTurnEnv } from "./lib/legacy/multi_turn.ts";
export type { MultiTurnEnvOptions } from "./lib/legacy/multi_turn.ts";
export { defineTool, StatefulToolEnv, ToolEnv } from "./lib/legacy/tool_env.ts";
export type { DefineToolOptions, ToolEnvOptions, ToolSpec } from "./lib/legacy/tool_env.ts";
export { EnvGroup, EnvGroupRubric } from "./lib/legacy/group.ts";
export type { EnvGroupOptions } from "./lib/legacy/group.ts";
export { stateToOutput, tokenGraph } from "./lib/state.ts";
export { groupAdvantages } from "./lib/scoring/advantages.ts";
export type { AdvantageOptions } from "./lib/scoring/advantages.ts";
export type { RolloutOutput, RolloutTiming, State } from "./lib/state.ts";
export { evaluate, generate } from "./lib/eval/evaluate.ts";
export { renderSummary } from "./lib/eval/progress.ts";
export { OutputTally } from "./lib/eval/tally.ts";
export type {
  EvaluateOptions,
  GenerateOptions,
  GenerateOutputs,
  Progress,
} from "./lib/eval/evaluate.ts";
export { loadMetadata, loadOutputs, passAtK } from "./lib/eval/results.ts";
export type { RunMetadata } from "./lib/eval/results.ts";
export { loadEnvironment } from "./lib/legacy/load.ts";
export { ENV_SERVER_PROTOCOL, startEnvServer } from "./lib/serve/server.ts";
export type { EnvServer, EnvServerOptions, RolloutsLine } from "./lib/serve/server.ts";
export { EnvServerError, ServerEnvironment } from "./lib/serve/client.ts";
export type {
  GroupResult,
  ServerEnvironmentOptions,
  ServerInfo,
  StreamRolloutsOptions,
} from "./lib/serve/client.ts";
export { EnvServerCore } from "./lib/serve/core.ts";
export type { EnvServerCoreOptions, EnvServerTarget } from "./lib/serve/core.ts";
export { DEFAULT_ZMQ_ADDRESS, startZmqEnvServer } from "./lib/serve/zmq.ts";
export type {
  EpisodeRequest,
  EpisodeRunner,
  ZmqEnvServer,
  ZmqEnvServerOptions,
} from "./lib/serve/zmq.ts";
export {
  datasetRunner,
  rowFromTaskData,
  TaskDataSchema,
  taskFromData,
  tasksetRunner,
} from "./lib/serve/episode_runner.ts";
export type { RoleDefaults, TasksetRunnerOptions } from "./lib/serve/episode_runner.ts";
export { EnvServerReplyError, ZmqEnvClient } from "./lib/serve/zmq_client.ts";
export type { ZmqClientConfig, ZmqRunRequest } from "./lib/serve/zmq_client.ts";
export type { EnvironmentModule } from "./lib/legacy/load.ts";
export { VERSION } from "./lib/version.ts";
export { mulberry32, seededShuffle } from "./lib/random.ts";

import type { RolloutOutput } from "./lib/state.ts";
import { Dataset } from "./lib/data/dataset.ts";

/** Turn saved rollout outputs into a Dataset (e.g. for filtering or training). */
export function makeDataset(results: RolloutOutput[] | { outputs: RolloutOutput[] }): Dataset {
  const rows = Array.isArray(results) ? results : results.outputs;
  return Dataset.fromList(rows.map((r) => ({ ...r })));
}

export { metric, readText, reward, stop, Task, Taskset } from "./lib/tasks/task.ts";
export type {
  Artifact,
  PluggedHook,
  RuntimeConfig,
  ScoringConfig,
  StopContext,
  StopFunc,
  StopHook,
  TaskConfig,
  TaskData,
  TaskHookContext,
  TaskScores,
  TasksetConfig,
  TasksetModule,
  TraceView,
  UserTurnContext,
} from "./lib/tasks/task.ts";
export { loadPluggedHooks } from "./lib/tasks/plugged.ts";
export { defineToolset } from "./lib/tools/toolset.ts";
export type { ToolDef, ToolRunContext, ToolsetSpec } from "./lib/tools/toolset.ts";
export { Toolbox } from "./lib/tools/toolbox.ts";
export type { ToolResult } from "./lib/tools/toolbox.ts";
export { loadToolsets } from "./lib/tools/config.ts";
export { mcpTools } from "./lib/tools/legacy.ts";
export { checkCompose, loadServices } from "./lib/services/compose.ts";
export type { ServiceSpec, ServicesSpec } from "./lib/services/compose.ts";
export { ServiceGroup } from "./lib/services/docker.ts";
export { buildImage } from "./lib/services/build.ts";
export {
  HarborTask,
  HarborTaskset,
  isHarborFolder,
  loadHarborTask,
  readHarborSettings,
} from "./lib/harbor/taskset.ts";
export type { HarborSettings } from "./lib/harbor/taskset.ts";
export {
  type AtifStep,
  atifToMessages,
  type AtifToolCall,
  type AtifTrajectory,
  traceToAtif,
} from "./lib/harbor/atif.ts";
export { importHarborJob } from "./lib/harbor/import.ts";
export {
  assistantMessage,
  BashHarness,
  callModel,
  NullHarness,
  StopFired,
} from "./lib/tasks/harness.ts";
export { getHarness, HARNESSES } from "./lib/tasks/harness_registry.ts";
export { ProgramHarness, type ProgramHarnessOptions } from "./lib/tasks/program.ts";
export {
  type EgressDenial,
  Gateway,
  type GatewayHandler,
  type GatewayRoute,
  GatewaySession,
} from "./lib/gateway/gateway.ts";
export {
  composePolicies,
  type NetworkPolicy,
  type NetworkPolicyInput,
  parseNetworkPolicy,
  policyAllows,
} from "./lib/gateway/policy.ts";
export { Trace } from "./lib/tasks/trace.ts";
export { MessageGraph, messageHash } from "./lib/graph.ts";
export type { BranchTokens, MessageNode } from "./lib/graph.ts";
export type { Harness, HarnessContext, HarnessRecorder } from "./lib/tasks/harness.ts";
export {
  collectArtifacts,
  gradeSubmission,
  rescoreTrace,
  restoreArtifacts,
  runTaskRollout,
  TaskRollout,
} from "./lib/tasks/rollout/mod.ts";
export type {
  AgentPolicy,
  Box,
  Segment,
  TaskRolloutOptions,
  TaskTrace,
} from "./lib/tasks/rollout/mod.ts";
export { renderTaskSummary } from "./lib/tasks/summary.ts";
export { validateTaskset } from "./lib/tasks/validate.ts";
export {
  compareStdout,
  parsePytestOutcomes,
  readAnswerFileOrLastReply,
  verifyBoxedMathAnswer,
} from "./lib/scoring/graders.ts";
export type { FileReader, PytestOutcome } from "./lib/scoring/graders.ts";
export type { TaskRunSummary } from "./lib/tasks/summary.ts";
export type { ValidationResult } from "./lib/tasks/validate.ts";
export { Env, runEpisode } from "./lib/agents/env.ts";
export type { Agents, EnvInit, Episode, EpisodeError } from "./lib/agents/env.ts";
export { EpisodeAgent, Interaction } from "./lib/agents/agent.ts";
export type { AgentRole, AgentRun, AgentRunOptions } from "./lib/agents/agent.ts";
export { buildEnv, ENVS, parseEnvConfig, resolveEnvClass } from "./lib/agents/load.ts";
export type { BuildEnvOptions, EnvClass, EnvConfig, ParseEnvOptions } from "./lib/agents/load.ts";
export { loadEpisodes, loadTraces, runTaskset, selectTasks } from "./lib/agents/run.ts";
export type { RunTasksetOptions } from "./lib/agents/run.ts";
export { SingleAgentEnv } from "./lib/agents/builtin/single_agent.ts";
export { BestOfNEnv } from "./lib/agents/builtin/best_of_n.ts";
export { AgenticJudgeEnv, SharedAgenticJudgeEnv } from "./lib/agents/builtin/agentic_judge.ts";
export { BestOfNJudgeEnv } from "./lib/agents/builtin/best_of_n_judge.ts";
export { UserSimEnv } from "./lib/agents/builtin/user_sim.ts";
export type { UserScript, UserScriptContext } from "./lib/agents/builtin/user_sim.ts";
export { JudgeTask } from "./lib/agents/builtin/judge_task.ts";
export { loadCriteria } from "./lib/scoring/judges/criteria.ts";
export type { Criterion } from "./lib/scoring/judges/criteria.ts";
export {
  cleanupContainers,
  cleanupLedger,
  createRuntime,
  Ledger,
  liveEntries,
  recordSandbox,
  registerCleaner,
  SandboxLimits,
  WarmPool,
} from "./runtimes/mod.ts";
export type {
  Cleaner,
  LedgerEntry,
  LiveSandbox,
  SandboxLimit,
  SandboxSlot,
  SandboxSource,
} from "./runtimes/mod.ts";
export { limitModelConnections, Semaphore } from "./lib/model/limits.ts";
export type {
  ArchiveOutOptions,
  RunOptions,
  RunResult,
  Runtime,
  RuntimeCapabilities,
  RuntimeSpec,
} from "./runtimes/mod.ts";
