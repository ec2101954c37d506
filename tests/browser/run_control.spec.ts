import { execFileSync } from "node:child_process";
import { mkdtempSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { expect, test } from "@playwright/test";
import { EXPERIMENT, status } from "./tabs";

// Run control in Chromium (docs/edge.md#run-control): the stack's one validator is the whole quorum, so
// an order it signs pauses or resumes the experiment. Written, signed and submitted with the operator's
// own commands (`dtn control new | sign | submit`), against the stack playwright.config.ts started.
const STACK = `var/e2e-${process.env.DTN_E2E_PORT ?? 8765}`;

function order(action: "pause" | "resume", edge: string): void {
  const file = join(mkdtempSync(join(tmpdir(), "dtn-order-")), `${action}.json`);
  const network = `${STACK}/network.json`;
  const dtn = (...args: string[]) =>
    execFileSync(".venv/bin/python", ["-m", "native_peer", "control", ...args], { stdio: "pipe" });
  dtn("new", file, "--network", network, "--experiment", EXPERIMENT, "--action", action, "--edge", edge);
  dtn("sign", file, "--network", network, "--storage", `${STACK}/validator`);
  dtn("submit", file, "--edge", edge);
}

test("a tab trains no window while its validators pause the experiment and trains again once they resume it", async ({
  page,
  baseURL,
}) => {
  const card = page.locator(`.head[data-experiment="${EXPERIMENT}"]`);
  await page.goto(`/?experiment=${EXPERIMENT}`);
  await page.locator("#toggle").click();
  await expect.poll(async () => (await status(page)).windows_done ?? 0, { timeout: 180_000 }).toBeGreaterThanOrEqual(1);
  order("pause", baseURL!);
  try {
    await expect(card).toContainText("paused by its validators");
    // what was in flight when the order landed (a window being trained, one trained ahead) may still
    // publish; then nothing more while paused: no head comes and no lease is granted
    await page.waitForTimeout(5_000);
    const held = (await status(page)).windows_done;
    await page.waitForTimeout(5_000);
    expect((await status(page)).windows_done).toBe(held);
    await expect(card).toContainText("paused by its validators");
    order("resume", baseURL!);
    await expect(card).not.toContainText("paused", { timeout: 30_000 });
    await expect.poll(async () => (await status(page)).windows_done, { timeout: 120_000 }).toBeGreaterThan(held);
  } finally {
    const paused = await card.textContent();
    if (paused?.includes("paused by its validators")) order("resume", baseURL!); // the stack goes on for later specs
  }
});
