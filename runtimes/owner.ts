/**
 * Who owns a sandbox: the vf process that created it, named so another process can tell
 * whether it still runs. `vf cleanup` removes a sandbox on its own only when its owner is
 * gone; a live run's sandboxes are left alone unless `--force`.
 *
 * An owner is the host name, the pid, the process's start time (clock ticks since boot,
 * from `/proc/<pid>/stat`, so a reused pid is not mistaken for the owner) and the boot id
 * (so a pid from before a reboot is not either). Docker containers carry it as labels
 * (`vf.owner.host`, `vf.owner.pid`, `vf.owner.start`, `vf.owner.boot`); ledger lines as
 * `owner`.
 * @module
 */

import { readFileSync } from "node:fs";
import { hostname } from "node:os";
import process from "node:process";

/** The process that created a sandbox. */
export interface SandboxOwner {
  host: string;
  pid: number;
  /** Start time in clock ticks since boot (Linux); absent where /proc is not readable. */
  start?: string;
  /** The kernel's boot id (Linux). */
  boot?: string;
}

/** Whether a sandbox's owner still runs: `unknown` for another host or no owner recorded. */
export type OwnerState = "alive" | "gone" | "unknown";

function readText(path: string): string | undefined {
  try {
    return readFileSync(path, "utf8");
  } catch {
    return undefined;
  }
}

/** Field 22 of /proc/<pid>/stat (after the command name, which may hold spaces). */
function startTicks(pid: number | "self"): string | undefined {
  const stat = readText(`/proc/${pid}/stat`);
  if (stat === undefined) return undefined;
  const fields = stat.slice(stat.lastIndexOf(")") + 2).split(" ");
  return fields[19]; // fields[0] is field 3 (state)
}

function bootId(): string | undefined {
  return readText("/proc/sys/kernel/random/boot_id")?.trim() || undefined;
}

let self: SandboxOwner | undefined;

/** This process, as the owner of the sandboxes it creates. */
export function currentOwner(): SandboxOwner {
  if (!self) {
    self = { host: hostname(), pid: process.pid };
    const start = startTicks("self");
    if (start) self.start = start;
    const boot = bootId();
    if (boot) self.boot = boot;
  }
  return self;
}

/** Whether `owner` still runs, as far as this machine can tell. */
export function ownerState(owner: SandboxOwner | undefined): OwnerState {
  if (!owner || !Number.isInteger(owner.pid) || owner.pid <= 0) return "unknown";
  if (owner.host !== hostname()) return "unknown";
  const boot = bootId();
  if (owner.boot && boot && owner.boot !== boot) return "gone";
  if (owner.start !== undefined) {
    const start = startTicks(owner.pid);
    if (start !== undefined) return start === owner.start ? "alive" : "gone";
    if (readText("/proc/self/stat") !== undefined) return "gone"; // /proc works: no such pid
  }
  try {
    process.kill(owner.pid, 0);
    return "alive";
  } catch (error) {
    return (error as { code?: string }).code === "EPERM" ? "alive" : "gone";
  }
}

/** The owner as container labels. */
export function ownerLabels(owner: SandboxOwner = currentOwner()): Record<string, string> {
  const labels: Record<string, string> = {
    "vf.owner.host": owner.host,
    "vf.owner.pid": String(owner.pid),
  };
  if (owner.start) labels["vf.owner.start"] = owner.start;
  if (owner.boot) labels["vf.owner.boot"] = owner.boot;
  return labels;
}

/** The owner recorded in container labels, if any. */
export function ownerFromLabels(
  labels: Record<string, string> | undefined,
): SandboxOwner | undefined {
  const host = labels?.["vf.owner.host"];
  const pid = Number(labels?.["vf.owner.pid"]);
  if (!host || !Number.isInteger(pid)) return undefined;
  const owner: SandboxOwner = { host, pid };
  if (labels?.["vf.owner.start"]) owner.start = labels["vf.owner.start"];
  if (labels?.["vf.owner.boot"]) owner.boot = labels["vf.owner.boot"];
  return owner;
}

/** How `vf cleanup` treats sandboxes by owner. */
export interface OwnerPolicy {
  /** Remove sandboxes whatever their owner (`vf cleanup --force`). */
  force?: boolean;
  /** Sandboxes whose owner cannot be checked are removed only when at least this old. */
  olderThanMs?: number;
}

/**
 * Why a sandbox is kept under `policy`, or undefined when it may be removed: its owner runs
 * (never removed without `force`), or its owner cannot be checked and it is not older than
 * `olderThanMs`.
 */
export function keepReason(
  owner: SandboxOwner | undefined,
  createdMs: number,
  policy: OwnerPolicy,
): string | undefined {
  if (policy.force) return undefined;
  const state = ownerState(owner);
  if (state === "gone") return undefined;
  if (state === "alive") {
    return `its run is still going (pid ${owner!.pid} on ${
      owner!.host
    }); stop that run, or use --force`;
  }
  if (policy.olderThanMs !== undefined && Date.now() - createdMs >= policy.olderThanMs) {
    return undefined;
  }
  return owner
    ? `its owner (pid ${owner.pid} on ${owner.host}) cannot be checked from here; use --older-than or --force`
    : `it records no owner (made by an older vf); use --older-than or --force`;
}
