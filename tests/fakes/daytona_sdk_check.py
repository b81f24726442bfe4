#!/usr/bin/env python3
"""Drives a Daytona API (normally tests/fakes/daytona_fake.py) with the official Daytona Python SDK.

    python3 tests/fakes/daytona_sdk_check.py --url URL --api-key KEY --template NAME

Uses `daytona==0.226.1` the way a user of the real service would: create from a snapshot with labels and
env, get, list filtered by labels, stop, start, set the auto-stop / auto-archive / auto-delete intervals,
delete; plus the error paths (unknown sandbox, unknown snapshot, wrong key). Prints one line per step and
exits 0 only when every step answered as the SDK expects.

Not used, and why:
- The SDK's default event stream (socket.io under <api_url>/socket.io/) is not part of the fake, so the
  client is built with `use_deprecated_polling=True`, the SDK's documented polling mode: it waits for
  states by polling GET /sandbox/{id}.
- Nothing here calls the toolbox (process, fs, git, ...): those go to the sandbox's toolboxProxyUrl, to the
  Daytona daemon inside the sandbox, which the fake's sandboxes (our agent) do not run.
"""

import argparse
import sys
import uuid
import warnings

from daytona import (
    CreateSandboxFromSnapshotParams,
    Daytona,
    DaytonaConfig,
    DaytonaError,
    DaytonaNotFoundError,
    ListSandboxesQuery,
)

FAILED = []


def step(name, fn):
    try:
        detail = fn()
    except Exception as err:  # noqa: BLE001
        FAILED.append(name)
        print(f"FAIL {name}: {type(err).__name__}: {err}", flush=True)
        return None
    print(f"ok   {name}" + (f": {detail}" if detail else ""), flush=True)
    return detail


def expect(cond, what):
    if not cond:
        raise AssertionError(what)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--url", required=True)
    ap.add_argument("--api-key", required=True)
    ap.add_argument("--template", required=True)
    args = ap.parse_args()

    # use_deprecated_polling warns that it is deprecated; it is still the SDK's supported way to run
    # without the socket.io event stream (see the module docstring).
    warnings.filterwarnings("ignore", message="Polling-only mode", category=DeprecationWarning)

    def client(key):
        return Daytona(DaytonaConfig(api_key=key, api_url=args.url, target="us", use_deprecated_polling=True))

    daytona = client(args.api_key)
    run = uuid.uuid4().hex[:12]
    labels = {"computerd.check": run, "role": "sdk-check"}
    state = {}

    def create():
        sb = daytona.create(
            CreateSandboxFromSnapshotParams(
                snapshot=args.template,
                labels=labels,
                env_vars={"DAYTONA_SDK_CHECK": run},
                auto_stop_interval=0,
                auto_archive_interval=60,
                auto_delete_interval=-1,
            ),
            timeout=120,
        )
        state["sb"] = sb
        expect(str(uuid.UUID(sb.id)) == sb.id, f"id {sb.id} is not a UUID")
        expect(sb.state.value == "started", f"state {sb.state}")
        expect(sb.labels.get("computerd.check") == run, f"labels {sb.labels}")
        expect(sb.auto_stop_interval == 0, f"autoStopInterval {sb.auto_stop_interval}")
        expect(sb.auto_delete_interval == -1, f"autoDeleteInterval {sb.auto_delete_interval}")
        return f"id={sb.id} state={sb.state.value} labels={sb.labels}"

    if step("create (snapshot, labels, env, autoStop=0)", create) is None:
        print("cannot go on without a sandbox")
        return 1
    sb = state["sb"]

    def get():
        got = daytona.get(sb.id)
        expect(got.id == sb.id and got.state.value == "started", f"got {got.id} {got.state}")
        expect(got.env.get("DAYTONA_SDK_CHECK") == run, "env not answered")
        by_name = daytona.get(sb.name)
        expect(by_name.id == sb.id, "get by name")
        return f"state={got.state.value} (by id and by name)"

    step("get", get)

    def list_by_labels():
        found = [s.id for s in daytona.list(ListSandboxesQuery(labels={"computerd.check": run}))]
        expect(found == [sb.id], f"list by labels gave {found}")
        none = [s.id for s in daytona.list(ListSandboxesQuery(labels={"computerd.check": run, "role": "other"}))]
        expect(none == [], f"list with a non-matching label gave {none}")
        return f"{found}; with a non-matching second label: {none}"

    step("list filtered by labels", list_by_labels)

    def stop():
        daytona.stop(sb, timeout=60)
        expect(sb.state.value == "stopped", f"state {sb.state}")
        expect(daytona.get(sb.id).state.value == "stopped", "get after stop")
        return f"state={sb.state.value}"

    step("stop", stop)

    def start():
        daytona.start(sb, timeout=60)
        expect(sb.state.value == "started", f"state {sb.state}")
        expect(daytona.get(sb.id).state.value == "started", "get after start")
        return f"state={sb.state.value}"

    step("start", start)

    def intervals():
        sb.set_autostop_interval(0)
        sb.set_auto_archive_interval(120)
        sb.set_auto_delete_interval(30)
        got = daytona.get(sb.id)
        expect((got.auto_stop_interval, got.auto_archive_interval, got.auto_delete_interval) == (0, 120, 30),
               f"intervals {(got.auto_stop_interval, got.auto_archive_interval, got.auto_delete_interval)}")
        sb.set_auto_delete_interval(-1)
        return "autostop=0 autoarchive=120 autodelete=30, then autodelete=-1"

    step("set auto-stop / auto-archive / auto-delete intervals", intervals)

    def unknown_snapshot():
        try:
            daytona.create(CreateSandboxFromSnapshotParams(snapshot=f"no-such-{run}", labels=labels), timeout=60)
        except DaytonaError as err:
            expect("not found" in str(err), str(err))
            return f"{type(err).__name__}: {err}"
        raise AssertionError("create with an unknown snapshot succeeded")

    step("create with an unknown snapshot is refused", unknown_snapshot)

    def wrong_key():
        try:
            client(args.api_key + "-wrong").get(sb.id)
        except DaytonaError as err:
            return f"{type(err).__name__}: {err}"
        raise AssertionError("a wrong key was accepted")

    step("a wrong API key is refused", wrong_key)

    def delete():
        daytona.delete(sb)
        try:
            daytona.get(sb.id)
        except DaytonaNotFoundError as err:
            return f"then get: {type(err).__name__}"
        raise AssertionError("sandbox still there after delete")

    step("delete", delete)

    def list_after():
        found = [s.id for s in daytona.list(ListSandboxesQuery(labels={"computerd.check": run}))]
        expect(found == [], f"{found}")
        return "no sandbox left with the run's label"

    step("list after delete", list_after)

    if FAILED:
        print(f"FAILED: {', '.join(FAILED)}")
        return 1
    print("all steps passed")
    return 0


if __name__ == "__main__":
    sys.exit(main())
