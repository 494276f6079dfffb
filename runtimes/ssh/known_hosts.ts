/**
 * Host-key verification against an OpenSSH known_hosts file, shared by the SSH runtime and
 * the Docker-over-SSH dialer: plain and hashed (`|1|`) host names, `[host]:port` for ports
 * other than 22, `*`/`?` patterns and `!` negation, and `@revoked` keys. `@cert-authority`
 * lines are ignored (host certificates are not supported).
 * @module
 */

import { Buffer } from "node:buffer";
import { createHash, createHmac } from "node:crypto";
import { appendFile, mkdir, readFile } from "node:fs/promises";
import { dirname } from "node:path";

/** The name a host has in known_hosts: `host`, or `[host]:port` when the port is not 22. */
export function knownHostsName(host: string, port: number): string {
  return port === 22 ? host : `[${host}]:${port}`;
}

/** The key type named inside an SSH wire-format public key blob (`ssh-ed25519`, ...). */
export function keyTypeOf(blob: Uint8Array): string {
  const buf = Buffer.from(blob.buffer, blob.byteOffset, blob.byteLength);
  if (buf.length < 4) return "unknown";
  const len = buf.readUInt32BE(0);
  return buf.subarray(4, 4 + len).toString("latin1");
}

/** `SHA256:<base64>` fingerprint of a key blob, as `ssh-keygen -l` prints it. */
export function fingerprint(blob: Uint8Array): string {
  return "SHA256:" + createHash("sha256").update(blob).digest("base64").replace(/=+$/, "");
}

/** What known_hosts says about a host's key. */
export interface HostKeyCheck {
  /** `known`: a line matches; `unknown`: no line names the host; `mismatch`: lines name the host but none has this key; `revoked`: an `@revoked` line has this key. */
  status: "known" | "unknown" | "mismatch" | "revoked";
  /** 1-based line of the matching (or first conflicting) entry. */
  line?: number;
  /** Key types known_hosts holds for the host. */
  knownTypes: string[];
}

function globToRegExp(pattern: string): RegExp {
  const body = pattern.replace(/[.+^${}()|[\]\\]/g, "\\$&").replace(/\*/g, ".*").replace(
    /\?/g,
    ".",
  );
  return new RegExp(`^${body}$`, "i");
}

function hostMatches(field: string, name: string): boolean {
  if (field.startsWith("|1|")) {
    const [, , salt, hash] = field.split("|");
    if (!salt || !hash) return false;
    const mac = createHmac("sha1", Buffer.from(salt, "base64")).update(name).digest("base64");
    return mac === hash;
  }
  let matched = false;
  for (const pattern of field.split(",")) {
    if (pattern.startsWith("!")) {
      if (globToRegExp(pattern.slice(1)).test(name)) return false;
    } else if (globToRegExp(pattern).test(name)) {
      matched = true;
    }
  }
  return matched;
}

/**
 * Checks `keyBlob` (the server's host key) for `host:port` against known_hosts text.
 * @param text known_hosts content
 */
export function checkHostKey(
  text: string,
  host: string,
  port: number,
  keyBlob: Uint8Array,
): HostKeyCheck {
  const name = knownHostsName(host, port);
  const type = keyTypeOf(keyBlob);
  const data = Buffer.from(keyBlob.buffer, keyBlob.byteOffset, keyBlob.byteLength).toString(
    "base64",
  );
  const knownTypes: string[] = [];
  let known: number | undefined;
  let conflict: number | undefined;
  const lines = text.split("\n");
  for (let i = 0; i < lines.length; i++) {
    const line = lines[i].trim();
    if (!line || line.startsWith("#")) continue;
    const fields = line.split(/\s+/);
    let marker: string | undefined;
    if (fields[0].startsWith("@")) marker = fields.shift();
    if (fields.length < 3 || marker === "@cert-authority") continue;
    const [hosts, keyType, keyData] = fields;
    if (!hostMatches(hosts, name)) continue;
    const same = keyType === type && keyData === data;
    if (marker === "@revoked") {
      if (same) return { status: "revoked", line: i + 1, knownTypes };
      continue;
    }
    if (!knownTypes.includes(keyType)) knownTypes.push(keyType);
    if (same) known ??= i + 1;
    else if (keyType === type) conflict ??= i + 1;
  }
  if (known !== undefined) return { status: "known", line: known, knownTypes };
  if (conflict !== undefined) return { status: "mismatch", line: conflict, knownTypes };
  // Keys of other types only: OpenSSH asks for a known type first, and so do we (see
  // hostKeyAlgorithms); a server that still offers another type is treated as a mismatch.
  if (knownTypes.length) return { status: "mismatch", knownTypes };
  return { status: "unknown", knownTypes };
}

/** Reads known_hosts; a missing file is empty. */
export async function readKnownHosts(path: string): Promise<string> {
  try {
    return await readFile(path, "utf8");
  } catch (error) {
    if ((error as { code?: string }).code === "ENOENT") return "";
    throw error;
  }
}

/** Appends the host's key to known_hosts (trust on first use), creating the file 0600. */
export async function addKnownHost(
  path: string,
  host: string,
  port: number,
  keyBlob: Uint8Array,
): Promise<void> {
  await mkdir(dirname(path), { recursive: true, mode: 0o700 });
  const data = Buffer.from(keyBlob.buffer, keyBlob.byteOffset, keyBlob.byteLength).toString(
    "base64",
  );
  const existing = await readKnownHosts(path);
  const prefix = existing && !existing.endsWith("\n") ? "\n" : "";
  await appendFile(
    path,
    `${prefix}${knownHostsName(host, port)} ${keyTypeOf(keyBlob)} ${data}\n`,
    { mode: 0o600 },
  );
}

/** ssh2 host-key algorithm names for known_hosts key types. */
export function hostKeyAlgorithms(knownTypes: string[]): string[] {
  const out: string[] = [];
  for (const type of knownTypes) {
    if (type === "ssh-rsa") out.push("rsa-sha2-512", "rsa-sha2-256", "ssh-rsa");
    else out.push(type);
  }
  return [...new Set(out)];
}

/** `yes`: only keys already in known_hosts; `accept-new`: record unknown hosts' keys; `no`: no checking. */
export type HostKeyChecking = "yes" | "accept-new" | "no";

/** Checks the key a server offers; {@linkcode hostKeyVerifier} makes one. */
export interface HostKeyVerifier {
  /** ssh2's `hostVerifier`: calls `done(true)` to accept the key. */
  verify(key: Uint8Array, done: (ok: boolean) => void): void;
  /** Why the last key was refused (a sentence with the remedy), if it was. */
  rejection(): string | undefined;
}

/**
 * A host-key verifier for ssh2's `hostVerifier` option.
 * @param options.knownHostsFile the known_hosts file
 * @param options.checking default `yes`
 * @param options.acceptNewHint how the caller enables `accept-new`, for the message about
 *   an unknown host (default "set host key checking to accept-new")
 */
export function hostKeyVerifier(
  host: string,
  port: number,
  options: { knownHostsFile: string; checking?: HostKeyChecking; acceptNewHint?: string },
): HostKeyVerifier {
  const { knownHostsFile: file } = options;
  const checking = options.checking ?? "yes";
  const hint = options.acceptNewHint ?? "set host key checking to accept-new";
  const where = knownHostsName(host, port);
  let refused: string | undefined;
  return {
    rejection: () => refused,
    verify(key, done) {
      refused = undefined;
      if (checking === "no") return done(true);
      const offered = `${keyTypeOf(key)} ${fingerprint(key)}`;
      (async () => {
        let text: string;
        try {
          text = await readKnownHosts(file);
        } catch (error) {
          refused = `cannot read known_hosts "${file}": ${error}`;
          return false;
        }
        const check = checkHostKey(text, host, port, key);
        switch (check.status) {
          case "known":
            return true;
          case "revoked":
            refused = `the host key of "${where}" (${offered}) is marked @revoked in ` +
              `"${file}" line ${check.line}; refusing to connect`;
            return false;
          case "mismatch":
            refused = `the host key of "${where}" (${offered}) does not match known_hosts ` +
              `"${file}"${check.line ? ` line ${check.line}` : ""} (someone may be ` +
              `intercepting the connection); if the host was reinstalled, remove the old entry ` +
              `with ssh-keygen -R "${where}" -f "${file}"`;
            return false;
          default:
            if (checking === "accept-new") {
              try {
                await addKnownHost(file, host, port, key);
              } catch (error) {
                refused = `cannot record the host key of "${where}" in "${file}": ${error}`;
                return false;
              }
              return true;
            }
            refused = `the host key of "${where}" (${offered}) is not in known_hosts ` +
              `"${file}"; check the fingerprint, then add it (ssh-keyscan -p ${port} ${host} ` +
              `>> "${file}") or ${hint}`;
            return false;
        }
      })().then(done, (error) => {
        refused = `cannot check the host key of "${where}": ${error}`;
        done(false);
      });
    },
  };
}

/** ssh2 `algorithms.serverHostKey` for a host known_hosts already has keys for, else undefined. */
export async function knownHostKeyAlgorithms(
  file: string,
  host: string,
  port: number,
): Promise<string[] | undefined> {
  const text = await readKnownHosts(file).catch(() => "");
  const check = checkHostKey(text, host, port, new Uint8Array(0));
  return check.knownTypes.length ? hostKeyAlgorithms(check.knownTypes) : undefined;
}
