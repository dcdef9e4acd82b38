#!/usr/bin/env python3
"""A browser's side of Web Push, for tests/push/notifications.rs: the subscription's
keys, and decrypting what a push service would hand the browser.

    webpush_subscriber.py keys DIR     -> writes DIR/vapid.pem (the sender's VAPID key) and
                                          DIR/subscriber.pem; prints {"p256dh", "auth"}
    webpush_subscriber.py decrypt DIR BODYFILE -> prints the plaintext (RFC 8291, aes128gcm)
"""
import base64
import json
import os
import sys

import http_ece
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ec
from py_vapid import Vapid


def b64(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).decode().rstrip("=")


def keys(folder: str) -> None:
    vapid = Vapid()
    vapid.generate_keys()
    vapid.save_key(os.path.join(folder, "vapid.pem"))
    private = ec.generate_private_key(ec.SECP256R1())
    with open(os.path.join(folder, "subscriber.pem"), "wb") as f:
        f.write(private.private_bytes(serialization.Encoding.PEM,
                                      serialization.PrivateFormat.PKCS8,
                                      serialization.NoEncryption()))
    auth = os.urandom(16)
    with open(os.path.join(folder, "auth"), "wb") as f:
        f.write(auth)
    public = private.public_key().public_bytes(serialization.Encoding.X962,
                                               serialization.PublicFormat.UncompressedPoint)
    print(json.dumps({"p256dh": b64(public), "auth": b64(auth)}))


def decrypt(folder: str, body_file: str) -> None:
    with open(os.path.join(folder, "subscriber.pem"), "rb") as f:
        private = serialization.load_pem_private_key(f.read(), password=None)
    with open(os.path.join(folder, "auth"), "rb") as f:
        auth = f.read()
    with open(body_file, "rb") as f:
        body = f.read()
    print(http_ece.decrypt(body, private_key=private, auth_secret=auth, version="aes128gcm").decode())


if __name__ == "__main__":
    {"keys": lambda: keys(sys.argv[2]), "decrypt": lambda: decrypt(sys.argv[2], sys.argv[3])}[sys.argv[1]]()
