#!/usr/bin/env python3
"""A bot runtime for computerd: a starting point for your own (Python 3 standard library only).

It claims its bot's runs (a long poll with a lease, renewed in the background), brings each
attachment into the Computer with a checked copy, checks the copy again from inside the Computer,
reports what it does as the run's events, and ends the run with the artifacts as its result. The
"brain" here is a fixed plan; put your model's loop where `work` is.

    python3 examples/runtime/runtime.py --url http://127.0.0.1:8080 --token-file bot.token \\
        --computer cmp_... [--once]

With `--site URL` it also does the worked case: "with my account on site A, upload report.pdf to
project B's documents and return the link". In the Computer's browser (a session on the profile
`site-a`, signed in with the account when it is not), it opens the project's documents, sets the
copied file on the upload form, records the action with the documents the site's API listed
before, and clicks the one upload button once (a re-claimed run replays that record, never the
click). Then it checks through the site's API that exactly one new document exists whose bytes
hash to the blob's SHA-256, saves a screenshot as evidence, and ends the run with
`{"documentId", "url", "screenshotBlobId"}`. The site's API is reached with the same account
(`--site-user`, `--site-password-file`); the test site is tests/fixtures/browser_site.py. With
`--site-secret NAME` the browser signs in with the vault's secret of that name (`fill_secret`:
the member's vault holds the password and the bot's grant names it), so the password never
passes through the runtime's browser calls.

The token is the bot's (`POST /v1/tokens {"botId": ...}`); the bot needs a grant on the Computer
(`PUT /v1/computers/:id/bots/:bot`). Every call names the run's claim, so a runtime that lost its
lease (it stalled, or was killed and another took over) is refused instead of acting twice.

`--hold-at claim|upload` makes it wait on its standard input after claiming, or just before it
sets the file on the site's form, saying so on standard output (`claimed run_...`, `holding
before upload`): a drill for killing a runtime mid-run. Exit codes: 0 done, 2 usage,
3 the cluster refused something it should not have.
"""

import argparse
import hashlib
import http.cookiejar
import json
import sys
import threading
import time
import urllib.error
import urllib.parse
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

    def call(self, method, path, body=None, timeout=60, retry=False):
        """One call; with `retry` (a read, or a call that is safe to repeat: a browser tool with
        an action id replays its record) a node that died under it is tried again through the
        load balancer, a few times."""
        for attempt in range(8 if retry else 1):
            try:
                return self._call(method, path, body, timeout)
            except Refused as e:
                if not retry or e.status not in (502, 503, 504) or attempt == 7:
                    raise
            except OSError:
                if not retry or attempt == 7:
                    raise
            time.sleep(0.5 * (attempt + 1))

    def _call(self, method, path, body, timeout):
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


def work(api, run, computer, site=None):
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
        artifacts.append({"name": a["name"], "artifactId": art["artifactId"], "path": art["path"], "sha256": inside,
                          "blob": blob})
    if site is not None and artifacts:
        return upload_to_site(api, run, computer, site, artifacts[0])
    for a in artifacts:
        a.pop("blob")
    return {"computerId": computer, "artifacts": artifacts}


class Site:
    """The site's own API, signed in with the account (a cookie of its own, not the browser's)."""

    def __init__(self, url, user, password, project, hold_before_upload=False, secret=None):
        self.url = url.rstrip("/")
        self.secret = secret
        self.user = user
        self.password = password
        self.project = project
        self.hold_before_upload = hold_before_upload
        self.opener = urllib.request.build_opener(urllib.request.HTTPCookieProcessor(http.cookiejar.CookieJar()))
        self.signed_in = False

    def get(self, path, timeout=60):
        if not self.signed_in:
            form = urllib.parse.urlencode({"username": self.user, "password": self.password}).encode()
            self.opener.open(self.url + "/login", data=form, timeout=30).read()
            self.signed_in = True
        with self.opener.open(self.url + path, timeout=timeout) as r:
            return r.read()

    def documents(self):
        return json.loads(self.get(f"/api/projects/{self.project}/documents"))["documents"]


def browser(api, computer, tool, body, retry=False):
    return api.call("POST", f"/v1/computers/{computer}/browser/{tool}", body, timeout=120, retry=retry)[1]


def find(snap, role, name):
    for e in snap.get("elements", []):
        if e.get("role") == role and e.get("name") == name:
            return e["ref"]
    raise Refused(0, f"no {role} {name!r} on the page {snap.get('title')!r}")


def browser_session(api, computer, profile, url):
    """The browser session on `profile`: the one already open (a runtime before this one may have
    opened it), else a new one."""
    _, listed = api.call("GET", f"/v1/computers/{computer}/browser/sessions", retry=True)
    for s in listed.get("sessions", []):
        if s.get("profile") == profile and s.get("running", True):
            return s["session"]
    return browser(api, computer, "sessions", {"profile": profile, "url": url})["session"]


def upload_to_site(api, run, computer, site, art):
    """The worked case: the copied file onto project B's documents, once, and checked."""
    docs_url = f"{site.url}/projects/{site.project}/documents"
    sid = browser_session(api, computer, "site-a", f"{site.url}/")
    probes = {"signedInSelector": "#who", "account": site.user, "projectUrl": docs_url}
    status = lambda: browser(api, computer, "session_status",
                             {"session": sid, "origin": site.url, "probes": probes}, retry=True)
    st = status()
    if not st.get("signedIn"):
        # Signed in through the site's own form; the record keeps the password's length only.
        browser(api, computer, "navigate", {"session": sid, "url": f"{site.url}/login"}, retry=True)
        snap = browser(api, computer, "snapshot", {"session": sid, "format": "json"}, retry=True)
        browser(api, computer, "type", {"session": sid, "ref": find(snap, "textbox", "Username"), "text": site.user})
        if site.secret:
            # The vault's password, typed by the agent: neither the runtime nor its model sees it.
            browser(api, computer, "fill_secret", {"session": sid, "ref": find(snap, "textbox", "Password"),
                                                   "secret": site.secret})
        else:
            browser(api, computer, "type", {"session": sid, "ref": find(snap, "textbox", "Password"),
                                            "text": site.password})
        browser(api, computer, "click", {"session": sid, "ref": find(snap, "button", "Sign in"),
                                         "actionId": f"sign-in-{run.id}", "runId": run.id, "runClaim": run.claim,
                                         "intent": f"sign in to {site.url} as {site.user}"}, retry=True)
        st = status()
    run.event("activity", {"tool": "browser.session_status", "signedIn": st.get("signedIn"),
                           "accountMatches": st.get("accountMatches"),
                           "projectAccessible": st.get("projectAccessible")})
    if not (st.get("signedIn") and st.get("accountMatches") and st.get("projectAccessible")):
        raise Refused(0, f"the browser is not signed in as {site.user} with access to the project: {st}")
    nav = browser(api, computer, "navigate", {"session": sid, "url": docs_url}, retry=True)
    if nav.get("status") != 200:
        raise Refused(0, f"the documents page answered {nav.get('status')}")
    snap = browser(api, computer, "snapshot", {"session": sid, "format": "json"}, retry=True)
    run.event("partial", f"On {nav.get('title')}; uploading {art['name']}")
    if site.hold_before_upload:
        print("holding before upload", flush=True)
        sys.stdin.read()
    previous = [d["id"] for d in site.documents()]
    # The upload tool takes an absolute path under /workspace (a copy's path is the workdir's).
    path = art["path"] if art["path"].startswith("/") else "/workspace/" + art["path"]
    up = browser(api, computer, "upload", {"session": sid, "ref": find(snap, "button", "Choose file"),
                                           "paths": [path]}, retry=True)
    files = up.get("files") or [{}]
    if not up.get("accepted") or files[0].get("sha256") != art["sha256"]:
        raise Refused(0, f"the form did not take the file as copied: {up}")
    # The one effect: recorded first, with what is known; the same id is never clicked twice.
    action_id = f"upload-{run.id}"
    click = browser(api, computer, "click", {
        "session": sid, "ref": find(snap, "button", "Upload"), "actionId": action_id, "runId": run.id, "runClaim": run.claim,
        "intent": f"upload {art['name']} to project {site.project.upper()}",
        "evidence": {"fileSha": art["sha256"], "artifactId": art["artifactId"], "account": site.user,
                     "projectId": site.project, "previousDocumentIds": previous},
    }, retry=True)
    state = click["action"]["state"]
    run.event("activity", {"tool": "browser.click", "actionId": action_id, "state": state,
                           "replayed": bool(click.get("replayed"))})
    if state == "failed":
        raise Refused(0, f"the upload click failed: {click['action'].get('error')}")
    # Checked on the site, not taken from the page: exactly one new document, with these bytes.
    new = [d for d in site.documents() if d["id"] not in previous]
    if len(new) != 1:
        raise Refused(0, f"the site shows {len(new)} new documents, not one (the upload was {state})")
    doc = new[0]
    got = hashlib.sha256(site.get(doc["url"])).hexdigest()
    if got != art["blob"]["sha256"]:
        raise Refused(0, f"the new document's bytes hash to {got}, not the blob's {art['blob']['sha256']}")
    browser(api, computer, "navigate", {"session": sid, "url": docs_url}, retry=True)
    ev = browser(api, computer, "evidence", {"session": sid, "actionId": action_id}, retry=True)
    url = site.url + doc["url"]
    note = "" if state == "done" else (
        f" (the site's answer to the upload was lost, so the action stays {state} for a person to decide; "
        "the site's API shows the one new document, with the same bytes)")
    run.event("partial", f"Uploaded {art['name']} to project {site.project.upper()}: {url}{note}")
    return {"documentId": doc["id"], "url": url, "screenshotBlobId": ev["blobId"], "sha256": got,
            "upload": {"actionId": action_id, "state": state}, "artifactId": art["artifactId"]}


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--url", required=True)
    p.add_argument("--token-file", required=True)
    p.add_argument("--computer", required=True, help="the Computer the bot works on")
    p.add_argument("--bot", help="the bot (a member's token must name it)")
    p.add_argument("--once", action="store_true", help="end after one run")
    p.add_argument("--lease-ms", type=int, default=30000)
    p.add_argument("--site", help="the worked case: upload the first attachment to this site's project")
    p.add_argument("--project", default="b")
    p.add_argument("--site-user", default="alice")
    p.add_argument("--site-password-file")
    p.add_argument("--site-secret", help="sign in with this vault secret (fill_secret) instead of typing the password")
    p.add_argument("--hold-at", choices=["claim", "upload"], help=argparse.SUPPRESS)
    args = p.parse_args()
    with open(args.token_file) as f:
        api = Api(args.url, f.read().strip())
    site = None
    if args.site:
        if not args.site_password_file:
            p.error("--site needs --site-password-file")
        with open(args.site_password_file) as f:
            site = Site(args.site, args.site_user, f.read().strip(), args.project, args.hold_at == "upload",
                        args.site_secret)
    claim = {"waitMs": 20000, "leaseMs": args.lease_ms}
    if args.bot:
        claim["botId"] = args.bot
    while True:
        status, claimed = api.call("POST", "/api/runs/claim", claim, timeout=40, retry=True)
        if status == 204:
            continue
        run = Run(api, claimed)
        print(f"claimed {run.id} attempt {run.run['attempts']}", flush=True)
        if args.hold_at == "claim":
            sys.stdin.read()
        try:
            result = work(api, run, args.computer, site)
            if site is None:
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
