/**
 * `DOCKER_HOST` values: where the engine listens (a unix socket, `tcp://` with or without
 * TLS, or `ssh://`).
 * @module
 */

import process from "node:process";
import { SandboxUnavailableError } from "../errors.ts";
import { parseSshTarget } from "./ssh_dial.ts";

/** The socket used when `DOCKER_HOST` is not set. */
export const DEFAULT_DOCKER_SOCKET = "/var/run/docker.sock";

/** Where the engine listens. */
export interface DockerEndpoint {
  /** Unix socket path, or undefined for TCP and SSH. */
  socketPath?: string;
  /** Origin used in request URLs (`http://localhost` for unix sockets and SSH). */
  origin: string;
  /** How to name the endpoint in messages: the socket path, `tcp://host:port` or the ssh URL. */
  display: string;
  /** Set for `ssh://` hosts. */
  ssh?: { user: string; host: string; port: number };
  /** True for `tcp://` with TLS. */
  tls?: boolean;
}

/**
 * Parses a `DOCKER_HOST` value (`unix:///path`, `tcp://host:port`, `http://host:port`,
 * `https://host:port`, `ssh://[user@]host[:port]`).
 * @param host the value; default the local socket
 * @param options.tls use TLS for `tcp://` (what `DOCKER_TLS_VERIFY` asks for)
 */
export function parseDockerHost(
  host: string | undefined,
  options: { tls?: boolean } = {},
): DockerEndpoint {
  const value = host?.trim() || `unix://${DEFAULT_DOCKER_SOCKET}`;
  if (value.startsWith("unix://")) {
    const socketPath = value.slice("unix://".length);
    return { socketPath, origin: "http://localhost", display: socketPath };
  }
  if (value.startsWith("/")) {
    return { socketPath: value, origin: "http://localhost", display: value };
  }
  if (value.startsWith("ssh://")) {
    const ssh = parseSshTarget(value, process.env.USER || "root");
    const display = `ssh://${ssh.user}@${ssh.host.includes(":") ? `[${ssh.host}]` : ssh.host}${
      ssh.port === 22 ? "" : `:${ssh.port}`
    }`;
    return { origin: "http://localhost", display, ssh };
  }
  const match = /^(tcp|http|https):\/\/([^/]+)\/?$/.exec(value);
  if (match) {
    const tls = match[1] === "https" || (match[1] === "tcp" && options.tls === true);
    return tls
      ? { origin: `https://${match[2]}`, display: `tcp://${match[2]}`, tls: true }
      : { origin: `http://${match[2]}`, display: `tcp://${match[2]}` };
  }
  throw new SandboxUnavailableError(
    `Unsupported DOCKER_HOST "${value}"; use unix:///path/to/docker.sock, tcp://host:port or ` +
      `ssh://user@host`,
  );
}
