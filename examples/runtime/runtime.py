#!/usr/bin/env python3
"""A bot runtime for computerd: a starting point for your own (Python 3 standard library only).

It claims its bot's runs (a long poll with a lease, renewed in the background), brings each
attachment into the Computer with a checked copy, checks the copy again from inside the Computer,
reports what it does as the run's events, and ends the run with the artifacts as its result. The
"brain" here is a fixed plan; put your model's loop where `work` is.

    python3 examples/runtime/runtime.py --url http://127.0.0.1:8080 --token-file bot.token \\
        --computer cmp_... [--once]

The token is the bot's (`POST /v1/tokens {"botId": ...}`); the bot needs a grant on the Computer
(`PUT /v1/computers/:id/bots/:bot`). Every call names the run's claim, so a runtime that lost its
lease (it stalled, or was killed and another took over) is refused instead of acting twice.

`--hold-after-claim` makes it wait on its standard input after claiming and saying so on standard
output (`claimed run_...`): a drill for killing a runtime mid-run. Exit codes: 0 done, 2 usage,
3 the cluster refused something it should not have.
"""

import argparse
import json
import sys
import threading
import time
import urllib.error
import urllib.request

# A runtime coalesces partials: at most one per 250 ms (the run's events are bounded).
PARTIAL_EVERY_S = 0.25


class Refused(Exception):
    """The cluster answered an error: its status and body."""

    def __init__(self, status, body):
        super().__init__(f"{status}: {body}")
        self.status = status
        self.body = body


class Api:
    def __init__(self, url, token):
        self.url = url.rstrip("/")
        self.token = token

    def call(self, method, path, body=None, timeout=60):
        data = None if body is None else json.dumps(body).encode()
        req = urllib.request.Request(self.url + path, data=data, method=method)
        req.add_header("authorization", "Bearer " + self.token)
        if data is not None:
            req.add_header("content-type", "application/json")
        try:
            with urllib.request.urlopen(req, timeout=timeout) as resp:
                raw = resp.read()
                return resp.status, (json.loads(raw) if raw else None)
        except urllib.error.HTTPError as e:
            raw = e.read()
            try:
                body = json.loads(raw)
            except ValueError:
                body = raw.decode(errors="replace")
            raise Refused(e.code, body) from None


class Run:
    """One claimed run: its events and its end, all under the claim."""

    def __init__(self, api, claimed):
        self.api = api
        self.run = claimed["run"]
        self.id = self.run["runId"]
        self.claim = claimed["claim"]
        self.lease_ms = claimed["leaseMs"]
        self.lost = threading.Event()
        self.stop = threading.Event()
        self.last_partial = 0.0
        self.renewer = threading.Thread(target=self._renew, daemon=True)
        self.renewer.start()

    def _renew(self):
        # Renew at a third of the lease, so one slow answer does not lose it.
        while not self.stop.wait(self.lease_ms / 3000):
            try:
                self.api.call("POST", f"/api/runs/{self.id}/lease", {"claim": self.claim, "leaseMs": self.lease_ms})
            except Refused as e:
                if e.status == 409:
                    self.lost.set()
                    return
            except OSError:
                pass  # the next renewal tries again, through any node

    def event(self, kind, data):
        if self.lost.is_set():
            raise Refused(409, "the lease was lost")
        if kind == "partial":
            wait = self.last_partial + PARTIAL_EVERY_S - time.monotonic()
            if wait > 0:
                time.sleep(wait)
            self.last_partial = time.monotonic()
        self.api.call("POST", f"/api/runs/{self.id}/events", {"claim": self.claim, "kind": kind, "data": data})

    def finish(self, outcome, computer, result=None, error=None):
        # Naming the Computer lets the run's `afterRun: pause` pause it once the run ended.
        self.stop.set()
        body = {"claim": self.claim, "outcome": outcome, "result": result, "error": error, "computerId": computer}
        return self.api.call("POST", f"/api/runs/{self.id}/finish", body)[1]


def work(api, run, computer):
    """The plan: bring the files in, check them from inside, answer what is where."""
    run.event("partial", f"Working on: {run.run['text']}")
    artifacts = []
    for a in run.run["attachments"]:
        path = f".agent-turn/{run.id}/inbox/{a['name']}"
        _, blob = api.call("GET", f"/api/blobs/{a['blobId']}/info")
        _, art = api.call(
            "POST", f"/v1/computers/{computer}/copy-to-box", {"blobId": a["blobId"], "path": path}
        )
        # The agent checked length and SHA-256 before placing it; the artifact says what it counted.
        if art["sha256"] != blob["sha256"] or art["size"] != blob["size"]:
            raise Refused(0, f"the copy of {a['name']} is not its blob: {art} vs {blob}")
        run.event("activity", {"tool": "copy-to-box", "artifactId": art["artifactId"], "path": art["path"]})
        # Checked again from inside the Computer, as a later step would see it.
        _, out = api.call(
            "POST", f"/v1/computers/{computer}/sessions", {"command": f"sha256sum -- '{path}'"}
        )
        inside = (out.get("output") or "").split(" ")[0]
        if out.get("exitCode") != 0 or inside != blob["sha256"]:
            raise Refused(0, f"inside the Computer {a['name']} hashes to {inside!r}")
        run.event("partial", f"{a['name']} is in the Computer ({art['size']} bytes, sha256 {inside[:12]}…)")
        artifacts.append({"name": a["name"], "artifactId": art["artifactId"], "path": art["path"], "sha256": inside})
    return {"computerId": computer, "artifacts": artifacts}


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--url", required=True)
    p.add_argument("--token-file", required=True)
    p.add_argument("--computer", required=True, help="the Computer the bot works on")
    p.add_argument("--bot", help="the bot (a member's token must name it)")
    p.add_argument("--once", action="store_true", help="end after one run")
    p.add_argument("--lease-ms", type=int, default=30000)
    p.add_argument("--hold-after-claim", action="store_true", help=argparse.SUPPRESS)
    args = p.parse_args()
    with open(args.token_file) as f:
        api = Api(args.url, f.read().strip())
    claim = {"waitMs": 20000, "leaseMs": args.lease_ms}
    if args.bot:
        claim["botId"] = args.bot
    while True:
        status, claimed = api.call("POST", "/api/runs/claim", claim, timeout=40)
        if status == 204:
            continue
        run = Run(api, claimed)
        print(f"claimed {run.id} attempt {run.run['attempts']}", flush=True)
        if args.hold_after_claim:
            sys.stdin.read()
        try:
            result = work(api, run, args.computer)
            run.event("partial", "Done.")
            ended = run.finish("succeeded", args.computer, result=result)
            print(f"finished {run.id}", flush=True)
            if "afterRun" in ended:
                print(f"afterRun {json.dumps(ended['afterRun'], sort_keys=True)}", flush=True)
        except Refused as e:
            if e.status == 409:
                print(f"lost {run.id}: {e}", flush=True)  # another attempt has it, or a person
            else:
                run.finish("failed", args.computer, error=str(e)[:1000])
                print(f"failed {run.id}: {e}", flush=True)
                if e.status != 0:
                    return 3
        if args.once:
            return 0


if __name__ == "__main__":
    sys.exit(main())
