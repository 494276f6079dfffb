/**
 * Sandbox runtimes behind one small interface: Docker containers through the Engine API,
 * hosts over SSH, Prime Intellect sandboxes, and local subprocesses in a temp dir.
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

export type {
  ArchiveOutOptions,
  DockerRuntimeSpec,
  KubernetesRuntimeSpec,
  PrimeRuntimeSpec,
  RunOptions,
  RunResult,
  Runtime,
  RuntimeCapabilities,
  RuntimeSpec,
  RuntimeTraits,
  SshRuntimeSpec,
  SubprocessRuntimeSpec,
  TaskNeeds,
} from "./runtime.ts";
export {
  dedicatedHostOf,
  type RuntimeConfig,
  RuntimeConfigByType,
  RuntimeTable,
  type RuntimeType,
  specOf as runtimeSpecOf,
  traitsOf,
  traitsOfConfig,
  type TypedRuntimeConfig,
} from "./config.ts";
export { createRuntime, RUNTIME_TYPES } from "./create.ts";
export {
  shellQuote,
  SshConnectError,
  SshConnection,
  sshConnections,
  sshConnectionsClosed,
  type SshFailure,
  SshRuntime,
  type SshRuntimeOptions,
} from "./ssh/mod.ts";
export {
  cleanupPrime,
  listPrimeSandboxes,
  PRIME_API_BASE,
  PrimeApi,
  type PrimeApiOptions,
  type PrimeCleanupFilter,
  PrimeRuntime,
  type PrimeRuntimeOptions,
  type PrimeSandbox,
} from "./prime/mod.ts";
export {
  cleanupPods,
  closeKubeClients,
  KubeApiError,
  type KubeCleanupFilter,
  KubeClient,
  KubernetesRuntime,
  type KubernetesRuntimeOptions,
  type KubeTarget,
  type KubeTargetOptions,
  loadKubeTarget,
} from "./k8s/mod.ts";
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
  cleanupDockerLedger,
  type CleanupFilter,
  DockerEngine,
  DockerRuntime,
  type DockerRuntimeOptions,
} from "./docker/mod.ts";
export type { DockerEngineOptions } from "./docker/engine_api.ts";
export type { SshDialOptions } from "./docker/ssh_dial.ts";
export { scrubbedEnv, SubprocessRuntime } from "./subprocess.ts";
export {
  type Cleaner,
  type CleanerResult,
  cleanupLedger,
  defaultLedger,
  Ledger,
  type LedgerCleanupReport,
  type LedgerEntry,
  type LedgerFilter,
  liveEntries,
  type LiveSandbox,
  recordSandbox,
  registerCleaner,
  setDefaultLedger,
} from "./ledger.ts";
export {
  LimitedRuntime,
  type SandboxLimit,
  SandboxLimiter,
  SandboxLimitError,
  SandboxLimits,
  sandboxLimitsFromConfig,
  type SandboxSlot,
  TokenBucket,
} from "./limits.ts";
export {
  type AcquireOptions,
  poolKey,
  type SandboxSource,
  WarmPool,
  type WarmPoolOptions,
  type WarmPoolStats,
} from "./pool.ts";
