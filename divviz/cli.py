"""`divviz` on the command line: the same catalogue and engine as the app, headless.

    divviz measures [--json]
    divviz bounds --measure NAME [--param k=v]... [--pi-old P] [--json]

Bad input exits with code 2 and one line on stderr, never a traceback.
"""

from __future__ import annotations

import argparse
import json
import math
import sys

import numpy as np

from divviz.divergences import CATALOGUE, DUAL_CLIP, clip_test, get_entry
from divviz.params import DivvizInputError, Param, parse_assignments


class _Parser(argparse.ArgumentParser):
    def error(self, message):  # one line, exit 2 (argparse's default prints the usage too)
        raise DivvizInputError(message)


def _param_json(p: Param) -> dict:
    return {"name": p.name, "default": p.default, "kind": p.kind, "range": p.range_text(),
            "doc": p.doc, "trl_name": p.trl_name}


def cmd_measures(args) -> int:
    rows = [
        {"name": e.name, "family": e.family, "title": e.title, "latex": e.latex, "doc": e.doc,
         "params": [_param_json(p) for p in e.params]}
        for e in CATALOGUE.values()
    ]
    rows.append({"name": "dual_clip", "family": "cap", "title": "dual-clip cap for A < 0",
                 "latex": r"\ell_t \le -c\,A_t \;(A_t<0)", "doc": DUAL_CLIP.doc,
                 "params": [_param_json(DUAL_CLIP)]})
    if args.json:
        print(json.dumps(rows, indent=2))
        return 0
    for row in rows:
        params = ", ".join(f"{p['name']}={p['default']:g}" if p["kind"] != "bool" else f"{p['name']}={int(p['default'])}"
                           for p in row["params"])
        print(f"{row['name']:<12} {row['family']:<8} {row['title']}" + (f"  [{params}]" if params else ""))
    return 0


def cmd_bounds(args) -> int:
    entry = get_entry(args.measure)
    if entry.family != "clip":
        raise DivvizInputError(f"'{args.measure}' is a penalty; only clip tests have a feasible ratio interval")
    test = clip_test(args.measure, **parse_assignments(args.param))
    pi_old = None
    if args.pi_old is not None:
        pi_old = Param("pi_old", 0.5, 0.0, 1.0, low_open=True, high_open=False).check(args.pi_old, "bounds")
    if test.entry.needs_pi_old and pi_old is None:
        raise DivvizInputError(f"{test.name}: its interval depends on π_old; pass --pi-old P with P in (0, 1]")
    lower, upper = (float(b) for b in test.bounds(None if pi_old is None else np.asarray(pi_old)))
    if args.json:
        print(json.dumps({"measure": test.name, "params": test.params, "lower": lower,
                          "upper": None if math.isinf(upper) else upper}))
    else:
        where = f" at π_old = {pi_old:g}" if pi_old is not None else ""
        print(f"{test.name} {test.params}{where}: {lower:.10g} <= w <= {upper:.10g}")
    return 0


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(prog="divviz", description="See what a policy-divergence constraint does to GRPO.")
    sub = parser.add_subparsers(dest="command", required=True, parser_class=_Parser)

    p = sub.add_parser("measures", help="list the catalogue of divergence measures")
    p.add_argument("--json", action="store_true", help="machine-readable output")
    p.set_defaults(run=cmd_measures)

    p = sub.add_parser("bounds", help="feasible ratio interval [l, u] of a clip test")
    p.add_argument("--measure", required=True, help="clip test name, e.g. kl3 (see `divviz measures`)")
    p.add_argument("--param", action="append", default=[], metavar="K=V", help="a parameter, e.g. delta=0.05")
    p.add_argument("--pi-old", help="π_old of the token, for tests that depend on it (prob_tv)")
    p.add_argument("--json", action="store_true", help='print {"measure", "params", "lower", "upper"}')
    p.set_defaults(run=cmd_bounds)
    return parser


def main(argv: list[str] | None = None) -> int:
    try:
        args = build_parser().parse_args(argv)
        return args.run(args)
    except DivvizInputError as err:
        print(f"divviz: error: {err}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
