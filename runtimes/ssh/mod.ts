/**
 * Hosts over SSH as sandboxes: the runtime, the shared connection pool, and the shell
 * snippets the runtime runs remotely.
 * @module
 */

export {
  loadSsh2,
  SshConnectError,
  SshConnection,
  sshConnections,
  sshConnectionsClosed,
  type SshFailure,
} from "./connection.ts";
export { shellQuote } from "./shell.ts";
export { dedicatedHolderOf, SshRuntime, type SshRuntimeOptions } from "./runtime.ts";
