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

/**
 * The reward: 1 when the runner's last `VF_RESULTS` line reports exactly the expected
 * outputs for `name`, else 0. The exit code is not trusted.
 */
export function gradeOutput(name: string, stdout: string): number {
  const line = stdout.split("\n").reverse().find((l) => l.startsWith("VF_RESULTS "));
  if (!line) return 0;
  let report: { function?: string; outputs?: unknown[]; error?: unknown };
  try {
    report = JSON.parse(line.slice("VF_RESULTS ".length));
  } catch {
    return 0;
  }
  const want = EXPECTED[name];
  if (report.function !== name || report.error || !Array.isArray(report.outputs)) return 0;
  return want !== undefined && JSON.stringify(report.outputs) === JSON.stringify(want) ? 1 : 0;
}
