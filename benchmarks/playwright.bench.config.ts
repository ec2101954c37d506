import { defineConfig } from "@playwright/test";
import base from "../playwright.config";

// The browser benchmark: same Chromium and stack as the browser tests, its own test folder.
export default defineConfig({ ...base, testDir: ".", testMatch: "browser.spec.ts", outputDir: "../test-results/bench" });
