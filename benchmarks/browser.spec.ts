import { execFileSync } from "node:child_process";
import { writeFileSync } from "node:fs";
import { expect, test } from "@playwright/test";

// Browser training samples/s (Pyodide NumPy in a Web Worker, real windows through the edge)
// as a ratio to the same NumPy trainer under native CPython, measured in the same run.
test("browser training throughput vs native NumPy", async ({ page }, testInfo) => {
  const baseline = (env: Record<string, string>) =>
    JSON.parse(execFileSync(".venv/bin/python", ["-m", "benchmarks.numpy_training"], { env: { ...process.env, ...env } }).toString())
      .samples_per_s as number;
  // the native baselines run first, while nothing else competes for the CPU
  const native = baseline({});
  const nativeOneThread = baseline({ OPENBLAS_NUM_THREADS: "1", OMP_NUM_THREADS: "1" });
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
  const result = {
    browser_samples_per_s: browser,
    native_numpy_samples_per_s: native,
    native_numpy_one_thread_samples_per_s: nativeOneThread,
    ratio: browser / native,
    ratio_one_thread: browser / nativeOneThread,
  };
  console.log(`browser (Pyodide NumPy, one Web Worker): ${browser.toFixed(0)} samples/s`);
  console.log(`native NumPy, same trainer code, all cores: ${native.toFixed(0)} samples/s  ratio ${result.ratio.toFixed(3)}`);
  console.log(`native NumPy, same code, one BLAS thread:   ${nativeOneThread.toFixed(0)} samples/s  ratio ${result.ratio_one_thread.toFixed(3)}`);
  writeFileSync(testInfo.outputPath("browser-benchmark.json"), JSON.stringify(result, null, 2));
});
