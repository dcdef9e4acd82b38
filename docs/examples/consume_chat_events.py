#!/usr/bin/env python3
"""Read chat.events with Confluent's standard Avro deserializer (confluent-kafka).

    pip install -r docs/examples/requirements.txt
    python3 docs/examples/consume_chat_events.py [--from-beginning] [--max N] [--idle-timeout S] [--print-messages]

Nothing here knows chatpipe: the schema comes from the registry by the id in each
record (Confluent wire format), the key is a plain string. Dedupe as docs/topics.md says.

It also keeps what a downstream copy of the messages must keep (`Messages`): the latest
body of each message, edits applied, and deleted messages as tombstones whose body is
dropped and stays dropped, even when an at-least-once replay of their message.new or
message.edited comes by again. `--print-messages` prints that copy at the end.
"""
import argparse
import json
import os
import sys
import uuid

from confluent_kafka import Consumer
from confluent_kafka.schema_registry import SchemaRegistryClient
from confluent_kafka.schema_registry.avro import AvroDeserializer
from confluent_kafka.serialization import MessageField, SerializationContext


class Messages:
    """Each message's body by (conversationId, seq), as chat.events says it is now."""

    def __init__(self):
        self.bodies = {}
        self.deleted = set()  # tombstones: these bodies were erased and must stay gone

    def apply(self, event) -> bool:
        """Applies one event; False for an at-least-once duplicate of a message.new."""
        kind, payload = event["type"], event["payload"]
        if kind not in ("message.new", "message.edited", "message.deleted"):
            return True
        key = (event["conversationId"], payload["seq"])
        if kind == "message.new":
            if key in self.bodies or key in self.deleted:
                return False
            self.bodies[key] = payload["body"]
        elif kind == "message.edited":
            if key not in self.deleted:
                self.bodies[key] = payload["body"]
        else:
            self.bodies.pop(key, None)
            self.deleted.add(key)
        return True

    def rows(self):
        for key in sorted(self.bodies.keys() | self.deleted):
            row = {"conversationId": key[0], "seq": key[1]}
            if key in self.deleted:
                row["deleted"] = True
            else:
                row["body"] = self.bodies[key]
            yield row


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--brokers", default=os.environ.get("KAFKA_BROKERS", "127.0.0.1:9092"))
    ap.add_argument("--registry", default=os.environ.get(
        "SCHEMA_REGISTRY_URL", "http://127.0.0.1:8081/apis/ccompat/v7"))
    ap.add_argument("--topic", default="chat.events")
    ap.add_argument("--from-beginning", action="store_true")
    ap.add_argument("--max", type=int, default=0, help="stop after N records (0: never)")
    ap.add_argument("--idle-timeout", type=float, default=0, help="stop after S idle seconds (0: never)")
    ap.add_argument("--print-messages", action="store_true",
                    help="at the end, print every message as edits and deletes left it")
    args = ap.parse_args()

    # The client waits forever by default: bound each registry call and retry it, so a
    # registry that drops one request costs seconds, not the consumer.
    registry = SchemaRegistryClient({"url": args.registry, "timeout": 10, "max.retries": 3})
    deserialize = AvroDeserializer(registry)
    consumer = Consumer({
        "bootstrap.servers": args.brokers,
        "group.id": f"example-{uuid.uuid4()}",
        "auto.offset.reset": "earliest" if args.from_beginning else "latest",
        "enable.auto.commit": False,
    })
    consumer.subscribe([args.topic])
    messages = Messages()
    printed = idle = 0
    try:
        while not args.max or printed < args.max:
            msg = consumer.poll(1.0)
            if msg is None:
                idle += 1
                if args.idle_timeout and idle >= args.idle_timeout:
                    break
                continue
            idle = 0
            if msg.error():
                print(f"error: {msg.error()}", file=sys.stderr)
                continue
            try:
                event = deserialize(msg.value(), SerializationContext(msg.topic(), MessageField.VALUE))
            except Exception as err:  # not ours to fix here: report it and keep reading
                print(f"undecodable record at {msg.partition()}/{msg.offset()}: {err!r}", file=sys.stderr)
                continue
            if not messages.apply(event):
                continue  # an at-least-once duplicate
            print(json.dumps({"key": msg.key().decode(), "partition": msg.partition(),
                              "offset": msg.offset(), "event": event}, default=str), flush=True)
            printed += 1
    finally:
        consumer.close()
    if args.print_messages:
        for row in messages.rows():
            print(json.dumps({"message": row}), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
