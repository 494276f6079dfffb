/**
 * The `pi` harness: pi, the coding agent (`pi`, the npm package
 * `@mariozechner/pi-coding-agent`, installed with its dependencies) on Node 22. The gateway
 * is a provider `vf` in its own `models.json` (`PI_CODING_AGENT_DIR`), speaking the chosen
 * API: `openai-completions`, `openai-responses` or `anthropic-messages`.
 * @module
 */
import type { GatewayRoute } from "../../gateway/gateway.ts";
import type { HarnessContext } from "../harness.ts";
import { AgentCliHarness, CLI_DIR, type CliLaunch, jsonLines } from "./cli_harness.ts";
import { type Bundle, bundleDir, ensureNode } from "./install.ts";

const PKG = "@mariozechner/pi-coding-agent";

/** pi in the sandbox, printing its events as JSON lines. */
export class PiHarness extends AgentCliHarness {
  readonly id = "pi";
  readonly defaultVersion = "0.73.1";
  override readonly nodeMajor = 22;
  readonly apis = ["openai-completions", "openai-responses", "anthropic-messages"] as const;

  protected bundles(): Bundle[] {
    return [{ pkg: PKG, version: this.version, tree: true }];
  }

  protected async launch(
    ctx: HarnessContext,
    route: GatewayRoute,
    model: string,
  ): Promise<CliLaunch> {
    const node = await ensureNode(ctx.runtime, 22, { signal: ctx.signal });
    const dir = `${CLI_DIR}/pi-home`;
    const models = {
      providers: {
        vf: {
          baseUrl: this.api === "anthropic-messages" ? route.url : `${route.url}/v1`,
          api: this.api,
          // The name of the variable holding the rollout's secret, not a key.
          apiKey: "OPENAI_API_KEY",
          compat: { supportsDeveloperRole: false },
          models: [{ id: model }],
        },
      },
    };
    return {
      argv: [
        node,
        `${bundleDir(this.bundles()[0])}/node_modules/${PKG}/dist/cli.js`,
        "--mode",
        "json",
        "--provider",
        "vf",
        "--model",
        model,
        "--no-session",
      ],
      env: {
        PI_CODING_AGENT_DIR: dir,
        PI_OFFLINE: "1",
        PI_SKIP_VERSION_CHECK: "1",
        PI_TELEMETRY: "0",
      },
      files: { [`${dir}/models.json`]: `${JSON.stringify(models, null, 2)}\n` },
    };
  }

  /** Its events: turns, tool runs, and the assistant messages' usage. */
  protected override report(stdout: string): Record<string, number> {
    const m = { turns: 0, tool_calls: 0, tool_errors: 0, input_tokens: 0, output_tokens: 0 };
    for (const e of jsonLines(stdout)) {
      if (e.type === "turn_end") {
        m.turns++;
        const u = (e.message as { usage?: Record<string, number> })?.usage ?? {};
        m.input_tokens += u.input ?? 0;
        m.output_tokens += u.output ?? 0;
      } else if (e.type === "tool_execution_end") {
        m.tool_calls++;
        if (e.isError) m.tool_errors++;
      }
    }
    return m;
  }
}
