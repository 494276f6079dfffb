/**
 * ATIF v1.7 documents checked against `lib/harbor/atif.schema.json` (written from Harbor's RFC
 * 0001) with a real JSON Schema validator, plus the cross-value rules of `atifProblems()`.
 * @module
 */
import Ajv from "npm:ajv@8.20.0";
import addFormats from "npm:ajv-formats@3.0.1";
import { atifProblems, type AtifTrajectory } from "../lib/harbor/atif.ts";

const schema = JSON.parse(
  await Deno.readTextFile(new URL("../lib/harbor/atif.schema.json", import.meta.url)),
);
// deno-lint-ignore no-explicit-any
const ajv = new (Ajv as any)({
  allErrors: true,
  strictSchema: true,
  strictTypes: false,
  strictRequired: false,
});
// deno-lint-ignore no-explicit-any
(addFormats as any)(ajv);
const validate = ajv.compile(schema);

/** Every way `doc` breaks ATIF v1.7 (the schema's, then the cross-value rules); [] if none. */
export function atifErrors(doc: unknown): string[] {
  if (!validate(doc)) {
    return (validate.errors as Array<{ instancePath: string; message: string }>).map((e) =>
      `${e.instancePath || "/"}: ${e.message}`
    );
  }
  return atifProblems(doc as AtifTrajectory);
}
