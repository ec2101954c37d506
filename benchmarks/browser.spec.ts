import { execFileSync } from "node:child_process";
import { writeFileSync } from "node:fs";
import { expect, test } from "@playwright/test";

// Browser training samples/s (Pyodide in a Web Worker, real windows through the edge), with the WebAssembly
// SIMD kernels and without them (`?kernels=off`: SciPy's BLAS and NumPy's Adam), as ratios to the same
// trainer under native CPython measured in the same run: one worker over the best native run on one BLAS
// thread, all workers over the best native run on those cores with either thread count (multithreaded
// BLAS collapses when the cores are shared). RUNS rounds, each measuring every configuration in turn
// (interleaved: a drift hits all alike).
const RUNS = Number(process.env.DTN_BENCH_RUNS ?? 3);
const MEASURE_S = 5; // seconds of a tab's training per configuration and round

test("browser training throughput vs native NumPy", async ({ page }, testInfo) => {
  test.setTimeout(RUNS * 600_000);
  const baseline = (env: Record<string, string>) =>
    JSON.parse(execFileSync(".venv/bin/python", ["-m", "benchmarks.numpy_training"], { env: { ...process.env, ...env } }).toString())
      .samples_per_s as number;
  const oneThread = { OPENBLAS_NUM_THREADS: "1", OMP_NUM_THREADS: "1" };
  // one tab on one worker, then on as many workers as the machine has cores (a window in parts)
  const cores = await page.evaluate(() => navigator.hardwareConcurrency);
  // a tab's rate: examples over training seconds (its own accounting, browser_peer/costs.py: the window's
  // parts, their transfers and averaging included; waiting for heads and leases not) over MEASURE_S
  // seconds of training, once two windows ran on all its workers (its lease has grown to the window)
  const computes = new Set<string>(); // the trainer's paths measured, as the page names them
  const rate = async (workers: number, kernels: boolean) => {
    await page.goto(`/?experiment=study/mnist/rev-1${kernels ? "" : "&kernels=off"}`);
    await page.locator("#cores").selectOption(String(workers));
    await page.locator("#toggle").click();
    const status = () => page.evaluate(() => (window as any).dtn.status);
    let firstFull = -1;
    await expect
      .poll(
        async () => {
          const now = await status();
          if (now.workers === workers && firstFull < 0) firstFull = now.windows_done;
          return firstFull < 0 ? 0 : now.windows_done - firstFull;
        },
        { timeout: 300_000, intervals: [250] },
      )
      .toBeGreaterThanOrEqual(2);
    const from = await status();
    await expect
      .poll(async () => (await status()).training_s - from.training_s, { timeout: 300_000, intervals: [250] })
      .toBeGreaterThanOrEqual(MEASURE_S);
    const to = await status();
    expect(to.compute.startsWith("wasm-simd")).toBe(kernels); // the path measured is the path named
    computes.add(to.compute);
    expect(to.workers).toBe(workers);
    return (to.trained_examples - from.trained_examples) / (to.training_s - from.training_s);
  };
  const configurations = { kernels: [1, true], numpy: [1, false], kernels_all_cores: [cores, true], numpy_all_cores: [cores, false] } as const;
  const runs: Record<string, number>[] = [];
  for (let run = 0; run < RUNS; run++) {
    // the native baselines first in each round, while nothing else competes for the CPU
    const measured: Record<string, number> = { native: baseline({}), native_one_thread: baseline(oneThread) };
    for (const [name, [workers, kernels]] of Object.entries(configurations)) {
      if (workers > 1 && cores < 2) continue;
      measured[name] = await rate(workers, kernels);
    }
    runs.push(measured);
  }
  const best = (key: string) => Math.max(...runs.map((r) => r[key]));
  const spread = (values: number[], digits: number) =>
    `${Math.min(...values).toFixed(digits)}–${Math.max(...values).toFixed(digits)}`;
  const oneThreadBest = best("native_one_thread");
  const result = { cores, runs, best_native: Math.max(best("native"), oneThreadBest), best_native_one_thread: oneThreadBest, ratios: {} as Record<string, number[]> };
  console.log(`native NumPy, same trainer code: all ${cores} cores ${spread(runs.map((r) => r.native), 0)}, one BLAS thread ${spread(runs.map((r) => r.native_one_thread), 0)} samples/s (${RUNS} runs; ratios below over the best)`);
  console.log(`best native: one thread ${oneThreadBest.toFixed(0)}, on ${cores} cores ${result.best_native.toFixed(0)} samples/s`);
  for (const name of Object.keys(configurations)) {
    if (!(name in runs[0])) continue;
    const over = name.endsWith("all_cores") ? result.best_native : result.best_native_one_thread;
    const values = runs.map((r) => r[name]);
    result.ratios[name] = values.map((v) => v / over);
    console.log(
      `browser ${name.padEnd(18)} ${spread(values, 0)} samples/s = ${spread(result.ratios[name], 3)} x the best native ${name.endsWith("all_cores") ? `on ${cores} cores` : "thread"}`,
    );
  }
  console.log(`the trainer's paths: ${[...computes].join(", ")}`);
  const speedups = runs.map((r) => r.kernels / r.numpy);
  console.log(`kernels over NumPy path, one worker, same round: ${spread(speedups, 2)} x`);
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
  // with the kernels, then without (`?kernels=off`)
  const inBrowser = (script: string) =>
    page.evaluate(
      async ([script, models]: [string, [string, string, number][]]) => {
        const worker = new Worker(script);
        const rates: Record<string, number> = {};
        for (const [name, model, batchSize] of models) {
          rates[name] = await new Promise((resolve) => {
            worker.onmessage = ({ data }) => data.type === "benchmark" && resolve(data.samples_per_s);
            worker.postMessage({ type: "benchmark", model, batchSize, steps: 20 });
          });
        }
        worker.terminate();
        return rates;
      },
      [script, models] as [string, [string, string, number][]],
    );
  const browser = await inBrowser("/static/worker.js");
  const withoutKernels = await inBrowser("/static/worker.js?kernels=off");
  for (const [model, rate] of Object.entries(browser)) {
    const { numpy, jax } = native[model];
    console.log(
      `${model}: browser ${rate.toFixed(0)} samples/s (without kernels ${withoutKernels[model].toFixed(0)}), native NumPy ${numpy.toFixed(0)} (browser ${(rate / numpy).toFixed(3)} x), JAX ${jax.toFixed(0)} (browser ${(rate / jax).toFixed(3)} x)`,
    );
  }
  writeFileSync(testInfo.outputPath("models-benchmark.json"), JSON.stringify({ browser, without_kernels: withoutKernels, native }, null, 2));
});
