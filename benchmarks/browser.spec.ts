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
  // one tab on one worker, then on as many workers as the machine has cores (a window in parts)
  const cores = await page.evaluate(() => navigator.hardwareConcurrency);
  const rate = async (workers: number) => {
    await page.goto("/?experiment=study/mnist/rev-1");
    await page.locator("#cores").selectOption(String(workers));
    await page.locator("#toggle").click();
    const rates: number[] = [];
    let lastWindow = -1;
    await expect
      .poll(
        async () => {
          const status = await page.evaluate(() => (window as any).dtn.status);
          if ((status.windows_done ?? 0) > lastWindow && status.workers === workers) {
            if (lastWindow >= 0) rates.push(status.samples_per_s); // the first window warms up
            lastWindow = status.windows_done;
          }
          return rates.length;
        },
        { timeout: 300_000, intervals: [250] },
      )
      .toBeGreaterThanOrEqual(3);
    return rates.sort((a, b) => a - b)[1];
  };
  const browser = await rate(1);
  const browserAllCores = cores > 1 ? await rate(cores) : browser;
  const result = {
    cores,
    browser_samples_per_s: browser,
    browser_all_cores_samples_per_s: browserAllCores,
    native_numpy_samples_per_s: native,
    native_numpy_one_thread_samples_per_s: nativeOneThread,
    ratio: browserAllCores / native,
    ratio_one_thread: browser / nativeOneThread,
  };
  console.log(`browser (Pyodide NumPy), one Web Worker:        ${browser.toFixed(0)} samples/s`);
  console.log(`browser, ${cores} workers (a window in parts):        ${browserAllCores.toFixed(0)} samples/s`);
  console.log(`native NumPy, same code, all ${cores} cores: ${native.toFixed(0)} samples/s  ratio (${cores} workers) ${result.ratio.toFixed(3)}`);
  console.log(`native NumPy, same code, one BLAS thread: ${nativeOneThread.toFixed(0)} samples/s  ratio (one worker) ${result.ratio_one_thread.toFixed(3)}`);
  writeFileSync(testInfo.outputPath("browser-benchmark.json"), JSON.stringify(result, null, 2));
});

// Start-up on a first visit (nothing cached) and on return visits (the page, Pyodide, NumPy and the
// peer's code from the Service Worker's cache): from "Start contributing" to the first training batch,
// and on a return visit also from the page's load, where the runtime boots while the page is open.
test("cold vs warm start to training", async ({ page }, testInfo) => {
  const phase = () => page.evaluate(() => (window as any).dtn.status.phase ?? "");
  const training = () => expect.poll(phase, { timeout: 120_000, intervals: [50] }).toMatch(/^training window/);
  const clickToTraining = async () => {
    const started = Date.now();
    await page.locator("#toggle").click();
    await training();
    return (Date.now() - started) / 1000;
  };
  await page.goto("/?experiment=study/mnist/rev-1");
  const cold = await clickToTraining();
  const loadToTraining: number[] = [];
  const warm: number[] = [];
  for (let visit = 0; visit < 3; visit++) {
    const loaded = Date.now();
    await page.goto("/?experiment=study/mnist/rev-1&contribute=1"); // starts at once
    await training();
    loadToTraining.push((Date.now() - loaded) / 1000);
    await page.goto("/?experiment=study/mnist/rev-1"); // the page open: the runtime boots before the click
    await expect.poll(phase, { timeout: 60_000 }).toMatch(/^ready/);
    warm.push(await clickToTraining());
  }
  const median = (values: number[]) => [...values].sort((a, b) => a - b)[1];
  console.log(`first visit, click to training: ${cold.toFixed(2)} s`);
  console.log(`return visit, click to training (runtime booted while the page was open), median of 3: ${median(warm).toFixed(2)} s`);
  console.log(`return visit, page load to training (runtime from the cache), median of 3: ${median(loadToTraining).toFixed(2)} s`);
  writeFileSync(
    testInfo.outputPath("start-benchmark.json"),
    JSON.stringify({ cold_click_s: cold, warm_click_s: warm, warm_load_s: loadToTraining }, null, 2),
  );
});

// Each model (the layer set): samples/s in the browser (Pyodide NumPy in a Web Worker) vs the same NumPy
// code natively vs the native JAX trainer, same synthetic batches, in one run.
test("models: browser vs native NumPy vs JAX", async ({ page }, testInfo) => {
  const native = JSON.parse(execFileSync(".venv/bin/python", ["-m", "benchmarks.model_throughput"]).toString());
  await page.goto("/");
  // each model's spec (networks/models.toml) and batch size, as the native run measured it
  const models = Object.entries(native as Record<string, { spec: string; batch_size: number }>).map(
    ([name, { spec, batch_size }]) => [name, spec, batch_size] as [string, string, number],
  );
  const browser = await page.evaluate(async (models: [string, string, number][]) => {
    const worker = new Worker("/static/worker.js");
    const rates: Record<string, number> = {};
    for (const [name, model, batchSize] of models) {
      rates[name] = await new Promise((resolve) => {
        worker.onmessage = ({ data }) => data.type === "benchmark" && resolve(data.samples_per_s);
        worker.postMessage({ type: "benchmark", model, batchSize, steps: 20 });
      });
    }
    worker.terminate();
    return rates;
  }, models);
  for (const [model, rate] of Object.entries(browser)) {
    const { numpy, jax } = native[model];
    console.log(
      `${model}: browser ${rate.toFixed(0)} samples/s, native NumPy ${numpy.toFixed(0)} (browser ${(rate / numpy).toFixed(3)} x), JAX ${jax.toFixed(0)} (browser ${(rate / jax).toFixed(3)} x)`,
    );
  }
  writeFileSync(testInfo.outputPath("models-benchmark.json"), JSON.stringify({ browser, native }, null, 2));
});
