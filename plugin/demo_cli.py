"""`flashnpc demo`: the main job.

Until the plugin's village demo lands this runs the behavior-tree guard demo.
"""

from __future__ import annotations

import argparse


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--ticks", type=int, default=12)


def run(args: argparse.Namespace) -> int:
    from behavior_tree.demo import run_demo

    return run_demo(seed=args.seed, ticks=args.ticks)
