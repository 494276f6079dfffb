/**
 * EnvGroup: several environments behind one, routed by each row's `task`.
 * @module
 */
import type { ChatClient } from "../model/client.ts";
import { Dataset } from "../data/dataset.ts";
import { Environment, type EnvironmentOptions, type RolloutOptions } from "./environment.ts";
import { formatRows } from "../data/formatting.ts";
import { applyGroupScores, Rubric } from "../scoring/rubric.ts";
import type { State } from "../state.ts";
import type { Row } from "../types.ts";
import { RewardError } from "../errors.ts";

/** Options of {@link EnvGroup}. */
export interface EnvGroupOptions extends Omit<EnvironmentOptions, "dataset" | "evalDataset"> {
  /** One name per environment, used as its rows' `task`; default `env_0`, `env_1`, … */
  envNames?: string[];
}

/**
 * Scores a state with the rubric of the environment its task routes to, zero-filling other
 * names. A task no environment has is not scored: its rollouts get a `RewardError`.
 */
export class EnvGroupRubric extends Rubric {
  #envs: Map<string, Environment>;

  constructor(envs: Map<string, Environment>) {
    super();
    this.#envs = envs;
  }

  #allNames(): string[] {
    return [...new Set([...this.#envs.values()].flatMap((e) => e.rubric.funcNames))].sort();
  }

  override async scoreRollout(state: State): Promise<void> {
    await this.scoreGroup([state]);
  }

  override async scoreGroup(states: State[]): Promise<void> {
    if (states.length === 0) return;
    const names = this.#allNames();
    const env = this.#envs.get(states[0].task);
    if (!env) {
      // No rubric ran: an error on each rollout (left out of averages), never a score of 0.
      const known = [...this.#envs.keys()].map((k) => `"${k}"`).join(", ");
      for (const s of states) {
        s.error ??= new RewardError(
          `No environment in the group for task "${s.task}" (tasks: ${known}); it was not scored`,
        );
      }
      applyGroupScores(states, states.map(() => 0), states.map(() => zeroFill(names, {})));
      return;
    }
    await env.rubric.scoreGroup(states);
    applyGroupScores(
      states,
      states.map((s) => s.reward ?? 0),
      states.map((s) => zeroFill(names, s.metrics ?? {})),
    );
  }
}

function zeroFill(names: string[], metrics: Record<string, number>): Record<string, number> {
  const out: Record<string, number> = {};
  for (const n of names) out[n] = metrics[n] ?? 0;
  return out;
}

/** Route rows to child environments by `task`; each child scores with its own rubric. */
export class EnvGroup extends Environment {
  envs: Environment[];
  envNames: string[];
  envMap: Map<string, Environment>;

  constructor(envs: Environment[], options: EnvGroupOptions = {}) {
    if (envs.length === 0) throw new RangeError("EnvGroup needs at least one environment");
    const names = options.envNames ?? envs.map((_, i) => `env_${i}`);
    if (names.length !== envs.length) {
      throw new RangeError(`EnvGroup got ${envs.length} environments but ${names.length} names`);
    }
    const collect = async (split: "train" | "eval"): Promise<Row[]> => {
      const parts: Dataset[] = [];
      for (const [i, env] of envs.entries()) {
        if (split === "train" && !env.hasDataset) continue; // an eval-only child
        const ds = split === "train" ? await env.getDataset() : await env.getEvalDataset();
        parts.push(Dataset.fromList(ds.toList().map((r) => ({ ...r, task: names[i] }))));
      }
      if (parts.length === 0) {
        throw new TypeError(`No environment in the group has a ${split} dataset`);
      }
      return Dataset.concatenate(parts).toList();
    };
    super({
      ...options,
      dataset: () => collect("train"),
      evalDataset: () => collect("eval"),
    });
    this.envs = envs;
    this.envNames = names;
    this.envMap = new Map(names.map((n, i) => [n, envs[i]]));
    this.rubric = new EnvGroupRubric(this.envMap);
  }

  protected override formatDataset(rows: Row[], label: string): Row[] {
    const fresh = rows.map(({ example_id: _drop, ...rest }) => rest);
    return formatRows(fresh, {
      systemPrompt: this.systemPrompt,
      fewShot: this.fewShot,
      envId: this.envId,
      label,
    });
  }

  /** Whether any child has a training dataset. */
  override get hasDataset(): boolean {
    return this.envs.some((env) => env.hasDataset);
  }

  /** The child environment for a task; unknown tasks go to the first environment. */
  getEnvForTask(task: string): Environment {
    return this.envMap.get(task) ?? this.envs[0];
  }

  rollout(input: Row, client: ChatClient, model: string, options?: RolloutOptions): Promise<State> {
    return this.getEnvForTask(String(input.task)).rollout(input, client, model, options);
  }

  override runGroup(
    inputs: Row[],
    client: ChatClient,
    model: string,
    options?: RolloutOptions & { independentScoring?: boolean },
  ): Promise<State[]> {
    return this.getEnvForTask(String(inputs[0]?.task)).runGroup(inputs, client, model, options);
  }

  override setKwargs(kwargs: Record<string, unknown>): void {
    super.setKwargs(kwargs);
    for (const env of this.envs) env.setKwargs(kwargs);
  }

  override async teardown(): Promise<void> {
    await super.teardown();
    for (const env of this.envs) await env.teardown();
  }
}
