/**
 * `vf view [outputs-dir | run-dir] [--port N]`: the local web viewer of runs.
 * @module
 */
import process from "node:process";
import { existsSync } from "node:fs";
import { resolve } from "node:path";
import { ConfigError } from "../errors.ts";
import { terminalText } from "../util/terminal.ts";
import { findRuns, serveView } from "../view/server.ts";
import { parseArgs } from "./args.ts";

const VIEW_HELP = `vf view [outputs-dir | run-dir] [--port 8400] [--host 127.0.0.1]

Serve a web page of the runs under a folder (default ./outputs): the runs list, each run's
summary, reward histogram and rollouts (filter, sort, page), each rollout's transcript, tool
calls, model calls, sandbox commands, rewards and errors, and a paired comparison of two runs.
A running eval's page follows it as results land. Stop with Ctrl-C.

The page answers only at the address it prints (loopback, or the --host it is bound to) and
only GET requests; run files are shown as text, never run as script.
`;

export async function cmdView(argv: string[]): Promise<number> {
  const flags = parseArgs(argv);
  if (flags.help || flags.h) {
    process.stdout.write(VIEW_HELP);
    return 0;
  }
  const root = resolve(String(flags._[0] ?? "outputs"));
  if (!existsSync(root)) throw new ConfigError(`${root}: no such folder`);
  const port = flags.port === undefined ? 8400 : Number(flags.port);
  if (!Number.isInteger(port) || port < 0 || port > 65535) {
    throw new ConfigError(`--port: "${flags.port}" is not a port number`);
  }
  const runs = findRuns(root);
  if (runs.length === 0) {
    process.stderr.write(
      `No runs under ${
        terminalText(root)
      } yet (no results.jsonl or traces.jsonl); the page lists them as they appear\n`,
    );
  }
  const host = typeof flags.host === "string" ? flags.host : "127.0.0.1";
  const server = await serveView(root, { port, hostname: host });
  if (!isLoopback(host)) {
    // The viewer has no login: on another interface, the network can read the transcripts.
    process.stderr.write(
      `vf view: listening on "${
        terminalText(host)
      }" port ${server.port}, not loopback: anyone who can ` +
        `reach it can read every run under ${
          terminalText(root)
        }; use --host 127.0.0.1 (the default) and ` +
        `an ssh tunnel to view it from elsewhere\n`,
    );
  }
  process.stdout.write(
    `vf view: ${runs.length} run${runs.length === 1 ? "" : "s"} at ${terminalText(server.url)}\n`,
  );
  await new Promise<void>((resolveStop) => {
    const stop = () => resolveStop();
    process.once("SIGINT", stop);
    process.once("SIGTERM", stop);
  });
  await server.close();
  return 0;
}

/** Whether `host` names this machine's loopback interface only. */
function isLoopback(host: string): boolean {
  const h = host.toLowerCase().replace(/^\[|\]$/g, "");
  return h === "localhost" || h === "::1" || /^127\.\d{1,3}\.\d{1,3}\.\d{1,3}$/.test(h);
}
