import { expect, test } from "@playwright/test";

// The page on its public URL behind nginx: the viewer's snapshot and live event stream (wss), and the
// contributing worker: Pyodide and NumPy from nginx's disk, the peer bundle, the relay (wss, Origin
// checked by the edge) joined. Every request goes to the public origin.
test("the page works behind the proxy on its public URL", async ({ page, context, baseURL }) => {
  const origin = new URL(baseURL!).origin;
  const requests: string[] = [];
  context.on("request", (request) => requests.push(request.url()));
  await page.goto("/");
  await expect(page.locator(".head").first()).toBeVisible();
  await expect.poll(() => page.evaluate(() => (window as any).dtn.streaming), { timeout: 20_000 }).toBe(true);
  await page.locator("#toggle").click();
  await expect
    .poll(() => page.evaluate(() => (window as any).dtn.status?.connected ?? false), { timeout: 75_000 })
    .toBe(true);
  expect(requests.some((url) => /\/pyodide\/[0-9a-f]{32}\/pyodide\.asm\.wasm$/.test(url))).toBe(true);
  expect(requests.filter((url) => new URL(url).origin !== origin)).toEqual([]);
});
