#!/usr/bin/env python3
"""Turn chat.notifications into Web Push requests (RFC 8030, payloads encrypted per RFC
8291, VAPID per RFC 8292), with Confluent's standard Avro deserializer and pywebpush.

    pip install -r docs/examples/requirements.txt
    python3 docs/examples/notifications_to_webpush.py \
        --subscriptions subscriptions.json --vapid-key vapid_private.pem \
        --vapid-subject mailto:ops@example.com [--max N] [--idle-timeout S]

`subscriptions.json` maps a user id to the browser's PushSubscription (what
`registration.pushManager.subscribe()` gave the client, which stored it with you):
    {"14": [{"endpoint": "https://push.example/...", "keys": {"p256dh": "...", "auth": "..."}}]}
A real sender keeps these in its own database; chatpipe does not hold them.

What it does with each record, in order, per partition:
  * a user without a subscription: nothing (counted);
  * otherwise one push per subscription, the payload a small JSON the service worker
    shows (`conversationId`, `kind`, `count`, `lastSeq`, `senderId`, `preview`,
    `threadRootSeq`), TTL `--ttl`, `Topic` one per conversation (a newer push for the
    same conversation replaces one the push service still holds), urgency high for a
    mention or a reply;
  * 404 or 410 from the push service: the subscription is gone (the user unsubscribed):
    it is dropped from the file's copy in memory and reported, never retried;
  * a connection error, 429 or 5xx: retried with backoff until it goes through; the
    record's offset is committed only after every push of it is answered, so a crash
    sends it again (at least once: a phone may show one twice; the payload's
    (conversationId, lastSeq) lets the service worker drop a repeat).
A registry outage is waited out the same way, never counted as an undecodable record.
"""
import argparse
import json
import os
import sys
import time
import uuid

from confluent_kafka import Consumer, TopicPartition
from confluent_kafka.schema_registry import SchemaRegistryClient
from confluent_kafka.schema_registry.avro import AvroDeserializer
from confluent_kafka.serialization import MessageField, SerializationContext
from pywebpush import WebPushException, webpush

RETRY_MAX_S = 30.0


def payload_of(n):
    """What the service worker gets: enough to show the notification and to pull."""
    return json.dumps({
        "conversationId": n["conversationId"], "kind": n["kind"], "count": n["count"],
        "lastSeq": n["lastSeq"], "senderId": n["senderId"], "preview": n.get("preview"),
        "threadRootSeq": n.get("threadRootSeq"),
    }, separators=(",", ":"))


def push_one(subscription, n, args):
    """Sends one push; True once the push service took it, False if the subscription is
    gone. Retries everything else until it goes through."""
    wait = 0.5
    while True:
        try:
            webpush(
                subscription_info=subscription,
                data=payload_of(n),
                vapid_private_key=args.vapid_key,
                vapid_claims={"sub": args.vapid_subject},
                ttl=args.ttl,
                headers={"Topic": f"c{n['conversationId']}",
                         "Urgency": "high" if n["kind"] in ("mention", "reply") else "normal"},
                timeout=10,
            )
            return True
        except WebPushException as err:
            status = err.response.status_code if err.response is not None else None
            if status in (404, 410):
                return False
            if status is not None and status < 500 and status != 429:
                # Our request is wrong (a bad key, a payload too large): retrying will
                # not help; say so and move on rather than block the partition.
                print(f"push refused {status}: {err}", file=sys.stderr, flush=True)
                return True
            print(f"push failed ({status or err}), retrying in {wait:.1f}s", file=sys.stderr, flush=True)
        except Exception as err:  # the push service did not answer
            print(f"push failed ({err!r}), retrying in {wait:.1f}s", file=sys.stderr, flush=True)
        time.sleep(wait)
        wait = min(wait * 2, RETRY_MAX_S)


def decode(deserialize, msg):
    """The record, waiting out a registry that does not answer."""
    wait = 0.5
    while True:
        try:
            return deserialize(msg.value(), SerializationContext(msg.topic(), MessageField.VALUE))
        except Exception as err:
            print(f"decoding {msg.partition()}/{msg.offset()} failed ({err!r}), retrying",
                  file=sys.stderr, flush=True)
            time.sleep(wait)
            wait = min(wait * 2, RETRY_MAX_S)


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--brokers", default=os.environ.get("KAFKA_BROKERS", "127.0.0.1:9092"))
    ap.add_argument("--registry", default=os.environ.get(
        "SCHEMA_REGISTRY_URL", "http://127.0.0.1:8081/apis/ccompat/v7"))
    ap.add_argument("--topic", default="chat.notifications")
    ap.add_argument("--group", default="webpush-sender")
    ap.add_argument("--subscriptions", required=True, help="user id -> [PushSubscription] (JSON)")
    ap.add_argument("--vapid-key", required=True, help="the VAPID private key (PEM file)")
    ap.add_argument("--vapid-subject", default="mailto:ops@example.com")
    ap.add_argument("--ttl", type=int, default=86400, help="seconds a push service keeps a push")
    ap.add_argument("--max", type=int, default=0, help="stop after N records (0: never)")
    ap.add_argument("--idle-timeout", type=float, default=0, help="stop after S idle seconds (0: never)")
    args = ap.parse_args()

    with open(args.subscriptions) as f:
        subscriptions = {int(user): subs for user, subs in json.load(f).items()}
    registry = SchemaRegistryClient({"url": args.registry, "timeout": 10, "max.retries": 3})
    deserialize = AvroDeserializer(registry)
    consumer = Consumer({
        "bootstrap.servers": args.brokers,
        "group.id": args.group or f"webpush-{uuid.uuid4()}",
        "auto.offset.reset": "earliest",
        "enable.auto.commit": False,
    })
    consumer.subscribe([args.topic])
    done = idle = 0
    try:
        while not args.max or done < args.max:
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
            n = decode(deserialize, msg)
            user = n["userId"]
            sent = gone = 0
            for sub in list(subscriptions.get(user, [])):
                if push_one(sub, n, args):
                    sent += 1
                else:
                    gone += 1
                    subscriptions[user].remove(sub)
            print(json.dumps({"userId": user, "conversationId": n["conversationId"],
                              "lastSeq": n["lastSeq"], "pushed": sent, "gone": gone}), flush=True)
            # Only now: a crash before this sends the record's pushes again.
            consumer.commit(offsets=[TopicPartition(msg.topic(), msg.partition(), msg.offset() + 1)],
                            asynchronous=False)
            done += 1
    finally:
        consumer.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
