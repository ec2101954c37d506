"""Hosting the edge on a VPS: nginx (TLS, WebSockets, Pyodide and shard files from disk), systemd
units for the edge and a validator, one environment file. ``python -m deploy --help``; the steps are
deploy/README.md (the runbook), and ``tests/test_deploy.py`` runs them through a real nginx.

    host       the environment file, nginx, the systemd units and their checks
    services   private PostgreSQL and Redis servers (tests and benchmarks)"""
