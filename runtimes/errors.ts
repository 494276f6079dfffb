/**
 * Errors raised by sandbox runtimes. All extend {@linkcode SandboxError} (an `InfraError`),
 * except timeouts, which are `CommandTimeoutError` from `lib/errors.ts`.
 * @module
 */

import { SandboxError } from "../lib/errors.ts";

export { CommandTimeoutError, SandboxError } from "../lib/errors.ts";

/** The sandbox backend (Docker engine, temp dir, remote host) cannot be reached or is gone. */
export class SandboxUnavailableError extends SandboxError {}

/** The runtime is not started yet, or already stopped. */
export class SandboxStateError extends SandboxError {}

/** A path read or archived from the sandbox does not exist. */
export class SandboxFileNotFoundError extends SandboxError {
  /** The path as given by the caller. */
  readonly path: string;
  constructor(path: string, message: string, options?: { cause?: unknown }) {
    super(message, options);
    this.path = path;
  }
}

/** A file is larger than the `maxBytes` the caller allowed. */
export class SandboxFileTooLargeError extends SandboxError {
  /** The path as given by the caller. */
  readonly path: string;
  /** The file's size in bytes. */
  readonly size: number;
  /** The limit the caller gave. */
  readonly maxBytes: number;
  constructor(path: string, size: number, maxBytes: number, where: string) {
    super(
      `File "${path}" in ${where} is ${size} bytes, more than maxBytes ${maxBytes}; ` +
        `raise maxBytes or read a smaller file`,
    );
    this.path = path;
    this.size = size;
    this.maxBytes = maxBytes;
  }
}

/** A container image is not present and cannot be pulled. */
export class SandboxImageError extends SandboxError {
  /** The image reference. */
  readonly image: string;
  constructor(image: string, message: string, options?: { cause?: unknown }) {
    super(message, options);
    this.image = image;
  }
}

/** The sandbox backend answered a request with an error (e.g. the Docker engine's HTTP 500). */
export class SandboxApiError extends SandboxError {
  /** The HTTP status, when there is one. */
  readonly status: number;
  constructor(status: number, message: string, options?: { cause?: unknown }) {
    super(message, options);
    this.status = status;
  }
}

/** The runtime cannot do what was asked (e.g. `user` on the subprocess runtime). */
export class SandboxUnsupportedError extends SandboxError {}
