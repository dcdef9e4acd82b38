#!/usr/bin/env python3
"""Read chat.events with Confluent's standard Avro deserializer (confluent-kafka).

    pip install -r docs/examples/requirements.txt
    python3 docs/examples/consume_chat_events.py [--group G] [--from-beginning] [--max N] [--idle-timeout S] [--print-messages]

Nothing here knows chatpipe: the schema comes from the registry by the id in each
record (Confluent wire format), the key is a plain string. Dedupe as docs/topics.md says.

At least once, as docs/topics.md teaches: a record's offset is stored only once the
record is applied, and the consumer commits stored offsets (every 5 s and when it
stops), so a restart with the same --group goes on after the last record applied. A
registry that cannot answer (down, 5xx, timing out) is an outage: the record is retried
until it can be read, never counted as undecodable. Only a record that is wrong in
itself (no Confluent frame, a schema id the registry does not know, bytes that do not
decode) is reported and passed over; a real consumer writes it to a dead-letter topic.

It also keeps what a downstream copy of the messages must keep (`Messages`): the latest
body of each message, edits applied, and deleted messages as tombstones whose body is
dropped and stays dropped, even when an at-least-once replay of their message.new or
message.edited comes by again. `--print-messages` prints that copy at the end.
"""
import argparse
import json
import os
import sys
import time
import uuid

from confluent_kafka import Consumer
from confluent_kafka.schema_registry import SchemaRegistryClient
from confluent_kafka.schema_registry.avro import AvroDeserializer
from confluent_kafka.schema_registry.error import SchemaRegistryError
from confluent_kafka.serialization import MessageField, SerializationContext, SerializationError


class Undecodable(Exception):
    """The record itself is wrong: retrying cannot help."""


def is_outage(err: Exception) -> bool:
    """Whether reading a record failed because the registry could not answer."""
    if isinstance(err, SchemaRegistryError):
        # 404 (no such schema id) and 4xx are the record's fault; no status, 408, 429 and
        # 5xx are the registry's.
        status = err.http_status_code
        return status is None or status in (408, 429) or status >= 500
    # Bytes that are not what their frame says; anything else (a refused connection, a
    # timeout) is the transport's.
    return not isinstance(err, (SerializationError, ValueError, EOFError))


def decode(deserialize, msg):
    """The record's value, waiting out a registry outage; Undecodable if it is wrong."""
    delay = 0.5
    while True:
        try:
            return deserialize(msg.value(), SerializationContext(msg.topic(), MessageField.VALUE))
        except Exception as err:  # noqa: BLE001 -- sorted into outage or bad record below
            if not is_outage(err):
                raise Undecodable(repr(err)) from err
            print(f"registry unavailable at {msg.partition()}/{msg.offset()} ({err!r}); "
                  f"retrying in {delay:.1f} s", file=sys.stderr, flush=True)
            time.sleep(delay)
            delay = min(delay * 2, 10.0)


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
    ap.add_argument("--group", help="consumer group (default: a new one each run, starting from --from-beginning)")
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
        "group.id": args.group or f"example-{uuid.uuid4()}",
        "auto.offset.reset": "earliest" if args.from_beginning else "latest",
        # Commit what store_offsets stored: offsets of records already applied.
        "enable.auto.commit": True,
        "enable.auto.offset.store": False,
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
                event = decode(deserialize, msg)
            except Undecodable as err:
                print(f"undecodable record at {msg.partition()}/{msg.offset()}: {err}", file=sys.stderr)
                consumer.store_offsets(message=msg)
                continue
            if messages.apply(event):  # False: an at-least-once duplicate
                print(json.dumps({"key": msg.key().decode(), "partition": msg.partition(),
                                  "offset": msg.offset(), "event": event}, default=str), flush=True)
                printed += 1
            consumer.store_offsets(message=msg)
    finally:
        consumer.close()
    if args.print_messages:
        for row in messages.rows():
            print(json.dumps({"message": row}), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
