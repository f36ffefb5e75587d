"""Soak and fault benchmark of a served recipe (issue 35; docs/bench.md, "Soak").

Builds the recipe decoupled, serves it with ``specbuild serve --openai-port P --restart on-failure``
on free loopback ports, measures plain-decoding throughput at ``--concurrency``, then drives an
open-loop mix at ``--fraction`` of it for ``--duration``: Triton gRPC and the OpenAI front, streamed
and unary, 10 % cancelling mid-stream, 5 % bad requests, 10 % on new connections, prompts up to
near ``max_input_len``. Every ``--interval`` it records outcomes, sampled output equality with the
plain reference, server RSS and threads, TTFT/ITL/E2E percentiles and acceptance. ``--fault`` injects
faults (kill, stall, disk-full, kv-exhaust) spread over the run. Writes ``soak.json`` and
``soak.png`` under ``--results-dir`` and exits 1 when a pass criterion fails.

    python benchmarks/soak.py --recipe smollm2-ngram --duration 60m --results-dir out/soak-60m
    python benchmarks/soak.py --recipe smollm2-ngram --duration 5m --interval 30s --results-dir out/soak-5m
    python benchmarks/soak.py --recipe smollm2-ngram --duration 6m --interval 20s \\
        --fault kill,stall,disk-full,kv-exhaust --results-dir out/soak-faults
    python benchmarks/soak.py --recipe smollm2-ngram --url 127.0.0.1:8001 --openai http://127.0.0.1:9000/v1 \\
        --server-pid "$(pgrep -n tritonserver)" --duration 10m --results-dir out/soak-running
"""

from __future__ import annotations

import argparse
import re
import sys
from pathlib import Path

from specbuild.soak.faults import FAULTS
from specbuild.soak.harness import SoakConfig, run_soak
from specbuild.soak.load import Mix

UNITS = {"s": 1, "m": 60, "h": 3600, "": 1}


def duration(text: str) -> float:
    """``90``, ``90s``, ``5m``, ``1.5h`` -> seconds. Raises ``argparse.ArgumentTypeError`` otherwise."""
    match = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*([smh]?)\s*", text)
    if not match or float(match.group(1)) <= 0:
        raise argparse.ArgumentTypeError(f"{text!r} is not a duration; write e.g. 90s, 5m or 1h")
    return float(match.group(1)) * UNITS[match.group(2)]


def fault_list(text: str) -> tuple[str, ...]:
    names = tuple(n.strip() for n in text.split(",") if n.strip())
    unknown = [n for n in names if n not in FAULTS]
    if unknown:
        raise argparse.ArgumentTypeError(f"unknown fault(s) {unknown}; choose from {','.join(FAULTS)}")
    return names


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter,
                                epilog="\n\n".join(__doc__.split("\n\n")[1:]))
    p.add_argument("--recipe", default="smollm2-ngram", help="bundled recipe name or recipe file [smollm2-ngram]")
    p.add_argument("--results-dir", type=Path, required=True, help="soak.json, soak.png, logs, live/ (the live results)")
    p.add_argument("--duration", type=duration, default=3600.0, help="load time after calibration [60m]")
    p.add_argument("--interval", type=duration, default=60.0, help="sampling interval [60s]")
    p.add_argument("--warmup", type=duration, default=None, help="warm-up excluded from RSS and p99 drift [duration/10, at most 5m]")
    p.add_argument("--fraction", type=float, default=0.7, help="load as a fraction of plain-decoding token throughput [0.7]")
    p.add_argument("--concurrency", type=int, default=4, help="calibration concurrency [4]")
    p.add_argument("--calibrate", type=duration, default=30.0, help="least calibration time [30s]")
    p.add_argument("--timeout", type=duration, default=60.0, help="client timeout per request [60s]")
    p.add_argument("--grace", type=duration, default=10.0, help="beyond the timeout, a request without answer or error is lost [10s]")
    p.add_argument("--fault", type=fault_list, default=(), help=f"faults to inject, comma-separated: {','.join(FAULTS)}")
    p.add_argument("--stall", type=duration, default=10.0, help="SIGSTOP time of the stall fault [10s]")
    p.add_argument("--max-tokens", default="16,32,64", help="output lengths drawn from [16,32,64]")
    p.add_argument("--sample", type=float, default=0.5, help="fraction of completed outputs compared with the reference [0.5]")
    p.add_argument("--max-requests", type=int, default=100_000, help="stop sending after this many [100000]")
    p.add_argument("--max-in-flight", type=int, default=64, help="arrivals beyond this many running are shed (counted) [64]")
    p.add_argument("--no-fill-slots", dest="fill_slots", action="store_false",
                   help="skip writing every KV slot once before the load (the RSS baseline then includes first-touch growth)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--output-root", type=Path, default=None, help="where the recipe is built [./specbuild-out]")
    p.add_argument("--url", default=None, help="soak a running deployment's gRPC host:port instead of serving the recipe")
    p.add_argument("--openai", default=None, help="with --url: its OpenAI front's base URL (else Triton only)")
    p.add_argument("--server-pid", type=int, default=None, help="with --url: tritonserver's pid (RSS, kill and stall)")
    return p


def config_from(args: argparse.Namespace) -> SoakConfig:
    max_tokens = tuple(int(x) for x in args.max_tokens.split(","))
    return SoakConfig(
        recipe=args.recipe, results_dir=args.results_dir, duration_s=args.duration, interval_s=args.interval,
        warmup_s=args.warmup, fraction=args.fraction, concurrency=args.concurrency, calibrate_s=args.calibrate,
        timeout_s=args.timeout, grace_s=args.grace, faults=args.fault, stall_s=args.stall,
        mix=Mix(max_tokens=max_tokens, sample=args.sample), max_requests=args.max_requests,
        max_in_flight=args.max_in_flight, seed=args.seed, output_root=args.output_root,
        grpc_url=args.url, openai_url=args.openai, server_pid=args.server_pid, fill_slots=args.fill_slots,
    )


def main(argv: list[str] | None = None) -> int:
    args = parser().parse_args(argv)
    report = run_soak(config_from(args), log=lambda line: print(line, flush=True))
    print(f"wrote {args.results_dir / 'soak.json'} and soak.png")
    return 0 if report["passed"] else 1


if __name__ == "__main__":
    sys.exit(main())
