import { expect, type APIRequestContext, type Browser, type Page } from "@playwright/test";

// Tabs for the head-sharing specs (tests/browser/head_sharing.spec.ts, tests/turn/turn.spec.ts): each a
// fresh profile (a context: its own IndexedDB, so its own peer key) on the running stack.
export const EXPERIMENT = "study/mnist/rev-1";

export type Status = Record<string, any>;

export async function tab(browser: Browser, baseURL: string, init?: () => void): Promise<Page> {
  // a fresh profile whose requests must all stay on the local edge
  const context = await browser.newContext({ baseURL });
  const origin = new URL(baseURL).origin;
  await context.route(
    (url) => url.origin !== origin,
    (route) => route.abort(),
  );
  if (init) await context.addInitScript(init);
  const page = await context.newPage();
  await page.goto(`/?experiment=${EXPERIMENT}`);
  return page;
}

export const status = (page: Page): Promise<Status> => page.evaluate(() => (window as any).dtn.status);
export const heads = (page: Page): Promise<Status> => page.evaluate(() => (window as any).dtn.heads);
export const pause = (page: Page) =>
  page.evaluate(() => (window as any).dtn.worker.postMessage({ type: "pause", reason: "holding" }));
export const resume = (page: Page) => page.evaluate(() => (window as any).dtn.worker.postMessage({ type: "resume" }));

export async function standingBy(page: Page): Promise<void> {
  // contributing with the Python runtime booted and the peer started, but paused before its first window:
  // once resumed it asks for the current head at once. A fresh profile boots its runtime only when it
  // starts (10-30 s, more for tabs booting together on 2 busy cores); booted first, the tabs that need
  // a held head ask for it while it is still current.
  // the page resumes its worker when it learns the battery's state (static/app.js, a good guest): once,
  // from the one battery promise a page has, whose first handler is the page's; after it, no resume comes
  await page.evaluate(async () => void (await (navigator as any).getBattery?.()));
  await page.locator("#toggle").click();
  await expect.poll(() => page.evaluate(() => Boolean((window as any).dtn.running))).toBe(true);
  await pause(page); // after the start's own resume, before the runtime is up: the peer starts paused
  await expect.poll(async () => (await status(page)).paused ?? null, { timeout: 120_000 }).toBe("holding");
}

export async function holdingTheHead(page: Page): Promise<Status> {
  // contributing, the current head fetched, verified and announced, then paused mid-window: the head
  // stays current until its window's deadline (60 s after the head on the test stack: lab.stack's
  // held_windows) and this tab keeps serving it. The pause is posted from inside the page on the
  // worker's first "training window" status (every 8 batches; a first lease of 4 shards is about 100),
  // so it lands batches before the window ends: polled from here, a short window could publish first,
  // and the head moved on without this tab.
  await page.locator("#share").fill("10");
  await page.locator("#toggle").click();
  await page.evaluate(async () => {
    const dtn = (window as any).dtn;
    while (!dtn.worker) await new Promise((resolve) => setTimeout(resolve, 5)); // made once the page starts
    dtn.worker.addEventListener("message", function hold(event: MessageEvent) {
      if (event.data.type !== "status" || !/^training window/.test(event.data.status.phase ?? "")) return;
      dtn.worker.removeEventListener("message", hold);
      dtn.worker.postMessage({ type: "pause", reason: "holding" });
    });
  });
  await expect.poll(async () => (await status(page)).paused ?? null, { timeout: 120_000 }).toBe("holding");
  const held = await status(page);
  expect(held.windows_done ?? 0).toBe(0); // paused in its first window, before publishing it
  return held;
}

export async function freshWindow(request: APIRequestContext): Promise<void> {
  // a window no earlier tab holds a lease in: tabs of an earlier test, closed while holding leases they
  // sized to their waits (up to the experiment's 16 shards), may have filled the open window's shards,
  // on its head or ahead on its parent (a tab that published leases the next window at once); those lapse
  // at its deadline (60 s on the test stack) and close it, and until then a newcomer finds every shard
  // leased (protocol.lease_size.granted_shards keeps one newcomer's share). Asked of the head current at
  // each look: when the head moves on, the window it opens may hold the leases taken ahead of it.
  const base = `/v1/experiments/${EXPERIMENT}`;
  const settled = async () => {
    const open = await (await request.get(`${base}/head`)).json();
    const heads = [open.head_id, ...(open.parent ? [open.parent] : [])].map((h) => `base_head=${h}`).join("&");
    const leases = await (await request.get(`${base}/leases?${heads}`)).json();
    return !leases.some((lease: any) => lease.window === open.window);
  };
  await expect.poll(settled, { timeout: 150_000, intervals: [500] }).toBe(true);
}
