import { expect, test } from "@playwright/test";
import { freshWindow, heads, holdingTheHead, status, tab } from "../browser/tabs";

// Two tabs on an edge whose pages may connect to each other only through its TURN server
// (ice_relay_only): tests/test_turn.py starts coturn and the edge, runs one of these (--grep) and then
// reads coturn's log for what it relayed, or refused. Each prints "turn-report <JSON>" for it.

test("a head moves from tab to tab through the TURN server", async ({ browser, baseURL }) => {
  const a = await tab(browser, baseURL!);
  const holder = await holdingTheHead(a);
  expect(holder.ice_relay_only).toBe(true);
  const b = await tab(browser, baseURL!);
  await b.locator("#toggle").click();
  await expect.poll(async () => (await status(b)).head_peer_bytes ?? 0, { timeout: 120_000 }).toBeGreaterThan(0);
  const asker = await status(b);
  expect(asker.peers_dropped).toEqual([]); // the bytes that came through the relay checked out
  expect((await heads(a)).served).toBeGreaterThanOrEqual(1);
  const fetched = (await heads(b)).fetched;
  console.log("turn-report", JSON.stringify({ holder: holder.peer_id, asker: asker.peer_id, fetched, ice: asker.ice_servers }));
  for (const page of [b, a]) await page.close({ runBeforeUnload: true }); // the relay allocations released
});

test("with a wrong TURN secret no connection forms and the tab takes the head from the edge", async ({ browser, baseURL, request }) => {
  await freshWindow(request); // both tabs lease in one window: none of it held by the first test's tabs
  const a = await tab(browser, baseURL!);
  const holder = await holdingTheHead(a);
  const b = await tab(browser, baseURL!);
  await b.locator("#toggle").click();
  await expect.poll(async () => (await status(b)).windows_done ?? 0, { timeout: 150_000 }).toBeGreaterThanOrEqual(1);
  const asker = await status(b);
  expect(asker.head_peer_bytes).toBe(0);
  expect(asker.head_edge_bytes).toBeGreaterThan(0);
  const { failures, served } = await heads(b);
  expect(failures.some((failure: string) => failure.startsWith(holder.peer_id.slice(0, 16)))).toBe(true); // A was asked
  expect((await heads(a)).served).toBe(0);
  console.log("turn-report", JSON.stringify({ holder: holder.peer_id, asker: asker.peer_id, failures, served }));
  for (const page of [b, a]) await page.close();
});
