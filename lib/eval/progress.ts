/**
 * Progress display for long runs (a live line on a TTY, plain lines otherwise) and the
 * end-of-run summary table.
 * @module
 */
import type { Progress } from "./evaluate.ts";
import { isUnscoredOutput, type RunMetadata } from "./results.ts";
import type { RolloutOutput } from "../state.ts";

/** Where progress and summaries are written. */
export interface Output {
  write(text: string): void;
  isTTY: boolean;
}

function fmtDuration(ms: number): string {
  if (!Number.isFinite(ms)) return "?";
  const s = Math.round(ms / 1000);
  if (s < 60) return `${s}s`;
  const m = Math.floor(s / 60);
  return m < 60 ? `${m}m${String(s % 60).padStart(2, "0")}s` : `${Math.floor(m / 60)}h${m % 60}m`;
}

/** Renders progress events: redrawn in place on a TTY, one line per ~10% otherwise. */
export class ProgressDisplay {
  #out: Output;
  #label: string;
  #lastPlain = -1;
  #lastLen = 0;

  #suffix: (() => string) | undefined;

  /** @param suffix more to show at the end of each line (the adaptive limit, say) */
  constructor(out: Output, label: string, suffix?: () => string) {
    this.#out = out;
    this.#label = label;
    this.#suffix = suffix;
  }

  /** Render one progress event. */
  update(p: Progress): void {
    const rate = p.elapsedMs > 0 ? (p.done / p.elapsedMs) * 1000 : 0;
    const eta = rate > 0 ? ((p.total - p.done) / rate) * 1000 : Infinity;
    const frac = p.total ? p.done / p.total : 1;
    const stats = `${p.done}/${p.total} ${rate.toFixed(1)}/s ETA ${fmtDuration(eta)} reward ${
      p.avgReward.toFixed(3)
    }${p.errors ? ` errors ${p.errors}` : ""}${this.#suffix?.() ?? ""}`;
    if (this.#out.isTTY) {
      const width = 24;
      const filled = Math.round(frac * width);
      const bar = "█".repeat(filled) + "░".repeat(width - filled);
      const line = `${this.#label} ${bar} ${stats}`;
      this.#out.write(`\r${line}${" ".repeat(Math.max(0, this.#lastLen - line.length))}`);
      this.#lastLen = line.length;
    } else {
      const step = Math.floor(frac * 10);
      if (step !== this.#lastPlain) {
        this.#lastPlain = step;
        this.#out.write(`${this.#label} ${stats}\n`);
      }
    }
  }

  /** End the live line. */
  finish(): void {
    if (this.#out.isTTY && this.#lastLen) this.#out.write("\n");
    this.#lastLen = 0;
  }
}

function mean(xs: number[]): number {
  return xs.length ? xs.reduce((a, b) => a + b, 0) / xs.length : 0;
}

function std(xs: number[]): number {
  if (xs.length < 2) return 0;
  const m = mean(xs);
  return Math.sqrt(mean(xs.map((x) => (x - m) ** 2)));
}

function table(rows: string[][]): string {
  const widths = rows[0].map((_, c) => Math.max(...rows.map((r) => r[c].length)));
  return rows.map((r) => r.map((cell, c) => cell.padEnd(widths[c])).join("  ").trimEnd()).join(
    "\n",
  );
}

/** The end-of-run summary: reward, metrics, pass@k, tokens, stop conditions, errors. */
export function renderSummary(metadata: RunMetadata, outputs: RolloutOutput[]): string {
  const lines: string[] = [];
  lines.push(
    `env ${metadata.env_id}  model ${metadata.model}  examples ${metadata.num_examples}  ` +
      `rollouts/example ${metadata.rollouts_per_example}  rollouts ${metadata.num_rollouts}  ` +
      `time ${fmtDuration(metadata.time_ms)}`,
  );
  const scored = outputs.filter((o) => !isUnscoredOutput(o));
  const rewards = scored.map((o) => o.reward);
  const rows: string[][] = [["", "mean", "std"]];
  rows.push([
    "reward",
    metadata.avg_reward === null ? "n/a" : metadata.avg_reward.toFixed(4),
    rewards.length ? std(rewards).toFixed(4) : "n/a",
  ]);
  for (const [name, avg] of Object.entries(metadata.avg_metrics)) {
    const xs = scored.map((o) => o.metrics?.[name]).filter((v): v is number =>
      typeof v === "number"
    );
    rows.push([name, avg.toFixed(4), std(xs).toFixed(4)]);
  }
  lines.push(table(rows));
  const ks = Object.keys(metadata.pass_at_k);
  if (ks.length) {
    lines.push(table([
      ["k", ...ks],
      ["pass@k", ...ks.map((k) => metadata.pass_at_k[k].toFixed(3))],
      ["pass^k", ...ks.map((k) => metadata.pass_all_k[k].toFixed(3))],
    ]));
  }
  if (metadata.usage) {
    lines.push(
      `tokens: input ${metadata.usage.total_input_tokens} (mean ${
        metadata.usage.input_tokens.toFixed(1)
      }), output ${metadata.usage.total_output_tokens} (mean ${
        metadata.usage.output_tokens.toFixed(1)
      })`,
    );
  }
  const stops = new Map<string, number>();
  for (const o of outputs) {
    stops.set(o.stop_condition ?? "none", (stops.get(o.stop_condition ?? "none") ?? 0) + 1);
  }
  if (stops.size) {
    lines.push(`stop conditions: ${[...stops].map(([k, v]) => `${k} ${v}`).join(", ")}`);
  }
  const errors = outputs.filter((o) => o.error);
  lines.push(
    `errors: ${errors.length} of ${outputs.length} (${(metadata.avg_error * 100).toFixed(1)}%)` +
      (metadata.num_unscored
        ? `, ${metadata.num_unscored} never scored and left out of the reward and pass@k`
        : ""),
  );
  const kinds = new Map<string, number>();
  for (const o of errors) {
    const key = `${o.error!.error}: ${o.error!.message.slice(0, 100)}`;
    kinds.set(key, (kinds.get(key) ?? 0) + 1);
  }
  for (const [k, v] of [...kinds].slice(0, 5)) lines.push(`  ${v} × ${k}`);
  const retried = outputs.filter((o) => Number(o.model_retries ?? 0) > 0).length;
  if (metadata.num_model_retries > 0) {
    lines.push(
      `model retries: ${metadata.num_model_retries} (in ${retried} of ${outputs.length} rollouts)`,
    );
  }
  return lines.join("\n");
}
