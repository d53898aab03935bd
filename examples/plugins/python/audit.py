#!/usr/bin/env python3
"""An example kubebridge exec plugin (docs/plugins.md), standard library only.

It speaks kubebridge.exec/v1: each line on stdin is one CloudEvent (JSON);
it answers each on stdout with one line, {"id": ..., "ok": true} or
{"id": ..., "ok": false, "error": ..., "permanent": ...}, flushed at once.
Stdout belongs to the protocol: log to stderr (the bridge logs it).

It appends one line per event, "<id>\\t<type>\\t<subject>", to the file
named by $AUDIT_FILE, and fsyncs it before acknowledging the event.

Knobs for tests, set by labels on the object:

  audit.kubebridge.io/fail: retry-once   the event fails retryably the first time its id is seen
  audit.kubebridge.io/fail: permanent    the event is refused for good (the sink's dead-letter gets it)
  audit.kubebridge.io/crash: once        the plugin exits with code 3 the first time it sees the event

Seen ids are kept in $AUDIT_FILE.seen, so that a restarted plugin does not
fail or crash on the same event forever.
"""
import json
import os
import sys


def main():
    path = os.environ.get("AUDIT_FILE")
    if not path:
        sys.exit("audit: AUDIT_FILE is not set")
    out = open(path, "a", encoding="utf-8")
    seen_path = path + ".seen"
    try:
        with open(seen_path, encoding="utf-8") as f:
            seen = set(f.read().splitlines())
    except FileNotFoundError:
        seen = set()
    seen_file = open(seen_path, "a", encoding="utf-8")

    def first(key):
        """Record key; True when it was new."""
        if key in seen:
            return False
        seen.add(key)
        seen_file.write(key + "\n")
        seen_file.flush()
        os.fsync(seen_file.fileno())
        return True

    def answer(event_id, ok, error=None, permanent=False):
        a = {"id": event_id, "ok": ok}
        if not ok:
            a["error"] = error
            a["permanent"] = permanent
        sys.stdout.write(json.dumps(a) + "\n")
        sys.stdout.flush()

    for line in sys.stdin.buffer:  # one event per line; yields each as soon as it arrives
        if not line.strip():
            continue
        event = json.loads(line)
        event_id = event["id"]
        obj = (event.get("data") or {}).get("object") or {}
        labels = (obj.get("metadata") or {}).get("labels") or {}
        if labels.get("audit.kubebridge.io/crash") == "once" and first("crash " + event_id):
            sys.exit(3)
        fail = labels.get("audit.kubebridge.io/fail")
        if fail == "permanent":
            answer(event_id, False, event["subject"] + " is labelled audit.kubebridge.io/fail=permanent", permanent=True)
            continue
        if fail == "retry-once" and first("retry " + event_id):
            answer(event_id, False, event["subject"] + ": the first attempt fails on purpose (retry-once)")
            continue
        out.write("%s\t%s\t%s\n" % (event_id, event["type"], event["subject"]))
        out.flush()
        os.fsync(out.fileno())
        answer(event_id, True)


if __name__ == "__main__":
    main()
