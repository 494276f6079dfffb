/**
 * The private grader of py-grader. Two halves, so that nothing a solution does inside the
 * grading sandbox can fake a pass:
 *
 * - {@linkcode PRIVATE_TESTS}, staged only into the grading sandbox by `stageVerifier` (the
 *   agent never sees it), imports the solution and prints what the function returns for the
 *   test inputs, as one `VF_RESULTS {...}` JSON line. It knows the inputs, not the answers.
 * - {@linkcode EXPECTED} never enters a sandbox: the reward compares the printed outputs with it
 *   in the evaluator. A solution that exits at import (`os._exit(0)`, `sys.exit(0)`) prints
 *   no results and scores 0, whatever the exit code; one that prints results must compute
 *   them, which is the task.
 *
 * Kept as a module so a compiled binary embeds it.
 */

/** The test inputs per function (also written into the runner below). */
export const INPUTS: Record<string, unknown[][]> = {
  add: [[2, 3], [-1, 1], [10 ** 12, 1]],
  reverse_words: [["hello world"], ["a b c"], ["single"]],
  is_prime: [[2], [15], [97], [1], [0]],
  fizzbuzz: [[3], [5], [15], [7]],
};

/** What each call must return; only the evaluator holds these. */
export const EXPECTED: Record<string, unknown[]> = {
  add: [5, 0, 10 ** 12 + 1],
  reverse_words: ["world hello", "c b a", "single"],
  is_prime: [true, false, true, false, false],
  fizzbuzz: ["Fizz", "Buzz", "FizzBuzz", "7"],
};

export const PRIVATE_TESTS = `import importlib.util, json, sys

INPUTS = json.loads(${JSON.stringify(JSON.stringify(INPUTS))})
name = sys.argv[1]

def report(outputs, error=None):
    print("VF_RESULTS " + json.dumps({"function": name, "outputs": outputs, "error": error}))
    sys.stdout.flush()

spec = importlib.util.spec_from_file_location("solution", "/app/solution.py")
mod = importlib.util.module_from_spec(spec)
try:
    spec.loader.exec_module(mod)
except BaseException as e:  # SystemExit at import is a failure too
    report([], "cannot import solution: " + repr(e))
    sys.exit(2)

fn = getattr(mod, name, None)
if fn is None:
    report([], "missing function " + name)
    sys.exit(1)
outputs = []
for args in INPUTS[name]:
    try:
        got = fn(*args)
        json.dumps(got)
    except BaseException as e:
        got = {"raised": repr(e)}
    outputs.append(got)
report(outputs)
`;

/** A value as Python's repr() shows it (for the messages). */
function pyRepr(value: unknown): string {
  if (typeof value === "string") {
    return `'${value.replaceAll("\\", "\\\\").replaceAll("'", "\\'")}'`;
  }
  if (typeof value === "boolean") return value ? "True" : "False";
  if (value === null) return "None";
  if (typeof value === "object" && value && "raised" in value) {
    return `raised ${(value as { raised: unknown }).raised}`;
  }
  return String(value);
}

/**
 * Grades the runner's last `VF_RESULTS` line against the expected outputs for `name`: reward 1
 * when every call returned what it should, else 0, with a summary for the trace (`3/3 passed`,
 * or one line per wrong call). The exit code is not trusted.
 */
export function gradeOutput(name: string, stdout: string): { reward: number; summary: string } {
  const line = stdout.split("\n").reverse().find((l) => l.startsWith("VF_RESULTS "));
  if (!line) return { reward: 0, summary: "no results were reported" };
  let report: { function?: string; outputs?: unknown[]; error?: unknown };
  try {
    report = JSON.parse(line.slice("VF_RESULTS ".length));
  } catch {
    return { reward: 0, summary: "the results line is not JSON" };
  }
  const want = EXPECTED[name];
  const inputs = INPUTS[name];
  if (!want || !inputs) return { reward: 0, summary: `unknown function ${name}` };
  if (report.function !== name) return { reward: 0, summary: "results for another function" };
  if (report.error) return { reward: 0, summary: String(report.error) };
  const outputs = Array.isArray(report.outputs) ? report.outputs : [];
  const wrong: string[] = [];
  want.forEach((expected, i) => {
    const got = outputs[i];
    if (JSON.stringify(got) !== JSON.stringify(expected)) {
      const args = inputs[i].map(pyRepr).join(", ") + (inputs[i].length === 1 ? "," : "");
      wrong.push(`${name}(${args}): got ${pyRepr(got)}, want ${pyRepr(expected)}`);
    }
  });
  const passed = want.length - wrong.length;
  return {
    reward: wrong.length === 0 && outputs.length === want.length ? 1 : 0,
    summary: [...wrong, `${passed}/${want.length} passed`].join("\n"),
  };
}
