/**
 * The `qwen-code` harness: Qwen Code (`qwen`, the npm package `@qwen-code/qwen-code`, one
 * bundled script) on Node 22. Its auth type names the API it speaks to the gateway: `openai`
 * (chat completions; `OPENAI_BASE_URL`, `OPENAI_API_KEY`), `openai-responses` or `anthropic`
 * (`ANTHROPIC_BASE_URL`, `ANTHROPIC_API_KEY`), each key the rollout's secret.
 * @module
 */
import type { GatewayRoute } from "../../gateway/gateway.ts";
import type { HarnessContext } from "../harness.ts";
import { AgentCliHarness, CLI_DIR, type CliLaunch } from "./cli_harness.ts";
import { type Bundle, bundleDir, ensureNode } from "./install.ts";

/** Qwen Code in the sandbox, headless (`--yolo`, a JSON result). */
export class QwenCodeHarness extends AgentCliHarness {
  readonly id = "qwen-code";
  readonly defaultVersion = "0.24.4";
  override readonly nodeMajor = 22;
  readonly apis = ["openai", "openai-responses", "anthropic"] as const;

  protected bundles(): Bundle[] {
    return [{ pkg: "@qwen-code/qwen-code", version: this.version }];
  }

  protected async launch(
    ctx: HarnessContext,
    route: GatewayRoute,
    model: string,
  ): Promise<CliLaunch> {
    const node = await ensureNode(ctx.runtime, 22, { signal: ctx.signal });
    const secret = route.session.modelSecret;
    return {
      argv: [
        node,
        `${bundleDir(this.bundles()[0])}/cli-entry.js`,
        "--auth-type",
        this.api,
        "-m",
        model,
        "--yolo",
        "--output-format",
        "json",
      ],
      env: {
        OPENAI_BASE_URL: `${route.url}/v1`,
        OPENAI_API_KEY: secret,
        OPENAI_MODEL: model,
        ANTHROPIC_BASE_URL: route.url,
        ANTHROPIC_API_KEY: secret,
        ANTHROPIC_MODEL: model,
        QWEN_HOME: `${CLI_DIR}/qwen-home`,
      },
    };
  }

  /** Its JSON result: the `result` message's turns, time and usage. */
  protected override report(stdout: string): Record<string, number> {
    let events: unknown;
    try {
      events = JSON.parse(stdout.trim());
    } catch {
      return {};
    }
    const list = Array.isArray(events) ? events : [events];
    const r = list.findLast((e) => (e as { type?: string })?.type === "result") as
      | Record<string, unknown>
      | undefined;
    if (!r) return {};
    const u = (r.usage ?? {}) as Record<string, number>;
    return {
      num_turns: r.num_turns as number,
      duration_api_ms: r.duration_api_ms as number,
      input_tokens: u.input_tokens,
      output_tokens: u.output_tokens,
      is_error: r.is_error ? 1 : 0,
    };
  }
}
