"""``lab.stack.Fleet``: the nodes a benchmark or ``python -m lab`` starts stop with it, also when its
process is told to stop (SIGTERM), instead of running on and taking the cores of what runs next."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

from lab.stack import REPO

SCRIPT = """
import sys, time
from pathlib import Path
from lab.stack import Fleet
with Fleet(Path(sys.argv[1])) as fleet:
    fleet.start("node", [sys.executable, "-c", "import time; time.sleep(60)"])
    print(fleet.processes["node"].pid, flush=True)
    time.sleep(60)
"""


def test_a_fleet_stops_its_nodes_when_its_process_is_terminated(tmp_path: Path) -> None:
    argv = [sys.executable, "-c", SCRIPT, str(tmp_path)]
    with subprocess.Popen(argv, stdout=subprocess.PIPE, cwd=REPO, text=True) as parent:
        assert parent.stdout is not None
        node = int(parent.stdout.readline())
        parent.send_signal(signal.SIGTERM)
        try:
            assert parent.wait(20) == 128 + signal.SIGTERM
            assert not Path(f"/proc/{node}").exists(), "the node outlived its fleet"  # stopped and reaped
        finally:
            if Path(f"/proc/{node}").exists():
                os.kill(node, signal.SIGKILL)
