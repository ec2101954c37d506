import { defineConfig } from "@playwright/test";
// Debian's Chromium and the flags that work as root: one file, read by the demo too (lab/demo.py).
import chromium from "./lab/chromium.json";

// Browser tests on Debian's Chromium (apt), never a downloaded browser. The web server is the real
// stack: edge (uvicorn) + validator, serving the self-hosted Pyodide runtime.
const port = Number(process.env.DTN_E2E_PORT ?? 8765);

export default defineConfig({
  testDir: "./tests/browser",
  outputDir: "./test-results",
  timeout: 240_000,
  expect: { timeout: 30_000 },
  workers: 1,
  reporter: [["list"]],
  use: {
    baseURL: `http://127.0.0.1:${port}`,
    browserName: "chromium",
    launchOptions: {
      executablePath: chromium.executable,
      args: chromium.args,
    },
  },
  webServer: {
    // a folder per port: stacks of parallel runs on other ports never wipe each other's state
    // windows wait 60 s for a lease that never delivers: a tab holding the head it trains on (paused,
    // head_sharing.spec.ts) keeps that head current while other tabs start (their Python runtime takes
    // 10-30 s to boot on 2 busy cores; at 30 s they once came after the head had moved on) and fetch it
    command: `.venv/bin/python -m lab stack --port ${port} --out var/e2e-${port} --min-deadline-s 60`,
    url: `http://127.0.0.1:${port}/healthz`,
    timeout: 180_000,
    cwd: __dirname,
    reuseExistingServer: false,
    stdout: "ignore",
    stderr: "pipe",
  },
});
