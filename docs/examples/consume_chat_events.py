#!/usr/bin/env python3
"""Read chat.events with Confluent's standard Avro deserializer (confluent-kafka).

    pip install -r docs/examples/requirements.txt
    python3 docs/examples/consume_chat_events.py [--from-beginning] [--max N] [--idle-timeout S]

Nothing here knows chatpipe: the schema comes from the registry by the id in each
record (Confluent wire format), the key is a plain string. Dedupe as docs/topics.md says.
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


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--brokers", default=os.environ.get("KAFKA_BROKERS", "127.0.0.1:9092"))
    ap.add_argument("--registry", default=os.environ.get(
        "SCHEMA_REGISTRY_URL", "http://127.0.0.1:8081/apis/ccompat/v7"))
    ap.add_argument("--topic", default="chat.events")
    ap.add_argument("--from-beginning", action="store_true")
    ap.add_argument("--max", type=int, default=0, help="stop after N records (0: never)")
    ap.add_argument("--idle-timeout", type=float, default=0, help="stop after S idle seconds (0: never)")
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
    seen_messages = set()  # (conversationId, seq): the dedupe key of message.new
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
            if event["type"] == "message.new":
                key = (event["conversationId"], event["payload"]["seq"])
                if key in seen_messages:
                    continue  # an at-least-once duplicate
                seen_messages.add(key)
            print(json.dumps({"key": msg.key().decode(), "partition": msg.partition(),
                              "offset": msg.offset(), "event": event}, default=str), flush=True)
            printed += 1
    finally:
        consumer.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
