/**
 * Loading one Harbor task folder into a task: its settings, steps and Compose file read, its
 * images built, each phase's network and limit (times the multipliers) set on its task data.
 * @module
 */
import { existsSync } from "node:fs";
import { readFile } from "node:fs/promises";
import { basename, join, resolve } from "node:path";
import { ConfigError } from "../errors.ts";
import { buildImage } from "../services/build.ts";
import type { TaskData } from "../tasks/task.ts";
import { type HarborNetwork, readHarborSettings } from "./settings.ts";
import { readHarborCompose } from "./compose.ts";
import { HarborStepsTask, loadSteps } from "./steps.ts";
import { HarborTask } from "./task.ts";

/**
 * Harbor's timeout multipliers, from `[env.taskset]` (or `--env.taskset.<key> N`):
 * `timeout_multiplier` for all, then `agent_timeout_multiplier`,
 * `verifier_timeout_multiplier`, `agent_setup_timeout_multiplier` and
 * `environment_build_timeout_multiplier` each over it. Default 1.
 */
export interface HarborMultipliers {
  agent: number;
  verifier: number;
  agentSetup: number;
  build: number;
}

/**
 * The multipliers of a taskset config.
 * @throws {ConfigError} naming the key of one that is not a positive number
 */
export function harborMultipliers(config: Record<string, unknown>): HarborMultipliers {
  const read = (key: string): number | undefined => {
    const raw = config[key];
    if (raw === undefined) return undefined;
    // From the command line a number arrives as its text.
    const v = typeof raw === "string" && /^\d+(\.\d+)?$/.test(raw) ? Number(raw) : raw;
    if (typeof v === "number" && Number.isFinite(v) && v > 0) return v;
    throw new ConfigError(`env.taskset.${key}: ${JSON.stringify(v)} is not a positive number`);
  };
  const all = read("timeout_multiplier") ?? 1;
  return {
    agent: read("agent_timeout_multiplier") ?? all,
    verifier: read("verifier_timeout_multiplier") ?? all,
    agentSetup: read("agent_setup_timeout_multiplier") ?? all,
    build: read("environment_build_timeout_multiplier") ?? all,
  };
}

const ONE: HarborMultipliers = { agent: 1, verifier: 1, agentSetup: 1, build: 1 };

function sameNetwork(a: HarborNetwork, b: HarborNetwork): boolean {
  return a.mode === b.mode && a.hosts.join("\n") === b.hosts.join("\n");
}

/** A phase's network as vf's task data has it: on, off, or an allowlist through the proxy. */
function networkOf(n: HarborNetwork): boolean | { allow: string[] } {
  return n.mode === "allowlist" ? { allow: n.hosts } : n.mode === "public";
}

/** A phase's network as an egress policy (for a phase under a proxy). */
function policyOf(n: HarborNetwork): { allow: string[]; block: string[] } {
  return n.mode === "allowlist"
    ? { allow: n.hosts, block: [] }
    : n.mode === "public"
    ? { allow: ["*"], block: [] }
    : { allow: [], block: ["*"] };
}

/**
 * Load one Harbor task folder: read it, build its image (or use `docker_image`), and for a
 * separate verifier its own image (`tests/Dockerfile`, `[verifier.environment] docker_image`,
 * else the agent's).
 * @throws {ConfigError} naming the path and key when something required is missing, or a
 * setting vf cannot honour is there
 */
export async function loadHarborTask(
  folder: string,
  options: { multipliers?: HarborMultipliers } = {},
): Promise<HarborTask> {
  const m = options.multipliers ?? ONE;
  const name = basename(folder);
  const tomlPath = join(folder, "task.toml");
  const settings = readHarborSettings(await readFile(tomlPath, "utf8"), tomlPath);
  const steps = settings.steps.length ? await loadSteps(folder, tomlPath, settings) : null;
  const instructionPath = join(folder, "instruction.md");
  if (!steps && !existsSync(instructionPath)) {
    throw new ConfigError(`${instructionPath}: missing; a Harbor task needs its instruction`);
  }
  if (!steps && !existsSync(join(folder, "tests", "test.sh"))) {
    throw new ConfigError(`${join(folder, "tests", "test.sh")}: missing; the verifier runs it`);
  }
  const verifier = settings.verifier;
  const separate = verifier.mode === "separate";
  if (separate && !settings.artifacts.length) {
    throw new ConfigError(
      `${tomlPath}: artifacts: a separate verifier sees only the declared artifacts; list the ` +
        `paths it grades (artifacts = ["/app/answer.txt"])`,
    );
  }
  // The network of each phase: setup and the agent share one in vf, the verifier may differ.
  const base = settings.environment.network;
  const agentNet = settings.agent.network ?? base;
  if (!sameNetwork(agentNet, base) && base.mode !== "public") {
    throw new ConfigError(
      `${tomlPath}: agent.network_mode: "${agentNet.mode}" over an environment baseline of ` +
        `"${base.mode}" cannot be kept: vf runs setup under the agent's network; set ` +
        `[environment].network_mode to the agent's`,
    );
  }
  const envDir = join(folder, "environment");
  const compose = await readHarborCompose(envDir);
  let image = compose?.main.image ?? settings.environment.image;
  if (!image) {
    const context = compose?.main.build ?? envDir;
    if (!existsSync(join(context, "Dockerfile"))) {
      throw new ConfigError(
        `${join(context, "Dockerfile")}: missing, and task.toml names no docker_image`,
      );
    }
    image = await buildImage(`harbor-${name}`, context, {
      root: folder,
      signal: AbortSignal.timeout(settings.environment.buildTimeout * m.build * 1000),
    });
  }
  let scoring: TaskData["scoring"] = { mode: "shared" };
  if (separate) {
    const env = verifier.environment;
    const testsDir = join(folder, "tests");
    let graderImage = env.image ?? image;
    if (existsSync(join(testsDir, "Dockerfile"))) {
      if (env.image) {
        throw new ConfigError(
          `${tomlPath}: verifier.environment.docker_image: tests/Dockerfile builds the ` +
            `verifier's image too; keep one of them`,
        );
      }
      graderImage = await buildImage(`harbor-${name}-verifier`, testsDir, {
        root: folder,
        signal: AbortSignal.timeout(env.buildTimeout * m.build * 1000),
      });
    }
    const own = verifier.network ?? env.network;
    scoring = {
      mode: "isolated",
      runtime: {
        image: graderImage,
        network: own.mode === "public",
        ...(env.cpus ? { cpu: env.cpus } : {}),
        ...(env.memoryMb ? { memory: `${env.memoryMb}m` } : {}),
      } as NonNullable<TaskData["scoring"]>["runtime"],
      // Under an agent's allowlist the grader would inherit it: it gets its own policy then.
      ...(own.mode === "allowlist" || agentNet.mode === "allowlist"
        ? { network: policyOf(own) }
        : {}),
    };
  } else {
    const own = verifier.network ?? base;
    if (!sameNetwork(own, agentNet)) {
      if (agentNet.mode !== "allowlist") {
        throw new ConfigError(
          `${tomlPath}: verifier.network_mode: "${own.mode}" differs from the agent's ` +
            `"${agentNet.mode}", and a verifier in the agent's sandbox keeps the agent's network ` +
            `unless the agent's is an allowlist; use [verifier] environment_mode = "separate"`,
        );
      }
      scoring = { mode: "shared", network: policyOf(own) };
    }
  }
  // Harbor's limits times the multipliers; the verifier's in the settings test.sh runs under.
  verifier.timeout *= m.verifier;
  for (const step of steps ?? []) step.verifier.timeout *= m.verifier;
  const instruction = steps ? steps[0].instruction : await readFile(instructionPath, "utf8");
  const memory = settings.environment.memoryMb;
  // A multi-step task's steps each keep their own limit (HarborStepsTask.sessionTimeout); the
  // whole agent's is their sum.
  const agentTimeout = steps
    ? (steps.every((st) => st.agent.timeout)
      ? steps.reduce((a, st) => a + st.agent.timeout!, 0)
      : undefined)
    : settings.agent.timeout;
  // Each step's agent has its own limit (Harbor's per-step agent timeout), times the multiplier.
  for (const step of steps ?? []) if (step.agent.timeout) step.agent.timeout *= m.agent;
  const scoringTimeout = Math.max(
    verifier.timeout,
    ...(steps ?? []).map((st) => st.verifier.timeout),
  );
  const data: TaskData = {
    id: name,
    prompt: instruction,
    image,
    network: networkOf(agentNet),
    agent_user: settings.agent.user,
    ...(settings.environment.workdir ? { workdir: settings.environment.workdir } : {}),
    resources: {
      cpu: settings.environment.cpus,
      memory: memory ? `${memory}m` : undefined,
    },
    timeout: {
      agent: agentTimeout ? agentTimeout * m.agent : undefined,
      ...(settings.agent.setupTimeout ? { setup: settings.agent.setupTimeout * m.agentSetup } : {}),
      // The verifier's own limit, and a minute for the sweep (or the grader), staging and
      // the reward.
      scoring: scoringTimeout + 60,
    },
    scoring,
    // Missing is the verifier's to judge (Harbor's hands it nothing), never a failed rollout.
    ...(settings.artifacts.length
      ? { artifacts: settings.artifacts.map((source) => ({ source, required: false })) }
      : {}),
    ...(compose && Object.keys(compose.main.env).length ? { env: compose.main.env } : {}),
  };
  return steps
    ? new HarborStepsTask(data, resolve(folder), settings, compose?.sidecars ?? null, steps)
    : new HarborTask(data, resolve(folder), settings, compose?.sidecars ?? null);
}
