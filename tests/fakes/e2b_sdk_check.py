#!/usr/bin/env python3
"""Drive the E2B fake (tests/fakes/e2b_fake.py) with the official E2B Python SDK, e2b==2.63.0.

    python3 tests/fakes/e2b_sdk_check.py --url http://127.0.0.1:PORT --api-key KEY --template NAME

Prints one line per step and exits 0 only when every step answered as the SDK expects.  It uses the
SDK's control-plane calls only (Sandbox.create / get_info / list / set_timeout / pause / connect / kill and
the generated client e2b.api.client for the deprecated v1 routes).  Sandbox.create does not reach envd
(the in-sandbox daemon), so nothing is skipped there; what is skipped is every envd call (files, commands,
is_running), because the fake's sandboxes run computer-agent, not envd.
"""

import argparse
import inspect
import os
import re
import sys
import time
import uuid
from datetime import datetime, timezone

import e2b
from e2b import (AuthenticationException, NotFoundException, Sandbox, SandboxQuery, SandboxState)
from e2b.api.client import models as M
from e2b.api.client.api.sandboxes import (get_sandboxes, post_sandboxes, post_sandboxes_sandbox_id_connect,
                                          post_sandboxes_sandbox_id_pause, post_sandboxes_sandbox_id_resume,
                                          post_v2_sandboxes)
from e2b.api.client.types import UNSET
from e2b.api.client_sync import get_api_client
from e2b.connection_config import ConnectionConfig

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
sys.dont_write_bytecode = True  # leave no __pycache__ in the tree
import e2b_fake  # noqa: E402  (only for the schema cross-check)

failures = []
# computer-agent exits at once without a server to dial; with these it keeps retrying, so the
# container stays up (a real adapter passes the cluster's URL and a pairing code the same way).
AGENT_ENVS = {"COMPUTER_AGENT_SERVER": "http://127.0.0.1:9", "COMPUTER_AGENT_PAIR": "sdk-check",
              "COMPUTER_AGENT_STATE": "/var/lib/computer-agent"}


def step(name, fn):
    try:
        detail = fn()
        print(f"ok   {name}{': ' + detail if detail else ''}", flush=True)
    except Exception as e:  # noqa: BLE001
        failures.append(name)
        print(f"FAIL {name}: {type(e).__name__}: {e}", flush=True)


def check(cond, msg):
    if not cond:
        raise AssertionError(msg)


def model_fields(cls):
    src = inspect.getsource(cls.from_dict)
    req = re.findall(r'd\.pop\("(\w+)"\)', src)
    opt = re.findall(r'd\.pop\("(\w+)", UNSET\)', src)
    return set(req), set(req) | set(opt)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--url", required=True)
    ap.add_argument("--api-key", required=True)
    ap.add_argument("--template", required=True)
    a = ap.parse_args()
    # api_url points the SDK at the fake; HTTP/1.1 because the fake is a plain http.server (the SDK
    # defaults to HTTP/2); retries=0 so that a refused request is seen as such.
    opts = dict(api_key=a.api_key, api_url=a.url, http_version="1.1", retries=0, request_timeout=30)
    client = get_api_client(ConnectionConfig(**opts))
    run = uuid.uuid4().hex[:8]
    ids = {}
    print(f"e2b SDK {e2b.__version__ if hasattr(e2b, '__version__') else '2.63.0'} against {a.url}", flush=True)

    def schemas_match_sdk():
        names = ["NewSandbox", "NewSandboxV2", "ConnectSandbox", "ConnectSandboxV2", "ResumedSandbox",
                 "SandboxTimeoutRequest", "SandboxPauseRequest", "SandboxAutoResumeConfig",
                 "SandboxNetworkConfig", "SandboxIamToken", "SandboxVolumeMount", "SandboxEgressProxyConfigType0",
                 "SandboxEgressProxyTLSConfigType0", "SandboxNetworkRule", "SandboxNetworkTransform", "SandboxIam"]
        for n in names:
            req, allf = model_fields(getattr(M, n))
            mine = e2b_fake.SCHEMAS[n]
            check(set(mine["props"]) == allf, f"{n}: fake fields {sorted(mine['props'])} != SDK {sorted(allf)}")
            check(set(mine["req"]) == req, f"{n}: fake required {mine['req']} != SDK {sorted(req)}")
        return f"{len(names)} request models agree with e2b.api.client.models"

    step("request schemas equal the SDK models", schemas_match_sdk)

    def create_a():
        sbx = Sandbox.create(a.template, timeout=120, metadata={"run": run, "role": "a", "odd key": "v&=1"},
                             envs=dict(AGENT_ENVS, COMPUTER_AGENT_TEST="1"), lifecycle={"on_timeout": "pause", "auto_resume": True},
                             **opts)
        ids["a"] = sbx.sandbox_id
        check(re.fullmatch(r"[a-z0-9]{20}", sbx.sandbox_id), f"odd id {sbx.sandbox_id}")
        return f"Sandbox.create -> {sbx.sandbox_id}"

    step("create A (metadata, envs, autoPause, autoResume)", create_a)

    def create_b():
        sbx = Sandbox.create(a.template, timeout=120, metadata={"run": run, "role": "b"}, envs=AGENT_ENVS, **opts)
        ids["b"] = sbx.sandbox_id
        return f"Sandbox.create -> {sbx.sandbox_id}"

    step("create B", create_b)

    def info_a():
        i = Sandbox.get_info(ids["a"], **opts)
        check(i.state == SandboxState.RUNNING, f"state {i.state}")
        check(i.metadata == {"run": run, "role": "a", "odd key": "v&=1"}, f"metadata {i.metadata}")
        check(i.template_id == a.template, f"template {i.template_id}")
        check(i.lifecycle and i.lifecycle.get("on_timeout") == "pause" and i.lifecycle.get("auto_resume") is True
              if isinstance(i.lifecycle, dict) else
              i.lifecycle.on_timeout == "pause" and i.lifecycle.auto_resume is True, f"lifecycle {i.lifecycle}")
        left = (i.end_at - datetime.now(timezone.utc)).total_seconds()
        check(100 < left <= 121, f"endAt {left:.1f}s away")
        return f"running, endAt in {left:.0f}s, lifecycle {i.lifecycle}"

    step("get_info A", info_a)

    def list_by_metadata():
        got = Sandbox.list(query=SandboxQuery(metadata={"run": run, "role": "a"}), **opts).next_items()
        check([s.sandbox_id for s in got] == [ids["a"]], f"got {[s.sandbox_id for s in got]}")
        got = Sandbox.list(query=SandboxQuery(metadata={"odd key": "v&=1"}), **opts).next_items()
        check([s.sandbox_id for s in got] == [ids["a"]], f"odd metadata got {[s.sandbox_id for s in got]}")
        got = Sandbox.list(query=SandboxQuery(metadata={"run": run}, state=[SandboxState.RUNNING]), **opts).next_items()
        check(sorted(s.sandbox_id for s in got) == sorted([ids["a"], ids["b"]]), f"got {got}")
        return "metadata {run, role=a} -> [A]; {run} running -> [A, B]"

    step("list filtered by metadata", list_by_metadata)

    def paging():
        p = Sandbox.list(query=SandboxQuery(metadata={"run": run}), limit=1, **opts)
        first = p.next_items()
        check(len(first) == 1 and p.has_next, "first page")
        second = p.next_items()
        check(len(second) == 1 and not p.has_next, "second page")
        check({first[0].sandbox_id, second[0].sandbox_id} == {ids["a"], ids["b"]}, "pages")
        return "limit=1 gives two pages via X-Next-Token"

    step("list pages", paging)

    def set_timeout():
        Sandbox.set_timeout(ids["a"], 300, **opts)
        left = (Sandbox.get_info(ids["a"], **opts).end_at - datetime.now(timezone.utc)).total_seconds()
        check(290 < left <= 301, f"endAt {left:.1f}s away")
        return f"endAt now {left:.0f}s away"

    step("set_timeout A 300", set_timeout)

    def pause():
        check(Sandbox.pause(ids["a"], **opts) is True, "first pause not True")
        check(Sandbox.pause(ids["a"], **opts) is False, "second pause (409) not False")
        i = Sandbox.get_info(ids["a"], **opts)
        check(i.state == SandboxState.PAUSED, f"state {i.state}")
        got = Sandbox.list(query=SandboxQuery(metadata={"run": run}, state=[SandboxState.PAUSED]), **opts).next_items()
        check([s.sandbox_id for s in got] == [ids["a"]], f"paused list {got}")
        return "204, then 409 -> False; state paused; listed as paused"

    step("pause A", pause)

    def connect():
        sbx = Sandbox.connect(ids["a"], timeout=60, **opts)
        check(sbx.sandbox_id == ids["a"], "id")
        i = Sandbox.get_info(ids["a"], **opts)
        check(i.state == SandboxState.RUNNING, f"state {i.state}")
        sbx2 = Sandbox.connect(ids["a"], timeout=30, **opts)  # running: 200, TTL only extended
        left = (Sandbox.get_info(ids["a"], **opts).end_at - datetime.now(timezone.utc)).total_seconds()
        check(50 < left <= 61, f"endAt {left:.1f}s away")
        return f"resumed (201), connected again (200), endAt {left:.0f}s away; {sbx2.sandbox_id}"

    step("connect (resume) A", connect)

    def resume_v1():
        r = post_sandboxes_sandbox_id_pause.sync_detailed(ids["b"], client=client, body=M.SandboxPauseRequest())
        check(r.status_code == 204, f"pause {r.status_code}")
        r = post_sandboxes_sandbox_id_resume.sync_detailed(ids["b"], client=client, body=M.ResumedSandbox(timeout=60))
        check(r.status_code == 201 and r.parsed.sandbox_id == ids["b"], f"resume {r.status_code} {r.content!r}")
        r = post_sandboxes_sandbox_id_resume.sync_detailed(ids["b"], client=client, body=M.ResumedSandbox(timeout=60))
        check(r.status_code == 409, f"second resume {r.status_code}")
        r = post_sandboxes_sandbox_id_connect.sync_detailed(ids["b"], client=client, body=M.ConnectSandbox(timeout=90))
        check(r.status_code == 200, f"v1 connect {r.status_code}")
        return "pause 204, resume 201, resume again 409, v1 connect 200"

    step("deprecated resume / v1 connect B (generated client)", resume_v1)

    def filesystem_pause():
        check(Sandbox.pause(ids["b"], mode="filesystem", **opts) is True, "pause")
        i = Sandbox.get_info(ids["b"], **opts)
        check(i.state == SandboxState.PAUSED, f"state {i.state}")
        Sandbox.connect(ids["b"], timeout=60, **opts)
        check(Sandbox.get_info(ids["b"], **opts).state == SandboxState.RUNNING, "not running")
        return "memory=false pause (docker stop) and connect (docker start)"

    step("filesystem pause / connect B", filesystem_pause)

    def v1_routes():
        r = post_sandboxes.sync_detailed(client=client, body=M.NewSandbox(template_id=a.template,
                                                                          metadata={"run": run, "role": "v1"},
                                                                          env_vars=AGENT_ENVS))
        check(r.status_code == 201, f"POST /sandboxes {r.status_code} {r.content!r}")
        ids["v1"] = r.parsed.sandbox_id
        i = Sandbox.get_info(ids["v1"], **opts)
        left = (i.end_at - datetime.now(timezone.utc)).total_seconds()
        check(10 < left <= 15.5, f"default timeout gives {left:.1f}s")
        r = get_sandboxes.sync_detailed(client=client, metadata="run=" + run + "&role=v1")
        check(r.status_code == 200 and [s.sandbox_id for s in r.parsed] == [ids["v1"]], f"GET /sandboxes {r.content!r}")
        return f"POST /sandboxes 201 (default timeout 15 s), GET /sandboxes?metadata -> [{ids['v1']}]"

    step("v1 create and list (generated client)", v1_routes)

    def refusals():
        try:
            Sandbox.get_info(ids["a"], **dict(opts, api_key="wrong-key"))
            raise AssertionError("wrong key accepted")
        except AuthenticationException:
            pass
        try:
            Sandbox.create("no-such-template-" + run, **opts)
            raise AssertionError("unknown template accepted")
        except Exception as e:  # noqa: BLE001
            check("404" in str(e) and "not found" in str(e), f"unknown template: {e}")
        body = M.NewSandboxV2(template_id=a.template)
        body["bogusField"] = 1
        r = post_v2_sandboxes.sync_detailed(client=client, body=body)
        check(r.status_code == 400 and r.parsed.code == 400, f"unknown field {r.status_code}")
        r = post_v2_sandboxes.sync_detailed(client=client, body=M.NewSandboxV2(template_id=a.template, timeout="x"))
        check(r.status_code == 400, f"bad type {r.status_code}")
        return "wrong key 401 AuthenticationException; unknown template 404; unknown field / bad type 400"

    step("refusals", refusals)

    def idempotency():
        key = "idem-" + run
        s1 = Sandbox.create(a.template, timeout=60, metadata={"run": run, "role": "idem"}, envs=AGENT_ENVS,
                            idempotency_key=key, **opts)
        s2 = Sandbox.create(a.template, timeout=60, metadata={"run": run, "role": "idem"}, envs=AGENT_ENVS,
                            idempotency_key=key, **opts)
        ids["idem"] = s1.sandbox_id
        check(s1.sandbox_id == s2.sandbox_id, "a second sandbox was made")
        return f"same Idempotency-Key -> same sandbox {s1.sandbox_id}"

    step("create with idempotency_key", idempotency)

    def timeouts():
        k = Sandbox.create(a.template, timeout=2, metadata={"run": run, "role": "tk"}, envs=AGENT_ENVS, **opts).sandbox_id
        p = Sandbox.create(a.template, timeout=2, metadata={"run": run, "role": "tp"},
                           lifecycle={"on_timeout": "pause"}, envs=AGENT_ENVS, **opts).sandbox_id
        ids["tp"] = p
        time.sleep(3.5)
        try:
            Sandbox.get_info(k, **opts)
            raise AssertionError("timed-out sandbox still there")
        except NotFoundException:
            pass
        check(Sandbox.get_info(p, **opts).state == SandboxState.PAUSED, "autoPause sandbox not paused")
        return "timeout 2 s: plain one killed (404), autoPause one paused"

    step("timeout enforcement", timeouts)

    def kill():
        for k in list(ids):
            check(Sandbox.kill(ids[k], **opts) is True, f"kill {k}")
        check(Sandbox.kill(ids["a"], **opts) is False, "second kill not False (404)")
        try:
            Sandbox.get_info(ids["a"], **opts)
            raise AssertionError("killed sandbox still answers")
        except NotFoundException:
            pass
        left = Sandbox.list(query=SandboxQuery(metadata={"run": run}), **opts).next_items()
        check(left == [], f"still listed: {left}")
        return f"killed {len(ids)}; kill again -> False; get_info -> NotFoundException; list empty"

    step("kill all", kill)

    print(f"{'PASS' if not failures else 'FAIL'}: {len(failures)} step(s) failed", flush=True)
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
