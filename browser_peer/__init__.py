"""The browser peer: Python that runs in Pyodide inside a Web Worker.

    numpy_trainer  the MLP's forward, backward and Adam in NumPy (pure)
    bridge         the small interface the peer needs from its host (HTTP, WebSocket, status, clock)
    guest          when and how much the peer may compute (paused, CPU share), as the page decides
    peer           BrowserPeer: join the relay, lease, fetch, train, sign, publish, repeat (pure
                   but for the bridge)
    js_bridge      the only module that touches ``js`` / ``pyodide``: the bridge in a browser

The page's worker (``static/worker.js``) loads Pyodide and this package (served by the edge as one
zip with ``protocol``, at the content-addressed URL ``/v1/peer-runtime`` names, checked against its
sha256), reads the identity seed from IndexedDB and calls ``js_bridge.start``.
"""
