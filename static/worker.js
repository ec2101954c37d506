// The browser peer's Web Worker: loads Pyodide, NumPy and the peer's Python bundle (in parallel),
// keeps the peer identity in IndexedDB, and hands control to browser_peer.js_bridge.
// Messages in: {type: "start", edgeUrl, experiment, token?, heads?, workers?, pins?} | {type: "stop"} |
// {type: "pause", reason} | {type: "resume"} | {type: "share", share} (the fraction of a core to use,
// browser_peer/guest.py) | {type: "workers", count} (cores to train on) | {type: "part", id, payload} (in
// a helper, below) | {type: "benchmark", model, batchSize, steps} (model: a model spec as JSON, its wire
// form; answered with {type: "benchmark", model, samples_per_s}).
// Messages out: {type: "status", status} | {type: "error", message} | {type: "part-done", id, result} |
// {type: "part-failed", id, message}.
// Heads from peers (heads: the page has WebRTC), answered by static/head_sharing.js: the messages below.
const runtime = (async () => {
  // /v1/peer-runtime names the runtime and the bundle by content; their URLs are cached for a year
  const response = await fetch("/v1/peer-runtime", { cache: "no-cache" });
  if (!response.ok) throw new Error(`peer runtime: HTTP ${response.status}`);
  const { pyodide: core, bundle: code } = await response.json();
  if (core === null) throw new Error("this edge serves no Pyodide runtime (python -m tools pyodide-runtime)");
  importScripts(`${core.url}pyodide.js`);
  const [pyodide, bundle] = await Promise.all([loadPyodide({ indexURL: core.url }), fetchVerified(code)]);
  await pyodide.loadPackage("numpy", { messageCallback: () => {} });
  try {
    // optional: SciPy's wasm OpenBLAS makes the trainer's matmuls ~4x faster
    await pyodide.loadPackage("scipy", { messageCallback: () => {}, errorCallback: () => {} });
  } catch (error) {
    console.info("scipy unavailable, training with NumPy's own matmul", error);
  }
  pyodide.unpackArchive(bundle, "zip", { extractDir: "/home/pyodide/peer" });
  pyodide.runPython("import sys; sys.path.insert(0, '/home/pyodide/peer')");
  self.dtnKernels = linkKernels(pyodide); // read by browser_peer/js_bridge.py
  console.info(`trainer: ${self.dtnKernels.path}`);
  return pyodide;
})();

// The trainer's WebAssembly SIMD kernels (browser_peer/kernels, in the bundle; decision 0031), linked
// into Pyodide's own memory so that they work on NumPy arrays in place: {exports, path}, exports null
// (the trainer keeps its NumPy path) without WebAssembly SIMD, with no kernels or an incomplete build on
// the edge, where linking fails, or with `?kernels=off` on this script's URL (the benchmark's baseline).
// Where WebAssembly has relaxed SIMD, the build whose multiply-adds are fused (decision 0052) comes first;
// `?kernels=wasm-simd` (or `wasm-simd-fma`) asks for one build.
// i8x16.popcnt(i8x16.splat(0)) as a function: valid only where WebAssembly has SIMD128
const SIMD_PROBE = new Uint8Array([0, 97, 115, 109, 1, 0, 0, 0, 1, 5, 1, 96, 0, 1, 123, 3, 2, 1, 0, 10, 10, 1, 8, 0, 65, 0, 253, 15, 253, 98, 11]);
// (v) => f32x4.relaxed_madd(v, v, v): valid only where WebAssembly has relaxed SIMD
const FMA_PROBE = new Uint8Array([0, 97, 115, 109, 1, 0, 0, 0, 1, 6, 1, 96, 1, 123, 1, 123, 3, 2, 1, 0, 10, 13, 1, 11, 0, 32, 0, 32, 0, 32, 0, 253, 133, 2, 11]);
const KERNELS_DIR = "/home/pyodide/peer/browser_peer/kernels";
const KERNEL_BUILDS = [
  { file: "kernels-fma.wasm", path: "wasm-simd-fma", probe: FMA_PROBE },
  { file: "kernels.wasm", path: "wasm-simd", probe: SIMD_PROBE },
];
const KERNEL_EXPORTS = ["gemm_nn", "gemm_nt", "adam"]; // what browser_peer/kernels calls

function linkKernels(pyodide) {
  const asked = new URLSearchParams(self.location.search).get("kernels"); // "off", or one build's path
  if (asked === "off") return { exports: null, path: "kernels off" };
  if (!WebAssembly.validate(SIMD_PROBE)) return { exports: null, path: "no WebAssembly SIMD" };
  const asking = KERNEL_BUILDS.filter(({ path }) => !asked || asked === path);
  if (!asking.length) return { exports: null, path: `no kernels build ${asked}` };
  const builds = asking.filter(
    ({ file, probe }) => WebAssembly.validate(probe) && pyodide.FS.analyzePath(`${KERNELS_DIR}/${file}`).exists,
  );
  let failed = { exports: null, path: "no kernels on this edge" };
  for (const { file, path } of builds) { // the first build that links; why the last one did not, else
    try {
      const bytes = pyodide.FS.readFile(`${KERNELS_DIR}/${file}`);
      const options = { loadAsync: false, global: false, nodelete: true };
      const exports = pyodide._module.loadWebAssemblyModule(bytes, options, `dtn_${path}`, {}, 0);
      const missing = KERNEL_EXPORTS.filter((name) => typeof exports[name] !== "function");
      if (!missing.length) return { exports, path };
      failed = { exports: null, path: `kernels without ${missing.join(", ")} (an old build?)` };
    } catch (error) {
      failed = { exports: null, path: `kernels not linked: ${error}` };
    }
  }
  return failed;
}

async function fetchVerified({ url, id }) {
  // the peer's code, checked against the content id the edge named before it runs (where the page
  // has WebCrypto: a secure context, i.e. HTTPS or loopback; over plain HTTP nothing can be checked)
  const response = await fetch(url);
  if (!response.ok) throw new Error(`bundle: HTTP ${response.status}`);
  const bytes = await response.arrayBuffer();
  if (!crypto.subtle) return bytes;
  const digest = Array.from(new Uint8Array(await crypto.subtle.digest("SHA-256", bytes)), (b) =>
    b.toString(16).padStart(2, "0"),
  ).join("");
  if (`sha256:${digest}` !== id) throw new Error(`bundle: sha256:${digest} is not ${id}`);
  return bytes;
}

// IndexedDB "dtn-peer": the identity seed (store "identity"), the peer's saved progress (store
// "progress": optimizer state and windows done, browser_peer/progress.py; the shard index) and the
// shards it keeps by content (store "shards", browser_peer/shard_store.py).
function database() {
  return new Promise((resolve, reject) => {
    const open = indexedDB.open("dtn-peer", 3);
    open.onupgradeneeded = () => {
      for (const store of ["identity", "progress", "shards"]) {
        if (!open.result.objectStoreNames.contains(store)) open.result.createObjectStore(store);
      }
    };
    open.onerror = () => reject(open.error);
    open.onsuccess = () => resolve(open.result);
  });
}

async function transact(store, mode, operation) {
  // the result of operation(objectStore), once its transaction has completed
  const db = await database();
  return new Promise((resolve, reject) => {
    const transaction = db.transaction(store, mode);
    const request = operation(transaction.objectStore(store));
    transaction.oncomplete = () => resolve(request.result);
    transaction.onerror = transaction.onabort = () => reject(transaction.error);
  });
}

async function stored(store, key, value) {
  // the value under key (undefined: none); with a value, puts it first
  if (value === undefined) return transact(store, "readonly", (s) => s.get(key));
  await transact(store, "readwrite", (s) => s.put(value, key));
  return value;
}

self.dtnLoad = async (key) => (await stored("progress", key)) ?? null; // called by browser_peer/js_bridge.py
self.dtnSave = async (key, bytes) => {
  await stored("progress", key, bytes);
};

// Shards by content id, for browser_peer/shard_store.py (which keeps their index and byte cap, and
// verifies every shard it reads back): in IndexedDB, or in a Map from the first failure on (no
// IndexedDB, or its quota spent), kept as long as the page lives.
const shards = {
  memory: null,
  async run(mode, operation, inMemory) {
    if (this.memory === null) {
      try {
        return await transact("shards", mode, operation);
      } catch (error) {
        console.info("keeping shards in memory:", error);
        this.memory = new Map();
      }
    }
    return inMemory(this.memory);
  },
};
self.dtnShardKeys = () => shards.run("readonly", (s) => s.getAllKeys(), (m) => [...m.keys()]);
self.dtnShardGet = async (key) => (await shards.run("readonly", (s) => s.get(key), (m) => m.get(key))) ?? null;
self.dtnShardPut = (key, bytes) =>
  shards.run("readwrite", (s) => s.put(bytes, key), (m) => m.set(key, bytes.slice())).then(
    () => true,
    () => false,
  );
self.dtnShardDelete = (key) => shards.run("readwrite", (s) => s.delete(key), (m) => m.delete(key));

async function identitySeed() {
  // 32 random bytes, created once per browser profile
  const seed = await stored("identity", "seed");
  if (seed) return seed;
  const fresh = Array.from(crypto.getRandomValues(new Uint8Array(32)), (b) => b.toString(16).padStart(2, "0")).join("");
  return stored("identity", "seed", fresh);
}

// Heads from peers: the page owns the WebRTC connections; browser_peer/js_bridge.py asks it through these.
//   out: {type: "head.fetch", id, head_id, holders, max_bytes}  in: {type: "head.fetched", id, data?, peer_id?}
//   out: {type: "head.keep", head_id, data} | {type: "peer.drop", peer_id, reason} | {type: "ice", servers, relay_only}
//   out: {type: "signal", peer_id, data: JSON text} (from the relay)  in: {type: "signal", peer_id, data} (to it)
const headRequests = new Map(); // request id -> resolve
let lastHeadRequest = 0;
self.dtnFetchHead = (headId, holders, maxBytes) =>
  new Promise((resolve) => {
    headRequests.set(++lastHeadRequest, resolve);
    postMessage({ type: "head.fetch", id: lastHeadRequest, head_id: headId, holders: [...holders], max_bytes: maxBytes });
  });
self.dtnKeepHead = (headId, data) => postMessage({ type: "head.keep", head_id: headId, data });
const signals = { queue: [], waiting: null }; // the page's signaling, until the peer's socket takes it
self.dtnNextSignal = () =>
  signals.queue.length ? Promise.resolve(signals.queue.shift()) : new Promise((resolve) => (signals.waiting = resolve));

function headSharing(message) {
  if (message.type === "head.fetched") {
    headRequests.get(message.id)?.(message.data ? { data: message.data, peer_id: message.peer_id } : null);
    headRequests.delete(message.id);
  } else {
    const text = JSON.stringify({ peer_id: message.peer_id, data: message.data });
    const waiting = signals.waiting;
    signals.waiting = null;
    if (waiting) waiting(text);
    else if (signals.queue.length < 64) signals.queue.push(text);
  }
}

let peer = null;
const guest = { paused: null, share: 1 }; // the page's latest word, also for a peer not started yet

function applyGuest() {
  for (const { worker } of helpers) worker.postMessage(guest.paused ? { type: "pause", reason: guest.paused } : { type: "resume" });
  for (const { worker } of helpers) worker.postMessage({ type: "share", share: guest.share });
  if (peer === null) return runtime.then((pyodide) => pyodide.pyimport("browser_peer.js_bridge").guide_parts(guest.paused, guest.share));
  peer.set_share(guest.share);
  if (guest.paused) peer.pause(guest.paused);
  else peer.resume();
}

// More cores: the tab's peer trains each window in parts, one per worker (browser_peer/parts.py). Its
// helpers are workers of this same script; they load the runtime (from the Service Worker's cache)
// and train the parts they are sent, one at a time.
const helpers = [];
const waiting = new Map(); // task id -> {resolve, reject, helper}
let tasks = 0;
let parts = Promise.resolve(); // in a helper: its parts, in order

function useWorkers(count) {
  while (helpers.length < count - 1) {
    const helper = { worker: new Worker(self.location.href), ready: false }; // with this worker's ?kernels=
    helper.worker.onmessage = ({ data }) => {
      if (data.type === "status" && data.status.phase?.startsWith("ready")) helper.ready = true;
      const task = waiting.get(data.id);
      if (!task || (data.type !== "part-done" && data.type !== "part-failed")) return;
      waiting.delete(data.id);
      data.type === "part-done" ? task.resolve(data.result) : task.reject(new Error(data.message));
    };
    helpers.push(helper);
    applyGuest();
  }
  for (const helper of helpers.splice(Math.max(0, count - 1))) {
    helper.worker.terminate();
    for (const [id, task] of waiting) if (task.helper === helper) waiting.delete(id) && task.reject(new Error("worker removed"));
  }
}

self.dtnPartWorkers = () => helpers.filter((helper) => helper.ready).length; // called by js_bridge.py
self.dtnTrainPart = (index, payload) =>
  new Promise((resolve, reject) => {
    const helper = helpers.filter((h) => h.ready)[index - 1];
    if (!helper) return reject(new Error(`no worker ${index}`));
    const id = tasks++;
    waiting.set(id, { resolve, reject, helper });
    helper.worker.postMessage({ type: "part", id, payload }, [payload.buffer]);
  });

async function trainPart({ id, payload }) {
  try {
    const pyodide = await runtime;
    const bytes = await pyodide.pyimport("browser_peer.js_bridge").run_part(payload); // a Uint8Array copy
    postMessage({ type: "part-done", id, result: bytes }, [bytes.buffer]);
  } catch (error) {
    postMessage({ type: "part-failed", id, message: String(error) });
  }
}
runtime.then(
  () => peer === null && postMessage({ type: "status", status: { phase: "ready: Python runtime loaded" } }),
  (error) => postMessage({ type: "error", message: String(error) }),
);

onmessage = async (event) => {
  const message = event.data;
  try {
    if (message.type === "start" && peer === null) {
      postMessage({ type: "status", status: { phase: "loading Python runtime" } });
      const [pyodide, seed] = await Promise.all([runtime, identitySeed()]);
      const bridge = pyodide.pyimport("browser_peer.js_bridge");
      peer = bridge.start(
        message.edgeUrl,
        message.experiment,
        seed,
        message.token ?? null,
        Boolean(message.heads),
        message.pins ?? null,
      );
      useWorkers(message.workers ?? 1);
      applyGuest();
    } else if (message.type === "workers") {
      if (peer !== null) useWorkers(message.count);
    } else if (message.type === "benchmark") {
      const pyodide = await runtime; // benchmarks/browser.spec.ts: this runtime's training speed per model
      const rate = pyodide.pyimport("browser_peer.js_bridge").benchmark(message.model, message.batchSize, message.steps);
      postMessage({ type: "benchmark", model: message.model, samples_per_s: rate });
    } else if (message.type === "part") {
      parts = parts.then(() => trainPart(message));
    } else if (message.type === "pause" || message.type === "resume" || message.type === "share") {
      if (message.type === "share") guest.share = message.share;
      else guest.paused = message.type === "pause" ? message.reason : null;
      applyGuest();
    } else if (message.type === "head.fetched" || message.type === "signal") {
      headSharing(message);
    } else if (message.type === "stop" && peer !== null) {
      useWorkers(1);
      peer.stop();
      peer.destroy();
      peer = null;
    }
  } catch (error) {
    postMessage({ type: "error", message: String(error) });
  }
};
