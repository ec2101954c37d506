// The browser peer's Web Worker: loads Pyodide, NumPy and the peer's Python bundle (in parallel),
// keeps the peer identity in IndexedDB, and hands control to browser_peer.js_bridge.
// Messages in: {type: "start", edgeUrl, experiment, token?} | {type: "stop"}.
// Messages out: {type: "status", status} | {type: "error", message}.
importScripts("/pyodide/pyodide.js");

const runtime = (async () => {
  const [pyodide, bundle] = await Promise.all([
    loadPyodide({ indexURL: "/pyodide/" }),
    fetch("/bundle/peer.zip").then((response) => {
      if (!response.ok) throw new Error(`bundle: HTTP ${response.status}`);
      return response.arrayBuffer();
    }),
  ]);
  await pyodide.loadPackage("numpy", { messageCallback: () => {} });
  try {
    // optional: SciPy's wasm OpenBLAS makes the trainer's matmuls ~4x faster
    await pyodide.loadPackage("scipy", { messageCallback: () => {}, errorCallback: () => {} });
  } catch (error) {
    console.info("scipy unavailable, training with NumPy's own matmul", error);
  }
  pyodide.unpackArchive(bundle, "zip", { extractDir: "/home/pyodide/peer" });
  pyodide.runPython("import sys; sys.path.insert(0, '/home/pyodide/peer')");
  return pyodide;
})();

function identitySeed() {
  // 32 random bytes, created once per browser profile, kept in IndexedDB.
  return new Promise((resolve, reject) => {
    const open = indexedDB.open("dtn-peer", 1);
    open.onupgradeneeded = () => open.result.createObjectStore("identity");
    open.onerror = () => reject(open.error);
    open.onsuccess = () => {
      const db = open.result;
      const read = db.transaction("identity", "readonly").objectStore("identity").get("seed");
      read.onerror = () => reject(read.error);
      read.onsuccess = () => {
        if (read.result) return resolve(read.result);
        const seed = Array.from(crypto.getRandomValues(new Uint8Array(32)), (b) => b.toString(16).padStart(2, "0")).join("");
        const write = db.transaction("identity", "readwrite").objectStore("identity").put(seed, "seed");
        write.onerror = () => reject(write.error);
        write.onsuccess = () => resolve(seed);
      };
    };
  });
}

let peer = null;

onmessage = async (event) => {
  const message = event.data;
  try {
    if (message.type === "start" && peer === null) {
      postMessage({ type: "status", status: { phase: "loading Python runtime" } });
      const [pyodide, seed] = await Promise.all([runtime, identitySeed()]);
      const bridge = pyodide.pyimport("browser_peer.js_bridge");
      peer = bridge.start(message.edgeUrl, message.experiment, seed, message.token ?? null);
    } else if (message.type === "stop" && peer !== null) {
      peer.stop();
      peer.destroy();
      peer = null;
    }
  } catch (error) {
    postMessage({ type: "error", message: String(error) });
  }
};
