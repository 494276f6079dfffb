/**
 * The `opencode` harness: opencode (`opencode run`), its linux binary from the npm package
 * `opencode-linux-x64`. The gateway is a provider `vf` in its own config (`OPENCODE_CONFIG`),
 * through the OpenAI-compatible provider opencode carries in its binary; its fetch of the
 * models.dev catalogue fails offline, and it goes on without it.
 * @module
 */
import type { GatewayRoute } from "../../gateway/gateway.ts";
import type { HarnessContext } from "../harness.ts";
import { AgentCliHarness, CLI_DIR, type CliLaunch, jsonLines } from "./cli_harness.ts";
import { type Bundle, bundleDir } from "./install.ts";

/** opencode in the sandbox, speaking chat completions to the gateway. */
export class OpencodeHarness extends AgentCliHarness {
  readonly id = "opencode";
  readonly defaultVersion = "1.18.33";
  readonly apis = ["chat"] as const;

  protected bundles(): Bundle[] {
    return [{ pkg: "opencode-linux-x64", version: this.version, keep: ["bin/opencode"] }];
  }

  protected launch(_ctx: HarnessContext, route: GatewayRoute, model: string): CliLaunch {
    const path = `${CLI_DIR}/opencode.json`;
    const config = {
      provider: {
        vf: {
          npm: "@ai-sdk/openai-compatible",
          name: "vf",
          options: { baseURL: `${route.url}/v1`, apiKey: "{env:OPENAI_API_KEY}" },
          models: { [model]: { name: model } },
        },
      },
      model: `vf/${model}`,
      autoupdate: false,
      share: "disabled",
      permission: { "*": "allow" },
    };
    return {
      argv: [
        `${bundleDir(this.bundles()[0])}/bin/opencode`,
        "run",
        "--format",
        "json",
        "-m",
        `vf/${model}`,
      ],
      env: {
        OPENCODE_CONFIG: path,
        OPENCODE_DISABLE_AUTOUPDATE: "1",
        OPENCODE_DISABLE_MODELS_FETCH: "1",
        XDG_DATA_HOME: `${CLI_DIR}/opencode-home/data`,
        XDG_CONFIG_HOME: `${CLI_DIR}/opencode-home/config`,
        XDG_CACHE_HOME: `${CLI_DIR}/opencode-home/cache`,
        XDG_STATE_HOME: `${CLI_DIR}/opencode-home/state`,
      },
      files: { [path]: `${JSON.stringify(config, null, 2)}\n` },
    };
  }

  /** Its JSON events: steps and tool uses. */
  protected override report(stdout: string): Record<string, number> {
    const m = { steps: 0, tool_calls: 0 };
    for (const e of jsonLines(stdout)) {
      if (e.type === "step_finish") m.steps++;
      else if (e.type === "tool_use") m.tool_calls++;
    }
    return m;
  }
}
