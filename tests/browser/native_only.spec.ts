import { execFileSync } from "node:child_process";
import { expect, test } from "@playwright/test";
import { EXPERIMENT } from "./tabs";

// A native-only experiment (its model is JAX code, a workload: docs/workloads-of-your-own.md) is not for
// a browser: the page shows it to a viewer but never offers it to contribute to (the edge refuses a
// browser its lease too: tests/test_jax_workloads.py). The stack serves spec models only, so its real
// snapshot gets one such experiment added, with the model record `init-network` writes for a workload.
const NATIVE_ONLY = "study/own-mlp/rev-1";
const WORKLOAD = "tests.jax_workloads.pytree_mlp:learner";

function workloadModel(): Record<string, unknown> {
  const code = `import json, sys; from native_peer.workloads import describe
print(json.dumps(describe(sys.argv[1], "own-mlp").to_wire()))`;
  return JSON.parse(execFileSync(".venv/bin/python", ["-c", code, WORKLOAD], { encoding: "utf8" }));
}

test("the page offers a browser every experiment but a native-only one, which viewers still see", async ({ page }) => {
  const model = workloadModel();
  expect(model.workload).toBe(WORKLOAD);
  await page.route("**/portal/snapshot", async (route) => {
    const response = await route.fetch();
    const snapshot = await response.json();
    const real = snapshot.experiments.find((e: any) => e.key === EXPERIMENT);
    snapshot.experiments.push({ ...real, key: NATIVE_ONLY, spec: { ...real.spec, key: NATIVE_ONLY, model } });
    await route.fulfill({ response, json: snapshot });
  });
  await page.goto("/");
  await expect(page.locator(`.head[data-experiment="${NATIVE_ONLY}"]`)).toBeVisible(); // the viewer's card
  const offered = await page.locator("#experiment option").evaluateAll((options) =>
    options.map((o) => (o as HTMLOptionElement).value),
  );
  expect(offered).toContain(EXPERIMENT);
  expect(offered).not.toContain(NATIVE_ONLY);
});
