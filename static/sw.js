// The page's Service Worker: return visits start from disk, and the page still opens while the edge
// is briefly down.
//
// * Content-addressed files (/pyodide/<id>/..., /bundle/<id>.zip): cache first. A file is cached only
//   once its sha256 matches what /v1/peer-runtime lists for it, and only while its id is current;
//   files of any other id are deleted when a new runtime or bundle is announced.
// * The page shell (/, its scripts and styles) and /v1/peer-runtime: network first, the last good copy
//   when the edge cannot be reached.
// Everything else (the API, shards, heads, the relay) goes to the network untouched.
const CONTENT = "dtn-content-v1";
const SHELL = "dtn-shell-v1";
const SHELL_PATHS = new Set([
  "/",
  "/static/app.js",
  "/static/head_sharing.js",
  "/static/worker.js",
  "/static/style.css",
  "/v1/peer-runtime",
]);
const ADDRESSED = /^\/(?:pyodide\/([0-9a-f]{32})\/([A-Za-z0-9._-]+)|bundle\/([0-9a-f]{32})\.zip)$/;

self.addEventListener("install", (event) => {
  // the shell is small: kept at once, so that even the visit that installs this worker can return offline
  event.waitUntil(caches.open(SHELL).then((cache) => cache.addAll([...SHELL_PATHS])).then(() => self.skipWaiting()));
});
self.addEventListener("activate", (event) => event.waitUntil(self.clients.claim()));

self.addEventListener("fetch", (event) => {
  const url = new URL(event.request.url);
  if (url.origin !== location.origin || event.request.method !== "GET") return;
  const addressed = ADDRESSED.exec(url.pathname);
  if (addressed) event.respondWith(contentAddressed(event.request, addressed));
  else if (SHELL_PATHS.has(url.pathname) && url.search === "") event.respondWith(networkFirst(event.request));
  else if (url.pathname === "/" && url.search !== "") event.respondWith(networkFirst(event.request, "/"));
});

async function networkFirst(request, key = request) {
  const cache = await caches.open(SHELL);
  try {
    const response = await fetch(request);
    if (response.ok) {
      await cache.put(key, response.clone());
      if (new URL(request.url).pathname === "/v1/peer-runtime") await forgetOthers(await response.clone().json());
    }
    return response;
  } catch (error) {
    const cached = await cache.match(key);
    if (cached) return cached;
    throw error;
  }
}

async function runtimeManifest() {
  // the current manifest: from the edge, or the last good copy while it is down
  return (await networkFirst(new Request("/v1/peer-runtime"))).json();
}

async function contentAddressed(request, [, pyodideId, file, bundleId]) {
  const cache = await caches.open(CONTENT);
  const cached = await cache.match(request);
  if (cached) return cached;
  const response = await fetch(request);
  if (!response.ok) return response;
  const manifest = await runtimeManifest().catch(() => null);
  const expected = pyodideId
    ? manifest?.pyodide && idOf(manifest.pyodide.url) === pyodideId && manifest.pyodide.files[file]
    : manifest && idOf(manifest.bundle.url) === bundleId && manifest.bundle.id.replace("sha256:", "");
  if (!expected) return response; // an id that is not current: served, never kept
  const bytes = await response.arrayBuffer();
  if ((await sha256(bytes)) !== expected) {
    return new Response(`${request.url}: sha256 does not match /v1/peer-runtime`, { status: 502 });
  }
  const headers = new Headers(response.headers);
  for (const name of ["content-encoding", "content-length"]) headers.delete(name); // these bytes are decoded
  const verified = new Response(bytes, { status: 200, headers });
  await cache.put(request, verified.clone());
  return verified;
}

async function forgetOthers(manifest) {
  // keep the files of the current ids only
  const current = new Set([idOf(manifest.bundle.url), manifest.pyodide && idOf(manifest.pyodide.url)]);
  const cache = await caches.open(CONTENT);
  for (const request of await cache.keys()) {
    const match = ADDRESSED.exec(new URL(request.url).pathname);
    if (!match || !current.has(match[1] ?? match[3])) await cache.delete(request);
  }
}

function idOf(url) {
  return /([0-9a-f]{32})/.exec(url)[1];
}

async function sha256(bytes) {
  const digest = new Uint8Array(await crypto.subtle.digest("SHA-256", bytes));
  return Array.from(digest, (b) => b.toString(16).padStart(2, "0")).join("");
}
