/**
 * Fast copies of plain JSON-like data, for the per-rollout hot path. `structuredClone` goes
 * through the host's serializer and `JSON.parse(JSON.stringify(v, replacer))` calls the
 * replacer per key; both are several times slower than a walk over the few small objects a
 * rollout holds. Anything that is not plain data falls back to the slow, exact path.
 * @module
 */

const MAX_DEPTH = 100;
const FALLBACK = Symbol("fallback");

function isPlainObject(value: object): boolean {
  const proto = Object.getPrototypeOf(value);
  return proto === Object.prototype || proto === null;
}

function setKey(out: Record<string, unknown>, key: string, value: unknown): void {
  if (key === "__proto__") {
    Object.defineProperty(out, key, {
      value,
      enumerable: true,
      writable: true,
      configurable: true,
    });
  } else out[key] = value;
}

function copy(value: unknown, depth: number): unknown {
  if (typeof value !== "object" || value === null) {
    if (typeof value === "function" || typeof value === "symbol") return structuredClone(value);
    return value;
  }
  if (depth > MAX_DEPTH) throw FALLBACK; // deep or cyclic: let structuredClone handle it
  if (Array.isArray(value)) {
    if (Object.getPrototypeOf(value) !== Array.prototype) return structuredClone(value);
    const out = new Array(value.length);
    for (let i = 0; i < value.length; i++) {
      if (!(i in value)) throw FALLBACK; // keep holes exactly as structuredClone does
      out[i] = copy(value[i], depth + 1);
    }
    return out;
  }
  if (!isPlainObject(value)) return structuredClone(value);
  const out: Record<string, unknown> = {};
  const record = value as Record<string, unknown>;
  // for…in: a plain object inherits no enumerable keys, and it needs no array of keys.
  for (const key in record) setKey(out, key, copy(record[key], depth + 1));
  return out;
}

/**
 * A deep copy equal to `structuredClone(value)` for plain data (objects, arrays,
 * primitives); other objects (Date, Map, class instances, …) are copied by
 * `structuredClone`, and cyclic or very deep values are handed to it whole. Unlike
 * `structuredClone`, an object reached twice is copied twice.
 */
export function copyPlain<T>(value: T): T {
  try {
    return copy(value, 0) as T;
  } catch (error) {
    if (error === FALLBACK) return structuredClone(value);
    throw error;
  }
}

function json(value: unknown, depth: number): unknown {
  switch (typeof value) {
    case "string":
    case "boolean":
      return value;
    case "number":
      return Number.isFinite(value) ? (value === 0 ? 0 : value) : null;
    case "object":
      break;
    default:
      throw FALLBACK; // bigint, undefined, function, symbol: the caller decides
  }
  if (value === null) return null;
  if (depth > MAX_DEPTH) throw FALLBACK;
  if (Array.isArray(value)) {
    if (Object.getPrototypeOf(value) !== Array.prototype) throw FALLBACK;
    const out = new Array(value.length);
    for (let i = 0; i < value.length; i++) {
      const v = value[i];
      out[i] = v === undefined || typeof v === "function" || typeof v === "symbol"
        ? null
        : json(v, depth + 1);
    }
    return out;
  }
  if (!isPlainObject(value)) throw FALLBACK;
  const record = value as Record<string, unknown>;
  if (typeof record.toJSON === "function") throw FALLBACK;
  const out: Record<string, unknown> = {};
  for (const key in record) {
    const v = record[key];
    if (v === undefined || typeof v === "function" || typeof v === "symbol") continue;
    setKey(out, key, json(v, depth + 1));
  }
  return out;
}

/**
 * `JSON.parse(JSON.stringify(value, replacer) ?? "null")`, computed by a direct walk when
 * `value` is plain JSON-like data (the replacer is then never needed); anything else (bigint,
 * class instances, `toJSON`, cycles) takes the exact slow path.
 */
export function jsonCopy(
  value: unknown,
  replacer: (key: string, value: unknown) => unknown,
): unknown {
  if (value === undefined || typeof value === "function" || typeof value === "symbol") return null;
  try {
    return json(value, 0);
  } catch (error) {
    if (error !== FALLBACK) throw error;
    return JSON.parse(JSON.stringify(value, replacer) ?? "null");
  }
}

/**
 * Whether {@link jsonCopy} of `value` would be a deep-equal copy of it: plain objects (of
 * `Object.prototype`, no `toJSON`, no `__proto__` key) and packed arrays of strings, booleans,
 * finite numbers other than -0, null, and such objects and arrays. A caller that owns such a
 * value can keep it instead of copying it.
 */
export function isJsonPlain(value: unknown): boolean {
  return plain(value, 0);
}

function plain(value: unknown, depth: number): boolean {
  switch (typeof value) {
    case "string":
    case "boolean":
      return true;
    case "number":
      return Number.isFinite(value) && !Object.is(value, -0);
    case "object":
      break;
    default:
      return false;
  }
  if (value === null) return true;
  if (depth > MAX_DEPTH) return false;
  if (Array.isArray(value)) {
    if (Object.getPrototypeOf(value) !== Array.prototype) return false;
    for (let i = 0; i < value.length; i++) {
      if (!(i in value) || !plain(value[i], depth + 1)) return false;
    }
    return true;
  }
  if (Object.getPrototypeOf(value) !== Object.prototype) return false;
  const record = value as Record<string, unknown>;
  if (typeof record.toJSON === "function") return false;
  for (const key in record) {
    if (key === "__proto__" || !plain(record[key], depth + 1)) return false;
  }
  return true;
}
