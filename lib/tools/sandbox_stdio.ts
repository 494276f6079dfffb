/**
 * An MCP transport to a stdio server running inside a sandbox (a colocated toolset): the
 * server is a process the runtime keeps open ({@link Runtime.spawn}), and messages are
 * newline-delimited JSON-RPC over its stdin and stdout, as MCP's stdio transport defines.
 * @module
 */
import type { Runtime, RuntimeProcess } from "../../runtimes/runtime.ts";
import { InfraError } from "../errors.ts";

// deno-lint-ignore no-explicit-any
type JsonRpcMessage = any;

/** The MCP SDK's `Transport`, implemented over a sandbox process. */
export class SandboxStdioTransport {
  onmessage?: (message: JsonRpcMessage) => void;
  onerror?: (error: Error) => void;
  onclose?: () => void;
  #process: RuntimeProcess | null = null;
  #buffer = "";
  #stderr = "";
  readonly #decoder = new TextDecoder();
  readonly #encoder = new TextEncoder();

  constructor(
    readonly runtime: Runtime,
    readonly argv: string[],
    readonly options: { env?: Record<string, string>; cwd?: string; user?: string } = {},
  ) {}

  async start(): Promise<void> {
    if (!this.runtime.spawn) {
      throw new InfraError(
        `The ${this.runtime.type} runtime cannot keep a process open; a colocated toolset needs docker`,
      );
    }
    this.#process = await this.runtime.spawn(this.argv, {
      ...this.options,
      onStdout: (chunk) => this.#read(chunk),
      onStderr: (chunk) => {
        this.#stderr = (this.#stderr + this.#decoder.decode(chunk)).slice(-2000);
      },
    });
    this.#process.exited.then(() => {
      this.#process = null;
      this.onclose?.();
    });
  }

  /** What the server last wrote to stderr (for errors). */
  get stderr(): string {
    return this.#stderr;
  }

  #read(chunk: Uint8Array): void {
    this.#buffer += this.#decoder.decode(chunk, { stream: true });
    let newline: number;
    while ((newline = this.#buffer.indexOf("\n")) >= 0) {
      const line = this.#buffer.slice(0, newline).replace(/\r$/, "");
      this.#buffer = this.#buffer.slice(newline + 1);
      if (!line.trim()) continue;
      try {
        this.onmessage?.(JSON.parse(line));
      } catch (error) {
        this.onerror?.(
          new Error(`colocated server wrote a line that is not JSON: ${line.slice(0, 200)}`, {
            cause: error,
          }),
        );
      }
    }
  }

  send(message: JsonRpcMessage): Promise<void> {
    if (!this.#process) {
      return Promise.reject(
        new Error(`not connected${this.#stderr ? `: ${this.#stderr.trim()}` : ""}`),
      );
    }
    this.#process.write(this.#encoder.encode(JSON.stringify(message) + "\n"));
    return Promise.resolve();
  }

  async close(): Promise<void> {
    const process = this.#process;
    this.#process = null;
    await process?.kill();
  }
}
