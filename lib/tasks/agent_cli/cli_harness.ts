/**
 * What the built-in agent-CLI harnesses share: the CLI is installed into the sandbox from
 * the evaluator's npm cache (baked into a cached image derived from the task's where the
 * runtime starts sandboxes from images vf builds, else uploaded as an archive), configured
 * to call the rollout's model gateway with the rollout's secret as its only key, and run
 * through the `program` harness, so its model calls, exit code and output land on the trace
 * the same way. Its own report (a JSON result, a JSON event stream) is kept in the sandbox
 * and read back as the harness's metrics.
 * @module
 */
import { ConfigError } from "../../errors.ts";
import type { GatewayRoute } from "../../gateway/gateway.ts";
import type { Harness, HarnessContext } from "../harness.ts";
import { ProgramHarness } from "../program.ts";
import { bakeImage, type Bundle, installBundles, NODE_BUNDLE } from "./install.ts";

/** `[env.<role>.harness]` keys every agent-CLI harness takes. */
export interface AgentCliOptions {
  /** The CLI's npm version; default the harness's pinned one. */
  version?: string;
  /** The model name the CLI is told; default the run's model (the gateway answers with it). */
  model?: string;
  /** Which API the CLI speaks to the gateway, where it has a choice. */
  api?: string;
  /** Extra arguments appended to the CLI's command line. */
  args?: string[];
  /** Extra environment of the CLI, over what vf sets. */
  env?: Record<string, string>;
  /** Names of evaluator environment variables passed through. */
  forward_env?: string[];
  /** Seconds the CLI may run; default the rollout's agent timeout. */
  timeout?: number;
  /**
   * How the CLI gets into the sandbox: `"image"` (the default) bakes it into an image of the
   * task's, built once and reused, where the runtime can start one (docker), and uploads it
   * elsewhere; `"archive"` uploads it into every sandbox.
   */
  install?: "image" | "archive";
}

const warned = new Set<string>();

/** Where a CLI's config, home and report live in the sandbox. */
export const CLI_DIR = "/tmp/vf-agent";

/** What a CLI harness decides for one rollout. */
export interface CliLaunch {
  /** The CLI's argv; `$VF_INSTRUCTION` is the task's prompt, given as an argument by the caller. */
  argv: string[];
  env: Record<string, string>;
  /** Folders put before the image's own `PATH`. */
  path?: string[];
  /** Config files to write before it starts (sandbox path → text). */
  files?: Record<string, string>;
}

/** Quotes one word for `sh`. */
export function shellQuote(word: string): string {
  return /^[\w@%+=:,./-]+$/.test(word) ? word : `'${word.replaceAll("'", `'\\''`)}'`;
}

/** The base of the built-in agent-CLI harnesses. */
export abstract class AgentCliHarness implements Harness {
  abstract readonly id: string;
  readonly executesCode = true;
  readonly needsGateway = true;
  readonly options: AgentCliOptions;
  /** The pinned version when `version` is not given. */
  abstract readonly defaultVersion: string;
  /** The APIs the CLI can speak, the first being the default; empty when it has no choice. */
  abstract readonly apis: readonly string[];
  /** The Node.js major the CLI runs on, when it is a Node program (baked in beside it). */
  readonly nodeMajor: number | null = null;

  constructor(options: AgentCliOptions = {}) {
    this.options = options;
  }

  /** Checks the options against the subclass's knobs; called by the registry. */
  validate(): this {
    const { api, args } = this.options;
    if (api !== undefined && !this.apis.includes(api)) {
      throw new ConfigError(
        this.apis.length
          ? `harness.api of "${this.id}" must be one of ${
            this.apis.map((a) => `"${a}"`).join(", ")
          }, not "${api}"`
          : `harness.api: "${this.id}" speaks one API and takes no "api"`,
      );
    }
    if (args !== undefined && (!Array.isArray(args) || args.some((a) => typeof a !== "string"))) {
      throw new ConfigError(`harness.args of "${this.id}" must be a list of strings`);
    }
    const install = this.options.install;
    if (install !== undefined && install !== "image" && install !== "archive") {
      throw new ConfigError(
        `harness.install of "${this.id}" must be "image" or "archive", not ${
          JSON.stringify(install)
        }`,
      );
    }
    return this;
  }

  /**
   * The task's image with the CLI (and Node.js, for a Node program) baked in, built once per
   * base image id and bundle versions and reused by later rollouts and runs. A failed build
   * is warned about once and the CLI is uploaded into each sandbox instead.
   */
  async bakeImage(image: string, options: { signal?: AbortSignal } = {}): Promise<string> {
    if (this.options.install === "archive") return image;
    const bundles = [...this.bundles(), ...(this.nodeMajor ? [NODE_BUNDLE] : [])];
    try {
      return await bakeImage(image, bundles, { signal: options.signal });
    } catch (error) {
      if (options.signal?.aborted) throw error;
      const message = `The ${this.id} harness could not bake its CLI into an image of "${image}" ` +
        `(${error instanceof Error ? error.message : error}); it is uploaded into each sandbox`;
      if (!warned.has(message)) console.warn(message);
      warned.add(message);
      return image;
    }
  }

  get version(): string {
    return this.options.version ?? this.defaultVersion;
  }

  get api(): string {
    return this.options.api ?? this.apis[0] ?? "";
  }

  /** What goes into the sandbox for this version. */
  protected abstract bundles(): Bundle[];

  /** The command line, environment and config files for one rollout. */
  protected abstract launch(
    ctx: HarnessContext,
    route: GatewayRoute,
    model: string,
  ): Promise<CliLaunch> | CliLaunch;

  /** The CLI's own numbers from its report (its stdout); none by default. */
  protected report(_stdout: string): Record<string, number> {
    return {};
  }

  /**
   * Where session `n` of the rollout keeps its report: a task whose user turns start fresh
   * sessions (Harbor's steps) runs the CLI once per turn, and each run's report is kept.
   */
  #out(n: number): string {
    return n === 0 ? `${CLI_DIR}/${this.id}.out` : `${CLI_DIR}/${this.id}.${n}.out`;
  }

  /** The rollout's runs of this CLI so far (each leaves one tool call named after it). */
  #sessions(ctx: HarnessContext): number {
    return ctx.recorder.tool_calls.filter((c) => c.name === this.id).length;
  }

  async run(ctx: HarnessContext): Promise<void> {
    const route = ctx.gateway;
    if (!route) {
      throw new ConfigError(
        `The ${this.id} harness needs a route from the sandbox to the model gateway, which the ` +
          `${ctx.runtime.type} runtime does not provide; use docker`,
      );
    }
    await installBundles(ctx.runtime, this.bundles(), { signal: ctx.signal });
    const launch = await this.launch(ctx, route, this.options.model ?? ctx.model);
    for (const [path, text] of Object.entries(launch.files ?? {})) {
      await ctx.runtime.write(path, text);
    }
    // The agent user (if any) owns its config and home.
    await ctx.runtime.run(["sh", "-c", `mkdir -p ${CLI_DIR} && chmod -R a+rwX ${CLI_DIR}`]);
    const argv = [...launch.argv, ...(this.options.args ?? [])].map(shellQuote).join(" ");
    // The report is kept for metrics() and still shown as the program's output on the trace.
    const out = this.#out(this.#sessions(ctx));
    const path = launch.path?.length
      ? `export PATH=${launch.path.map(shellQuote).join(":")}:"$PATH"; `
      : "";
    const script = `${path}${argv} "$VF_INSTRUCTION" < /dev/null > ${out} 2> ${out}.err; rc=$?; ` +
      `cat ${out}; cat ${out}.err >&2; exit $rc`;
    const program = new ProgramHarness({
      command: ["sh", "-c", script],
      env: { ...launch.env, ...(this.options.env ?? {}) },
      forward_env: this.options.forward_env,
      timeout: this.options.timeout,
    });
    await program.run(ctx);
    const record = ctx.recorder.tool_calls.findLast((c) => c.name === "program");
    if (record) record.name = this.id;
  }

  /** The CLI's own numbers, summed over the rollout's runs of it. */
  async metrics(ctx: HarnessContext): Promise<Record<string, number>> {
    const out: Record<string, number> = {};
    for (let n = 0; n < Math.max(1, this.#sessions(ctx)); n++) {
      let text: string;
      try {
        text = new TextDecoder().decode(
          await ctx.runtime.read(this.#out(n), { maxBytes: 8 << 20 }),
        );
      } catch {
        continue;
      }
      for (const [k, v] of Object.entries(this.report(text))) {
        const key = `${this.id}/${k}`;
        if (Number.isFinite(v)) out[key] = (out[key] ?? 0) + v;
      }
    }
    return out;
  }
}

/** Each JSON object of a JSON-lines report (lines that are not JSON are skipped). */
export function jsonLines(text: string): Record<string, unknown>[] {
  const out: Record<string, unknown>[] = [];
  for (const line of text.split("\n")) {
    const t = line.trim();
    if (!t.startsWith("{")) continue;
    try {
      out.push(JSON.parse(t));
    } catch { /* a line of something else */ }
  }
  return out;
}
