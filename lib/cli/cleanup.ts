/**
 * `vf cleanup`: remove sandboxes vf left behind, by label and from the ledger.
 * @module
 */

import process from "node:process";
import { cleanupContainers } from "../../runtimes/docker/mod.ts";
import { cleanupLedger, defaultLedger } from "../../runtimes/ledger.ts";
import { SandboxUnavailableError } from "../../runtimes/errors.ts";
import { describeError } from "../errors.ts";
import { parseArgs, parseDuration } from "./args.ts";

export async function cmdCleanup(argv: string[]): Promise<number> {
  const flags = parseArgs(argv);
  if (flags.help || flags.h) {
    process.stdout.write(
      "vf cleanup [--run ID] [--older-than 30m]\n\nRemove sandboxes vf left behind: Docker containers labelled vf.managed=1 on\n" +
        "DOCKER_HOST, and every sandbox the local ledger (VF_LEDGER, default ~/.cache/vf/ledger.jsonl)\n" +
        "still lists as live, on every runtime type and host it was created on.\n",
    );
    return 0;
  }
  const runId = flags.run === undefined ? undefined : String(flags.run);
  const older = flags["older-than"] === undefined
    ? undefined
    : parseDuration(String(flags["older-than"]));
  let removed: string[] = [];
  let dockerError: unknown;
  try {
    removed = await cleanupContainers({ runId, olderThanMs: older });
  } catch (error) {
    // No engine on DOCKER_HOST: the ledger may still reach sandboxes on other hosts and runtimes.
    if (!(error instanceof SandboxUnavailableError)) throw error;
    dockerError = error;
  }
  const ledger = await cleanupLedger({ runId, olderThanMs: older });
  process.stdout.write(`removed ${removed.length} container${removed.length === 1 ? "" : "s"}\n`);
  for (const id of removed) process.stdout.write(`  ${id.slice(0, 12)}\n`);
  if (ledger.removed.length) {
    process.stdout.write(
      `removed ${ledger.removed.length} more sandbox${
        ledger.removed.length === 1 ? "" : "es"
      } listed in the ledger\n`,
    );
    for (const key of ledger.removed) process.stdout.write(`  ${key}\n`);
  }
  await defaultLedger()?.compact().catch(() => {});
  if (dockerError) process.stderr.write(`warning: docker: ${describeError(dockerError)}\n`);
  for (const f of ledger.failed) {
    process.stderr.write(`warning: ${f.type} sandbox "${f.key}" remains: ${f.error}\n`);
  }
  return ledger.failed.length ? 1 : 0;
}
