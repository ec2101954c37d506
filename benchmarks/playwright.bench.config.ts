import { defineConfig } from "@playwright/test";
import base from "../playwright.config";

// The browser benchmark: same Chromium and stack as the browser tests, its own test folder. The stack
// (edge and validator) runs at the lowest CPU priority: on a contributor's machine it is elsewhere, so
// the tab's workers, like the native baseline they are divided by, have the cores while they train.
const webServer = base.webServer as { command: string };
export default defineConfig({
  ...base,
  testDir: ".",
  testMatch: "browser.spec.ts",
  outputDir: "../test-results/bench",
  webServer: { ...base.webServer, command: `nice -n 19 ${webServer.command}` },
});
