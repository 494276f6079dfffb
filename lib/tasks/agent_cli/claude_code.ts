/**
 * The `claude-code` harness: Anthropic's Claude Code (`claude -p`), its native linux binary
 * from the npm package `@anthropic-ai/claude-code-linux-x64`. It speaks Anthropic Messages to
 * the gateway through its own variables: `ANTHROPIC_BASE_URL` and `ANTHROPIC_API_KEY` (the
 * rollout's secret), the model for every tier it picks from, nothing sent anywhere else.
 * @module
 */
import type { GatewayRoute } from "../../gateway/gateway.ts";
import type { HarnessContext } from "../harness.ts";
import { AgentCliHarness, CLI_DIR, type CliLaunch, jsonLines } from "./cli_harness.ts";
import { type Bundle, bundleDir } from "./install.ts";

/** Claude Code in the sandbox, its every model call through the gateway's Messages route. */
export class ClaudeCodeHarness extends AgentCliHarness {
  readonly id = "claude-code";
  readonly defaultVersion = "2.1.332";
  readonly apis = ["messages"] as const;

  protected bundles(): Bundle[] {
    return [{
      pkg: "@anthropic-ai/claude-code-linux-x64",
      version: this.version,
      keep: ["claude"],
    }];
  }

  protected launch(_ctx: HarnessContext, route: GatewayRoute, model: string): CliLaunch {
    const secret = route.session.modelSecret;
    return {
      argv: [
        `${bundleDir(this.bundles()[0])}/claude`,
        "-p",
        "--output-format",
        "json",
        "--dangerously-skip-permissions",
        "--model",
        model,
      ],
      env: {
        ANTHROPIC_BASE_URL: route.url,
        ANTHROPIC_API_KEY: secret,
        ANTHROPIC_MODEL: model,
        ANTHROPIC_SMALL_FAST_MODEL: model,
        ANTHROPIC_DEFAULT_HAIKU_MODEL: model,
        ANTHROPIC_DEFAULT_SONNET_MODEL: model,
        ANTHROPIC_DEFAULT_OPUS_MODEL: model,
        CLAUDE_CONFIG_DIR: `${CLI_DIR}/claude-home`,
        CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC: "1",
        DISABLE_AUTOUPDATER: "1",
        DISABLE_TELEMETRY: "1",
        DISABLE_ERROR_REPORTING: "1",
        // A sandbox: permission prompts are skipped even as root.
        IS_SANDBOX: "1",
      },
    };
  }

  /** Its JSON result: turns, API time, tokens and the cost it computes itself. */
  protected override report(stdout: string): Record<string, number> {
    const r = jsonLines(stdout).findLast((e) => e.type === "result");
    if (!r) return {};
    const u = (r.usage ?? {}) as Record<string, number>;
    return {
      num_turns: r.num_turns as number,
      duration_api_ms: r.duration_api_ms as number,
      total_cost_usd: r.total_cost_usd as number,
      input_tokens: u.input_tokens,
      output_tokens: u.output_tokens,
      is_error: r.is_error ? 1 : 0,
    };
  }
}
