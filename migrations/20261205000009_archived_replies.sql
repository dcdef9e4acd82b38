-- Thread pages across the tiers: the retention step, as it moves replies out of
-- PostgreSQL, keeps here which seqs were replies of which thread (one small row per
-- archived reply, never per recipient), so a thread page finds its archived replies
-- without scanning the conversation's archive. A reply an edit or delete brought back
-- is in both (PostgreSQL's row wins, as in history).
CREATE TABLE archived_reply (
    conversation_id BIGINT NOT NULL REFERENCES conversation (id) ON DELETE CASCADE,
    root_seq        BIGINT NOT NULL,
    seq             BIGINT NOT NULL,
    PRIMARY KEY (conversation_id, root_seq, seq)
);
