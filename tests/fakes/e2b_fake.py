#!/usr/bin/env python3
"""Fake E2B control-plane API whose sandboxes are local Docker containers.

README
------
Follows the E2B REST API as published in e2b-dev/infra ``spec/openapi.yml`` (info.version 0.1.0, the copy
at /tmp/e2b-openapi.yml) and, where the two differ, the generated client shipped in the E2B Python SDK
``e2b==2.63.0`` (``e2b.api.client``), whose request models every body is validated against.  That SDK
already uses two routes the spec copy does not list yet (``POST /v2/sandboxes`` and
``POST /v2/sandboxes/{id}/connect``), so both generations are served.

Implemented (auth header ``X-API-Key``; every error body is ``{"code": <status>, "message": "..."}``):
  POST   /sandboxes                 NewSandbox   -> 201 Sandbox (timeout default 15 s)
  POST   /v2/sandboxes              NewSandboxV2 -> 201 Sandbox (timeout default 300 s; honours the
                                    ``Idempotency-Key`` header: the same key answers the same sandbox again)
  GET    /sandboxes                 (deprecated) running sandboxes, ``metadata`` filter -> 200 ListedSandbox[]
  GET    /v2/sandboxes              ``metadata``, ``state``, ``order``, ``startedAfter``, ``template``,
                                    ``limit``, ``nextToken`` -> 200 ListedSandbox[] (+ X-Next-Token, X-Total-Running)
  GET    /sandboxes/{id}            -> 200 SandboxDetail | 404
  DELETE /sandboxes/{id}            -> 204 (docker rm -f) | 404
  POST   /sandboxes/{id}/pause      SandboxPauseRequest (optional) -> 204 | 409 already paused | 404.
                                    memory=true (default): ``docker pause`` (memory and processes kept);
                                    memory=false: ``docker stop`` (filesystem only; resume cold-boots it)
  POST   /sandboxes/{id}/resume     (deprecated) ResumedSandbox -> 201 Sandbox | 409 not paused | 404
  POST   /sandboxes/{id}/connect    ConnectSandbox (timeout required) -> 200 was running | 201 resumed | 404
  POST   /v2/sandboxes/{id}/connect ConnectSandboxV2 (timeout default 300) -> same as above
  POST   /sandboxes/{id}/timeout    SandboxTimeoutRequest -> 204 (endAt = now + timeout) | 404 (also for a
                                    paused sandbox, which is not running)
  Unknown template -> 404 ``template '<name>' not found`` (what api.e2b.app answers).  Unknown routes -> 404.
  Timeout enforcement: every 0.5 s each running sandbox whose endAt has passed is paused (autoPause) or
  killed; the journal gets a line with method "TIMER" and effect "timeout_pause" / "timeout_kill".
  Connect only extends the TTL of a running sandbox (spec: "TTL is only extended"): endAt = max(endAt,
  now + timeout); a resumed one gets endAt = now + timeout.
  PUT    /sandboxes/{id}/network    SandboxNetworkUpdate (allowOut, denyOut, allowInternetAccess) -> 204 |
                                    409 not running | 404; recorded (journal ``network``), not applied
Left out: templates, snapshots, fork, metrics, logs, volumes, secrets, teams, access
tokens; envd (the in-sandbox daemon: the SDK's files/commands API cannot work against a fake sandbox);
traffic-triggered auto-resume (``autoResume`` is stored and reported in ``lifecycle`` only); network/mcp/
iam/volumeMounts are validated but have no effect; no per-team timeout ceiling.
Fake-only routes: ``GET /_fake/journal``, ``POST /_fake/faults`` (see tests/fakes contract) and
``POST /_fake/seed {"count"}`` (that many running sandboxes that are records only, to page a list). A
create's journal line carries the ``metadata`` and ``envVars`` it got. A
``status`` fault may carry the ``message`` of its answer, so a test gets E2B's other 409 of a pause
(``Sandbox '<id>' cannot be paused while in '<state>' state``), which this fake has no state for.

Usage: e2b_fake.py --journal FILE --api-key KEY --run-label LABEL --agent-binary PATH --template NAME=IMAGE ...
"""

import argparse
import base64
import json
import os
import re
import secrets
import signal
import socket
import string
import subprocess
import sys
import threading
import time
import urllib.parse
from datetime import datetime, timezone
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

ENVD_VERSION = "0.4.2"
CLIENT_ID = "6532622b"
CPU_COUNT = 2
MEMORY_MB = 512
DISK_SIZE_MB = 10240


def log(msg):
    sys.stderr.write(f"[e2b-fake {time.strftime('%H:%M:%S')}] {msg}\n")
    sys.stderr.flush()


# --------------------------------------------------------------------------------------------------
# Request-model validation.  The schemas mirror the request models of e2b==2.63.0
# (e2b.api.client.models); tests/fakes/e2b_sdk_check.py cross-checks the field names against them.
# Schema nodes: {"t": "object", "props": {...}, "req": [...]}, {"t": "map", "values": node},
# {"t": "array", "items": node}, {"t": "string"|"boolean"|"any"}, {"t": "integer", "min": n, "max": n},
# {"t": "string", "enum": [...]}; "nullable": True allows null.

def _obj(props, req=(), nullable=False):
    return {"t": "object", "props": props, "req": list(req), "nullable": nullable}


STR = {"t": "string"}
BOOL = {"t": "boolean"}
INT32_MIN0 = {"t": "integer", "min": 0, "max": 2**31 - 1}
STR_MAP = {"t": "map", "values": STR}

AUTO_RESUME = _obj({"enabled": BOOL}, ["enabled"])
NETWORK_RULE = _obj({"transform": _obj({"headers": STR_MAP})})
NETWORK = _obj({
    "allowPublicTraffic": {"t": "boolean", "nullable": True},
    "allowOut": {"t": "array", "items": STR},
    "denyOut": {"t": "array", "items": STR},
    "dnsServers": {"t": "array", "items": STR},
    "egressProxy": _obj({
        "address": STR,
        "username": {"t": "string", "maxLen": 255},
        "password": {"t": "string", "maxLen": 255},
        "tls": _obj({"enabled": BOOL, "serverName": STR, "caCert": STR}, ["enabled"], nullable=True),
    }, ["address"], nullable=True),
    "maskRequestHost": STR,
    "httpsPorts": {"t": "array", "items": {"t": "integer", "min": 0, "max": 2**31 - 1}},
    "rules": {"t": "map", "values": {"t": "array", "items": NETWORK_RULE}},
})
IAM = _obj({"tokens": {"t": "map", "values": _obj({"audience": STR, "tokenType": STR},
                                                   ["audience", "tokenType"])}})
MCP = {"t": "map", "values": {"t": "any"}, "nullable": True}
VOLUME_MOUNT = _obj({"name": STR, "path": STR}, ["name", "path"])

_NEW_SANDBOX_COMMON = {
    "templateID": STR,
    "timeout": INT32_MIN0,
    "autoPause": BOOL,
    "autoPauseMemory": BOOL,
    "autoResume": AUTO_RESUME,
    "allow_internet_access": BOOL,
    "network": NETWORK,
    "metadata": STR_MAP,
    "envVars": STR_MAP,
    "mcp": MCP,
    "iam": IAM,
    "volumeMounts": {"t": "array", "items": VOLUME_MOUNT},
}

SCHEMAS = {
    "NewSandbox": _obj(dict(_NEW_SANDBOX_COMMON, secure=BOOL), ["templateID"]),
    "NewSandboxV2": _obj(dict(_NEW_SANDBOX_COMMON), ["templateID"]),
    "ConnectSandbox": _obj({"timeout": INT32_MIN0, "memory": BOOL}, ["timeout"]),
    "ConnectSandboxV2": _obj({"timeout": INT32_MIN0, "memory": BOOL}),
    "ResumedSandbox": _obj({"timeout": INT32_MIN0, "autoPause": BOOL, "memory": BOOL}),
    "SandboxTimeoutRequest": _obj({"timeout": INT32_MIN0}, ["timeout"]),
    "SandboxNetworkUpdate": _obj({"allowOut": {"t": "array", "items": STR}, "denyOut": {"t": "array", "items": STR},
                                  "allowInternetAccess": {"t": "boolean", "nullable": True}}),
    "SandboxPauseRequest": _obj({"memory": BOOL, "requireHealthyGuest": BOOL}),
    # nested models, exported for the SDK cross-check
    "SandboxAutoResumeConfig": AUTO_RESUME,
    "SandboxNetworkConfig": NETWORK,
    "SandboxIamToken": IAM["props"]["tokens"]["values"],
    "SandboxVolumeMount": VOLUME_MOUNT,
    "SandboxEgressProxyConfigType0": NETWORK["props"]["egressProxy"],
    "SandboxEgressProxyTLSConfigType0": NETWORK["props"]["egressProxy"]["props"]["tls"],
    "SandboxNetworkRule": NETWORK_RULE,
    "SandboxNetworkTransform": NETWORK_RULE["props"]["transform"],
    "SandboxIam": IAM,
}


def validate(node, value, where):
    """Return None when value fits node, else a sentence naming the first problem."""
    if value is None:
        return None if node.get("nullable") else f"{where}: null is not allowed"
    t = node["t"]
    if t == "any":
        return None
    if t == "string":
        if not isinstance(value, str):
            return f"{where}: expected a string, got {type(value).__name__}"
        if "enum" in node and value not in node["enum"]:
            return f"{where}: {value!r} is not one of {node['enum']}"
        if "maxLen" in node and len(value.encode()) > node["maxLen"]:
            return f"{where}: longer than {node['maxLen']} bytes"
        return None
    if t == "boolean":
        return None if isinstance(value, bool) else f"{where}: expected a boolean, got {type(value).__name__}"
    if t == "integer":
        if isinstance(value, bool) or not isinstance(value, int):
            return f"{where}: expected an integer, got {json.dumps(value)}"
        if "min" in node and value < node["min"]:
            return f"{where}: {value} is below the minimum {node['min']}"
        if "max" in node and value > node["max"]:
            return f"{where}: {value} is above the maximum {node['max']}"
        return None
    if t == "array":
        if not isinstance(value, list):
            return f"{where}: expected an array, got {type(value).__name__}"
        for i, item in enumerate(value):
            err = validate(node["items"], item, f"{where}[{i}]")
            if err:
                return err
        return None
    if t == "map":
        if not isinstance(value, dict):
            return f"{where}: expected an object, got {type(value).__name__}"
        for k, v in value.items():
            err = validate(node["values"], v, f"{where}.{k}")
            if err:
                return err
        return None
    if t == "object":
        if not isinstance(value, dict):
            return f"{where}: expected an object, got {type(value).__name__}"
        for k in node["req"]:
            if k not in value:
                return f"{where}: required field '{k}' is missing"
        for k, v in value.items():
            if k not in node["props"]:
                return f"{where}: unknown field '{k}'"
            err = validate(node["props"][k], v, f"{where}.{k}")
            if err:
                return err
        return None
    raise AssertionError(t)


# --------------------------------------------------------------------------------------------------

def rfc3339(ts):
    return datetime.fromtimestamp(ts, timezone.utc).isoformat(timespec="microseconds").replace("+00:00", "Z")


def parse_rfc3339(text):
    t = text.strip()
    if t.endswith("Z") or t.endswith("z"):
        t = t[:-1] + "+00:00"
    dt = datetime.fromisoformat(t)
    if dt.tzinfo is None:
        raise ValueError("no time zone")
    return dt.timestamp()


def new_sandbox_id():
    alphabet = string.ascii_lowercase + string.digits
    return "".join(secrets.choice(alphabet) for _ in range(20))


class ApiError(Exception):
    def __init__(self, status, message, invalid=None, headers=None):
        super().__init__(message)
        self.status = status
        self.message = message
        self.invalid = invalid
        self.headers = headers or {}


class Docker:
    def __init__(self, label, agent):
        self.label = label
        self.agent = agent

    def _run(self, args, check=True):
        proc = subprocess.run(["docker"] + args, capture_output=True, text=True, timeout=120)
        if check and proc.returncode != 0:
            raise ApiError(500, f"docker {args[0]} failed: {proc.stderr.strip()[:300]}")
        return proc

    def name(self, sid):
        return f"fake-e2b-{sid}"

    def run(self, sid, image, env):
        args = ["run", "-d", "--network", "host", "--name", self.name(sid),
                "-v", f"{self.agent}:/usr/local/bin/computer-agent:ro",
                "--label", f"computerd.fake={self.label}", "--label", f"computerd.fake.sandbox={sid}"]
        for k, v in env.items():
            args += ["-e", f"{k}={v}"]
        args.append(image)
        self._run(args)

    def rm(self, sid):
        self._run(["rm", "-f", self.name(sid)], check=False)

    def pause(self, sid):
        self._run(["pause", self.name(sid)])

    def unpause(self, sid):
        self._run(["unpause", self.name(sid)])

    def running(self, sid):
        proc = self._run(["inspect", "-f", "{{.State.Running}}", self.name(sid)], check=False)
        return proc.stdout.strip() == "true"

    def stop(self, sid):
        self._run(["stop", "-t", "5", self.name(sid)])

    def start(self, sid):
        self._run(["start", self.name(sid)])

    def restart(self, sid):
        self._run(["restart", "-t", "5", self.name(sid)])


class Sandbox:
    def __init__(self, sid, template, image, metadata, env_vars, timeout, auto_pause, auto_pause_memory,
                 auto_resume, allow_internet):
        self.id = sid
        self.template = template
        self.image = image
        self.metadata = metadata
        self.env_vars = env_vars
        self.auto_pause = auto_pause
        self.auto_pause_memory = auto_pause_memory
        self.auto_resume = auto_resume
        self.allow_internet = allow_internet
        self.started_at = time.time()
        self.end_at = self.started_at + timeout
        self.state = "running"
        self.pause_mode = None  # "full" (docker pause) or "filesystem" (docker stop) while paused
        self.envd_access_token = secrets.token_hex(16)

    def sandbox_json(self):
        return {"templateID": self.template, "sandboxID": self.id, "alias": self.template,
                "clientID": CLIENT_ID, "envdVersion": ENVD_VERSION,
                "envdAccessToken": self.envd_access_token, "trafficAccessToken": None, "domain": None}

    def listed_json(self):
        return {"templateID": self.template, "alias": self.template, "sandboxID": self.id,
                "clientID": CLIENT_ID, "startedAt": rfc3339(self.started_at), "endAt": rfc3339(self.end_at),
                "cpuCount": CPU_COUNT, "memoryMB": MEMORY_MB, "diskSizeMB": DISK_SIZE_MB,
                "metadata": dict(self.metadata), "state": self.state, "envdVersion": ENVD_VERSION}

    def detail_json(self):
        d = self.listed_json()
        d.update({"envdAccessToken": self.envd_access_token, "domain": None,
                  "allowInternetAccess": self.allow_internet,
                  "lifecycle": {"autoResume": self.auto_resume,
                                "onTimeout": "pause" if self.auto_pause else "kill"}})
        if self.state == "paused":
            d["pauseMode"] = self.pause_mode
        return d


class Fake:
    def __init__(self, args):
        self.api_key = args.api_key
        self.templates = {}
        for t in args.template:
            name, sep, image = t.partition("=")
            if not sep or not name or not image:
                raise SystemExit(f"--template wants NAME=IMAGE, got {t!r}")
            self.templates[name] = image
        self.docker = Docker(args.run_label, args.agent_binary)
        self.lock = threading.RLock()
        self.sandboxes = {}
        self.idempotency = {}  # Idempotency-Key -> sandbox id
        self.journal_lock = threading.Lock()
        self.journal = []
        self.journal_file = open(args.journal, "a", encoding="utf-8")
        self.faults = []
        self.faults_lock = threading.Lock()

    # ---- journal ----
    def write_journal(self, entry):
        with self.journal_lock:
            entry = dict(entry)
            entry["seq"] = len(self.journal) + 1
            ordered = {"seq": entry.pop("seq")}
            ordered.update(entry)
            self.journal.append(ordered)
            self.journal_file.write(json.dumps(ordered) + "\n")
            self.journal_file.flush()

    # ---- faults ----
    def arm_fault(self, spec):
        if not isinstance(spec, dict):
            raise ApiError(400, "fault must be an object")
        method = spec.get("method")
        path = spec.get("path")
        kind = spec.get("fault")
        if not isinstance(method, str) or not isinstance(path, str) or not path.startswith("/"):
            raise ApiError(400, "fault needs method and path")
        if kind not in ("lose_answer", "slow", "status"):
            raise ApiError(400, "fault must be lose_answer, slow or status")
        status = spec.get("status", 500)
        if kind == "status" and (not isinstance(status, int) or not 400 <= status <= 599):
            raise ApiError(400, "status must be an HTTP error status")
        delay = spec.get("delayMs", 3000)
        times = spec.get("times", 1)
        message = spec.get("message", f"injected fault: status {status}")
        if not isinstance(message, str):
            raise ApiError(400, "message must be a string")
        if not isinstance(delay, int) or delay < 0 or not isinstance(times, int) or times < 1:
            raise ApiError(400, "delayMs must be >= 0 and times >= 1")
        with self.faults_lock:
            self.faults.append({"method": method.upper(), "path": path, "fault": kind, "status": status,
                                "delayMs": delay, "times": times, "message": message})

    def take_fault(self, method, path):
        segs = path.split("/")
        with self.faults_lock:
            for f in self.faults:
                if f["method"] != method:
                    continue
                pat = f["path"].split("/")
                if len(pat) != len(segs) or any(p != "*" and p != s for p, s in zip(pat, segs)):
                    continue
                f["times"] -= 1
                if f["times"] <= 0:
                    self.faults.remove(f)
                return dict(f)
        return None

    # ---- sandbox helpers ----
    def get(self, sid):
        sb = self.sandboxes.get(sid)
        if sb is None:
            raise ApiError(404, f"sandbox \"{sid}\" doesn't exist or you don't have access to it")
        return sb

    def resume_locked(self, sb, timeout, memory=True):
        if sb.pause_mode == "filesystem":
            self.docker.start(sb.id)
        else:
            self.docker.unpause(sb.id)
            if memory is False:  # resume from disk state only: cold boot
                self.docker.restart(sb.id)
        sb.state = "running"
        sb.pause_mode = None
        sb.end_at = time.time() + timeout

    def pause_locked(self, sb, memory=True):
        if memory and self.docker.running(sb.id):
            self.docker.pause(sb.id)
            sb.pause_mode = "full"
        elif memory:  # the container's process has exited: keep its filesystem, start it on resume
            sb.pause_mode = "filesystem"
        else:
            self.docker.stop(sb.id)
            sb.pause_mode = "filesystem"
        sb.state = "paused"

    # ---- timeout enforcement ----
    def reaper(self):
        while True:
            time.sleep(0.5)
            try:
                now = time.time()
                with self.lock:
                    due = [sb for sb in self.sandboxes.values() if sb.state == "running" and sb.end_at <= now]
                    for sb in due:
                        if sb.auto_pause:
                            try:
                                self.pause_locked(sb, memory=sb.auto_pause_memory)
                                effect = "timeout_pause"
                            except ApiError as e:
                                log(f"timeout pause of {sb.id} failed: {e.message}")
                                continue
                        else:
                            self.docker.rm(sb.id)
                            del self.sandboxes[sb.id]
                            effect = "timeout_kill"
                        log(f"{effect} {sb.id}")
                        self.write_journal({"method": "TIMER", "path": f"/sandboxes/{sb.id}", "query": "",
                                            "status": None, "effect": effect, "sandboxId": sb.id,
                                            "metadata": dict(sb.metadata), "keyOk": None, "fault": None,
                                            "invalid": None})
            except Exception as e:  # keep the reaper alive
                log(f"reaper error: {e!r}")


# --------------------------------------------------------------------------------------------------

class Result:
    def __init__(self, status, body=None, effect=None, sandbox=None, metadata=None, headers=None, env_vars=None,
                 network=None):
        self.network = network
        self.status = status
        self.body = body
        self.effect = effect
        self.sandbox = sandbox
        self.metadata = metadata
        self.headers = headers or {}
        self.env_vars = env_vars


SB = r"([A-Za-z0-9_.-]+)"
ROUTES = [
    ("POST", re.compile(r"^/sandboxes$"), "create_v1"),
    ("GET", re.compile(r"^/sandboxes$"), "list_v1"),
    ("POST", re.compile(r"^/v2/sandboxes$"), "create_v2"),
    ("GET", re.compile(r"^/v2/sandboxes$"), "list_v2"),
    ("GET", re.compile(rf"^/sandboxes/{SB}$"), "get"),
    ("DELETE", re.compile(rf"^/sandboxes/{SB}$"), "kill"),
    ("POST", re.compile(rf"^/sandboxes/{SB}/pause$"), "pause"),
    ("POST", re.compile(rf"^/sandboxes/{SB}/resume$"), "resume"),
    ("POST", re.compile(rf"^/sandboxes/{SB}/connect$"), "connect_v1"),
    ("POST", re.compile(rf"^/v2/sandboxes/{SB}/connect$"), "connect_v2"),
    ("POST", re.compile(rf"^/sandboxes/{SB}/timeout$"), "timeout"),
    ("PUT", re.compile(rf"^/sandboxes/{SB}/network$"), "network"),
]


def parse_metadata_query(raw):
    """metadata=k%3Dv%26k2%3Dv2 -> {"k": "v", "k2": "v2"} (keys and values may be URL-encoded again)."""
    if re.search(r"%(?![0-9A-Fa-f]{2})", raw):
        raise ApiError(400, "Error parsing metadata: invalid URL escape", invalid="query metadata: bad escape")
    out = {}
    for pair in raw.split("&"):
        if pair == "":
            continue
        k, _, v = pair.partition("=")
        k = urllib.parse.unquote_plus(k)
        v = urllib.parse.unquote_plus(v)
        if re.search(r"%(?![0-9A-Fa-f]{2})", k + v):
            raise ApiError(400, "Error parsing metadata: invalid URL escape", invalid="query metadata: bad escape")
        out[urllib.parse.unquote(k)] = urllib.parse.unquote(v)
    return out


class Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    server_version = "e2b-fake"
    fake: Fake = None

    def log_message(self, fmt, *args):
        log(f"{self.address_string()} {fmt % args}")

    def do_GET(self):
        self.handle_any("GET")

    def do_POST(self):
        self.handle_any("POST")

    def do_DELETE(self):
        self.handle_any("DELETE")

    def do_PUT(self):
        self.handle_any("PUT")

    def do_PATCH(self):
        self.handle_any("PATCH")

    def do_OPTIONS(self):
        self.handle_any("OPTIONS")

    # ---- plumbing ----
    def read_body(self):
        n = int(self.headers.get("Content-Length") or 0)
        return self.rfile.read(n) if n > 0 else b""

    def send(self, status, body=None, headers=None):
        data = b"" if body is None else json.dumps(body).encode()
        self.send_response(status)
        for k, v in (headers or {}).items():
            self.send_header(k, v)
        if body is not None:
            self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        if data:
            self.wfile.write(data)
        self.wfile.flush()

    def handle_any(self, method):
        fake = self.fake
        url = urllib.parse.urlsplit(self.path)
        path, query = url.path, url.query
        raw_body = self.read_body()

        if path.startswith("/_fake/"):
            return self.handle_fake(method, path, raw_body)

        key_ok = self.headers.get("X-API-Key") == fake.api_key
        entry = {"method": method, "path": path, "query": query, "status": None, "effect": None,
                 "sandboxId": None, "metadata": None, "keyOk": key_ok, "fault": None, "invalid": None}

        fault = fake.take_fault(method, path)
        if fault and fault["fault"] == "slow":
            entry["fault"] = "slow"
            time.sleep(fault["delayMs"] / 1000.0)
        elif fault and fault["fault"] == "status":
            status = fault["status"]
            headers = {"Retry-After": "1"} if status == 429 else {}
            entry.update(status=status, fault="status")
            m = re.match(r"^(?:/v2)?/sandboxes/([^/]+)", path)
            if m and m.group(1) != "metrics":
                entry["sandboxId"] = m.group(1)
            fake.write_journal(entry)
            return self.send(status, {"code": status, "message": fault["message"]}, headers)

        try:
            res = self.dispatch(method, path, query, raw_body, key_ok, entry)
        except ApiError as e:
            res = Result(e.status, {"code": e.status, "message": e.message}, headers=e.headers)
            entry["invalid"] = e.invalid
        except Exception as e:  # a bug or docker trouble: answer 500 like the real API would
            log(f"internal error: {e!r}")
            res = Result(500, {"code": 500, "message": f"internal error: {e}"})
        entry["status"] = res.status
        entry["effect"] = res.effect if res.status < 400 else None
        if res.sandbox is not None:
            entry["sandboxId"] = res.sandbox
        if res.metadata is not None:
            entry["metadata"] = res.metadata
        if res.env_vars is not None:
            entry["envVars"] = res.env_vars  # a create's, as it got them
        if res.network is not None:
            entry["network"] = res.network  # a create's or a network update's

        if fault and fault["fault"] == "lose_answer":
            entry["fault"] = "lose_answer"
            fake.write_journal(entry)
            self.close_connection = True
            try:
                self.connection.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
            return
        fake.write_journal(entry)
        self.send(res.status, res.body, res.headers)

    def handle_fake(self, method, path, raw_body):
        fake = self.fake
        if method == "GET" and path == "/_fake/journal":
            with fake.journal_lock:
                snapshot = list(fake.journal)
            return self.send(200, snapshot)
        if method == "POST" and path == "/_fake/faults":
            try:
                fake.arm_fault(json.loads(raw_body or b"null"))
            except (ApiError, ValueError) as e:
                return self.send(400, {"code": 400, "message": str(e)})
            return self.send(204)
        if method == "POST" and path == "/_fake/seed":
            # Sandboxes that are records only (no container): enough of them to page a list.
            try:
                count = json.loads(raw_body or b"null")["count"]
                assert isinstance(count, int) and 0 < count <= 20000
            except Exception:  # noqa: BLE001
                return self.send(400, {"code": 400, "message": "seed wants {\"count\": 1..20000}"})
            with fake.lock:
                for i in range(count):
                    sid = "phantom" + secrets.token_hex(8)
                    sb = Sandbox(sid, "phantom", "none", {"computerd.computer": f"cmp_phantom_{sid}"}, {},
                                 10 ** 9, False, False, False, True)
                    fake.sandboxes[sid] = sb
            return self.send(204)
        return self.send(404, {"code": 404, "message": "unknown fake route"})

    def dispatch(self, method, path, query, raw_body, key_ok, entry):
        for m, rx, name in ROUTES:
            mt = rx.match(path)
            if mt and m == method:
                break
        else:
            raise ApiError(404, f"no route for {method} {path}")
        sid = mt.group(1) if mt.groups() else None
        if sid is not None:
            entry["sandboxId"] = sid
        if not key_ok:
            if self.headers.get("X-API-Key") is None:
                raise ApiError(401, "authorization header is missing")
            raise ApiError(401, "Invalid API key")
        params = urllib.parse.parse_qs(query, keep_blank_values=True)
        return getattr(self, "r_" + name)(sid, params, raw_body)

    def body(self, raw, model, required):
        if not raw.strip():
            if required:
                raise ApiError(400, "request body has an error: value is required but missing",
                               invalid=f"{model}: body is missing")
            return {}
        try:
            data = json.loads(raw)
        except ValueError as e:
            raise ApiError(400, f"request body has an error: failed to decode request body: {e}",
                           invalid=f"{model}: body is not JSON")
        err = validate(SCHEMAS[model], data, model)
        if err:
            raise ApiError(400, f"request body has an error: {err}", invalid=err)
        return data

    # ---- routes ----
    def r_create_v1(self, _sid, _params, raw):
        return self.create(self.body(raw, "NewSandbox", True), default_timeout=15, idem_key=None)

    def r_create_v2(self, _sid, _params, raw):
        key = self.headers.get("Idempotency-Key")
        if key is not None and not re.fullmatch(r"[a-z0-9-]{1,255}", key):
            raise ApiError(400, "invalid Idempotency-Key", invalid="header Idempotency-Key: bad format")
        return self.create(self.body(raw, "NewSandboxV2", True), default_timeout=300, idem_key=key)

    def create(self, req, default_timeout, idem_key):
        fake = self.fake
        template = req["templateID"]
        if template not in fake.templates:
            raise ApiError(404, f"template '{template}' not found")
        auto_resume = bool(req.get("autoResume", {}).get("enabled", False))
        auto_pause_memory = req.get("autoPauseMemory", True)
        if auto_resume and req.get("autoPause") and auto_pause_memory is False:
            raise ApiError(400, "autoResume cannot be combined with autoPauseMemory=false",
                           invalid="autoResume with autoPauseMemory=false")
        with fake.lock:
            if idem_key is not None and idem_key in fake.idempotency:
                sb = fake.sandboxes.get(fake.idempotency[idem_key])
                if sb is not None:
                    return Result(201, sb.sandbox_json(), effect=None, sandbox=sb.id, metadata=dict(sb.metadata))
            sid = new_sandbox_id()
            while sid in fake.sandboxes:
                sid = new_sandbox_id()
            sb = Sandbox(sid, template, fake.templates[template], dict(req.get("metadata") or {}),
                         dict(req.get("envVars") or {}), req.get("timeout", default_timeout),
                         bool(req.get("autoPause", False)), auto_pause_memory, auto_resume,
                         req.get("allow_internet_access"))
            env = {"E2B_SANDBOX": "true", "E2B_SANDBOX_ID": sid, "E2B_TEMPLATE_ID": template}
            env.update(sb.env_vars)
            try:
                fake.docker.run(sid, sb.image, env)
            except ApiError:
                fake.docker.rm(sid)
                raise
            sb.started_at = time.time()
            sb.end_at = sb.started_at + req.get("timeout", default_timeout)
            fake.sandboxes[sid] = sb
            if idem_key is not None:
                fake.idempotency[idem_key] = sid
            log(f"created {sid} from {template} ({sb.image})")
            return Result(201, sb.sandbox_json(), effect="create", sandbox=sid, metadata=dict(sb.metadata),
                          env_vars=dict(sb.env_vars), network=req.get("network"))

    def list_common(self, params, states, v2):
        fake = self.fake
        meta = {}
        if "metadata" in params:
            meta = parse_metadata_query(params["metadata"][-1])
        order, started_after, template, limit, offset = "desc", None, None, None, 0
        if v2:
            if "state" in params:
                states = set()
                for part in ",".join(params["state"]).split(","):
                    if part not in ("running", "paused"):
                        raise ApiError(400, f"invalid state '{part}'", invalid=f"query state: {part!r} not in [running paused]")
                    states.add(part)
            if "order" in params:
                order = params["order"][-1]
                if order not in ("asc", "desc"):
                    raise ApiError(400, f"invalid order '{order}'", invalid=f"query order: {order!r} not in [asc desc]")
            if "startedAfter" in params:
                try:
                    started_after = parse_rfc3339(params["startedAfter"][-1])
                except ValueError:
                    raise ApiError(400, "invalid startedAfter", invalid="query startedAfter: not an RFC 3339 date-time")
            if "template" in params:
                template = params["template"][-1]
            if "limit" in params:
                try:
                    limit = int(params["limit"][-1])
                except ValueError:
                    limit = -1
                if not 1 <= limit <= 100:
                    raise ApiError(400, "limit must be between 1 and 100", invalid="query limit: not an integer in 1..100")
            else:
                limit = 100
            if "nextToken" in params:
                try:
                    offset = int(base64.urlsafe_b64decode(params["nextToken"][-1].encode()).decode())
                    assert offset >= 0
                except Exception:
                    raise ApiError(400, "invalid next token", invalid="query nextToken: not a token this server gave")
        with fake.lock:
            items = [sb for sb in fake.sandboxes.values()
                     if sb.state in states
                     and all(sb.metadata.get(k) == v for k, v in meta.items())
                     and (started_after is None or sb.started_at >= started_after)
                     and (template is None or sb.template == template)]
            total_running = sum(1 for sb in fake.sandboxes.values() if sb.state == "running")
            items.sort(key=lambda sb: (sb.started_at, sb.id), reverse=(order == "desc"))
            headers = {}
            if limit is not None:
                page = items[offset:offset + limit]
                if offset + limit < len(items):
                    headers["X-Next-Token"] = base64.urlsafe_b64encode(str(offset + limit).encode()).decode()
                headers["X-Total-Running"] = str(total_running)
            else:
                page = items
            return Result(200, [sb.listed_json() for sb in page], headers=headers)

    def r_list_v1(self, _sid, params, _raw):
        return self.list_common(params, {"running"}, v2=False)

    def r_list_v2(self, _sid, params, _raw):
        return self.list_common(params, {"running", "paused"}, v2=True)

    def r_get(self, sid, _params, _raw):
        with self.fake.lock:
            sb = self.fake.get(sid)
            return Result(200, sb.detail_json(), sandbox=sid, metadata=dict(sb.metadata))

    def r_kill(self, sid, _params, _raw):
        fake = self.fake
        with fake.lock:
            sb = fake.get(sid)
            fake.docker.rm(sid)
            del fake.sandboxes[sid]
            log(f"killed {sid}")
            return Result(204, effect="kill", sandbox=sid, metadata=dict(sb.metadata))

    def r_pause(self, sid, _params, raw):
        fake = self.fake
        req = self.body(raw, "SandboxPauseRequest", False)
        with fake.lock:
            sb = fake.get(sid)
            if sb.state == "paused":
                raise ApiError(409, f"Sandbox {sid} is already paused")
            fake.pause_locked(sb, memory=req.get("memory", True))
            log(f"paused {sid} ({sb.pause_mode})")
            return Result(204, effect="pause", sandbox=sid, metadata=dict(sb.metadata))

    def r_resume(self, sid, _params, raw):
        fake = self.fake
        req = self.body(raw, "ResumedSandbox", False)
        with fake.lock:
            sb = fake.get(sid)
            if sb.state != "paused":
                raise ApiError(409, f"Sandbox {sid} is already running")
            fake.resume_locked(sb, req.get("timeout", 15), memory=req.get("memory", True))
            if "autoPause" in req:
                sb.auto_pause = req["autoPause"]
            log(f"resumed {sid}")
            return Result(201, sb.sandbox_json(), effect="resume", sandbox=sid, metadata=dict(sb.metadata))

    def connect(self, sid, req, default_timeout):
        fake = self.fake
        timeout = req.get("timeout", default_timeout)
        with fake.lock:
            sb = fake.get(sid)
            if sb.state == "running":
                new_end = time.time() + timeout
                effect = None
                if new_end > sb.end_at:  # "TTL is only extended"
                    sb.end_at, effect = new_end, "timeout"
                return Result(200, sb.sandbox_json(), effect=effect, sandbox=sid, metadata=dict(sb.metadata))
            fake.resume_locked(sb, timeout, memory=req.get("memory", True))
            log(f"resumed {sid} (connect)")
            return Result(201, sb.sandbox_json(), effect="resume", sandbox=sid, metadata=dict(sb.metadata))

    def r_connect_v1(self, sid, _params, raw):
        return self.connect(sid, self.body(raw, "ConnectSandbox", True), 15)

    def r_connect_v2(self, sid, _params, raw):
        return self.connect(sid, self.body(raw, "ConnectSandboxV2", False), 300)

    def r_timeout(self, sid, _params, raw):
        fake = self.fake
        req = self.body(raw, "SandboxTimeoutRequest", True)
        with fake.lock:
            sb = fake.get(sid)
            if sb.state != "running":
                raise ApiError(404, f"Sandbox \"{sid}\" is not running")
            sb.end_at = time.time() + req["timeout"]
            return Result(204, effect="timeout", sandbox=sid, metadata=dict(sb.metadata))

    def r_network(self, sid, _params, raw):
        fake = self.fake
        req = self.body(raw, "SandboxNetworkUpdate", True)
        with fake.lock:
            sb = fake.get(sid)
            if sb.state != "running":
                raise ApiError(409, f"Sandbox \"{sid}\" is not running")
            sb.network = req
            return Result(204, effect="network", sandbox=sid, metadata=dict(sb.metadata), network=req)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--journal", required=True)
    ap.add_argument("--api-key", required=True)
    ap.add_argument("--run-label", required=True)
    ap.add_argument("--agent-binary", required=True)
    ap.add_argument("--template", action="append", default=[], help="NAME=IMAGE (repeatable)")
    args = ap.parse_args()

    fake = Fake(args)
    Handler.fake = fake
    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    server.daemon_threads = True
    threading.Thread(target=fake.reaper, daemon=True, name="reaper").start()
    def on_term(*_):
        log("SIGTERM: exiting")
        os._exit(0)  # journal lines are flushed as written; containers are the harness's to remove

    signal.signal(signal.SIGTERM, on_term)
    port = server.server_address[1]
    log(f"templates: {', '.join(f'{k}={v}' for k, v in fake.templates.items()) or '(none)'}")
    sys.stdout.write(f"LISTENING http://127.0.0.1:{port}\n")
    sys.stdout.flush()
    try:
        server.serve_forever(poll_interval=0.2)
    except (KeyboardInterrupt, SystemExit):
        pass


if __name__ == "__main__":
    main()
