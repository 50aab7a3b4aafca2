"""``accelmux jobs ...``: submit and follow batch jobs of a running daemon over HTTP.

    accelmux jobs submit --model embed FILE     one input per line (FILE - reads stdin)
    accelmux jobs list
    accelmux jobs show ID
    accelmux jobs results ID [--offset N] [--limit N] [--all]   JSON lines, one per input
    accelmux jobs cancel ID

``--url`` (default ``$ACCELMUX_URL`` or http://127.0.0.1:8600) names the daemon;
``--api-key`` (default ``$ACCELMUX_API_KEY``) is sent as a bearer token: with API keys
configured a key sees only the jobs it submitted; the admin key sees every job.
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import sys
import urllib.error
import urllib.parse
import urllib.request
from typing import Any

DEFAULT_URL = "http://127.0.0.1:8600"
TIMEOUT_S = 60.0


class ClientError(Exception):
    """A request to the daemon failed; the message is for the user."""


def register(sub: Any) -> None:
    p = sub.add_parser("jobs", help="submit and follow batch jobs (embeddings, indexing)")

    def usage(_args: argparse.Namespace) -> int:
        p.print_help()
        return 2

    p.set_defaults(func=usage)
    jobs = p.add_subparsers(dest="jobs_command", metavar="ACTION")

    def action(name: str, help_text: str) -> argparse.ArgumentParser:
        q: argparse.ArgumentParser = jobs.add_parser(name, help=help_text)
        q.add_argument(
            "--url",
            default=os.environ.get("ACCELMUX_URL", DEFAULT_URL),
            help=f"daemon address (default $ACCELMUX_URL or {DEFAULT_URL})",
        )
        q.add_argument(
            "--api-key",
            default=os.environ.get("ACCELMUX_API_KEY"),
            help="bearer key (default $ACCELMUX_API_KEY): an API key sees the jobs it "
            "submitted, the admin key every job",
        )
        return q

    q = action("submit", "create a job from a file with one input per line")
    q.add_argument("--model", required=True, help="target service or model")
    q.add_argument("file", help="text file, one input per line; - reads stdin")
    q.set_defaults(func=run_submit)

    q = action("list", "list jobs, newest first")
    q.add_argument("--limit", type=int, default=20)
    q.set_defaults(func=run_list)

    q = action("show", "show one job's status and progress as JSON")
    q.add_argument("id")
    q.set_defaults(func=run_show)

    q = action("results", "print a job's results as JSON lines, one per input")
    q.add_argument("id")
    q.add_argument("--offset", type=int, default=0)
    q.add_argument("--limit", type=int, default=100)
    q.add_argument("--all", action="store_true", help="page through every result")
    q.set_defaults(func=run_results)

    q = action("cancel", "cancel a job (inputs in flight finish)")
    q.add_argument("id")
    q.set_defaults(func=run_cancel)


def _guarded(run: Any) -> Any:
    def wrapped(args: argparse.Namespace) -> int:
        try:
            return int(run(args))
        except ClientError as exc:
            print(f"accelmux jobs: {exc}", file=sys.stderr)
            return 1

    wrapped.__doc__ = run.__doc__
    return wrapped


@_guarded
def run_submit(args: argparse.Namespace) -> int:
    inputs = _read_inputs(args.file)
    if not inputs:
        raise ClientError(f"{args.file}: no inputs (every line is blank)")
    job = request(args, "POST", "/v1/jobs", {"model": args.model, "inputs": inputs})
    print(f"{job['id']}: {len(inputs)} input(s) for {job['model']}, status {job['status']}")
    return 0


@_guarded
def run_list(args: argparse.Namespace) -> int:
    page = request(args, "GET", f"/v1/jobs?limit={max(1, min(args.limit, 100))}")
    if not page["data"]:
        print("no jobs")
    for job in page["data"]:
        print(_summary(job))
    return 0


@_guarded
def run_show(args: argparse.Namespace) -> int:
    job = request(args, "GET", f"/v1/jobs/{_quote(args.id)}")
    print(json.dumps(job, indent=2))
    return 0


@_guarded
def run_results(args: argparse.Namespace) -> int:
    offset = max(0, args.offset)
    limit = max(1, min(args.limit, 1000))
    while True:
        page = request(
            args, "GET", f"/v1/jobs/{_quote(args.id)}/results?offset={offset}&limit={limit}"
        )
        for item in page["data"]:
            print(json.dumps(item, separators=(",", ":")))
        if not args.all or page["next_offset"] is None:
            return 0
        offset = page["next_offset"]


@_guarded
def run_cancel(args: argparse.Namespace) -> int:
    job = request(args, "POST", f"/v1/jobs/{_quote(args.id)}/cancel")
    print(_summary(job))
    return 0


def _summary(job: dict[str, Any]) -> str:
    counts = job["request_counts"]
    extra = f", {counts['failed']} failed" if counts["failed"] else ""
    return (
        f"{job['id']}  {job['status']:<9}  {job['model']}  "
        f"{counts['completed']}/{counts['total']} done{extra}"
    )


def _quote(job_id: str) -> str:
    return urllib.parse.quote(job_id, safe="")


def _read_inputs(path: str) -> list[str]:
    try:
        if path == "-":
            text = sys.stdin.read()
        else:
            with open(path, encoding="utf-8") as handle:
                text = handle.read()
    except OSError as exc:
        raise ClientError(f"cannot read {path}: {exc.strerror or exc}") from None
    except UnicodeDecodeError:
        raise ClientError(f"{path} is not UTF-8 text") from None
    return [line for line in text.splitlines() if line.strip()]


def request(args: argparse.Namespace, method: str, path: str, body: Any = None) -> dict[str, Any]:
    """One JSON request to the daemon; every failure becomes a :class:`ClientError`."""
    url = args.url.rstrip("/") + path
    data = None if body is None else json.dumps(body).encode()
    headers = {"Accept": "application/json"}
    if data is not None:
        headers["Content-Type"] = "application/json"
    if args.api_key:
        headers["Authorization"] = f"Bearer {args.api_key}"
    req = urllib.request.Request(url, data=data, method=method, headers=headers)
    try:
        with urllib.request.urlopen(req, timeout=TIMEOUT_S) as response:
            payload = response.read()
    except urllib.error.HTTPError as exc:
        with exc:
            raise ClientError(_http_error(exc.code, exc.read())) from None
    except urllib.error.URLError as exc:
        reason = exc.reason
        if isinstance(reason, ConnectionRefusedError):
            why = "connection refused; is `accelmux serve` running?"
        elif isinstance(reason, TimeoutError):
            why = f"no answer in {TIMEOUT_S:.0f} s"
        elif isinstance(reason, socket.gaierror):
            why = f"unknown host ({reason.strerror})"
        else:
            why = str(getattr(reason, "strerror", None) or reason)
        raise ClientError(f"cannot reach the daemon at {args.url}: {why}") from None
    except TimeoutError:
        raise ClientError(f"the daemon at {args.url} did not answer in {TIMEOUT_S:.0f} s") from None
    except (OSError, ValueError) as exc:
        raise ClientError(f"cannot talk to the daemon at {args.url}: {exc}") from None
    try:
        result: dict[str, Any] = json.loads(payload)
    except ValueError:
        raise ClientError(f"the daemon at {args.url} answered something that is not JSON") from None
    return result


def _http_error(status: int, payload: bytes) -> str:
    try:
        error = json.loads(payload)["error"]
        message = str(error["message"])
        param = f" [{error['param']}]" if error.get("param") else ""
    except (ValueError, KeyError, TypeError):
        text = payload.decode("utf-8", "replace").strip()[:200]
        return f"HTTP {status}: {text or 'no details'}"
    return f"HTTP {status}: {message}{param}"
