import { defineConfig } from "@playwright/test";
import base from "../playwright.config";

// The web page through a deployed edge: the same Chromium as the browser tests, against the public
// URL in DTN_PUBLIC_URL (tests/test_deploy.py starts nginx, the edge and a validator first).
const publicUrl = process.env.DTN_PUBLIC_URL;
if (!publicUrl) throw new Error("DTN_PUBLIC_URL must name the deployed edge");

export default defineConfig({
  ...base,
  testDir: ".",
  testMatch: "page.spec.ts",
  outputDir: "../test-results/deploy",
  timeout: 90_000,
  webServer: undefined,
  use: { ...base.use, baseURL: publicUrl, ignoreHTTPSErrors: true }, // its certificate is self-signed
});
