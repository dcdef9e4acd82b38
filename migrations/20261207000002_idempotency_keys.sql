-- Idempotency-Key on POST /v1/conversations and POST /v1/direct: a retried create gives
-- the first answer instead of a second group. The key's row is written in the same
-- transaction as what the request made, so a request either made its conversation and
-- holds its key, or did neither: a retry after any failure (a timeout, a crash, a lost
-- answer) finds the first answer or makes the conversation once. A concurrent request
-- with the same key waits on the primary key until the first commits, then reads its
-- answer. `request` is the operation and its normalized body: the same key with another
-- request is refused (409 idempotency-key-reused). Rows older than
-- `idempotency.retention_s` count as absent and are deleted a few at a time by the
-- requests that write keys (ingest-api/src/store/idempotency.rs).
CREATE TABLE idempotency_key (
    user_id    bigint      NOT NULL,
    key        text        NOT NULL,
    request    jsonb       NOT NULL,
    status     smallint    NOT NULL,
    response   jsonb       NOT NULL,
    created_at timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (user_id, key)
);
CREATE INDEX idempotency_key_created_at ON idempotency_key (created_at);
