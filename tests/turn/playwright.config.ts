import { defineConfig } from "@playwright/test";
import base from "../../playwright.config";

// Heads between tabs through a TURN server: the same Chromium as the browser tests, against the edge in
// DTN_E2E_URL, which tests/test_turn.py starts (with a private coturn, its ICE settings and a validator).
const url = process.env.DTN_E2E_URL;
if (!url) throw new Error("DTN_E2E_URL must name the edge (tests/test_turn.py starts it)");

export default defineConfig({
  ...base,
  testDir: ".",
  testMatch: "turn.spec.ts",
  outputDir: "../../test-results/turn",
  webServer: undefined,
  use: { ...base.use, baseURL: url },
});
