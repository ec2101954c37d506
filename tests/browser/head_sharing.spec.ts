import { expect, test, type APIRequestContext } from "@playwright/test";
import { freshWindow, heads, holdingTheHead, pause, resume, standingBy, status, tab } from "./tabs";

// Heads from peers: several browser profiles (contexts: each its own IndexedDB, so its own peer key) on
// one running stack fetch the current head from each other over WebRTC (static/head_sharing.js), each
// checking it by content id in Python, and fall back to the edge.
async function headBytesServed(request: APIRequestContext): Promise<number> {
  const metrics = await (await request.get("/metrics")).text();
  return Number(/^dtn_head_bytes_total (\S+)$/m.exec(metrics)![1]);
}

test("heads move from tab to tab over WebRTC, and the edge serves fewer head bytes", async ({ browser, baseURL, request }, testInfo) => {
  await freshWindow(request); // A, B and C lease in one window: none of it held by earlier specs' tabs
  const before = await headBytesServed(request);
  const [b, c] = await Promise.all([tab(browser, baseURL!), tab(browser, baseURL!)]);
  await Promise.all([b, c].map(standingBy));
  const a = await tab(browser, baseURL!);
  await holdingTheHead(a);
  // B and C go on together: the head they need is the one A holds
  await Promise.all([b, c].map(resume));
  for (const page of [b, c]) {
    await expect.poll(async () => (await status(page)).head_peer_bytes ?? 0, { timeout: 120_000 }).toBeGreaterThan(0);
  }
  const served = await heads(a);
  expect(served.served).toBeGreaterThanOrEqual(1); // A served B, and C took it from A or B
  // then all three train on, each new head fetched by one tab from the edge and by the others from it
  await resume(a);
  await a.locator("#share").fill("100");
  for (const page of [a, b, c]) {
    await expect.poll(async () => (await status(page)).windows_done ?? 0, { timeout: 180_000 }).toBeGreaterThanOrEqual(2);
  }
  for (const page of [a, b, c]) await pause(page);
  const measure = async () => {
    const statuses = await Promise.all([a, b, c].map(status));
    const sum = (field: string) => statuses.reduce((total, s) => total + s[field], 0);
    const [fromEdge, fromPeers] = [sum("head_edge_bytes"), sum("head_peer_bytes")];
    const edgeServed = (await headBytesServed(request)) - before;
    return { used: fromEdge + fromPeers, fromEdge, fromPeers, edgeServed, windows: statuses.map((s) => s.windows_done), statuses };
  };
  // once the paused tabs are still: what they say they took from the edge is what the edge counted
  await expect
    .poll(async () => {
      const { edgeServed, fromEdge } = await measure();
      return edgeServed - fromEdge;
    })
    .toBe(0);
  const { statuses, ...measured } = await measure();
  console.log("head bytes", JSON.stringify(measured));
  await testInfo.attach("head-bytes", { body: JSON.stringify(measured, null, 2), contentType: "application/json" });
  expect(measured.edgeServed).toBeLessThan(measured.used); // without sharing the edge would have served it all
  expect(statuses.every((s) => s.peers_dropped.length === 0)).toBe(true);
  for (const page of [a, b, c]) await page.context().close();
});

test("a tab that sends a wrong head is dropped, and the asker falls back to the edge and trains", async ({
  browser,
  baseURL,
  request,
}) => {
  await freshWindow(request); // the liar and the asker both lease in one window: none of it held by earlier tabs
  // the liar's page flips the first byte of every binary message it sends on a data channel
  const liar = await tab(browser, baseURL!, () => {
    const send = RTCDataChannel.prototype.send;
    RTCDataChannel.prototype.send = function (this: RTCDataChannel, data: any) {
      if (typeof data === "string") return send.call(this, data);
      const bytes = new Uint8Array(data.buffer ?? data, data.byteOffset ?? 0, data.byteLength).slice();
      bytes[0] ^= 0xff;
      return send.call(this, bytes);
    } as any;
  });
  const asker = await tab(browser, baseURL!);
  await standingBy(asker);
  const lying = await holdingTheHead(liar);
  await resume(asker);
  await expect.poll(async () => (await status(asker)).peers_dropped ?? [], { timeout: 120_000 }).toEqual([lying.peer_id]);
  expect((await heads(asker)).dropped).toEqual([lying.peer_id]); // the page closed it and asks it no more
  expect((await heads(liar)).served).toBeGreaterThanOrEqual(1);
  await expect.poll(async () => (await status(asker)).windows_done ?? 0, { timeout: 120_000 }).toBeGreaterThanOrEqual(1);
  const final = await status(asker);
  expect(final.head_edge_bytes).toBeGreaterThan(0);
  expect(final.head_peer_bytes).toBe(0);
  for (const page of [liar, asker]) await page.context().close();
});
