// Heads from peers: this tab fetches the current head from other tabs that hold it, over WebRTC data
// channels, and serves the heads it holds to them. The page owns the connections (Chromium has no
// RTCPeerConnection in workers); the worker's Python decides and checks (browser_peer/peer.py: it asks
// the edge who holds the head, verifies every byte by content id, drops a peer that lied and falls back
// to HTTP). Messages with the worker (static/worker.js):
//
//   worker → {type: "head.fetch", id, head_id, holders, max_bytes}  page → {type: "head.fetched", id, data?, peer_id?}
//   worker → {type: "head.keep", head_id, data}     verified: kept (the RECENT_HEADS latest) and served
//   worker → {type: "peer.drop", peer_id, reason}   it sent wrong bytes: closed, never asked or served again
//   worker → {type: "signal", peer_id, data: JSON}  page → {type: "signal", peer_id, data}: relayed by the edge
//   worker → {type: "ice", servers, relay_only}     the edge's ICE servers (protocol/ice.py, checked by the
//                                                   worker's Python), for the connections made from now on
//
// Signaling, one message each way (the descriptions carry every candidate gathered: the host's, and
// with the edge's STUN/TURN servers its public and relayed addresses; relay_only: relayed ones only):
//   asker → {kind: "offer", sdp}   holder → {kind: "answer", sdp}   either → {kind: "bye"}
//   the edge → {kind: "unreachable"} when it could not deliver ours
// On the data channel "heads" (ordered, reliable), one request at a time:
//   asker → {"type": "get", "head_id"}
//   holder → {"type": "head", "head_id", "size_bytes"} then binary chunks of CHUNK_BYTES | {"type": "missing" | "busy"}
// A holder that fails (no connection, too slow: all tries share FETCH_BUDGET_MS) is not asked for REST_MS.
const CHUNK_BYTES = 64 * 1024;
const RECENT_HEADS = 3;
const MAX_LINKS = 8; // connections kept in each direction; the least recently used is closed first
const MAX_TRANSFERS = 4; // heads being sent at once, to all askers together
const ASKER_BYTES_PER_PERIOD = 64 * 1024 * 1024; // what one asker may take in PERIOD_MS
const PERIOD_MS = 10 * 60_000;
const MAX_TRIES = 3; // holders asked per head, in the order the edge gave
const FETCH_BUDGET_MS = 30_000; // for all of them together; then the worker downloads it from the edge
const CONNECT_TIMEOUT_MS = 8_000;
const REST_MS = 10 * 60_000; // a holder that failed (no connection, too slow) is not asked again for this long
const MAX_NOTES = 50; // entries kept in each list of stats
const GATHER_TIMEOUT_MS = 2_000;
const MAX_SDP_CHARS = 16_384;
const OFFERS_PER_MINUTE = 60; // connections this tab answers, from all askers together
const BUFFERED_BYTES = 1024 * 1024; // sending waits while more than this is queued on the channel

export class HeadSharing {
  static supported = typeof RTCPeerConnection === "function";

  constructor(post) {
    this.post = post; // to the worker
    this.heads = new Map(); // head id -> bytes, verified by the worker, oldest first
    this.asking = new Map(); // peer id -> link (we asked for the connection: we fetch over it)
    this.serving = new Map(); // peer id -> link (it asked: we serve over it)
    this.dropped = new Set();
    this.resting = new Map(); // peer id -> until when it is not asked (it failed)
    this.transfers = 0;
    this.offers = { sinceMs: 0, count: 0 };
    this.ice = { iceServers: [] }; // host candidates only, until the edge names ICE servers
    // read by the page and the browser tests
    this.stats = { received_bytes: 0, served_bytes: 0, served: 0, fetched: [], dropped: [], failures: [] };
  }

  handle(message) {
    // true when the message was for head sharing
    if (message.type === "head.fetch") {
      this.fetch(message).then(({ data, peer_id }) => this.post({ type: "head.fetched", id: message.id, data, peer_id }));
    } else if (message.type === "head.keep") {
      this.heads.delete(message.head_id);
      this.heads.set(message.head_id, message.data);
      while (this.heads.size > RECENT_HEADS) this.heads.delete(this.heads.keys().next().value);
    } else if (message.type === "peer.drop") {
      this.dropped.add(message.peer_id);
      note(this.stats.dropped, message.peer_id);
      this.close(this.asking, message.peer_id, "bye");
      this.close(this.serving, message.peer_id, "bye");
    } else if (message.type === "signal") {
      this.signalled(message.peer_id, message.data);
    } else if (message.type === "ice") {
      this.ice = { iceServers: message.servers, iceTransportPolicy: message.relay_only ? "relay" : "all" };
    } else return false;
    return true;
  }

  // -- asking ------------------------------------------------------------------------------------
  async fetch({ head_id: headId, holders, max_bytes: maxBytes }) {
    const deadline = Date.now() + FETCH_BUDGET_MS;
    const usable = (peer) => !this.dropped.has(peer) && (this.resting.get(peer) ?? 0) <= Date.now();
    for (const peerId of holders.filter(usable).slice(0, MAX_TRIES)) {
      try {
        const data = await this.ask(peerId, headId, maxBytes, deadline);
        if (data) {
          this.stats.received_bytes += data.byteLength;
          note(this.stats.fetched, { head_id: headId, peer_id: peerId, size_bytes: data.byteLength });
          return { data, peer_id: peerId };
        }
      } catch (error) {
        note(this.stats.failures, `${peerId.slice(0, 16)}: ${error.message}`);
        this.resting.set(peerId, Date.now() + REST_MS);
        this.close(this.asking, peerId, "bye");
      }
      if (Date.now() >= deadline) break;
    }
    for (const [peerId, untilMs] of this.resting) if (untilMs <= Date.now()) this.resting.delete(peerId);
    return {};
  }

  async ask(peerId, headId, maxBytes, deadline) {
    // the head's bytes from peerId (unchecked), or null when it has none to give now
    const link = this.asking.get(peerId) ?? this.connect(peerId);
    touch(this.asking, peerId);
    await within(link.open, Math.min(CONNECT_TIMEOUT_MS, deadline - Date.now()), "no connection");
    const answer = new Promise((resolve, reject) => (link.pending = { headId, maxBytes, resolve, reject }));
    link.channel.send(JSON.stringify({ type: "get", head_id: headId }));
    try {
      return await within(answer, deadline - Date.now(), "too slow");
    } finally {
      link.pending = null;
    }
  }

  connect(peerId) {
    const pc = new RTCPeerConnection(this.ice);
    const channel = pc.createDataChannel("heads", { ordered: true });
    channel.binaryType = "arraybuffer";
    const link = { pc, channel, pending: null };
    link.open = new Promise((resolve, reject) => {
      channel.onopen = resolve;
      link.fail = reject;
    });
    link.open.catch(() => {}); // a failure is seen by whoever awaits it
    channel.onmessage = (event) => this.received(link, event.data);
    channel.onclose = () => {
      link.fail(new Error("connection closed"));
      link.pending?.reject(new Error("connection closed"));
      if (this.asking.get(peerId) === link) this.asking.delete(peerId);
    };
    this.keep(this.asking, peerId, link);
    (async () => {
      await pc.setLocalDescription();
      await gathered(pc);
      this.signal(peerId, { kind: "offer", sdp: pc.localDescription.sdp });
    })().catch((error) => link.fail(error));
    return link;
  }

  received(link, data) {
    const pending = link.pending;
    if (!pending) return;
    if (typeof data === "string") {
      const message = parse(data);
      const size = message?.size_bytes;
      if (message?.type === "head" && message.head_id === pending.headId && Number.isInteger(size) && size > 0 && size <= pending.maxBytes) {
        pending.bytes = new Uint8Array(size);
        pending.received = 0;
      } else pending.resolve(null); // missing, busy or nonsense: try another holder
    } else if (!pending.bytes || pending.received + data.byteLength > pending.bytes.byteLength) {
      pending.reject(new Error("more bytes than announced"));
    } else {
      pending.bytes.set(new Uint8Array(data), pending.received);
      pending.received += data.byteLength;
      if (pending.received === pending.bytes.byteLength) pending.resolve(pending.bytes);
    }
  }

  // -- serving -----------------------------------------------------------------------------------
  async answer(peerId, sdp) {
    this.close(this.serving, peerId);
    const pc = new RTCPeerConnection(this.ice);
    const link = { pc, channel: null, busy: false, periodStartMs: Date.now(), periodBytes: 0 };
    this.keep(this.serving, peerId, link);
    pc.ondatachannel = ({ channel }) => {
      if (link.channel || channel.label !== "heads") return channel.close();
      link.channel = channel;
      channel.binaryType = "arraybuffer";
      channel.bufferedAmountLowThreshold = BUFFERED_BYTES / 2;
      channel.onmessage = (event) => this.serve(peerId, link, event.data).catch(() => channel.close());
      channel.onclose = () => this.serving.get(peerId) === link && this.close(this.serving, peerId);
    };
    await pc.setRemoteDescription({ type: "offer", sdp });
    await pc.setLocalDescription();
    await gathered(pc);
    this.signal(peerId, { kind: "answer", sdp: pc.localDescription.sdp });
  }

  async serve(peerId, link, data) {
    const request = typeof data === "string" ? parse(data) : null;
    if (request?.type !== "get" || typeof request.head_id !== "string") return link.channel.close();
    touch(this.serving, peerId);
    const head = this.heads.get(request.head_id);
    if (Date.now() - link.periodStartMs > PERIOD_MS) [link.periodStartMs, link.periodBytes] = [Date.now(), 0];
    const refusal = !head
      ? "missing"
      : link.busy || this.transfers >= MAX_TRANSFERS || link.periodBytes + head.byteLength > ASKER_BYTES_PER_PERIOD
        ? "busy"
        : null;
    if (refusal) return link.channel.send(JSON.stringify({ type: refusal, head_id: request.head_id }));
    link.busy = true;
    this.transfers += 1;
    try {
      const channel = link.channel;
      channel.send(JSON.stringify({ type: "head", head_id: request.head_id, size_bytes: head.byteLength }));
      for (let offset = 0; offset < head.byteLength && channel.readyState === "open"; offset += CHUNK_BYTES) {
        if (channel.bufferedAmount > BUFFERED_BYTES) await drained(channel);
        channel.send(head.subarray(offset, offset + CHUNK_BYTES));
      }
      link.periodBytes += head.byteLength;
      this.stats.served_bytes += head.byteLength;
      this.stats.served += 1;
    } finally {
      link.busy = false;
      this.transfers -= 1;
    }
  }

  // -- signaling and links -----------------------------------------------------------------------
  signal(peerId, data) {
    this.post({ type: "signal", peer_id: peerId, data });
  }

  signalled(peerId, text) {
    const data = parse(text);
    if (this.dropped.has(peerId) || typeof data?.kind !== "string") return;
    const sdp = typeof data.sdp === "string" && data.sdp.length <= MAX_SDP_CHARS ? data.sdp : null;
    if (data.kind === "offer" && sdp) {
      if (Date.now() - this.offers.sinceMs > 60_000) this.offers = { sinceMs: Date.now(), count: 0 };
      if (++this.offers.count > OFFERS_PER_MINUTE) return this.signal(peerId, { kind: "bye" });
      this.answer(peerId, sdp).catch(() => this.close(this.serving, peerId));
    } else if (data.kind === "answer" && sdp) {
      const link = this.asking.get(peerId);
      if (link?.pc.signalingState === "have-local-offer") {
        link.pc.setRemoteDescription({ type: "answer", sdp }).catch((error) => link.fail(error));
      }
    } else if (data.kind === "bye" || data.kind === "unreachable") {
      this.close(this.asking, peerId);
      this.close(this.serving, peerId);
    }
  }

  keep(links, peerId, link) {
    links.set(peerId, link);
    while (links.size > MAX_LINKS) this.close(links, links.keys().next().value, "bye");
  }

  close(links, peerId, farewell) {
    const link = links.get(peerId);
    if (!link) return;
    links.delete(peerId);
    link.fail?.(new Error("closed"));
    link.pending?.reject(new Error("closed"));
    link.pc.close();
    if (farewell) this.signal(peerId, { kind: farewell });
  }
}

function touch(links, peerId) {
  // most recently used last
  const link = links.get(peerId);
  links.delete(peerId);
  links.set(peerId, link);
}

function note(list, entry) {
  list.push(entry);
  if (list.length > MAX_NOTES) list.shift();
}

function parse(text) {
  try {
    return JSON.parse(text);
  } catch {
    return null;
  }
}

function within(promise, ms, reason) {
  let timer;
  const timeout = new Promise((_, reject) => (timer = setTimeout(() => reject(new Error(reason)), ms)));
  return Promise.race([promise, timeout]).finally(() => clearTimeout(timer));
}

function gathered(pc) {
  // the candidates are in the local description once gathering completes (a STUN or TURN server's
  // answer is a round trip; one that never answers costs GATHER_TIMEOUT_MS)
  if (pc.iceGatheringState === "complete") return Promise.resolve();
  return new Promise((resolve) => {
    const done = () => pc.iceGatheringState === "complete" && resolve();
    pc.addEventListener("icegatheringstatechange", done);
    setTimeout(resolve, GATHER_TIMEOUT_MS);
  });
}

function drained(channel) {
  return new Promise((resolve) => {
    channel.addEventListener("bufferedamountlow", resolve, { once: true });
    channel.addEventListener("close", resolve, { once: true });
  });
}
