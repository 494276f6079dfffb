/**
 * An MCP tool result as the model sees it. Every content type reaches the model: text as
 * text; images as `image_url` parts (a data URL, as vf messages carry images) when the
 * toolset says the model takes images, else as a line naming the image; embedded resources
 * as their text under a line with their URI (a binary one by URI, type and size); resource
 * links as a line with their URI, name and description; audio as a line naming it. A result
 * with no content but structured content gives that content as JSON.
 * @module
 */
import type { ContentPart } from "../types.ts";

/** One MCP content block (the fields vf reads). */
interface Block {
  type: string;
  text?: string;
  data?: string;
  mimeType?: string;
  uri?: string;
  name?: string;
  title?: string;
  description?: string;
  resource?: { uri?: string; mimeType?: string; text?: string; blob?: string };
}

/** What a tool result gives the model: its text, and parts when it carries images. */
export interface RenderedContent {
  text: string;
  /** Text and image parts in order; only when an image was kept as one. */
  parts?: ContentPart[];
}

/** Decoded bytes of base64 text (its length, without decoding). */
function bytesOf(base64: string): number {
  const pad = base64.endsWith("==") ? 2 : base64.endsWith("=") ? 1 : 0;
  return Math.max(0, Math.floor((base64.length * 3) / 4) - pad);
}

/** Base64 text decoded as UTF-8; undefined when it is not. */
function decoded(base64: string): string | undefined {
  try {
    const bytes = Uint8Array.from(atob(base64), (c) => c.charCodeAt(0));
    return new TextDecoder("utf-8", { fatal: true }).decode(bytes);
  } catch {
    return undefined;
  }
}

function typeOf(mime: string | undefined): string {
  return mime ? ` (${mime})` : "";
}

/**
 * Render MCP content blocks for the model.
 * @param images keep images as `image_url` parts (the model takes images)
 */
export function renderContent(
  result: { content?: unknown; structuredContent?: unknown },
  images = false,
): RenderedContent {
  const blocks = (Array.isArray(result.content) ? result.content : []) as Block[];
  if (!blocks.length && result.structuredContent !== undefined) {
    return { text: JSON.stringify(result.structuredContent) };
  }
  const parts: ContentPart[] = [];
  const lines: string[] = [];
  let hasImage = false;
  const text = (t: string) => {
    lines.push(t);
    parts.push({ type: "text", text: t });
  };
  // An image is named in the text either way; kept as a part, it follows its name.
  const image = (head: string, data: string, mime: string | undefined) => {
    text(`${head}, ${bytesOf(data)} bytes]`);
    if (images && data && mime?.startsWith("image/")) {
      parts.push({ type: "image_url", image_url: { url: `data:${mime};base64,${data}` } });
      hasImage = true;
    }
  };
  for (const b of blocks) {
    switch (b.type) {
      case "text":
        text(b.text ?? "");
        break;
      case "image":
        image(`[image${typeOf(b.mimeType)}`, b.data ?? "", b.mimeType);
        break;
      case "audio":
        text(`[audio${typeOf(b.mimeType)}, ${bytesOf(b.data ?? "")} bytes]`);
        break;
      case "resource": {
        const r = b.resource ?? {};
        const head = `[resource ${r.uri ?? "(no uri)"}${typeOf(r.mimeType)}`;
        if (typeof r.text === "string") text(`${head}]\n${r.text}`);
        else if (r.blob && /^text\/|json|xml|yaml/.test(r.mimeType ?? "") && decoded(r.blob)) {
          text(`${head}]\n${decoded(r.blob)}`);
        } else image(head, r.blob ?? "", r.mimeType);
        break;
      }
      case "resource_link": {
        const name = b.title ?? b.name;
        text(
          `[resource_link ${b.uri ?? "(no uri)"}${name ? ` "${name}"` : ""}${typeOf(b.mimeType)}${
            b.description ? `: ${b.description}` : ""
          }]`,
        );
        break;
      }
      default:
        text(`[${b.type}: ${JSON.stringify(b).slice(0, 500)}]`);
    }
  }
  const flat = lines.join("\n");
  return hasImage ? { text: flat, parts } : { text: flat };
}
