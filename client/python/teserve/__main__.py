"""python -m teserve: health and server-info checks from the command line.

    python -m teserve health --server localhost:50051        exit 0 when SERVING
    python -m teserve server-info --server localhost:50051

Exit codes: 0 success, 1 the server or the call failed, 2 bad usage.
"""
from __future__ import annotations

import argparse
import sys
from typing import List, Optional

from teserve._errors import TeserveError
from teserve.client import connect
from teserve.v1 import service_pb2


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m teserve", description=__doc__.split("\n")[0])
    sub = parser.add_subparsers(dest="command", required=True)
    for name, help_text in (("health", "grpc.health.v1 check; exit 0 when SERVING"),
                            ("server-info", "version, device, libraries and recipe availability")):
        p = sub.add_parser(name, help=help_text)
        p.add_argument("--server", default="localhost:50051", help="host:port (default %(default)s)")
        p.add_argument("--token", default=None, help="bearer token sent as authorization metadata")
        p.add_argument("--tls", action="store_true", help="TLS with the system root certificates")
        p.add_argument("--timeout", type=float, default=5.0, help="seconds (default %(default)s)")
    return parser


def main(argv: Optional[List[str]] = None) -> int:
    args = _parser().parse_args(argv)  # exits 2 on bad usage
    client = connect(args.server, token=args.token, tls=args.tls or None, timeout=args.timeout)
    try:
        if args.command == "health":
            status = client.health(timeout=args.timeout)
            print(status)
            return 0 if status == "SERVING" else 1
        info = client.server_info()
        print(f"teserve {info.version} on {info.device} ({info.device_name or 'no device name'})")
        print(f"max_sessions {info.max_sessions}, max_message_bytes {info.max_message_bytes}, "
              f"cuda_compiled {info.cuda_compiled}, gpus {info.gpu_count}")
        idle = f"{info.session_idle_timeout_seconds:g}s" if info.session_idle_timeout_seconds else "never"
        print(f"max_sessions_per_tenant {info.max_sessions_per_tenant}, "
              f"max_tokens_per_request {info.max_tokens_per_request}, "
              f"max_attention_scores {info.max_attention_scores}, max_live_handles {info.max_live_handles}, "
              f"memory_budget_bytes {info.memory_budget_bytes}, admission_tokens {info.admission_tokens}, "
              f"session_idle_timeout {idle}, checkpoints {'on' if info.checkpoints_enabled else 'off'}")
        for r in info.recipes:
            reason = f"  {r.reason}" if r.reason else ""
            print(f"  {r.recipe:<8} {service_pb2.Availability.Name(r.availability):<12}{reason}")
        return 0
    except TeserveError as e:
        print(f"python -m teserve {args.command}: {args.server}: {e}", file=sys.stderr)
        return 1
    finally:
        client.close()


if __name__ == "__main__":
    sys.exit(main())
