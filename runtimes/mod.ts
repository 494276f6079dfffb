/**
 * Sandbox runtimes behind one small interface: Docker containers through the Engine API and
 * local subprocesses in a temp dir.
 *
 * @example
 * ```ts
 * import { createRuntime } from "./mod.ts";
 *
 * await using rt = createRuntime({ type: "docker", image: "busybox" }, { runId: "demo" });
 * await rt.start();
 * await rt.write("/app/hello.txt", "hi\n");
 * const { exit_code, stdout } = await rt.run(["cat", "/app/hello.txt"], { timeoutMs: 5_000 });
 * console.log(exit_code, stdout); // 0 "hi\n"
 * ```
 * @module
 */

export {
  createRuntime,
  type DockerRuntimeSpec,
  type RunOptions,
  type RunResult,
  type Runtime,
  RUNTIME_TYPES,
  type RuntimeCapabilities,
  type RuntimeSpec,
  type SubprocessRuntimeSpec,
} from "./runtime.ts";
export {
  CommandTimeoutError,
  SandboxApiError,
  SandboxError,
  SandboxFileNotFoundError,
  SandboxFileTooLargeError,
  SandboxImageError,
  SandboxStateError,
  SandboxUnavailableError,
  SandboxUnsupportedError,
} from "./errors.ts";
export { liveRuntimes, setAppHandlesSignals, stopAllRuntimes } from "./registry.ts";
export {
  cleanupContainers,
  type CleanupFilter,
  DockerEngine,
  DockerRuntime,
  type DockerRuntimeOptions,
} from "./docker/mod.ts";
export { scrubbedEnv, SubprocessRuntime } from "./subprocess.ts";
