import { execFileSync } from "node:child_process";
import { writeFileSync } from "node:fs";
import { expect, test } from "@playwright/test";

// Browser training samples/s (Pyodide NumPy in a Web Worker, real windows through the edge)
// as a ratio to the same NumPy trainer under native CPython, measured in the same run.
test("browser training throughput vs native NumPy", async ({ page }, testInfo) => {
  await page.goto("/?experiment=study/mnist/rev-1");
  await page.locator("#toggle").click();
  const rates: number[] = [];
  let lastWindow = 0;
  await expect
    .poll(
      async () => {
        const status = await page.evaluate(() => (window as any).dtn.status);
        if ((status.windows_done ?? 0) > lastWindow) {
          lastWindow = status.windows_done;
          if (lastWindow > 1) rates.push(status.samples_per_s); // window 1 warms up
        }
        return rates.length;
      },
      { timeout: 200_000, intervals: [250] },
    )
    .toBeGreaterThanOrEqual(3);
  const browser = rates.sort((a, b) => a - b)[1];
  const native = JSON.parse(execFileSync(".venv/bin/python", ["-m", "benchmarks.numpy_training"]).toString()).samples_per_s;
  const result = { browser_samples_per_s: browser, native_numpy_samples_per_s: native, ratio: browser / native };
  console.log(`browser (Pyodide NumPy, Web Worker): ${browser.toFixed(0)} samples/s`);
  console.log(`native NumPy (same trainer code):    ${native.toFixed(0)} samples/s`);
  console.log(`ratio browser / native: ${(browser / native).toFixed(3)} (goal >= 0.1)`);
  writeFileSync(testInfo.outputPath("browser-benchmark.json"), JSON.stringify(result, null, 2));
});
