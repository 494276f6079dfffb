/**
 * A task's data: {@link TaskDataSchema}, the fields every task's data may carry as they are
 * checked on the wire (`task_data` of the env servers), and {@link TaskData}, the type a task
 * holds, inferred from it. Where the wire checks only a shape (a message's role, the scoring
 * table, an artifact's source, a network policy, the phase timeouts), the type is the one those
 * values are declared with below and checked against where they are used.
 * @module
 */
import { z } from "npm:zod@^4.6.0";
import type { RuntimeConfig } from "../../runtimes/config.ts";
import type { NetworkPolicyInput } from "../gateway/policy.ts";
import type { Messages } from "../types.ts";

/** A path copied out of the agent sandbox (and restored into the grading sandbox). */
export interface Artifact {
  /** Absolute path, or relative to the workdir (then both sandboxes need the same workdir). */
  source: string;
  /** A missing required artifact fails the rollout. Default true. */
  required?: boolean;
  /** Glob patterns (relative to `source`) left out of a directory artifact. */
  exclude?: string[];
}

/** Where grading happens. */
export interface ScoringConfig {
  /** `shared`: score in the agent's sandbox; `isolated`: a fresh grading sandbox. */
  mode?: "shared" | "isolated";
  /** Retries of grading infrastructure failures in a fresh sandbox; default 2. */
  retries?: number;
  /** Scoring-only environment variables; `${VAR}` / `${VAR:-default}` resolved at scoring time. */
  env?: Record<string, string>;
  /** The grading sandbox's own runtime; default the agent's policy. */
  runtime?: RuntimeConfig;
  /** Where grading may connect (the egress proxy's policy while scoring); default the agent's. */
  network?: NetworkPolicyInput;
  /** Isolated grading: start the task's services fresh for the grading sandbox too. */
  services?: boolean;
}

/** Per-phase time limits in seconds. */
export interface TaskTimeouts {
  setup?: number;
  agent?: number;
  finalize?: number;
  scoring?: number;
}

/** A message as the wire checks it: a role, and content of any shape. */
export const MessageWire: z.ZodType<{ role: string; content?: unknown }> = z.looseObject({
  role: z.string(),
  content: z.unknown().optional(),
});
const Seconds: z.ZodType<number | null | undefined> = z.number().positive().nullish();

/** A field the wire may send as null or leave out. */
type Maybe<T extends z.ZodType> = z.ZodOptional<z.ZodNullable<T>>;

/**
 * {@link TaskDataSchema}'s fields, written out because the schema is public API; the schema is
 * built with it as the type argument, so a field it lacks or types otherwise is a type error.
 */
type TaskDataShape = {
  prompt: z.ZodUnion<readonly [z.ZodString, z.ZodArray<typeof MessageWire>]>;
  id: Maybe<z.ZodString>;
  idx: Maybe<z.ZodNumber>;
  name: Maybe<z.ZodString>;
  description: Maybe<z.ZodString>;
  system_prompt: Maybe<z.ZodString>;
  image: Maybe<z.ZodString>;
  workdir: Maybe<z.ZodString>;
  scoring: Maybe<z.ZodRecord<z.ZodString, z.ZodUnknown>>;
  artifacts: Maybe<
    z.ZodArray<
      z.ZodObject<{
        source: z.ZodString;
        required: Maybe<z.ZodBoolean>;
        exclude: Maybe<z.ZodArray<z.ZodString>>;
      }, z.core.$loose>
    >
  >;
  artifact_max_bytes: Maybe<z.ZodNumber>;
  agent_user: Maybe<z.ZodString>;
  env: Maybe<z.ZodRecord<z.ZodString, z.ZodString>>;
  timeout: Maybe<
    z.ZodObject<{
      setup: typeof Seconds;
      agent: typeof Seconds;
      finalize: typeof Seconds;
      scoring: typeof Seconds;
    }, z.core.$loose>
  >;
  resources: Maybe<
    z.ZodObject<{
      cpu: Maybe<z.ZodNumber>;
      memory: Maybe<z.ZodUnion<readonly [z.ZodNumber, z.ZodString]>>;
    }, z.core.$loose>
  >;
  network: Maybe<z.ZodUnion<readonly [z.ZodBoolean, z.ZodRecord<z.ZodString, z.ZodUnknown>]>>;
};

/**
 * The fields every task's data may carry, as `task_data` is checked on the wire (other fields
 * pass through for the taskset's own schema).
 */
export const TaskDataSchema: z.ZodObject<TaskDataShape, z.core.$loose> = z.looseObject<
  TaskDataShape
>({
  /** The first user message. */
  prompt: z.union([z.string(), z.array(MessageWire)]),
  /** A stable upstream identifier; default derived from the content hash. */
  id: z.string().nullish(),
  /** Position in the taskset's load order (assigned when loaded). */
  idx: z.number().int().min(0).nullish(),
  name: z.string().nullish(),
  description: z.string().nullish(),
  system_prompt: z.string().nullish(),
  /** Container image; forces a container runtime. */
  image: z.string().nullish(),
  workdir: z.string().nullish(),
  scoring: z.record(z.string(), z.unknown()).nullish(),
  artifacts: z.array(z.looseObject({
    source: z.string(),
    required: z.boolean().nullish(),
    exclude: z.array(z.string()).nullish(),
  })).nullish(),
  /** Byte bound of all collected artifacts; default 32 MiB. */
  artifact_max_bytes: z.number().int().positive().nullish(),
  /** The user the harness runs as; setup runs as the runtime's default user. */
  agent_user: z.string().nullish(),
  /** Environment variables of the agent sandbox (never traced). */
  env: z.record(z.string(), z.string()).nullish(),
  timeout: z.looseObject({
    setup: Seconds,
    agent: Seconds,
    finalize: Seconds,
    scoring: Seconds,
  }).nullish(),
  resources: z.looseObject({
    cpu: z.number().positive().nullish(),
    memory: z.union([z.number().positive(), z.string()]).nullish(),
  }).nullish(),
  /**
   * Network access for the agent sandbox; default false. A policy
   * (`{ allow: ["pypi.org:443"], block: [] }`) lets connections out through the rollout's
   * egress proxy only where it allows, in the agent phase (setup is unrestricted).
   */
  network: z.union([z.boolean(), z.record(z.string(), z.unknown())]).nullish(),
});

/**
 * The fields whose values are typed as they are used rather than as the wire checks them:
 * the prompt's messages and the scoring table and network policy (checked by shape only),
 * and the nested tables, whose fields the wire lets be null too (only top-level nulls are
 * dropped before a task is built).
 */
interface Declared {
  prompt: string | Messages;
  scoring?: ScoringConfig;
  artifacts?: Artifact[];
  timeout?: TaskTimeouts;
  resources?: { cpu?: number; memory?: number | string };
  network?: boolean | NetworkPolicyInput;
}

type Wire = z.output<typeof TaskDataSchema>;

/** {@link TaskDataSchema}'s output, typed as {@link Declared} says, without the top-level nulls. */
type InferredTaskData =
  & { [K in keyof Wire as K extends keyof Declared ? never : K]: Exclude<Wire[K], null> }
  & Declared;

/**
 * Immutable per-example fields: {@link TaskDataSchema}'s, without the nulls the wire allows
 * (a task is built from the data with them dropped). Extra fields stay on the evaluator,
 * never in the prompt.
 */
export interface TaskData extends InferredTaskData {}
