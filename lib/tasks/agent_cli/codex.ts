/**
 * The `codex` harness: OpenAI's Codex CLI (`codex exec`), its static linux binary from the
 * npm package `@openai/codex@<version>-linux-x64`. Its provider is vf's gateway, set in its
 * own `config.toml` (`CODEX_HOME`): `model_provider = "vf"` with `wire_api` the chosen API.
 * @module
 */
import type { GatewayRoute } from "../../gateway/gateway.ts";
import type { HarnessContext } from "../harness.ts";
import { AgentCliHarness, CLI_DIR, type CliLaunch, jsonLines } from "./cli_harness.ts";
import { type Bundle, bundleDir } from "./install.ts";

const BIN = "vendor/x86_64-unknown-linux-musl/bin/codex";

function tomlString(s: string): string {
  return JSON.stringify(s);
}

/** Codex CLI in the sandbox, speaking the Responses API (its only wire API) to the gateway. */
export class CodexHarness extends AgentCliHarness {
  readonly id = "codex";
  readonly defaultVersion = "0.171.0";
  readonly apis = ["responses"] as const;

  protected bundles(): Bundle[] {
    return [{
      pkg: "@openai/codex",
      version: `${this.version}-linux-x64`,
      keep: ["vendor/x86_64-unknown-linux-musl/bin", "vendor/x86_64-unknown-linux-musl/codex-path"],
    }];
  }

  protected launch(_ctx: HarnessContext, route: GatewayRoute, model: string): CliLaunch {
    const home = `${CLI_DIR}/codex-home`;
    const dir = bundleDir(this.bundles()[0]);
    const config = [
      `model = ${tomlString(model)}`,
      `model_provider = "vf"`,
      `[model_providers.vf]`,
      `name = "vf"`,
      `base_url = ${tomlString(`${route.url}/v1`)}`,
      `env_key = "OPENAI_API_KEY"`,
      `wire_api = ${tomlString(this.api)}`,
      "",
    ].join("\n");
    return {
      argv: [
        `${dir}/${BIN}`,
        "exec",
        "--json",
        "--skip-git-repo-check",
        "--dangerously-bypass-approvals-and-sandbox",
        "-m",
        model,
      ],
      env: {
        CODEX_HOME: home,
      },
      path: [`${dir}/vendor/x86_64-unknown-linux-musl/codex-path`],
      files: { [`${home}/config.toml`]: config },
    };
  }

  /** `turn.completed` carries each turn's usage; finished items say what it did. */
  protected override report(stdout: string): Record<string, number> {
    const m = { turns: 0, input_tokens: 0, cached_input_tokens: 0, output_tokens: 0, commands: 0 };
    for (const e of jsonLines(stdout)) {
      if (e.type === "turn.completed") {
        m.turns++;
        const u = (e.usage ?? {}) as Record<string, number>;
        m.input_tokens += u.input_tokens ?? 0;
        m.cached_input_tokens += u.cached_input_tokens ?? 0;
        m.output_tokens += u.output_tokens ?? 0;
      } else if (
        e.type === "item.completed" &&
        (e.item as { type?: string })?.type === "command_execution"
      ) {
        m.commands++;
      }
    }
    return m;
  }
}
