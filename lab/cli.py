"""``python -m lab``: the mixed-fleet demo, the workloads run, the attack suite, and the stack the browser
tests use."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from native_peer.cli import configure_logging

from .stack import REPO

__all__ = ["main"]


def cmd_demo(args: argparse.Namespace) -> None:
    from .demo import BrowserUnavailable, run_demo

    try:
        summary = run_demo(
            args.out, max_minutes=args.max_minutes, browser=not args.no_browser, target_accuracy=args.target_accuracy
        )
    except BrowserUnavailable as exc:
        sys.exit(f"error: {exc}")
    if not summary["all_checks_passed"]:
        sys.exit("error: some checks failed; see " + str(args.out / "summary.md"))


def cmd_workloads(args: argparse.Namespace) -> None:
    from .demo import BrowserUnavailable
    from .workloads import WORKLOADS, run_workloads

    try:
        summary = run_workloads(
            args.out,
            max_minutes=args.max_minutes,
            target_accuracy=args.target_accuracy,
            browser=not args.no_browser,
            keys=tuple(WORKLOADS[name] for name in dict.fromkeys(args.workloads)),
            keep_going=args.keep_going,
        )
    except BrowserUnavailable as exc:
        sys.exit(f"error: {exc}")
    if not summary["all_checks_passed"]:
        sys.exit("error: some checks failed; see " + str(args.out / "summary.md"))


def cmd_attack_suite(args: argparse.Namespace) -> None:
    from .attacks import ATTACKS, SETTINGS, run_suite, scorecard_table, write_scorecard

    scorecard = run_suite(
        args.datasets,
        presets=tuple(args.presets),
        attacks=tuple(args.attacks or ATTACKS),
        fractions=tuple(args.fractions) if args.fractions else None,
        windows=args.windows,
        peers=args.peers,
        settings=tuple(args.settings or SETTINGS),
        seed=args.seed,
        fresh_identities=args.fresh_identities,
    )
    write_scorecard(args.out, scorecard)
    print(scorecard_table(scorecard))
    print(f"scorecard written to {args.out / 'scorecard.json'} and {args.out / 'scorecard.md'}")


def cmd_stack(args: argparse.Namespace) -> None:
    from .stack import serve_stack

    serve_stack(args.out, args.port, args.min_deadline_s)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m lab", description=__doc__)
    parser.add_argument("-v", "--verbose", action="store_true")
    sub = parser.add_subparsers(dest="command", required=True)

    demo = sub.add_parser("demo", help="single-machine mixed-fleet MNIST sanity run")
    demo.add_argument("--out", type=Path, default=Path("var/demo"))
    demo.add_argument("--max-minutes", type=float, default=20.0)
    demo.add_argument("--target-accuracy", type=float, default=0.95)
    demo.add_argument("--no-browser", action="store_true", help="run without the headless-browser trainer")
    demo.set_defaults(run=cmd_demo)

    workloads = sub.add_parser("workloads", help="the CNN and the char-level language model in a mixed fleet")
    workloads.add_argument("--out", type=Path, default=Path("var/workloads"))
    workloads.add_argument("--max-minutes", type=float, default=30.0)
    workloads.add_argument("--target-accuracy", type=float, default=0.99, help="the CNN's test accuracy")
    workloads.add_argument("--no-browser", action="store_true", help="run without the headless-browser trainers")
    workloads.add_argument("--keep-going", action="store_true", help="train until the time is up, past the target")
    workloads.add_argument(
        "--workloads", nargs="+", choices=("cnn", "lm"), default=["cnn", "lm"], help="which to run (default: both)"
    )
    workloads.set_defaults(run=cmd_workloads)

    suite = sub.add_parser("attack-suite", help="score the screening presets against attacks on real MNIST updates")
    suite.add_argument("--out", type=Path, default=Path("var/attack-suite"))
    suite.add_argument("--datasets", type=Path, default=Path("var/datasets"))
    suite.add_argument("--presets", nargs="+", default=["minimal", "balanced", "strict"])
    suite.add_argument("--attacks", nargs="*", default=None, help="default: all")
    suite.add_argument("--windows", type=int, default=4)
    suite.add_argument("--peers", type=int, default=10)
    suite.add_argument(
        "--fractions",
        nargs="*",
        type=float,
        default=None,
        help="attacker fractions in the iid setting (default: planned)",
    )
    suite.add_argument(
        "--settings", nargs="*", default=None, help="default: all (iid, label_skew, label_skew_1, cohorts)"
    )
    suite.add_argument("--seed", type=int, default=0, help="another genesis, warm-up and draws (0: the CI scorecard's)")
    suite.add_argument(
        "--fresh-identities", action="store_true", help="attackers sign with new keys every window (no record)"
    )
    suite.set_defaults(run=cmd_attack_suite)

    stack = sub.add_parser("stack", help="an edge and a validator on one port until terminated (browser tests)")
    stack.add_argument("--port", type=int, default=8765)
    stack.add_argument("--out", type=Path, default=REPO / "var" / "e2e")
    stack.add_argument(
        "--min-deadline-s",
        type=float,
        default=5.0,
        help="how long a window waits at least for a lease that never delivers (default 5; the experiments' "
        "window_timeout_s is raised to it where shorter)",
    )
    stack.set_defaults(run=cmd_stack)

    args = parser.parse_args(argv)
    configure_logging(args.verbose)
    args.run(args)
