/**
 * `vf cleanup`: remove sandboxes vf left behind, by label and from the ledger.
 * @module
 */

import process from "node:process";
import { cleanupContainers } from "../../runtimes/docker/mod.ts";
import { cleanupPods } from "../../runtimes/k8s/mod.ts";
import { cleanupLedger, defaultLedger } from "../../runtimes/ledger.ts";
import { removeDanglingBuilds } from "../services/build.ts";
import { SandboxUnavailableError } from "../../runtimes/errors.ts";
import { describeError } from "../errors.ts";
import { terminalLines, terminalText } from "../util/terminal.ts";
import { parseArgs, parseDuration } from "./args.ts";

const CLEANUP_HELP = `vf cleanup [--run ID] [--older-than 30m] [--force] [--images]
           [--kubernetes [--kubeconfig PATH] [--context NAME] [--namespace NS]]

Remove sandboxes vf left behind: Docker containers labelled vf.managed=1 on DOCKER_HOST,
and every sandbox the local ledger (VF_LEDGER, default ~/.cache/vf/ledger.jsonl) still lists
as live, on every runtime type and host it was created on.

Only sandboxes whose run has ended are removed: each records the process that made it
(host, pid, start time), and a run that is still going keeps its sandboxes. Sandboxes whose
owner cannot be checked (another host, or made by an older vf) are removed only with
--older-than.
  --run ID          only this run's sandboxes
  --older-than D    only sandboxes at least this old (30s, 10m, 2h, 1d); also removes those
                    whose owner cannot be checked
  --force           remove the selected sandboxes whatever their owner, live runs included
                    (asks first on a terminal)
  --images          also remove dangling images of vf's builds (older builds of a task
                    folder whose tag moved on); tagged images stay
  --kubernetes      also delete pods (and their NetworkPolicies) labelled vf.managed=1 in a
                    namespace of a cluster, found by label selector; the cluster is the
                    kubeconfig's (--kubeconfig, default $KUBECONFIG or ~/.kube/config;
                    --context, default its current one), the namespace the context's unless
                    --namespace names one
`;

/** Asks on the terminal; true when the answer starts with y. */
async function confirm(question: string): Promise<boolean> {
  process.stderr.write(question);
  const buf = new Uint8Array(64);
  const n = await new Promise<number>((resolve) => {
    process.stdin.once("data", (chunk: Uint8Array) => {
      buf.set(chunk.subarray(0, 64));
      resolve(chunk.length);
    });
    process.stdin.once("end", () => resolve(0));
  });
  process.stdin.pause();
  return /^\s*y/i.test(new TextDecoder().decode(buf.subarray(0, n)));
}

export async function cmdCleanup(argv: string[]): Promise<number> {
  const flags = parseArgs(argv);
  if (flags.help || flags.h) {
    process.stdout.write(CLEANUP_HELP);
    return 0;
  }
  const runId = flags.run === undefined ? undefined : String(flags.run);
  const older = flags["older-than"] === undefined
    ? undefined
    : parseDuration(String(flags["older-than"]));
  const force = flags.force === true;
  if (force && process.stdin.isTTY) {
    const what = runId ? `run ${terminalText(runId)}'s sandboxes` : "every vf sandbox";
    const ok = await confirm(
      `Remove ${what}${
        older ? ` older than ${terminalText(flags["older-than"])}` : ""
      }, including those of runs still going? [y/N] `,
    );
    if (!ok) {
      process.stderr.write("Nothing removed\n");
      return 1;
    }
  }
  const owners = { force, olderThanMs: older };
  const kept: string[] = [];
  let removed: string[] = [];
  let dockerError: unknown;
  try {
    removed = await cleanupContainers({
      runId,
      olderThanMs: older,
      owners,
      onKept: (id, reason) => kept.push(`container ${id.slice(0, 12)}: ${reason}`),
    });
  } catch (error) {
    // No engine on DOCKER_HOST: the ledger may still reach sandboxes on other hosts and runtimes.
    if (!(error instanceof SandboxUnavailableError)) throw error;
    dockerError = error;
  }
  let pods: string[] = [];
  if (flags.kubernetes === true) {
    const text = (v: unknown) => (v === undefined ? undefined : String(v));
    pods = await cleanupPods({
      kubeconfig: text(flags.kubeconfig),
      context: text(flags.context),
      namespace: text(flags.namespace),
      runId,
      olderThanMs: older,
      owners,
      onKept: (name, reason) => kept.push(`pod ${name}: ${reason}`),
    });
  }
  const ledger = await cleanupLedger({ runId, olderThanMs: older, owners });
  // Docker sandboxes kept by the owner check were reported from their labels already.
  for (const k of ledger.kept) {
    if (k.type !== "docker" || dockerError) kept.push(`${k.type} sandbox ${k.key}: ${k.reason}`);
  }
  process.stdout.write(`removed ${removed.length} container${removed.length === 1 ? "" : "s"}\n`);
  for (const id of removed) process.stdout.write(`  ${terminalText(id.slice(0, 12))}\n`);
  if (flags.kubernetes === true) {
    process.stdout.write(`removed ${pods.length} pod${pods.length === 1 ? "" : "s"}\n`);
    for (const name of pods) process.stdout.write(`  ${terminalText(name)}\n`);
  }
  if (ledger.removed.length) {
    process.stdout.write(
      `removed ${ledger.removed.length} more sandbox${
        ledger.removed.length === 1 ? "" : "es"
      } listed in the ledger\n`,
    );
    for (const key of ledger.removed) process.stdout.write(`  ${terminalText(key)}\n`);
  }
  if (kept.length) {
    process.stdout.write(`kept ${kept.length} sandbox${kept.length === 1 ? "" : "es"}:\n`);
    for (const line of kept) process.stdout.write(`  ${terminalText(line)}\n`);
  }
  if (flags.images === true && !dockerError) {
    const images = await removeDanglingBuilds();
    process.stdout.write(
      `removed ${images.length} dangling build image${images.length === 1 ? "" : "s"}\n`,
    );
    for (const id of images) {
      process.stdout.write(`  ${terminalText(id.replace(/^sha256:/, "").slice(0, 12))}\n`);
    }
  }
  await defaultLedger()?.compact().catch(() => {});
  if (dockerError) {
    process.stderr.write(`warning: docker: ${terminalLines(describeError(dockerError))}\n`);
  }
  for (const f of ledger.failed) {
    process.stderr.write(
      `warning: ${terminalText(f.type)} sandbox "${terminalText(f.key)}" remains: ${
        terminalText(f.error)
      }\n`,
    );
  }
  return ledger.failed.length ? 1 : 0;
}
