/**
 * A rollout's artifacts: the files a task declares, copied out of the agent's sandbox as tar
 * archives (within `artifact_max_bytes`), and restored into a grading sandbox.
 * @module
 */
import { posix } from "node:path";
import { SandboxFileNotFoundError, SandboxFileTooLargeError } from "../../../runtimes/errors.ts";
import type { Runtime } from "../../../runtimes/runtime.ts";
import { joinTars } from "../../../runtimes/_tar.ts";
import { SandboxError, TaskError } from "../../errors.ts";
import { type Artifact, DEFAULT_ARTIFACT_MAX_BYTES, type Task } from "../task.ts";

/** `path` made absolute against `workdir` (default `/`). */
export function absolute(path: string, workdir: string | undefined): string {
  return posix.isAbsolute(path) ? path : posix.join(workdir ?? "/", path);
}

/** Make workspace paths writable for `agent_user` (setup runs as the default user). */
export async function grantAgentUser(runtime: Runtime, task: Task): Promise<void> {
  const user = task.data.agent_user;
  if (!user) return;
  const paths = new Set<string>();
  if (task.data.workdir) paths.add(task.data.workdir);
  for (const a of task.data.artifacts ?? []) paths.add(absolute(a.source, task.data.workdir));
  paths.add("/logs/artifacts");
  const script = 'for p in "$@"; do mkdir -p "$p" 2>/dev/null || true; chown -R "$0" "$p"; done';
  const r = await runtime.run(["sh", "-c", script, user, ...paths]);
  if (r.exit_code !== 0) {
    throw new TaskError(
      `Cannot make the workspace writable for agent_user "${user}": ${r.stderr.trim()}`,
    );
  }
}

/** Copy declared artifacts (and /logs/artifacts) out of a sandbox. */
export async function collectArtifacts(
  runtime: Runtime,
  task: Task,
): Promise<Map<string, Uint8Array | null>> {
  const out = new Map<string, Uint8Array | null>();
  const limit = task.data.artifact_max_bytes ?? DEFAULT_ARTIFACT_MAX_BYTES;
  let total = 0;
  const declared: Artifact[] = [...(task.data.artifacts ?? []), {
    source: "/logs/artifacts",
    required: false,
  }];
  for (const artifact of declared) {
    const path = absolute(artifact.source, task.data.workdir);
    if (out.has(path)) continue;
    let tar: Uint8Array;
    try {
      // Excluded entries and anything past the remaining budget are never held.
      tar = await runtime.archiveOut(path, {
        maxBytes: limit - total,
        exclude: artifact.exclude ?? [],
      });
    } catch (error) {
      if (error instanceof SandboxFileTooLargeError) {
        throw new TaskError(
          `Artifacts exceed artifact_max_bytes (${limit} bytes) at "${artifact.source}"; ` +
            `exclude files or raise TaskData.artifact_max_bytes`,
        );
      }
      if (error instanceof SandboxFileNotFoundError) {
        if (artifact.required ?? true) {
          // Blame the task only once the sandbox proves it is still there: a sandbox that
          // vanished (removed by another process, its engine restarted) is infrastructure.
          await runtime.run(["true"], { timeoutMs: 30_000 });
          throw new TaskError(
            `Required artifact "${artifact.source}" is missing in the agent sandbox`,
          );
        }
        out.set(path, null);
        continue;
      }
      throw error;
    }
    total += tar.length;
    if (total > limit) {
      throw new TaskError(
        `Artifacts exceed artifact_max_bytes (${limit} bytes) at "${artifact.source}"; ` +
          `exclude files or raise TaskData.artifact_max_bytes`,
      );
    }
    out.set(path, tar);
  }
  return out;
}

/**
 * Restore artifacts into a sandbox, replacing whatever is at those paths: one command clears
 * them and one upload puts every artifact back.
 */
export async function restoreArtifacts(
  runtime: Runtime,
  artifacts: Map<string, Uint8Array | null>,
): Promise<void> {
  const present = [...artifacts].filter((entry): entry is [string, Uint8Array] => !!entry[1]);
  if (present.length === 0) return;
  const paths = present.map(([path]) => path);
  const rm = await runtime.run(["rm", "-rf", "--", ...paths]);
  if (rm.exit_code !== 0) {
    throw new SandboxError(
      `Cannot clear ${paths.map((p) => `"${p}"`).join(", ")} before restoring: ${rm.stderr}`,
    );
  }
  const joined = joinTars(present.map(([path, tar]) => ({ under: posix.dirname(path), tar })));
  await runtime.archiveIn("/", joined);
}
