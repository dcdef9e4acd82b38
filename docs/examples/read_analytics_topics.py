#!/usr/bin/env python3
"""Read the analytics topics with Confluent's standard Avro deserializer (confluent-kafka).

    pip install -r docs/examples/requirements.txt
    python3 docs/examples/read_analytics_topics.py [--topics T,...] [--max N] [--idle-timeout S]

Prints one JSON line per record, from the beginning of each topic:
{"topic", "partition", "offset", "key", "value"}, timestamps as microseconds since the
epoch (the schemas' timestamp-micros), so that a job in any language can compare them.
The records are flat (one record type per topic: docs/topics.md, "Analytics topics"):
a SQL engine reads them as tables.
"""
import argparse
import datetime
import json
import os
import sys
import time
import uuid

from confluent_kafka import Consumer
from confluent_kafka.schema_registry import SchemaRegistryClient
from confluent_kafka.schema_registry.avro import AvroDeserializer
from confluent_kafka.serialization import MessageField, SerializationContext

TOPICS = "chat.analytics.messages,chat.analytics.reads,chat.analytics.deliveries,chat.analytics.membership"
EPOCH = datetime.datetime(1970, 1, 1, tzinfo=datetime.timezone.utc)


def plain(value):
    """A decoded record as JSON can hold it: timestamps as integer microseconds."""
    if isinstance(value, dict):
        return {k: plain(v) for k, v in value.items()}
    if isinstance(value, list):
        return [plain(v) for v in value]
    if isinstance(value, datetime.datetime):
        return (value - EPOCH) // datetime.timedelta(microseconds=1)
    return value


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--brokers", default=os.environ.get("KAFKA_BROKERS", "127.0.0.1:9092"))
    ap.add_argument("--registry", default=os.environ.get(
        "SCHEMA_REGISTRY_URL", "http://127.0.0.1:8081/apis/ccompat/v7"))
    ap.add_argument("--topics", default=TOPICS, help="comma-separated")
    ap.add_argument("--max", type=int, default=0, help="stop after N records (0: never)")
    ap.add_argument("--idle-timeout", type=float, default=0, help="stop after S idle seconds (0: never)")
    args = ap.parse_args()

    registry = SchemaRegistryClient({"url": args.registry, "timeout": 10, "max.retries": 3})
    deserialize = AvroDeserializer(registry)
    consumer = Consumer({
        "bootstrap.servers": args.brokers,
        "group.id": f"analytics-example-{uuid.uuid4()}",
        "auto.offset.reset": "earliest",
        "enable.auto.commit": False,
    })
    consumer.subscribe(args.topics.split(","))
    printed = 0
    idle_since = time.monotonic()
    try:
        while not args.max or printed < args.max:
            msg = consumer.poll(1.0)
            if msg is None:
                if args.idle_timeout and time.monotonic() - idle_since >= args.idle_timeout:
                    break
                continue
            idle_since = time.monotonic()
            if msg.error():
                print(f"error: {msg.error()}", file=sys.stderr)
                continue
            context = SerializationContext(msg.topic(), MessageField.VALUE)
            value = None if msg.value() is None else plain(deserialize(msg.value(), context))
            print(json.dumps({"topic": msg.topic(), "partition": msg.partition(), "offset": msg.offset(),
                              "key": msg.key().decode(), "value": value}), flush=True)
            printed += 1
    finally:
        consumer.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
