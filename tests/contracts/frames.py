"""Validates the gateway's frames against their payload schemas in docs/asyncapi.yaml.

Usage: frames.py ASYNCAPI_YAML FRAMES_JSON, where FRAMES_JSON is a list of
{"message": <key under components.messages>, "frame": <the frame>}. Prints one line per
frame and exits 1 if any is invalid. jsonschema comes with openapi-spec-validator
(tests/contracts/requirements.txt).
"""
import json
import sys

import jsonschema
import yaml


def main(asyncapi_path, frames_path):
    with open(asyncapi_path) as f:
        doc = yaml.safe_load(f)
    with open(frames_path) as f:
        frames = json.load(f)
    failed = 0
    for item in frames:
        message = doc["components"]["messages"][item["message"]]
        # The payload's $refs (#/components/schemas/...) resolve against this root.
        schema = dict(message["payload"], components=doc["components"])
        errors = [e.message for e in jsonschema.Draft202012Validator(schema).iter_errors(item["frame"])]
        if errors:
            failed += 1
            print(f"INVALID {item['message']}: {json.dumps(item['frame'])}: {errors}")
        else:
            print(f"ok {item['message']}: {json.dumps(item['frame'])}")
    sys.exit(1 if failed else 0)


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
