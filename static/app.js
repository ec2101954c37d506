// The page: "contribute compute" drives the worker; the viewer polls /portal/snapshot.
import { HeadSharing } from "./head_sharing.js";

const $ = (id) => document.getElementById(id);
const params = new URLSearchParams(location.search);
// The admission token comes in the URL's fragment (`/#token=…`), which the browser never sends: it
// stays out of the edge's and any proxy's access logs. It is taken off the address bar at once.
const fragment = new URLSearchParams(location.hash.slice(1));
const admissionToken = fragment.get("token");
if (admissionToken !== null) {
  fragment.delete("token");
  history.replaceState(null, "", `${location.pathname}${location.search}${fragment.size ? `#${fragment}` : ""}`);
}
// Validators to trust, `#validators=<fingerprint>,…` (from the network's operator): the peer refuses an
// edge whose network they did not sign (protocol/network_pins.py). Not secret: it stays in the address.
const pins = fragment.get("validators");
const state = { worker: null, running: false, snapshot: null, status: {} };
window.dtn = state; // read by the browser tests

function setText(id, value) {
  $(id).textContent = value;
}

// The edge this page came from may go away with its disk (another operator's edge then carries the
// network: docs/edge.md). After MIRROR_AFTER_MS of the worker failing to reach it, the page moves to the
// first of the edge's mirrors (the relay welcome's `mirrors`, checked by protocol/edge_urls.py) that
// answers, contributing there if it was here; the validator pins in the address go along. On the
// mirror's origin the tab has a key and progress of its own.
const MIRROR_AFTER_MS = 10_000;
async function moveToMirror() {
  state.moving = true;
  for (const mirror of state.status.mirrors ?? []) {
    // an opaque answer is enough to know it is up; a network error is not (no CORS needed for that)
    const up = await fetch(`${mirror}/livez`, { mode: "no-cors", cache: "no-store" }).then(() => true, () => false);
    if (!up) continue;
    const query = new URLSearchParams(location.search);
    if (state.running) {
      query.set("contribute", "1");
      query.set("experiment", state.status.experiment ?? query.get("experiment") ?? "");
    }
    state.movedTo = mirror; // read by the browser tests
    location.assign(`${mirror}/?${query}${pins ? `#validators=${pins}` : ""}`);
    return;
  }
  state.disconnectedSince = Date.now(); // none answers: look again after as long
  state.moving = false;
}

function followEdge(s) {
  if (!state.running || s.connected !== false) state.disconnectedSince = null; // stopped here: not gone
  else if (state.disconnectedSince == null) state.disconnectedSince = Date.now();
  else if (Date.now() - state.disconnectedSince >= MIRROR_AFTER_MS && !state.moving) moveToMirror();
}

function renderStatus(status) {
  state.status = { ...state.status, ...status };
  const s = state.status;
  followEdge(s);
  setText("phase", s.phase ?? "idle");
  setText("rate", s.samples_per_s ? `${Math.round(s.samples_per_s).toLocaleString()}` : "–");
  setText("windows", s.windows_done ?? 0);
  setText("accepted", s.accepted ?? 0);
  setText("rejected", s.rejected ?? 0);
  if (s.last_verdict) {
    const { accepted, reason } = s.last_verdict;
    $("verdict").textContent = accepted ? "accepted" : `rejected: ${reason}`;
    $("verdict").className = s.last_verdict.accepted ? "ok" : "bad";
  }
  if (s.peer_id) setText("peer-id", s.peer_id);
  if (s.compute) setText("compute", s.compute);
  setText("downloaded", megabytes(s.downloaded_bytes));
  setText("sent", megabytes((s.sent_bytes ?? 0) + (state.heads?.served_bytes ?? 0))); // heads served to peers too
  if (s.peer_id && (s.accepted ?? 0) !== state.creditFor) refreshCredit(s.accepted ?? 0);
  if (s.validators) {
    const signed = new Set(s.signed ?? []);
    const marks = s.validators.map((f) => `${f}${signed.has(f) ? " ✓" : ""}`).join(", ");
    setText("validators", `${s.quorum} of ${s.validators.length}: ${marks}${s.pinned?.length ? " (pinned)" : " (not pinned)"}`);
  }
  if (s.windows_done) setText("window-bytes", `↓ ${megabytes(s.window_downloaded_bytes)} · ↑ ${megabytes(s.window_sent_bytes)}`);
  if (s.wall_s > 0) {
    const share = (seconds) => `${Math.round((100 * (seconds ?? 0)) / s.wall_s)} %`;
    setText("time-split", `training ${share(s.training_s)} · waiting ${share(s.waiting_s)} · paused ${share(s.paused_s)}`);
  }
}

function megabytes(bytes) {
  return `${((bytes ?? 0) / 1e6).toFixed(bytes < 1e6 ? 2 : 1)} MB`;
}

// -- a good guest: paused while the tab is hidden or on battery (unless allowed), at the chosen CPU share
const guest = { onBattery: false };
const preferences = ["cores", "share", "background", "battery"];
const cores = navigator.hardwareConcurrency || 1;
for (let n = 1; n <= cores; n++) $("cores").add(new Option(`${n} of ${cores}`, String(n)));
$("cores").value = String(Math.max(1, Math.floor(cores / 2))); // about half of what the machine has

function guestPause() {
  if (document.hidden && !$("background").checked) return "tab hidden";
  if (guest.onBattery && !$("battery").checked) return "on battery";
  return null;
}

function applyGuest() {
  setText("share-value", `${$("share").value} %`);
  for (const id of preferences) localStorage.setItem(`dtn-${id}`, String($(id).type === "checkbox" ? $(id).checked : $(id).value));
  if (!state.worker) return;
  const reason = guestPause();
  state.worker.postMessage(reason ? { type: "pause", reason } : { type: "resume" });
  state.worker.postMessage({ type: "share", share: Number($("share").value) / 100 });
  state.worker.postMessage({ type: "workers", count: Number($("cores").value) });
}

for (const id of preferences) {
  const saved = localStorage.getItem(`dtn-${id}`);
  if (saved !== null) $(id).type === "checkbox" ? ($(id).checked = saved === "true") : ($(id).value = saved);
  $(id).addEventListener("input", applyGuest);
}
document.addEventListener("visibilitychange", applyGuest);
navigator.getBattery?.().then((battery) => {
  const update = () => {
    guest.onBattery = !battery.charging;
    applyGuest();
  };
  battery.addEventListener("chargingchange", update);
  update();
});

async function refreshCredit(accepted) {
  // this key's standing, tallied by the edge from the validators' signed verdicts
  state.creditFor = accepted;
  const experiment = state.status.experiment;
  const response = await fetch(`/v1/experiments/${experiment}/credit/${state.status.peer_id}`).catch(() => null);
  if (!response?.ok) return;
  const standing = await response.json();
  state.credit = standing;
  setText(
    "credit",
    standing.accepted
      ? `Your credit: ${standing.examples.toLocaleString()} examples accepted in ${standing.accepted} window${standing.accepted === 1 ? "" : "s"} (${experiment}).`
      : "Your credit: nothing accepted yet.",
  );
}

function renderLeaderboard(experiment) {
  const rows = (experiment?.leaderboard ?? []).map((standing, i) => {
    const tr = document.createElement("tr");
    if (standing.peer_id === state.status.peer_id) tr.className = "you";
    const you = standing.peer_id === state.status.peer_id ? " (you)" : "";
    for (const text of [i + 1, `${standing.peer_id.slice(8, 20)}…${you}`, standing.accepted, standing.examples.toLocaleString()]) {
      const td = document.createElement("td");
      td.textContent = text;
      tr.append(td);
    }
    return tr;
  });
  $("leaderboard").tBodies[0].replaceChildren(...rows);
}

async function serviceWorkerInControl() {
  // static/sw.js keeps the runtime and the page: return visits start from disk, and the page opens
  // while the edge is briefly down. Its first install takes control of this page (clients.claim).
  if (!navigator.serviceWorker) return false;
  try {
    await navigator.serviceWorker.register("/sw.js");
    if (!navigator.serviceWorker.controller) {
      const claimed = new Promise((resolve) => navigator.serviceWorker.addEventListener("controllerchange", resolve));
      await Promise.race([claimed, new Promise((resolve) => setTimeout(resolve, 3000))]);
    }
  } catch (error) {
    console.info("no Service Worker: every visit loads the runtime again", error);
  }
  return Boolean(navigator.serviceWorker.controller);
}
const offlineReady = serviceWorkerInControl();

function makeWorker() {
  // the worker starts loading the runtime as soon as it exists (static/worker.js)
  // `?kernels=off` on the page trains without the WebAssembly kernels (benchmarks/browser.spec.ts),
  // `?kernels=wasm-simd` with the build that fuses no multiply-add (static/worker.js)
  const kernels = params.get("kernels");
  const worker = new Worker(`/static/worker.js${kernels ? `?kernels=${encodeURIComponent(kernels)}` : ""}`);
  const sharing = new HeadSharing((message) => worker.postMessage(message)); // heads from and to other tabs
  state.heads = sharing.stats;
  worker.onmessage = (event) => {
    if (sharing.handle(event.data)) return;
    if (event.data.type === "status") renderStatus(event.data.status);
    else renderStatus({ phase: `error: ${event.data.message}` });
  };
  return worker;
}

async function prepareReturningPeer() {
  // A return visit, the runtime already in the Service Worker's cache: boot it now (a few seconds of
  // CPU, no download), so that "Start contributing" trains at once. Not for a hidden tab.
  if (!(await offlineReady) || document.hidden || state.worker) return;
  const runtime = await fetch("/v1/peer-runtime")
    .then((response) => response.json())
    .catch(() => null);
  if (runtime?.pyodide && (await caches.match(`${runtime.pyodide.url}pyodide.asm.wasm`))) state.worker ??= makeWorker();
}

async function toggle() {
  if (state.starting) return;
  if (!state.running) {
    state.starting = true;
    state.serviceWorker = await offlineReady; // the worker's downloads go through it (read by the tests)
    state.starting = false;
    state.worker ??= makeWorker();
    state.worker.postMessage({
      type: "start",
      edgeUrl: location.origin,
      experiment: $("experiment").value || params.get("experiment"), // no list while the edge is down
      token: admissionToken, // for networks that require one: sent in the relay's join, never in a URL
      pins,
      workers: Number($("cores").value),
      heads: HeadSharing.supported, // heads from other tabs over WebRTC (static/head_sharing.js)
    });
    applyGuest();
    state.running = true;
  } else {
    state.worker.postMessage({ type: "stop" });
    state.running = false;
  }
  $("toggle").textContent = state.running ? "Stop" : "Start contributing";
  $("toggle").className = state.running ? "stop" : "";
}

const COLOURS = ["#2f6fed", "#c4320a", "#12805c", "#7a5af8"];

function drawChart(experiments) {
  const canvas = $("chart");
  const ctx = canvas.getContext("2d");
  const [w, h, left, bottom, top] = [canvas.width, canvas.height, 44, 28, 12];
  ctx.clearRect(0, 0, w, h);
  ctx.font = "12px system-ui";
  // the snapshot lists the newest heads and evenly spaced earlier ones (server/portal.py chart_heads)
  const maxWindow = Math.max(1, ...experiments.map((e) => e.lineage.at(-1)?.window ?? 0));
  const x = (i) => left + ((w - left - 12) * i) / maxWindow;
  const y = (a) => top + (h - top - bottom) * (1 - a);
  ctx.strokeStyle = "#e4e7ec";
  ctx.fillStyle = "#667085";
  for (const tick of [0, 0.25, 0.5, 0.75, 1]) {
    ctx.beginPath();
    ctx.moveTo(left, y(tick));
    ctx.lineTo(w - 12, y(tick));
    ctx.stroke();
    ctx.fillText(tick.toFixed(2), 6, y(tick) + 4);
  }
  ctx.fillText("test accuracy by head (window)", left, h - 8);
  experiments.forEach((experiment, i) => {
    ctx.strokeStyle = COLOURS[i % COLOURS.length];
    ctx.lineWidth = 2;
    ctx.beginPath();
    const measured = experiment.lineage.filter((head) => head.metrics.test_accuracy !== undefined);
    measured.forEach((head, j) => {
      const acc = head.metrics.test_accuracy;
      j === 0 ? ctx.moveTo(x(head.window), y(acc)) : ctx.lineTo(x(head.window), y(acc));
    });
    ctx.stroke();
    ctx.fillStyle = COLOURS[i % COLOURS.length];
    for (const head of measured) {
      ctx.beginPath();
      ctx.arc(x(head.window), y(head.metrics.test_accuracy), 2.5, 0, 2 * Math.PI);
      ctx.fill();
    }
    ctx.fillText(experiment.key, left + 8, top + 14 + 14 * i);
  });
}

function renderSnapshot(snapshot) {
  state.snapshot = snapshot;
  setText("network-id", `network ${snapshot.network_id}`);
  const select = $("experiment");
  if (select.options.length === 0) {
    // a native-only experiment (its model is a workload, JAX code: protocol/workload.py) is not for a browser
    for (const experiment of snapshot.experiments.filter((e) => !("workload" in e.spec.model))) {
      select.add(new Option(experiment.key, experiment.key));
    }
    if (params.get("experiment")) select.value = params.get("experiment");
  }
  $("heads").replaceChildren(
    ...snapshot.experiments.map((experiment) => {
      const card = document.createElement("div");
      card.className = "head";
      card.dataset.experiment = experiment.key;
      const head = experiment.head;
      // a head's test-split evaluation follows it: the newest head measured so far
      const acc = experiment.lineage.findLast((h) => h.metrics.test_accuracy !== undefined)?.metrics.test_accuracy;
      card.innerHTML = `<div class="muted small"></div><div class="big"></div>
        <div class="small"></div><code></code>`;
      card.children[0].textContent = experiment.key;
      card.children[1].textContent = acc !== undefined ? `${(acc * 100).toFixed(2)} %` : head ? "measuring" : "no head yet";
      const run = experiment.control.state; // run control (protocol/run_control.py): validators' orders
      const halted = run.stopped ? " · stopped by its validators" : run.paused ? " · paused by its validators" : "";
      card.children[2].textContent = head
        ? `window ${head.window} · ${experiment.verdicts.accepted} accepted / ${experiment.verdicts.rejected} rejected${halted}`
        : halted;
      card.children[3].textContent = head ? head.head_id : "";
      return card;
    }),
  );
  drawChart(snapshot.experiments);
  renderLeaderboard(snapshot.experiments.find((e) => e.key === select.value) ?? snapshot.experiments[0]);
  const kinds = { ...snapshot.peers.active_by_kind };
  if (snapshot.peers.by_kind.viewer) kinds["viewers watching"] = snapshot.peers.by_kind.viewer;
  $("peers").replaceChildren(
    ...Object.entries(kinds).map(([kind, count]) => {
      const li = document.createElement("li");
      li.textContent = `${kind}: ${count}`;
      return li;
    }),
  );
  $("events").replaceChildren(...timeline(snapshot).slice(0, 30).map(eventItem));
}

// The recent events, newest first, with every run-control order and network revision the edge applied
// (kept in its store, so one older than the recent events stays in the timeline, once each).
function timeline(snapshot) {
  const orderKey = (experiment, d) => `${experiment} ${d.order.sequence}`;
  const revisionKey = (d) => `revision ${d.revision.number}`;
  const recent = new Set(
    snapshot.events
      .filter((e) => e.topic === "control" || e.topic === "network")
      .map((e) => (e.topic === "network" ? revisionKey(e.data) : orderKey(e.experiment, e.data))),
  );
  const orders = snapshot.experiments.flatMap((experiment) =>
    experiment.control.orders
      .filter((d) => !recent.has(orderKey(experiment.key, d)))
      .map((d) => ({ topic: "control", experiment: experiment.key, data: d, at_ms: d.applied_at_ms })),
  );
  const revisions = (snapshot.revisions ?? [])
    .filter((d) => !recent.has(revisionKey(d)))
    .map((d) => ({ topic: "network", experiment: "_network", data: d, at_ms: d.applied_at_ms }));
  return [...snapshot.events.slice().reverse(), ...orders, ...revisions].sort((a, b) => (b.at_ms ?? 0) - (a.at_ms ?? 0));
}

function eventItem(event) {
  const li = document.createElement("li");
  const d = event.data;
  const time = new Date(event.at_ms ?? Date.now()).toLocaleTimeString();
  let text = `${event.topic}`;
  if (event.topic === "heads") text = `new head, window ${d.window}, validation acc ${(d.metrics.val_accuracy ?? 0).toFixed(4)}`;
  else if (event.topic === "evaluations") text = `head of window ${d.window} measured: test acc ${(d.metrics.test_accuracy ?? 0).toFixed(4)}`;
  else if (event.topic === "verdicts") {
    text = d.accepted ? `verdict accepted into head ${String(d.head_id).slice(7, 19)}` : `verdict rejected: ${d.reason}${d.detail ? ` (${d.detail})` : ""}`;
    li.className = d.accepted ? "ok" : "bad";
  } else if (event.topic === "candidates") text = `candidate from ${d.peer_kind} ${d.peer_id.slice(0, 16)}…`;
  else if (event.topic === "leases") {
    const shards = d.shard_ids?.length ?? d.shards;
    text = d.released ? `lease of ${shards} shards given back: ${d.peer_id.slice(0, 16)}… left` : `lease of ${shards} shards to ${d.peer_id.slice(0, 16)}…`;
  }
  else if (event.topic === "peers") text = `${d.kind} peer joined`;
  else if (event.topic === "control") {
    const target = d.order.target ? ` ${String(d.order.target).slice(0, 20)}…` : "";
    text = `run control: ${d.order.action}${target} (order ${d.order.sequence}), signed by validators ${d.signers.join(", ")}`;
    li.className = "control";
  } else if (event.topic === "network") {
    const r = d.revision;
    const added = r.experiments.map((e) => e.key).join(", ") || "none";
    text = `network revision ${r.number}: experiments added ${added}; ${r.quorum} of ${r.validator_keys.length} validators, signed by ${d.signers.join(", ")}`;
    li.className = "control";
  }
  else if (event.topic === "metrics") text = `metrics from ${d.kind} ${String(d.peer_id).slice(0, 16)}…`;
  else if (event.topic === "quorum") {
    const head = String(d.head_id).slice(7, 19);
    text = d.rivals.length
      ? `validators disagree on window ${d.window}: ${d.rivals.length + 1} rival heads (${head} by ${d.proposer.slice(0, 8)}…)`
      : `head ${head} of window ${d.window} ${d.event} by validator ${d.validator.slice(0, 8)}…`;
    if (d.rivals.length || d.event === "disputed") li.className = "bad";
  }
  li.textContent = `${time} ${event.experiment === "_network" /* server.hub.NETWORK_SCOPE */ ? "" : event.experiment.split("/")[1] + ": "}${text}`;
  return li;
}

// Live events over the edge's read-only stream; heads and verdicts also refresh the snapshot.
function streamEvents(delay = 500) {
  const socket = new WebSocket(`${location.protocol === "https:" ? "wss" : "ws"}://${location.host}/v1/events`);
  let heartbeat = null;
  socket.onopen = () => {
    delay = 500;
    state.streaming = true;
    heartbeat = setInterval(() => socket.send('{"type":"ping"}'), 30_000);
  };
  socket.onmessage = (message) => {
    const event = JSON.parse(message.data);
    if (event.type !== "event") return;
    const list = $("events");
    list.prepend(eventItem(event));
    while (list.children.length > 30) list.lastChild.remove();
    if (["heads", "evaluations", "verdicts", "control", "network"].includes(event.topic)) refreshSoon();
  };
  socket.onclose = () => {
    state.streaming = false;
    clearInterval(heartbeat);
    setTimeout(() => streamEvents(Math.min(delay * 2, 10_000)), delay);
  };
}

// Events ask for a fresh snapshot at most every REFRESH_EVERY_MS: a window brings several (head, its
// evaluation, verdicts), and on a contributor's home link the snapshots would compete with its work.
const REFRESH_EVERY_MS = 2000;
let refreshing = null;
let refreshedAt = 0;
let refreshTimer = null;
function refreshSoon() {
  refreshTimer ??= setTimeout(() => {
    refreshTimer = null;
    refresh();
  }, Math.max(0, refreshedAt + REFRESH_EVERY_MS - Date.now()));
}

function refresh() {
  refreshedAt = Date.now();
  refreshing ??= fetch("/portal/snapshot", { cache: "no-store" })
    .then((response) => (response.ok ? response.json() : null))
    .then((snapshot) => snapshot && renderSnapshot(snapshot))
    .catch(() => setText("network-id", "edge unreachable, retrying…"))
    .finally(() => (refreshing = null));
  return refreshing;
}

async function poll() {
  await refresh();
  setTimeout(poll, state.streaming ? 5000 : 1500); // the stream makes frequent polling unnecessary
}

$("toggle").addEventListener("click", toggle);
await poll();
streamEvents();
if (params.get("contribute") === "1") toggle();
else prepareReturningPeer();
