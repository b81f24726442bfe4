#!/usr/bin/env python3
"""Fake Daytona API server whose sandboxes are local Docker containers.

README
------
Follows the Daytona API of the daytonaio/daytona repository at commit b5a5d9e78
(apps/api/src/sandbox/controllers/sandbox.controller.ts, services/sandbox.service.ts,
filters/all-exceptions.filter.ts) and validates requests against the generated Python client
`daytona-api-client==0.226.1` (pulled in by `daytona==0.226.1`): request bodies against its
pydantic models (fields outside a model's __properties, wrong types and enum values are refused)
and query parameters against the signatures of `SandboxApi` (names, types, enums, bounds).
Implemented, under `/sandbox` (the real server mounts them under the global prefix `/api`; the fake
answers both `/sandbox/...` and `/api/sandbox/...`), authenticated with `Authorization: Bearer KEY`:
  POST   /sandbox                                  200 Sandbox, state "started" (docker run -d ...)
  GET    /sandbox                                  200 ListSandboxesResponse {items, nextCursor}
  GET    /sandbox/{idOrName}                       200 Sandbox | 404
  POST   /sandbox/{idOrName}/stop[?force=true]     200 Sandbox, state "stopping" (docker stop / kill runs
                                                   after the answer; the state becomes "stopped" then)
  POST   /sandbox/{idOrName}/start                 200 Sandbox, state "started" (docker start), or
                                                   "starting" when the runner took longer than the
                                                   server's own 30 s wait
  DELETE /sandbox/{idOrName}                       200 Sandbox, state "destroyed" (docker rm -f); then 404
  POST   /sandbox/{idOrName}/autostop/{minutes}    201 Sandbox (NestJS answers 201 for a @Post
  POST   /sandbox/{idOrName}/autoarchive/{minutes} 201 Sandbox  without @HttpCode(200), which these
  POST   /sandbox/{idOrName}/autodelete/{minutes}  201 Sandbox  three routes lack)
Errors use the real AllExceptionsFilter body {path, timestamp, statusCode, error, message}: 401
"Invalid credentials", 404 "Sandbox with ID or name X not found", 400 for an unknown snapshot
("Snapshot X not found. Did you add it through the Daytona Dashboard?"), for stopping a sandbox that
is not started ("Sandbox is not in a stoppable state") and for starting one that is not stopped
("Sandbox is not in valid state"), 409 "Sandbox state change in progress" while a Docker operation on
that sandbox is running, 409 for a duplicate name. Unknown routes answer 404 "Cannot METHOD /path".
Auto-stop is enforced when autoStopInterval > 0 (default 15, as in the real API; minutes since the
last create, start or interval change); autoDeleteInterval > 0 deletes a stopped sandbox after that
many minutes, and 0 makes stop delete it (ephemeral); autoArchiveInterval is only recorded.
Left out: every other published Daytona route (pause, recover, resize, labels, snapshots, volumes,
toolbox, preview URLs, socket.io events, /config, ...: the /sandbox ones answer 501, the others 404),
declarative builds (buildInfo), volumes, secrets, linked sandboxes; `user`, `public` and the network
settings are recorded and answered but not applied (containers run with --network host as the image's
default user). The real API accepts unknown JSON fields; this fake refuses them on purpose. Stop and
start are asynchronous, as in the real API: stop answers "stopping" before the runner has stopped the
sandbox (a start sent meanwhile answers 409 "Sandbox state change in progress"), and start waits up to
30 s (the real server's wait) for the runner before it answers. A fault {"fault": "lag", "delayMs"}
on a stop or start route makes the runner take that much longer. Create and delete are synchronous.
Stop is SIGTERM with a 10 s grace period, as the Daytona runner does (apps/runner/pkg/docker/stop.go). The fake
does not watch its containers: a container whose entrypoint exits still reads "started".
toolboxProxyUrl points at <fake>/toolbox, which answers 404. The harness routes under /_fake/ (journal,
faults, and seed {"count"}: that many started sandboxes that are records only, to page a list) are not
journaled themselves. A create's journal line carries the `labels` and `env` it got.
"""

import argparse
import base64
import datetime
import enum
import inspect
import json
import re
import subprocess
import sys
import threading
import time
import typing
import uuid
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import parse_qsl, urlsplit

import pydantic
from daytona_api_client.api.sandbox_api import SandboxApi
from daytona_api_client.models.create_sandbox import CreateSandbox
from daytona_api_client.models.list_sandboxes_response import ListSandboxesResponse
from daytona_api_client.models.sandbox import Sandbox as SandboxModel
from daytona_api_client.models.sandbox_list_item import SandboxListItem

HTTP_REASONS = {
    400: "Bad Request", 401: "Unauthorized", 403: "Forbidden", 404: "Not Found", 409: "Conflict",
    422: "Unprocessable Entity", 429: "Too Many Requests", 500: "Internal Server Error",
    501: "Not Implemented", 502: "Bad Gateway", 503: "Service Unavailable", 504: "Gateway Timeout",
}
FAULT_MESSAGES = {429: "ThrottlerException: Too Many Requests", 500: "An unexpected error occurred."}
MAX_AUTO_ARCHIVE_INTERVAL = 43200  # apps/api/src/config/configuration.ts default
SERVER_WAIT = 30.0  # seconds the real API server waits for the runner on a create or start
DEFAULT_CPU, DEFAULT_MEMORY, DEFAULT_DISK = 1, 1, 3


def log(msg):
    sys.stderr.write(f"[daytona-fake {time.strftime('%H:%M:%S')}] {msg}\n")
    sys.stderr.flush()


def iso_now():
    return datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="milliseconds").replace("+00:00", "Z")


class ApiError(Exception):
    def __init__(self, status, message, invalid=None):
        super().__init__(message)
        self.status, self.message, self.invalid = status, message, invalid


# ---------------------------------------------------------------- validation against the client models

def _model_props(cls):
    return getattr(cls, f"_{cls.__name__}__properties")


def _nested_model(annotation):
    """The pydantic model class inside an annotation such as Optional[List[SandboxVolume]], if any."""
    if isinstance(annotation, type) and issubclass(annotation, pydantic.BaseModel):
        return annotation
    for arg in typing.get_args(annotation):
        found = _nested_model(arg)
        if found is not None:
            return found
    return None


def unknown_fields(cls, obj, where=""):
    """Names of fields of obj (and of nested model objects) outside the model's __properties."""
    if not isinstance(obj, dict):
        return []
    props = _model_props(cls)
    problems = [f"property {where}{k} should not exist" for k in obj if k not in props]
    for fname, finfo in cls.model_fields.items():
        if fname == "additional_properties":
            continue
        alias = finfo.serialization_alias or finfo.alias or fname
        sub = _nested_model(finfo.annotation)
        if sub is None or alias not in obj:
            continue
        value = obj[alias]
        if isinstance(value, list):
            for i, item in enumerate(value):
                problems += unknown_fields(sub, item, f"{where}{alias}[{i}].")
        else:
            problems += unknown_fields(sub, value, f"{where}{alias}.")
    return problems


def pydantic_problems(err):
    out = []
    for e in err.errors():
        loc = ".".join(str(p) for p in e.get("loc", ()))
        out.append(f"{loc}: {e.get('msg')}" if loc else str(e.get("msg")))
    return out


def validate_body(cls, obj):
    if not isinstance(obj, dict):
        raise ApiError(400, "request body must be a JSON object", "body is not a JSON object")
    problems = unknown_fields(cls, obj)
    if not problems:
        try:
            parsed = cls.from_dict(obj)
            # The generated enums map any unknown string to an artificial catch-all member.
            if has_unknown_enum(parsed):
                problems = ["an enum field has a value outside the published enum"]
        except pydantic.ValidationError as err:
            aliases = {f: (i.serialization_alias or f) for f, i in cls.model_fields.items()}
            problems = [re.sub(r"^(\w+)", lambda m: aliases.get(m.group(1), m.group(1)), p)
                        for p in pydantic_problems(err)]
        except Exception as err:  # noqa: BLE001 - anything the generated from_dict raises
            problems = [str(err)]
    if problems:
        msg = ", ".join(problems)
        raise ApiError(400, msg, f"{cls.__name__}: {msg}")
    return obj


def has_unknown_enum(value):
    if isinstance(value, enum.Enum):
        return value.value == "unknown_default_open_api"
    if isinstance(value, pydantic.BaseModel):
        return any(has_unknown_enum(getattr(value, f)) for f in type(value).model_fields)
    if isinstance(value, (list, tuple)):
        return any(has_unknown_enum(v) for v in value)
    if isinstance(value, dict):
        return any(has_unknown_enum(v) for v in value.values())
    return value == "unknown_default_open_api"


def _unwrap(annotation):
    """Base types of an annotation: strips Annotated/Optional/Union; returns a list."""
    origin = typing.get_origin(annotation)
    if origin is typing.Annotated:
        return _unwrap(typing.get_args(annotation)[0])
    if origin is typing.Union:
        out = []
        for a in typing.get_args(annotation):
            if a is not type(None):
                out += _unwrap(a)
        return out
    return [annotation]


def query_spec(method_name):
    """{wire name: annotation} of the query parameters SandboxApi.<method_name> can send."""
    fn = getattr(SandboxApi, method_name)
    sig = inspect.signature(fn)
    src = inspect.getsource(getattr(SandboxApi, f"_{method_name}_serialize"))
    spec, current = {}, None
    for m in re.finditer(r"if (\w+) is not None:|_query_params\.append\(\s*\(\s*'(\w+)'", src):
        if m.group(1):
            current = m.group(1)
        elif current in sig.parameters:
            spec[m.group(2)] = sig.parameters[current].annotation
    return spec


def _coerce_scalar(annotation, raw, name):
    bases = _unwrap(annotation)
    if bool in bases:
        if raw not in ("true", "false"):
            raise ValueError(f"{name} must be a boolean value (true or false)")
        return raw == "true"
    if int in bases or float in bases:
        try:
            return int(raw)
        except ValueError:
            pass
        if float in bases:
            try:
                return float(raw)
            except ValueError:
                pass
        raise ValueError(f"{name} must be a number")
    if raw == "unknown_default_open_api":
        raise ValueError(f"{name}: unknown_default_open_api is not part of the published enum")
    return raw


def validate_query(spec, pairs):
    """Checks raw query pairs against a query_spec; returns {wire name: value}."""
    grouped = {}
    for k, v in pairs:
        grouped.setdefault(k, []).append(v)
    values, problems = {}, []
    for name, raws in grouped.items():
        if name not in spec:
            problems.append(f"query parameter {name} should not exist")
            continue
        ann = spec[name]
        bases = _unwrap(ann)
        try:
            if len(bases) == 1 and typing.get_origin(bases[0]) in (list, typing.List):
                inner = typing.get_args(bases[0])[0]
                items = [p for r in raws for p in r.split(",") if p != ""]
                value = [_coerce_scalar(inner, it, name) for it in items]
            else:
                if len(raws) > 1:
                    raise ValueError(f"{name} must be given once")
                value = _coerce_scalar(ann, raws[0], name)
            values[name] = pydantic.TypeAdapter(ann).validate_python(value)
            if has_unknown_enum(values[name]):
                raise ValueError(f"{name} has a value outside the published enum")
        except ValueError as err:  # pydantic.ValidationError is a ValueError
            if isinstance(err, pydantic.ValidationError):
                problems += [f"{name} {p}" for p in pydantic_problems(err)]
            else:
                problems.append(str(err))
    if problems:
        msg = ", ".join(problems)
        raise ApiError(400, msg, msg)
    return values


def _published_sandbox_routes():
    """(METHOD, regex) of every /sandbox route the published client knows."""
    src = inspect.getsource(SandboxApi)
    routes = []
    for method, path in re.findall(r"method='(\w+)',\s*resource_path='([^']+)'", src):
        rx = "^" + re.sub(r"\\\{[^}]+\\\}", "[^/]+", re.escape(path)) + "$"
        routes.append((method.upper(), re.compile(rx)))
    return routes


# ---------------------------------------------------------------------------------------- the fake

class Fake:
    def __init__(self, args):
        self.journal_path = args.journal
        self.api_key = args.api_key
        self.run_label = args.run_label
        self.agent = args.agent_binary
        self.templates = {}
        for t in args.template:
            name, sep, image = t.partition("=")
            if not sep or not name or not image:
                raise SystemExit(f"--template wants NAME=IMAGE, got {t!r}")
            self.templates[name] = image
        self.org_id = str(uuid.uuid4())
        self.lock = threading.RLock()
        self.sandboxes = {}  # id -> record
        self.journal = []
        self.seq = 0
        self.faults = []
        self.base_url = ""
        self.q_list = query_spec("list_sandboxes")
        self.q_get = query_spec("get_sandbox")
        self.q_stop = query_spec("stop_sandbox")
        self.q_none = {}
        self.published = _published_sandbox_routes()
        open(self.journal_path, "a").close()

    # ------------------------------------------------------------------ journal & faults
    def write_journal(self, entry):
        with self.lock:
            self.seq += 1
            line = {"seq": self.seq}
            line.update(entry)
            self.journal.append(line)
            with open(self.journal_path, "a") as f:
                f.write(json.dumps(line) + "\n")
                f.flush()

    def take_fault(self, method, paths):
        with self.lock:
            for f in self.faults:
                if f["times"] <= 0 or f["method"] != method:
                    continue
                if any(self._path_matches(f["path"], p) for p in paths):
                    f["times"] -= 1
                    fault = dict(f)
                    self.faults = [x for x in self.faults if x["times"] > 0]
                    return fault
        return None

    @staticmethod
    def _path_matches(pattern, path):
        a, b = pattern.rstrip("/").split("/"), path.rstrip("/").split("/")
        return len(a) == len(b) and all(x == "*" or x == y for x, y in zip(a, b))

    def arm_fault(self, body):
        if not isinstance(body, dict):
            raise ApiError(400, "fault must be a JSON object")
        known = {"method", "path", "fault", "status", "delayMs", "times"}
        extra = set(body) - known
        if extra:
            raise ApiError(400, f"unknown fault fields {sorted(extra)}")
        method, path, kind = body.get("method"), body.get("path"), body.get("fault")
        if not isinstance(method, str) or not isinstance(path, str) or not path.startswith("/"):
            raise ApiError(400, "method and path (starting with /) are required")
        if kind not in ("lose_answer", "slow", "status", "lag"):
            raise ApiError(400, "fault must be lose_answer, slow, status or lag")
        status = body.get("status")
        if kind == "status" and (not isinstance(status, int) or not 400 <= status <= 599):
            raise ApiError(400, "a status fault needs status (400..599)")
        delay = body.get("delayMs", 3000)
        times = body.get("times", 1)
        if not isinstance(delay, int) or delay < 0 or not isinstance(times, int) or times < 1:
            raise ApiError(400, "delayMs must be an integer >= 0 and times an integer >= 1")
        with self.lock:
            self.faults.append({"method": method.upper(), "path": path, "fault": kind,
                                "status": status, "delayMs": delay, "times": times})

    # ------------------------------------------------------------------ docker
    def docker(self, *argv, timeout=120):
        res = subprocess.run(["docker", *argv], capture_output=True, text=True, timeout=timeout)
        if res.returncode != 0:
            raise RuntimeError(f"docker {argv[0]} failed: {res.stderr.strip()[:500]}")
        return res.stdout.strip()

    def container_name(self, sid):
        return f"fake-daytona-{sid}"

    # ------------------------------------------------------------------ sandbox records
    def dto(self, rec):
        d = {
            "id": rec["id"], "organizationId": self.org_id, "name": rec["name"], "snapshot": rec["snapshot"],
            "user": rec["user"], "env": dict(rec["env"]), "labels": dict(rec["labels"]),
            "public": rec["public"], "networkBlockAll": rec["networkBlockAll"], "kvm": rec["kvm"],
            "target": rec["target"], "cpu": DEFAULT_CPU, "gpu": 0, "memory": DEFAULT_MEMORY,
            "disk": DEFAULT_DISK, "state": rec["state"], "desiredState": rec["desiredState"],
            "recoverable": False, "backupState": "None",
            "autoStopInterval": rec["autoStopInterval"], "autoArchiveInterval": rec["autoArchiveInterval"],
            "autoDeleteInterval": rec["autoDeleteInterval"], "volumes": [],
            "createdAt": rec["createdAt"], "updatedAt": rec["updatedAt"], "lastActivityAt": rec["lastActivityAt"],
            "sandboxClass": "container", "runnerId": "fake-runner",
            "toolboxProxyUrl": f"{self.base_url}/toolbox",
        }
        for k in ("networkAllowList", "domainAllowList"):
            if rec.get(k) is not None:
                d[k] = rec[k]
        return d

    def list_item(self, rec):
        props = set(_model_props(SandboxListItem))
        return {k: v for k, v in self.dto(rec).items() if k in props}

    def find(self, id_or_name):
        with self.lock:
            rec = self.sandboxes.get(id_or_name)
            if rec is not None and rec["state"] != "destroyed":
                return rec
            for rec in self.sandboxes.values():
                if rec["name"] == id_or_name and rec["state"] != "destroyed":
                    return rec
        raise ApiError(404, f"Sandbox with ID or name {id_or_name} not found")

    def touch(self, rec, state=None, desired=None):
        now = iso_now()
        if state is not None:
            rec["state"] = state
        if desired is not None:
            rec["desiredState"] = desired
        rec["updatedAt"] = now
        rec["lastActivityAt"] = now
        rec["activity"] = time.time()

    def begin(self, rec, transitional, desired):
        """Marks a sandbox busy for a Docker operation; 409 when one is already running."""
        with self.lock:
            if rec["pending"]:
                raise ApiError(409, "Sandbox state change in progress")
            rec["pending"] = True
            rec["before"] = rec["state"]
            self.touch(rec, transitional, desired)

    def end(self, rec, state, desired):
        with self.lock:
            rec["pending"] = False
            self.touch(rec, state, desired)
            if state in ("stopped", "destroyed"):
                rec["stoppedAt"] = time.time()

    def fail(self, rec):
        with self.lock:
            rec["pending"] = False
            self.touch(rec, rec["before"], rec["before"] if rec["before"] != "creating" else "started")

    # ------------------------------------------------------------------ operations
    def create(self, body):
        validate_body(CreateSandbox, body)
        if body.get("buildInfo"):
            if body.get("snapshot"):
                raise ApiError(400, "Cannot specify a snapshot when using a build info entry")
            raise ApiError(400, "buildInfo (declarative builds) is not supported by the fake",
                           "buildInfo is not supported by the fake")
        if body.get("cpu") or body.get("gpu") or body.get("memory") or body.get("disk"):
            raise ApiError(400, "Cannot specify Sandbox resources when using a snapshot")
        if body.get("gpuType"):
            raise ApiError(400, "Cannot specify GPU type when creating sandbox from snapshot. "
                                "GPU type is inherited from snapshot.")
        snapshot = body.get("snapshot")
        if not snapshot or not snapshot.strip():
            snapshot = next(iter(self.templates), None)  # the real API uses its defaultSnapshot
        if snapshot not in self.templates:
            raise ApiError(400, f"Snapshot {snapshot} not found. Did you add it through the Daytona Dashboard?")
        for vol in body.get("volumes") or []:
            raise ApiError(400, f"Volume '{vol.get('volumeId')}' could not be resolved to a valid volume ID")
        if body.get("secrets"):
            raise ApiError(400, "secrets are not supported by the fake", "secrets are not supported by the fake")
        if body.get("linkedSandbox"):
            raise ApiError(400, "linkedSandbox is not supported by the fake",
                           "linkedSandbox is not supported by the fake")
        auto_stop = body.get("autoStopInterval")
        if auto_stop is not None and auto_stop < 0:
            raise ApiError(400, "Auto-stop interval must be non-negative")
        auto_archive = body.get("autoArchiveInterval")
        if auto_archive is not None:
            auto_archive = self.resolve_archive(auto_archive)
        sid = str(uuid.uuid4())
        now = iso_now()
        rec = {
            "id": sid, "name": body.get("name") or sid, "snapshot": snapshot,
            "user": body.get("user") or "daytona", "env": body.get("env") or {},
            "labels": body.get("labels") or {}, "public": bool(body.get("public") or False),
            "networkBlockAll": bool(body.get("networkBlockAll") or False), "kvm": bool(body.get("kvm") or False),
            "networkAllowList": body.get("networkAllowList"), "domainAllowList": body.get("domainAllowList"),
            "target": body.get("target") or "us",
            "autoStopInterval": 15 if auto_stop is None else auto_stop,
            "autoArchiveInterval": 7 * 24 * 60 if auto_archive is None else auto_archive,
            "autoDeleteInterval": -1 if body.get("autoDeleteInterval") is None else body["autoDeleteInterval"],
            "state": "creating", "desiredState": "started", "pending": True, "before": "creating",
            "createdAt": now, "updatedAt": now, "lastActivityAt": now, "activity": time.time(), "stoppedAt": None,
        }
        with self.lock:
            for other in self.sandboxes.values():
                if other["name"] == rec["name"] and other["state"] != "destroyed":
                    raise ApiError(409, f"Sandbox with name {rec['name']} already exists")
            self.sandboxes[sid] = rec
        argv = ["run", "-d", "--network", "host", "--name", self.container_name(sid),
                "-v", f"{self.agent}:/usr/local/bin/computer-agent:ro",
                "--label", f"computerd.fake={self.run_label}", "--label", f"computerd.fake.sandbox={sid}"]
        for k, v in rec["env"].items():
            argv += ["-e", f"{k}={v}"]
        argv.append(self.templates[snapshot])
        try:
            self.docker(*argv)
        except Exception as err:  # noqa: BLE001
            log(f"create {sid}: {err}")
            subprocess.run(["docker", "rm", "-f", self.container_name(sid)], capture_output=True)
            with self.lock:
                del self.sandboxes[sid]
            raise ApiError(500, "An unexpected error occurred.")
        self.end(rec, "started", "started")
        return rec

    def resolve_archive(self, minutes):
        if minutes < 0:
            raise ApiError(400, "Auto-archive interval must be non-negative")
        return MAX_AUTO_ARCHIVE_INTERVAL if minutes == 0 else min(minutes, MAX_AUTO_ARCHIVE_INTERVAL)

    def stop(self, rec, force=False, reason="stop", lag=0.0, wait=False):
        """Answers once the stop is under way ("stopping"), as the real API does; the runner's
        work (and `lag` more seconds) runs after, unless `wait`."""
        with self.lock:
            if rec["pending"]:
                raise ApiError(409, "Sandbox state change in progress")
            if rec["state"] not in ("started", "paused"):
                raise ApiError(400, "Sandbox is not in a stoppable state")
            ephemeral = rec["autoDeleteInterval"] == 0
            self.begin(rec, "destroying" if ephemeral else "stopping", "destroyed" if ephemeral else "stopped")

        def runner():
            try:
                if ephemeral:
                    self.docker("rm", "-f", self.container_name(rec["id"]))
                elif force:
                    self.docker("kill", self.container_name(rec["id"]))
                else:
                    self.docker("stop", "-t", "10", self.container_name(rec["id"]))
            except Exception as err:  # noqa: BLE001
                log(f"{reason} {rec['id']}: {err}")
                self.fail(rec)
                return
            time.sleep(lag)
            if ephemeral:
                self.end(rec, "destroyed", "destroyed")
            else:
                self.end(rec, "stopped", "stopped")

        if wait:
            runner()
        else:
            threading.Thread(target=runner, daemon=True).start()
        return rec

    def start(self, rec, lag=0.0):
        """Starts the sandbox and waits up to SERVER_WAIT for the runner, as the real server
        does; answers (the record, whether anything changed)."""
        with self.lock:
            if rec["state"] == "started" and rec["desiredState"] == "started" and not rec["pending"]:
                return rec, False
            if rec["pending"] or rec["state"] != rec["desiredState"]:
                raise ApiError(409, "Sandbox state change in progress")
            if rec["state"] not in ("stopped", "archived"):
                raise ApiError(400, "Sandbox is not in valid state")
            self.begin(rec, "starting", "started")
        done = threading.Event()

        def runner():
            try:
                self.docker("start", self.container_name(rec["id"]))
            except Exception as err:  # noqa: BLE001
                log(f"start {rec['id']}: {err}")
                self.fail(rec)
                done.set()
                return
            time.sleep(lag)
            self.end(rec, "started", "started")
            done.set()

        threading.Thread(target=runner, daemon=True).start()
        done.wait(SERVER_WAIT)
        return rec, True

    def delete(self, rec):
        with self.lock:
            if rec["pending"]:
                raise ApiError(409, "Sandbox state change in progress")
            self.begin(rec, "destroying", "destroyed")
        try:
            self.docker("rm", "-f", self.container_name(rec["id"]))
        except Exception as err:  # noqa: BLE001
            log(f"delete {rec['id']}: {err}")
            self.fail(rec)
            raise ApiError(500, "An unexpected error occurred.")
        self.end(rec, "destroyed", "destroyed")
        return rec

    def list(self, q):
        labels = None
        if "labels" in q:
            try:
                labels = json.loads(q["labels"])
            except ValueError:
                raise ApiError(400, "Invalid labels JSON format")
            if not isinstance(labels, dict) or not all(isinstance(v, str) for v in labels.values()):
                raise ApiError(400, "labels must be a JSON object of strings",
                               "labels must be a JSON object of strings")

        def ok(rec):
            if rec["state"] == "destroyed":
                return False
            if labels and any(rec["labels"].get(k) != v for k, v in labels.items()):
                return False
            if q.get("id") and not rec["id"].lower().startswith(q["id"].lower()):
                return False
            if q.get("name") and not rec["name"].lower().startswith(q["name"].lower()):
                return False
            if q.get("states") and rec["state"] not in [s.value for s in q["states"]]:
                return False
            if q.get("snapshots") and rec["snapshot"] not in q["snapshots"]:
                return False
            if q.get("regionIds") and rec["target"] not in q["regionIds"]:
                return False
            if q.get("sandboxClasses") and "container" not in [c.value for c in q["sandboxClasses"]]:
                return False
            if "isPublic" in q and rec["public"] != q["isPublic"]:
                return False
            for key, have in (("Cpu", DEFAULT_CPU), ("MemoryGiB", DEFAULT_MEMORY), ("DiskGiB", DEFAULT_DISK),
                              ("Gpu", 0)):
                if "min" + key in q and have < q["min" + key]:
                    return False
                if "max" + key in q and have > q["max" + key]:
                    return False
            created = datetime.datetime.fromisoformat(rec["createdAt"].replace("Z", "+00:00"))
            for key, after in (("createdAtAfter", True), ("createdAtBefore", False)):
                if key in q:
                    bound = q[key] if q[key].tzinfo else q[key].replace(tzinfo=datetime.timezone.utc)
                    if (after and created <= bound) or (not after and created >= bound):
                        return False
            return True

        with self.lock:
            recs = [r for r in self.sandboxes.values() if ok(r)]
            sort = q["sort"].value if "sort" in q else "lastActivityAt"
            desc = (q["order"].value if "order" in q else "desc") == "desc"
            keyf = {"name": lambda r: r["name"], "cpu": lambda r: DEFAULT_CPU,
                    "memoryGib": lambda r: DEFAULT_MEMORY, "diskGib": lambda r: DEFAULT_DISK,
                    "createdAt": lambda r: r["createdAt"]}.get(sort, lambda r: r["lastActivityAt"])
            recs.sort(key=lambda r: (keyf(r), r["id"]), reverse=desc)
            offset = 0
            if q.get("cursor"):
                try:
                    offset = int(base64.urlsafe_b64decode(q["cursor"].encode()).decode())
                except (ValueError, UnicodeDecodeError):
                    raise ApiError(400, "Invalid cursor")
            limit = q.get("limit", 100)
            page = recs[offset:offset + limit]
            nxt = None
            if offset + limit < len(recs):
                nxt = base64.urlsafe_b64encode(str(offset + limit).encode()).decode()
            return {"items": [self.list_item(r) for r in page], "nextCursor": nxt}

    def set_interval(self, rec, kind, raw):
        try:
            value = pydantic.TypeAdapter(typing.Union[int, float]).validate_python(
                int(raw) if re.fullmatch(r"-?\d+", raw) else float(raw))
        except ValueError:
            raise ApiError(400, "interval must be a number", f"path parameter interval {raw!r} is not a number")
        if value != value or value in (float("inf"), float("-inf")):
            raise ApiError(400, "interval must be a number", f"path parameter interval {raw!r} is not a number")
        if isinstance(value, float) and value.is_integer():
            value = int(value)
        with self.lock:
            if kind == "autostop":
                if value < 0:
                    raise ApiError(400, "Auto-stop interval must be non-negative")
                rec["autoStopInterval"] = value
            elif kind == "autoarchive":
                rec["autoArchiveInterval"] = self.resolve_archive(value)
            else:
                rec["autoDeleteInterval"] = value
            self.touch(rec)
        return rec

    # ------------------------------------------------------------------ auto-stop / auto-delete
    def reaper(self):
        while True:
            time.sleep(2)
            now = time.time()
            with self.lock:
                recs = list(self.sandboxes.values())
            for rec in recs:
                try:
                    if (not rec["pending"] and rec["state"] == "started" and rec["autoStopInterval"] > 0
                            and now - rec["activity"] > rec["autoStopInterval"] * 60):
                        log(f"auto-stop {rec['id']} after {rec['autoStopInterval']} min")
                        self.stop(rec, reason="auto-stop", wait=True)
                    elif (not rec["pending"] and rec["state"] == "stopped" and rec["autoDeleteInterval"] > 0
                          and rec["stoppedAt"] and now - rec["stoppedAt"] > rec["autoDeleteInterval"] * 60):
                        log(f"auto-delete {rec['id']} after {rec['autoDeleteInterval']} min")
                        self.delete(rec)
                except ApiError as err:
                    log(f"reaper {rec['id']}: {err.message}")


class Handler(BaseHTTPRequestHandler):
    server_version = "daytona-fake"
    fake: Fake = None

    def log_message(self, fmt, *args):  # the default logs to stderr with the client address; keep quiet
        pass

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

    def send_json(self, status, body, headers=None):
        data = b"" if body is None else json.dumps(body).encode()
        self.send_response(status)
        if body is not None:
            self.send_header("Content-Type", "application/json; charset=utf-8")
        self.send_header("Content-Length", str(len(data)))
        for k, v in (headers or {}).items():
            self.send_header(k, v)
        self.end_headers()
        if data:
            self.wfile.write(data)

    def error_body(self, status, message):
        return {"path": self.path, "timestamp": iso_now(), "statusCode": status,
                "error": HTTP_REASONS.get(status, "Error"), "message": message}

    def handle_any(self, method):
        fake = self.fake
        parts = urlsplit(self.path)
        path, query = parts.path, parts.query
        length = int(self.headers.get("Content-Length") or 0)
        raw_body = self.rfile.read(length) if length > 0 else b""

        if path.startswith("/_fake/"):
            return self.handle_control(method, path, raw_body)

        route = path[4:] if path == "/api" or path.startswith("/api/") else path
        route = route.rstrip("/") or "/"
        key_ok = self.headers.get("Authorization") == f"Bearer {fake.api_key}"
        entry = {"method": method, "path": path, "query": query, "status": None, "effect": None,
                 "sandboxId": None, "labels": None, "keyOk": key_ok, "fault": None, "invalid": None}

        fault = fake.take_fault(method, {path, route})
        self.lag = 0.0
        if fault is not None:
            entry["fault"] = fault["fault"]
            if fault["fault"] == "lag":
                self.lag = fault["delayMs"] / 1000.0
            elif fault["fault"] == "slow":
                time.sleep(fault["delayMs"] / 1000.0)
            elif fault["fault"] == "status":
                status = fault["status"]
                entry["status"] = status
                self.identify(entry, route)
                if route == "/sandbox" and method == "POST":
                    try:
                        entry["labels"] = json.loads(raw_body).get("labels")
                    except (ValueError, AttributeError):
                        pass
                fake.write_journal(entry)
                log(f"{method} {path} -> {status} (fault)")
                headers = {"Retry-After": "1"} if status == 429 else None
                msg = FAULT_MESSAGES.get(status, HTTP_REASONS.get(status, "Error"))
                return self.send_json(status, self.error_body(status, msg), headers)

        try:
            status, body = self.dispatch(method, route, query, raw_body, key_ok, entry)
        except ApiError as err:
            status, body = err.status, self.error_body(err.status, err.message)
            entry["invalid"] = err.invalid
            entry["effect"] = None
        except Exception as err:  # noqa: BLE001
            log(f"internal error on {method} {path}: {err!r}")
            status, body = 500, self.error_body(500, "An unexpected error occurred.")
            entry["effect"] = None
        entry["status"] = status
        if status >= 400:
            entry["effect"] = None
        fake.write_journal(entry)
        log(f"{method} {path} -> {status} effect={entry['effect']} sandbox={entry['sandboxId']}"
            + (f" invalid={entry['invalid']}" if entry["invalid"] else "")
            + (f" fault={entry['fault']}" if entry["fault"] else ""))
        if fault is not None and fault["fault"] == "lose_answer":
            self.close_connection = True
            return  # nothing written: the server closes the connection
        self.send_json(status, body)

    def identify(self, entry, route):
        m = re.match(r"^/sandbox/([^/]+)(/.*)?$", route)
        if m and m.group(1) not in ("for-runner", "ssh-access"):
            try:
                rec = self.fake.find(m.group(1))
                entry["sandboxId"], entry["labels"] = rec["id"], dict(rec["labels"])
            except ApiError:
                entry["sandboxId"] = m.group(1)

    def dispatch(self, method, route, query, raw_body, key_ok, entry):
        fake = self.fake
        pairs = parse_qsl(query, keep_blank_values=True)
        segs = route.split("/")[1:]
        known = route == "/sandbox" and method in ("GET", "POST") or (
            len(segs) >= 2 and segs[0] == "sandbox" and any(
                m == method and rx.match(route) for m, rx in fake.published))
        if not known:
            raise ApiError(404, f"Cannot {method} {self.path.split('?')[0]}")
        if not key_ok:
            self.identify(entry, route)
            raise ApiError(401, "Invalid credentials")

        def body_json():
            if not raw_body.strip():
                return {}
            try:
                return json.loads(raw_body)
            except ValueError:
                raise ApiError(400, "Unexpected token in JSON body", "body is not valid JSON")

        if route == "/sandbox" and method == "POST":
            validate_query(fake.q_none, pairs)
            body = body_json()
            if isinstance(body, dict) and isinstance(body.get("labels"), dict):
                entry["labels"] = body["labels"]
            rec = fake.create(body)
            entry.update(effect="create", sandboxId=rec["id"], labels=dict(rec["labels"]), env=dict(rec["env"]))
            return 200, self.checked(SandboxModel, fake.dto(rec))
        if route == "/sandbox" and method == "GET":
            q = validate_query(fake.q_list, pairs)
            if "labels" in q:
                try:
                    entry["labels"] = json.loads(q["labels"])
                except ValueError:
                    pass
            return 200, self.checked(ListSandboxesResponse, fake.list(q))

        if len(segs) == 2 and method in ("GET", "DELETE"):
            rec_id = segs[1]
            entry["sandboxId"] = rec_id
            validate_query(fake.q_get if method == "GET" else fake.q_none, pairs)
            self.require_empty(raw_body)
            rec = fake.find(rec_id)
            entry.update(sandboxId=rec["id"], labels=dict(rec["labels"]))
            if method == "GET":
                return 200, self.checked(SandboxModel, fake.dto(rec))
            fake.delete(rec)
            entry["effect"] = "delete"
            return 200, self.checked(SandboxModel, fake.dto(rec))
        if len(segs) == 3 and method == "POST" and segs[2] in ("start", "stop"):
            entry["sandboxId"] = segs[1]
            q = validate_query(fake.q_stop if segs[2] == "stop" else fake.q_none, pairs)
            self.require_empty(raw_body)
            rec = fake.find(segs[1])
            entry.update(sandboxId=rec["id"], labels=dict(rec["labels"]))
            if segs[2] == "stop":
                fake.stop(rec, force=bool(q.get("force")), lag=self.lag)
                entry["effect"] = "stop"
            else:
                _, changed = fake.start(rec, lag=self.lag)
                entry["effect"] = "start" if changed else None
            return 200, self.checked(SandboxModel, fake.dto(rec))
        if len(segs) == 4 and method == "POST" and segs[2] in ("autostop", "autoarchive", "autodelete"):
            entry["sandboxId"] = segs[1]
            validate_query(fake.q_none, pairs)
            self.require_empty(raw_body)
            rec = fake.find(segs[1])
            entry.update(sandboxId=rec["id"], labels=dict(rec["labels"]))
            fake.set_interval(rec, segs[2], segs[3])
            entry["effect"] = segs[2]
            return 201, self.checked(SandboxModel, fake.dto(rec))
        self.identify(entry, route)
        raise ApiError(501, f"{method} {route} is part of the published Daytona API but not implemented by this fake")

    @staticmethod
    def require_empty(raw_body):
        if raw_body.strip() and raw_body.strip() != b"{}":
            raise ApiError(400, "this route takes no request body", "unexpected request body")

    @staticmethod
    def checked(model, body):
        """Logs (never raises) when the fake's own answer would not parse with the published model."""
        try:
            model.from_dict(json.loads(json.dumps(body)))
        except Exception as err:  # noqa: BLE001
            log(f"BUG: answer does not fit {model.__name__}: {err}")
        return body

    def handle_control(self, method, path, raw_body):
        fake = self.fake
        if self.client_address[0] not in ("127.0.0.1", "::1"):
            return self.send_json(403, {"message": "loopback only"})
        if path == "/_fake/journal" and method == "GET":
            with fake.lock:
                return self.send_json(200, list(fake.journal))
        if path == "/_fake/faults" and method == "POST":
            try:
                fake.arm_fault(json.loads(raw_body or b"null"))
            except ValueError:
                return self.send_json(400, {"message": "body is not JSON"})
            except ApiError as err:
                return self.send_json(400, {"message": err.message})
            return self.send_json(204, None)
        if path == "/_fake/seed" and method == "POST":
            # Sandboxes that are records only (no container): enough of them to page a list.
            try:
                count = json.loads(raw_body or b"null")["count"]
                assert isinstance(count, int) and 0 < count <= 20000
            except Exception:  # noqa: BLE001
                return self.send_json(400, {"message": "seed wants {\"count\": 1..20000}"})
            with fake.lock:
                for _ in range(count):
                    sid = str(uuid.uuid4())
                    now = iso_now()
                    fake.sandboxes[sid] = {
                        "id": sid, "name": sid, "snapshot": "phantom", "user": "daytona", "env": {},
                        "labels": {"computerd.computer": f"cmp_phantom_{sid}"}, "public": False,
                        "networkBlockAll": False, "kvm": False, "networkAllowList": None, "domainAllowList": None,
                        "target": "us", "autoStopInterval": 0, "autoArchiveInterval": 7 * 24 * 60,
                        "autoDeleteInterval": -1, "state": "started", "desiredState": "started", "pending": False,
                        "before": "started", "createdAt": now, "updatedAt": now, "lastActivityAt": now,
                        "activity": time.time(), "stoppedAt": None,
                    }
            return self.send_json(204, None)
        if path == "/_fake/faults" and method == "GET":
            with fake.lock:
                return self.send_json(200, list(fake.faults))
        return self.send_json(404, {"message": f"Cannot {method} {path}"})


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--journal", required=True)
    ap.add_argument("--api-key", required=True)
    ap.add_argument("--run-label", required=True)
    ap.add_argument("--agent-binary", required=True)
    ap.add_argument("--template", action="append", default=[], help="NAME=IMAGE (Daytona snapshot name)")
    args = ap.parse_args()
    fake = Fake(args)
    Handler.fake = fake
    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    server.daemon_threads = True
    port = server.server_address[1]
    fake.base_url = f"http://127.0.0.1:{port}"
    threading.Thread(target=fake.reaper, daemon=True).start()
    log(f"templates: {', '.join(f'{k}={v}' for k, v in fake.templates.items()) or '(none)'}")
    sys.stdout.write(f"LISTENING {fake.base_url}\n")
    sys.stdout.flush()
    try:
        server.serve_forever()
    except KeyboardInterrupt:
        pass


if __name__ == "__main__":
    main()
