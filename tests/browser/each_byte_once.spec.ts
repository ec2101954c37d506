import { expect, test, type Page } from "@playwright/test";

// Issue 25 in Chromium: a tab downloads each shard once (kept by content in IndexedDB, across a reload)
// and, after a page load's first head, every head as a delta from the head it trained on.
const EXPERIMENT = "study/mnist/rev-1";

type Status = Record<string, any>;
const status = (page: Page): Promise<Status> => page.evaluate(() => (window as any).dtn.status);

async function storedShards(page: Page): Promise<string[]> {
  // the keys of the worker's shard store (IndexedDB "dtn-peer", store "shards": same origin as the page)
  return page.evaluate(
    () =>
      new Promise<string[]>((resolve, reject) => {
        const open = indexedDB.open("dtn-peer");
        open.onerror = () => reject(open.error);
        open.onsuccess = () => {
          const keys = open.result.transaction("shards").objectStore("shards").getAllKeys();
          keys.onsuccess = () => resolve(keys.result as string[]);
          keys.onerror = () => reject(keys.error);
        };
      }),
  );
}

async function contribute(page: Page, windows: number): Promise<Status> {
  // start, train until `windows` are done, stop: no download is under way once it says so
  await page.locator("#toggle").click();
  await expect.poll(async () => (await status(page)).windows_done ?? 0, { timeout: 200_000 }).toBeGreaterThanOrEqual(windows);
  await page.locator("#toggle").click();
  await expect.poll(async () => (await status(page)).phase, { timeout: 60_000 }).toBe("stopped");
  return status(page);
}

test("a tab downloads each shard once, keeps them across a reload, and takes heads as deltas", async ({ page, context }) => {
  test.setTimeout(420_000);
  const shards: string[] = []; // shard ids, one per download
  const heads: string[] = []; // whole head artifacts
  const deltas: string[] = [];
  context.on("request", (request) => {
    const url = new URL(request.url());
    const shard = /\/shards\/([^/?]+)$/.exec(url.pathname);
    if (shard) shards.push(shard[1]);
    else if (url.pathname.startsWith("/v1/artifacts/")) heads.push(url.pathname);
    else if (url.pathname.endsWith("/delta")) deltas.push(url.search);
  });
  await page.goto(`/?experiment=${EXPERIMENT}`);
  await page.locator("#cores").selectOption("1");
  const first = await contribute(page, 4);
  expect(first.head_delta_bytes).toBeGreaterThan(0);
  expect(heads.length).toBe(1); // the first head whole, every later one a delta
  expect(deltas.length).toBeGreaterThanOrEqual(3);
  expect(new Set(shards).size).toBe(shards.length); // no shard downloaded twice
  expect(first.shard_downloads).toBe(shards.length);
  const kept = await storedShards(page);
  expect(kept.length).toBe(shards.length); // every shard downloaded is in IndexedDB, by content

  await page.reload(); // a new page load: the shards stay, the last head does not
  await page.locator("#cores").selectOption("1");
  const again = await contribute(page, first.windows_done + 3);
  expect(new Set(shards).size).toBe(shards.length);
  expect(heads.length).toBe(2);
  expect(again.head_delta_bytes).toBeGreaterThan(0);
  expect(await storedShards(page)).toEqual(expect.arrayContaining(kept));
});
