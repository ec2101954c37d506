"""The browser peer: Python that runs in Pyodide inside a Web Worker.

    numpy_trainer  any model spec's forward, backward and Adam in NumPy (pure), on a Backend
    kernels        the WebAssembly SIMD kernels (kernels.wat) as that backend, on NumPy arrays in place
    bridge         the small interface the peer needs from its host (HTTP, WebSocket, status, clock)
    guest          when and how much the peer may compute (paused, CPU share), as the page decides
    costs          what contributing costs and yields: time training, paused and waiting; bytes a window
    peer           BrowserPeer: join the relay, lease, fetch, train, sign, publish, repeat (pure
                   but for the bridge)
    shard_store    the shards a tab keeps by content, across leases and page loads
    js_bridge      the only module that touches ``js`` / ``pyodide``: the bridge in a browser
    session        EdgeSession: the peer's HTTP to the edge (the upload and download plans)
    parts          one window on several cores of one tab, in parts
    progress       what the peer keeps across page loads (optimizer, codec residual, progress)
    throughput     how fast this runtime trains a model (the page's benchmark)

The page's worker (``static/worker.js``) loads Pyodide and this package (served by the edge as one
zip with ``protocol``, at the content-addressed URL ``/v1/peer-runtime`` names, checked against its
sha256), reads the identity seed from IndexedDB and calls ``js_bridge.start``.
"""
