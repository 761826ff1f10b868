"""``omniserve recordings ls|get|rm|prune``: the recordings store, read directly.

It opens the store the gateways write (``OMNISERVE_RECORDINGS_URL`` or ``--url``: a directory or
any fsspec URL), so it works with no gateway running and needs no admin token, only access to
the store itself.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import orjson

from api.recordings.store import BadName, RecordingStore


def _store(args: argparse.Namespace) -> RecordingStore:
    from omnicore.settings import get_settings

    return RecordingStore(args.url or get_settings().recordings_url)


def _when(ts: object) -> str:
    if not isinstance(ts, int | float):
        return "-"
    return time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(ts))


def cmd_ls(args: argparse.Namespace) -> int:
    """List the recordings, newest first."""
    metas = _store(args).metas()[: args.limit]
    if args.json:
        print(orjson.dumps(metas, option=orjson.OPT_INDENT_2).decode())
        return 0
    print(f"{'ID':34} {'MODE':12} {'STARTED':19} {'LENGTH':>8} {'SIZE':>9}  CLOSED")
    for m in metas:
        total = (m.get("durations") or {}).get("total_s")
        length = f"{total:.1f}s" if isinstance(total, int | float) else "-"
        size = f"{int(m.get('bytes') or 0) / 1024:.0f}K"
        print(
            f"{m.get('id', '?'):34} {m.get('mode', '?'):12} {_when(m.get('started_at')):19} "
            f"{length:>8} {size:>9}  {m.get('close_reason', '-')}"
        )
    return 0


def cmd_get(args: argparse.Namespace) -> int:
    """Print a recording's metadata, or save it (``-o x.zip``: a zip; ``-o DIR``: its files)."""
    store = _store(args)
    meta = store.meta(args.id)
    if meta is None:
        print(f"no recording {args.id}", file=sys.stderr)
        return 1
    if not args.out:
        print(orjson.dumps(meta, option=orjson.OPT_INDENT_2).decode())
        return 0
    out = Path(args.out)
    if out.suffix == ".zip":
        with out.open("wb") as fh:
            store.write_zip(args.id, fh)
    else:
        out.mkdir(parents=True, exist_ok=True)
        for name in store.file_names(args.id):
            (out / name).write_bytes(store.read(args.id, name))
    print(out)
    return 0


def cmd_rm(args: argparse.Namespace) -> int:
    """Delete recordings; exit status 1 when one of them did not exist."""
    store = _store(args)
    missing = 0
    for rid in args.ids:
        if store.remove(rid):
            print(f"removed {rid}")
        else:
            print(f"no recording {rid}", file=sys.stderr)
            missing += 1
    return 1 if missing else 0


def cmd_prune(args: argparse.Namespace) -> int:
    """Apply the retention settings now (the gateways also do, every minute)."""
    from omnicore.settings import get_settings

    s = get_settings()
    pruned = _store(args).prune(s.recordings_max_age_s, s.recordings_max_bytes)
    print(f"pruned {len(pruned.by_age)} by age, {len(pruned.by_size)} by size")
    return 0


def run(args: argparse.Namespace) -> int:
    """Dispatch ``omniserve recordings <action>``; a malformed id is an error, not a path."""
    try:
        return int(args.action(args))
    except BadName as exc:
        print(exc, file=sys.stderr)
        return 2


def add_parser(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """The ``recordings`` subcommand and its actions."""
    rec = sub.add_parser("recordings", help="list, fetch or delete session recordings")
    rec.add_argument("--url", help="the store (default: OMNISERVE_RECORDINGS_URL)")
    rsub = rec.add_subparsers(dest="what", required=True)
    ls = rsub.add_parser("ls", help="list recordings, newest first")
    ls.add_argument("--limit", type=int, default=50)
    ls.add_argument("--json", action="store_true", help="print the metadata as JSON")
    ls.set_defaults(action=cmd_ls)
    get = rsub.add_parser("get", help="print a recording's metadata or save it")
    get.add_argument("id")
    get.add_argument("-o", "--out", help="NAME.zip for a zip archive, or a directory")
    get.set_defaults(action=cmd_get)
    rm = rsub.add_parser("rm", help="delete recordings")
    rm.add_argument("ids", nargs="+")
    rm.set_defaults(action=cmd_rm)
    pr = rsub.add_parser("prune", help="apply the retention settings now")
    pr.set_defaults(action=cmd_prune)
    rec.set_defaults(func=run)
