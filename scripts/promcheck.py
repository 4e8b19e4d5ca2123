#!/usr/bin/env python3
"""Parses Prometheus text exposition on stdin with prometheus_client's parser (a parser
nobody here wrote) and prints one JSON line: families, samples, and every sample's value
keyed 'name{label=value,...}'. Exit 1 with the parser's error when it refuses the text."""
import json
import sys

from prometheus_client.parser import text_string_to_metric_families


def main():
    text = sys.stdin.read()
    try:
        fams = list(text_string_to_metric_families(text))
    except Exception as e:  # the parser's own complaint, whatever its type
        print(json.dumps({"error": f"{type(e).__name__}: {e}"}))
        return 1
    values = {}
    for f in fams:
        for s in f.samples:
            labels = ",".join(f"{k}={v}" for k, v in sorted(s.labels.items()))
            values[f"{s.name}{{{labels}}}"] = s.value
    print(json.dumps({"families": len(fams), "samples": len(values),
                      "types": {f.name: f.type for f in fams}, "values": values}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
