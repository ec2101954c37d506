import { expect, type Browser, type Page } from "@playwright/test";

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
  // stays current until its window's deadline (60 s after this tab's lease on the test stack:
  // playwright.config.ts) and this tab keeps serving it. At a 10 % CPU share the window lasts long
  // enough for the pause to land before it is published.
  await page.locator("#share").fill("10");
  await page.locator("#toggle").click();
  await expect.poll(async () => (await status(page)).phase ?? "", { timeout: 120_000 }).toMatch(/^training window/);
  await pause(page);
  await expect.poll(async () => (await status(page)).paused ?? null).toBe("holding");
  return status(page);
}
