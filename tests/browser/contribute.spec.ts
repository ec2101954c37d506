import { expect, test } from "@playwright/test";

const EXPERIMENT = "study/mnist/rev-1";

test.beforeEach(async ({ context, baseURL }) => {
  // Anything not addressed to the local edge is blocked and recorded: the page must not need it.
  const origin = new URL(baseURL!).origin;
  const outside: string[] = [];
  (context as any).outside = outside;
  await context.route(
    (url) => url.origin !== origin,
    (route) => {
      outside.push(route.request().url());
      return route.abort();
    },
  );
});

test("page loads offline: every request stays on the local edge", async ({ page, context }) => {
  const requests: string[] = [];
  context.on("request", (request) => requests.push(request.url()));
  await page.goto("/");
  await expect(page.locator(".head").first()).toBeVisible();
  await expect(page.locator("#experiment option")).toHaveCount(2);
  expect((context as any).outside).toEqual([]);
  expect(requests.length).toBeGreaterThan(2);
});

test("a browser window is trained in a worker, accepted by the validator, and shown by the viewer", async ({
  page,
  context,
}, testInfo) => {
  const requests: string[] = [];
  context.on("request", (request) => requests.push(request.url()));
  await page.goto(`/?experiment=${EXPERIMENT}`);
  await expect(page.locator(`.head[data-experiment="${EXPERIMENT}"]`)).toContainText("window 0");
  await page.locator("#toggle").click();
  await expect
    .poll(async () => page.evaluate(() => (window as any).dtn.status.accepted ?? 0), { timeout: 180_000 })
    .toBeGreaterThanOrEqual(1);
  const status = await page.evaluate(() => (window as any).dtn.status);
  expect(status.windows_done).toBeGreaterThanOrEqual(1);
  expect(status.samples_per_s).toBeGreaterThan(0);
  // Chromium has WebAssembly SIMD and relaxed SIMD: the worker linked the kernels' fused multiply-add
  // build and the trainer uses it (the page says so)
  expect(status.compute).toBe("wasm-simd-fma");
  await expect(page.locator("#compute")).toHaveText("wasm-simd-fma");
  await expect(page.locator("#verdict")).toContainText("accepted");
  // the viewer shows the head that merged the browser's candidate
  await expect(page.locator(`.head[data-experiment="${EXPERIMENT}"]`)).not.toContainText("window 0 ", {
    timeout: 10_000,
  });
  await expect(page.locator("#peers")).toContainText("browser");
  expect(await page.evaluate(() => (window as any).dtn.streaming)).toBe(true); // live event stream is up
  await expect(page.locator("#events")).toContainText("verdict accepted");
  const shardRequests = requests.filter((url) => url.includes("/shards/"));
  expect(shardRequests.length).toBeGreaterThanOrEqual(4);
  for (const url of shardRequests) expect(url).toMatch(/\?lease=lease-[0-9a-f]+$/);
  expect((context as any).outside).toEqual([]);
  // credit from the validator-signed verdicts: this key's own line and its row on the leaderboard
  await expect(page.locator("#credit")).toContainText(/examples accepted in \d+ window/);
  await expect(page.locator("#leaderboard tr.you")).toContainText("(you)");
  const standing = await page.evaluate(() => (window as any).dtn.credit);
  expect(standing.accepted).toBeGreaterThanOrEqual(1);
  // examples are credited for evidence of work on the lease (decision 0020), which an experiment's
  // first window, near chance, may not show: the tab trains on and a later window is credited
  await expect
    .poll(async () => page.evaluate(() => (window as any).dtn.credit?.examples ?? 0), { timeout: 120_000 })
    .toBeGreaterThan(0);
  const screenshot = testInfo.outputPath("contribute-and-viewer.png");
  await page.screenshot({ path: screenshot, fullPage: true });
  await testInfo.attach("contribute-and-viewer", { path: screenshot, contentType: "image/png" });
  // at phone width: one column, nothing wider than the screen
  await page.setViewportSize({ width: 390, height: 844 });
  expect(await page.evaluate(() => document.documentElement.scrollWidth)).toBeLessThanOrEqual(390);
  await expect(page.locator("#toggle")).toBeInViewport();
  const phone = testInfo.outputPath("phone-width.png");
  await page.screenshot({ path: phone, fullPage: true });
  await testInfo.attach("phone-width", { path: phone, contentType: "image/png" });
  // a reload keeps the work: the optimizer's state and the windows done come back from IndexedDB
  const before = await page.evaluate(() => (window as any).dtn.status.windows_done);
  await page.reload();
  await page.locator("#toggle").click();
  await expect.poll(() => page.evaluate(() => (window as any).dtn.status.resumed_steps ?? 0)).toBeGreaterThan(0);
  expect(await page.evaluate(() => (window as any).dtn.status.windows_done)).toBeGreaterThanOrEqual(before);
});

test("return visits start from the Service Worker's checked cache, even while the edge is unreachable", async ({
  page,
  context,
}) => {
  await page.goto(`/?experiment=${EXPERIMENT}`);
  await page.locator("#toggle").click();
  await expect
    .poll(() => page.evaluate(() => (window as any).dtn.status.phase ?? ""), { timeout: 120_000 })
    .toMatch(/^training window/);
  expect(await page.evaluate(() => (window as any).dtn.serviceWorker)).toBe(true);
  const runtime = await (await page.request.get("/v1/peer-runtime")).json();
  const kept = await page.evaluate(async () =>
    (await (await caches.open("dtn-content-v1")).keys()).map((request) => new URL(request.url).pathname),
  );
  // every runtime file the worker loaded, and the bundle, under their current ids
  for (const name of ["pyodide.js", "pyodide.asm.wasm", "python_stdlib.zip", "pyodide-lock.json"]) {
    expect(kept).toContain(`${runtime.pyodide.url}${name}`);
  }
  expect(kept).toContain(runtime.bundle.url);
  expect(kept.some((path: string) => path.includes("numpy-"))).toBe(true);

  // the edge unreachable: the page, Pyodide, NumPy and the peer's code all come from the cache, the
  // peer runs and waits for the edge; back online, it trains
  await context.setOffline(true);
  await page.reload();
  await expect(page.locator("#toggle")).toBeVisible();
  await page.locator("#toggle").click();
  await expect
    .poll(() => page.evaluate(() => (window as any).dtn.status.phase ?? ""), { timeout: 60_000 })
    .toMatch(/^reconnecting in/);
  await context.setOffline(false);
  await expect
    .poll(() => page.evaluate(() => (window as any).dtn.status.phase ?? ""), { timeout: 60_000 })
    .toMatch(/^training window|^window \d+ published|^publishing|^waiting/);
});

test("a good guest: paused on battery and while hidden unless allowed, at the CPU share chosen", async ({ page }) => {
  await page.addInitScript(() => {
    // a laptop unplugged: the Battery Status API says it is not charging
    const battery = Object.assign(new EventTarget(), { charging: false, level: 0.5 });
    (navigator as any).getBattery = async () => battery;
    localStorage.clear();
  });
  const status = () => page.evaluate(() => (window as any).dtn.status);
  await page.goto(`/?experiment=${EXPERIMENT}`);
  await page.locator("#toggle").click();
  await expect.poll(async () => (await status()).phase ?? "", { timeout: 120_000 }).toBe("paused: on battery");
  await page.waitForTimeout(1500);
  expect((await status()).windows_done ?? 0).toBe(0); // nothing leased or trained meanwhile
  await page.locator("#battery").check(); // the person allows it
  await expect.poll(async () => (await status()).phase ?? "", { timeout: 60_000 }).toMatch(/^training window/);
  await page.locator("#share").fill("50");
  await expect.poll(async () => (await status()).cpu_share).toBe(0.5);
  // the tab hidden: paused until it is visible again (or the person allows background training)
  const visibility = (hidden: boolean) =>
    page.evaluate((value) => {
      Object.defineProperty(document, "hidden", { value, configurable: true });
      document.dispatchEvent(new Event("visibilitychange"));
    }, hidden);
  await visibility(true);
  await expect.poll(async () => (await status()).paused).toBe("tab hidden");
  await visibility(false);
  await expect.poll(async () => (await status()).paused ?? null).toBeNull();
  await expect(page.locator("details summary")).toContainText("What this page downloads and sends");
  expect(Number((await page.locator("#downloaded").textContent())?.split(" ")[0])).toBeGreaterThan(1);
  expect(await page.evaluate(() => localStorage.getItem("dtn-share"))).toBe("50"); // remembered for next time
  // whose network: the validators' fingerprints, signed by them, not pinned (no #validators= here)
  await expect(page.locator("#validators")).toContainText(/^1 of 1: [0-9a-f]{16} ✓ \(not pinned\)$/);
  // what it costs: the last window's bytes each way, and the time training, waiting and paused (on battery)
  await expect.poll(async () => (await status()).windows_done ?? 0, { timeout: 120_000 }).toBeGreaterThan(0);
  await expect(page.locator("#window-bytes")).toContainText(/↓ \d+\.\d+ MB · ↑ \d+\.\d+ MB/);
  await expect(page.locator("#time-split")).toContainText(/training [1-9]\d* % · waiting \d+ % · paused [1-9]\d* %/);
});

test("one tab trains on two cores: a window in two parts, one candidate, accepted", async ({ page }) => {
  await page.goto(`/?experiment=${EXPERIMENT}`);
  await page.locator("#cores").selectOption("2");
  await page.locator("#toggle").click();
  // the helper loads its runtime while the first window may train alone; later windows use both
  await expect
    .poll(() => page.evaluate(() => (window as any).dtn.status.workers ?? 0), { timeout: 180_000 })
    .toBe(2);
  const accepted = await page.evaluate(() => (window as any).dtn.status.accepted ?? 0);
  await expect
    .poll(() => page.evaluate(() => (window as any).dtn.status.accepted ?? 0), { timeout: 120_000 })
    .toBeGreaterThan(accepted);
});

test("without the WebAssembly kernels (?kernels=off) the trainer takes its NumPy path, says so, and is accepted", async ({
  page,
}) => {
  await page.goto(`/?experiment=${EXPERIMENT}&kernels=off`);
  await page.locator("#toggle").click();
  await expect
    .poll(() => page.evaluate(() => (window as any).dtn.status.accepted ?? 0), { timeout: 180_000 })
    .toBeGreaterThanOrEqual(1);
  await expect(page.locator("#compute")).toHaveText(/^(blas|numpy) \(kernels off\)$/);
});
