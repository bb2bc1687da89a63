"""``python -m fuzz``: an exploration, or one program replayed.

    python -m fuzz --programs 20000 --seed 0 --jobs 1 --log /tmp/fuzz.log
    python -m fuzz --programs 500 --targeted    # only programs of the targeted forms (forms.py, large.py)
    python -m fuzz --replay 17          # print program 17 (te and torch) and check it here
    python -m fuzz --huge               # the huge-extent programs, each in a child process

Progress goes to stdout every ``--every`` programs; the log gets every
failure with its program, then the table of programs and failures by feature.
The exit code is 1 when anything failed.
"""
import argparse
import json
import sys

from .runner import FAILED, program_seeds, run, targeted_seeds


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m fuzz", description=__doc__.splitlines()[0])
    ap.add_argument("--programs", type=int, default=1000, help="how many programs")
    ap.add_argument("--seed", type=int, default=0, help="the exploration's seed (program k is seed * 10**6 + k)")
    ap.add_argument("--start", type=int, default=0, help="first program index (to resume)")
    ap.add_argument("--jobs", type=int, default=1, help="concurrent child processes")
    ap.add_argument("--batch", type=int, default=100, help="programs per child process")
    ap.add_argument("--group", type=int, default=8, help="programs per te kernel")
    ap.add_argument("--timeout", type=float, default=120.0, help="seconds a program may take before it is a hang")
    ap.add_argument("--every", type=int, default=100, help="a progress line every this many programs")
    ap.add_argument("--log", default=None, help="file for the failures and the feature table")
    ap.add_argument("--targeted", action="store_true",
                    help="only programs that take a targeted form (large programs, forms.py's reads)")
    ap.add_argument("--replay", type=int, default=None, help="print and check one program seed in this process")
    ap.add_argument("--huge", action="store_true", help="run the huge-extent checks")
    args = ap.parse_args(argv)

    if args.replay is not None:
        from .check import check
        from .programs import generate
        print(generate(args.replay).text())
        record = check(args.replay)
        print(json.dumps(record, indent=1))
        return int(record["status"] in FAILED)
    if args.huge:
        from .bad_inputs import huge_extent_failures
        failures = huge_extent_failures()
        print("\n".join(failures) or "huge extents: all refused cleanly")
        return int(bool(failures))

    log = open(args.log, "a") if args.log else None

    def on_record(record, summary):
        if record["status"] in FAILED:
            print(f"FAIL seed {record['seed']}: {record['status']}: {record['detail'].strip().splitlines()[-1:]}",
                  flush=True)
            if log:
                log.write(summary.report(record) + "\n")
                log.flush()
        if summary.count % args.every == 0 and summary.count < args.programs:
            print(summary.line(args.programs), flush=True)

    seeds = (targeted_seeds if args.targeted else program_seeds)(args.seed, args.programs, args.start)
    summary = run(seeds, args.jobs, args.batch, args.timeout,
                  on_record=on_record, group=args.group)
    print(summary.line(args.programs))
    print(summary.table())
    if log:
        log.write(f"{summary.line(args.programs)}\n{summary.table()}\n")
        log.close()
    return int(any(summary.status[k] for k in FAILED))


if __name__ == "__main__":
    sys.exit(main())
