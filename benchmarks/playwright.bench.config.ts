import { defineConfig } from "@playwright/test";
import base from "../playwright.config";

// The browser benchmark: same Chromium and stack as the browser tests, its own test folder. The stack
// (edge and validator) runs at the lowest CPU priority: on a contributor's machine it is elsewhere, so
// the tab's workers, like the native baseline they are divided by, have the cores while they train.
// Playwright starts the stack and Chromium each in a session of its own, and Linux schedules each
// session's autogroup fairly against the others whatever the nice of its processes
// (sched(7), "The autogroup feature"): the stack's autogroup gets nice 19 too, where the kernel has them.
const webServer = base.webServer as { command: string };
const lowest = "(echo 19 > /proc/self/autogroup) 2>/dev/null; exec nice -n 19";
export default defineConfig({
  ...base,
  testDir: ".",
  testMatch: "browser.spec.ts",
  outputDir: "../test-results/bench",
  webServer: { ...base.webServer, command: `${lowest} ${webServer.command}` },
});
