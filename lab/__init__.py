"""The lab: everything that runs a network for people to look at, not a peer or the edge itself.

    stack    local networks: prepare MNIST + a validator identity + the manifest, run nodes as
             processes (``Fleet``) or in threads (``validating``, ``serve_stack``)
    demo     the single-machine mixed-fleet MNIST sanity run and its summary
    efficiency  what a run cost (samples, utilization, bytes), for the demo and the benchmarks
    workloads   ``python -m lab workloads``: the models beyond the MLP, trained by a mixed fleet
    simulated   simulated trainers: many real identities in one process, for the fleet benchmark
    attacks  the attack suite: the validators' real rules against attackers on real MNIST updates
    hostile  hostile clients against a real edge (squatters, idle connections, stalled uploads)
    rogue    a rogue validator key: floods proposals, mints and erases credit (one key of a quorum)
    charts   a dependency-free SVG accuracy chart
    browser_host  the browser peer's host under CPython (httpx, websockets): its code as a tab runs it
    links    emulated home links: a peer in a network namespace behind a rate each way, a round trip
             and loss (``HomeLink``; ``python -m lab.links forward`` is its packet forwarder)
    cli      ``python -m lab demo | attack-suite | stack``

``lab`` sits on top: it imports ``tools``, ``native_peer``, ``browser_peer``, ``server``, ``datasets``
and ``protocol``; nothing but tests and benchmarks imports ``lab``.
"""
